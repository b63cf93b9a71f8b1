//! Pushing to a registry (the distribution spec's upload, as docker does it): a blob
//! is asked about first (HEAD), then uploaded in one streamed PATCH of a session the
//! registry opens (POST) and committed with its digest (PUT); a manifest is PUT last.
//! Answers are read as everywhere else (`registry_http.rs`): errors with a cap, and
//! credentials only for the registry's own host, wherever an upload location points.
use bytes::Bytes;
use futures_util::Stream;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::{Method, Response, StatusCode, Url};

use crate::error::Result;
use crate::manifest::Digest;
use crate::registry_http::{describe, Session};

impl Session {
    /// Whether the repository has `digest` already.
    pub async fn blob_exists(&self, digest: &Digest) -> Result<bool> {
        let url = self.url(&format!("blobs/{digest}"))?;
        let response = self.send(Method::HEAD, url, |r| r).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        self.expect(response, &[StatusCode::OK]).await?;
        Ok(true)
    }

    /// Uploads the `size` bytes `chunks` yields as `digest`.
    pub async fn upload_blob<S>(&self, digest: &Digest, size: u64, chunks: S) -> Result<()>
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    {
        let start = self.url("blobs/uploads/")?;
        let response = self
            .send(Method::POST, start, |r| r.header(CONTENT_LENGTH, 0))
            .await?;
        let response = self.expect(response, &[StatusCode::ACCEPTED]).await?;
        let location = self.location(&response)?;
        // Authorized above: a stream is sent once.
        let patch = self
            .http()
            .patch(location)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, size)
            .body(reqwest::Body::wrap_stream(chunks))
            .build()
            .map_err(|e| self.registry_error(describe(&e)))?;
        let response = self.send_once(patch).await?;
        let response = self.expect(response, &[StatusCode::ACCEPTED]).await?;
        let mut commit = self.location(&response)?;
        commit
            .query_pairs_mut()
            .append_pair("digest", digest.as_str());
        let response = self
            .send(Method::PUT, commit, |r| r.header(CONTENT_LENGTH, 0))
            .await?;
        self.expect(response, &[StatusCode::CREATED]).await?;
        Ok(())
    }

    /// Stores `manifest` (of `media_type`) under the reference's tag or digest.
    pub async fn put_manifest(&self, manifest: Vec<u8>, media_type: &'static str) -> Result<()> {
        let url = self.manifest_url(&self.image.inner)?;
        let body = Bytes::from(manifest);
        let response = self
            .send(Method::PUT, url, |r| {
                r.header(CONTENT_TYPE, media_type).body(body.clone())
            })
            .await?;
        self.expect(response, &[StatusCode::CREATED]).await?;
        Ok(())
    }

    /// An upload session's `Location`, relative to the answer's URL.
    fn location(&self, response: &Response) -> Result<Url> {
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| self.registry_error("an upload answer without a Location".into()))?;
        response
            .url()
            .join(location)
            .map_err(|e| self.registry_error(format!("an upload Location {location:?}: {e}")))
    }
}
