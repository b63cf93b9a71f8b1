//! `GET .../logs`: the end of a console log, streamed.
//!
//! A console log is bounded ([`crate::runtime::console`]), but one written before the
//! bound existed may not be, and several readers at once must not hold several logs in
//! memory: the answer is read from the file in chunks as the client takes them, from
//! at most `max` bytes before its end, never more.
use std::path::PathBuf;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Bytes read from the file per chunk of the answer.
const CHUNK: usize = 64 * 1024;

// The API's bound on a logs query is the log's own bound (zygote-api cannot read the
// VMM's constant).
const _: () = assert!(crate::model::LOG_CAP == crate::runtime::console::LOG_CAP);

/// The last `max` bytes of the file at `path` as a streamed `text/plain` body (empty when
/// there is no file).
pub async fn tail_body(path: Option<PathBuf>, max: u64) -> Response {
    let opened = match path {
        Some(p) => open_tail(p, max).await.ok(),
        None => None,
    };
    let Some((file, len)) = opened else {
        return text(Body::empty());
    };
    let stream = futures_util::stream::unfold((file, len), |(mut file, left)| async move {
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; CHUNK.min(left as usize)];
        match file.read(&mut buf).await {
            // The file shrank (compacted meanwhile): end early.
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                let chunk = Ok::<_, std::io::Error>(bytes::Bytes::from(buf));
                Some((chunk, (file, left - n as u64)))
            }
            Err(e) => Some((Err(e), (file, 0))),
        }
    });
    text(Body::from_stream(stream))
}

/// The file positioned `max` bytes before its end, and how many bytes follow.
async fn open_tail(path: PathBuf, max: u64) -> std::io::Result<(tokio::fs::File, u64)> {
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let start = len.saturating_sub(max);
    file.seek(std::io::SeekFrom::Start(start)).await?;
    Ok((file, len - start))
}

/// No Content-Length: a log compacted while it is read ends the body early.
fn text(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}
