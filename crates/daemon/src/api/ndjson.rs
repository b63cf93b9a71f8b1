//! Streamed answers: NDJSON bodies (`application/x-ndjson`, one JSON event a line) of
//! the routes that report progress (create and branch with `stream`, exec, image
//! builds and pulls, pack pushes and pulls).
use std::convert::Infallible;
use std::sync::Arc;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// NDJSON body from a channel of serializable events.
pub fn ndjson<T: serde::Serialize + Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> Response {
    ndjson_stream(ReceiverStream::new(rx))
}

/// NDJSON body from a stream of serializable events.
pub fn ndjson_stream<T: serde::Serialize + Send + 'static>(
    events: impl tokio_stream::Stream<Item = T> + Send + 'static,
) -> Response {
    let stream = events.map(|ev| {
        let mut line = serde_json::to_vec(&ev).expect("events serialize");
        line.push(b'\n');
        Ok::<_, Infallible>(bytes::Bytes::from(line))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// Runs `job` in a task of its own, which goes on if the client leaves (a pull or push
/// registers its result whole or not at all), and answers with what it reports as
/// NDJSON lines, then the line `last` makes of its outcome. Progress lines may be
/// dropped for a slow reader; the last one never is.
pub fn ndjson_job<E, T, Fut>(
    job: impl FnOnce(Arc<dyn Fn(zygote_oci::Event) + Send + Sync>) -> Fut,
    last: impl FnOnce(crate::error::Result<T>) -> E + Send + 'static,
) -> Response
where
    E: From<zygote_oci::Event> + serde::Serialize + Send + 'static,
    T: Send + 'static,
    Fut: std::future::Future<Output = crate::error::Result<T>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let progress_tx = tx.clone();
    let progress = Arc::new(move |e: zygote_oci::Event| {
        let _ = progress_tx.try_send(E::from(e));
    });
    let work = job(progress);
    tokio::spawn(async move {
        let _ = tx.send(last(work.await)).await;
    });
    ndjson(rx)
}
