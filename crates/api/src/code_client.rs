//! The code interpreter's routes for clients (`POST /v1/sandboxes/{id}/code` and the
//! contexts): what the CLI, the tests and SDK-like callers use.
use hyper::Method;

use crate::client::{Client, ClientError};
use crate::model::{CodeContext, CodeContextList, CodeEvent, CodeRequest, CreateContextRequest};

/// An execution's events gathered: what `run_code` returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Execution {
    /// Every `result` event, in order (the cell's value has `main`).
    pub results: Vec<CodeEvent>,
    pub stdout: String,
    pub stderr: String,
    /// `(name, value, traceback)` if the code raised, timed out or its kernel died.
    pub error: Option<(String, String, Vec<String>)>,
    /// Jupyter's counter from `done`; None if the stream ended without one.
    pub execution_count: Option<u64>,
    /// A `failure` line (code, message): the stream broke after it started.
    pub failure: Option<(String, String)>,
}

impl Execution {
    /// Folds one event in.
    pub fn add(&mut self, event: CodeEvent) {
        match event {
            CodeEvent::Stdout { text } => self.stdout.push_str(&text),
            CodeEvent::Stderr { text } => self.stderr.push_str(&text),
            e @ CodeEvent::Result { .. } => self.results.push(e),
            CodeEvent::Error {
                name,
                value,
                traceback,
            } => self.error = Some((name, value, traceback)),
            CodeEvent::Done { execution_count } => self.execution_count = Some(execution_count),
            CodeEvent::Failure { code, message } => self.failure = Some((code, message)),
        }
    }

    /// `text/plain` of the main result (the cell's last expression), if any.
    pub fn text(&self) -> Option<&str> {
        self.results.iter().find_map(|r| match r {
            CodeEvent::Result { main: true, data } => data.get("text/plain")?.as_str(),
            _ => None,
        })
    }
}

fn contexts_path(id: &str) -> String {
    format!("/v1/sandboxes/{id}/code/contexts")
}

impl Client {
    /// Runs code in sandbox `id`; each event goes to `on_event` as it arrives, and the
    /// whole execution is returned at the end.
    pub async fn run_code(
        &self,
        id: &str,
        req: &CodeRequest,
        mut on_event: impl FnMut(&CodeEvent),
    ) -> Result<Execution, ClientError> {
        let mut execution = Execution::default();
        let path = format!("/v1/sandboxes/{id}/code");
        self.ndjson(Method::POST, &path, Some(req), |ev: CodeEvent| {
            on_event(&ev);
            execution.add(ev);
        })
        .await?;
        Ok(execution)
    }

    pub async fn code_contexts(&self, id: &str) -> Result<Vec<CodeContext>, ClientError> {
        let list: CodeContextList = self
            .json(Method::GET, &contexts_path(id), None::<&()>)
            .await?;
        Ok(list.contexts)
    }

    pub async fn create_code_context(
        &self,
        id: &str,
        req: &CreateContextRequest,
    ) -> Result<CodeContext, ClientError> {
        self.json(Method::POST, &contexts_path(id), Some(req)).await
    }

    /// A fresh kernel for the context (its state is lost).
    pub async fn restart_code_context(&self, id: &str, context: &str) -> Result<(), ClientError> {
        let path = format!("{}/{context}/restart", contexts_path(id));
        self.raw(Method::POST, &path, None).await.map(drop)
    }

    pub async fn delete_code_context(&self, id: &str, context: &str) -> Result<(), ClientError> {
        let path = format!("{}/{context}", contexts_path(id));
        self.raw(Method::DELETE, &path, None).await.map(drop)
    }
}
