//! An upgraded exchange (WebSocket or any `Upgrade:` protocol): once both the client
//! and the guest have switched, the proxy copies bytes both ways until either side
//! closes. It does not look at the protocol, so anything the guest speaks works.
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

pub(super) async fn splice(client: OnUpgrade, guest: OnUpgrade, what: String) {
    let (client, guest) = match tokio::try_join!(client, guest) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!("proxy: upgrade with {what}: {e}");
            return;
        }
    };
    let (mut client, mut guest) = (TokioIo::new(client), TokioIo::new(guest));
    match tokio::io::copy_bidirectional(&mut client, &mut guest).await {
        Ok((up, down)) => {
            tracing::debug!(
                "proxy: upgraded connection to {what} done ({up} bytes up, {down} down)"
            )
        }
        Err(e) => tracing::debug!("proxy: upgraded connection to {what}: {e}"),
    }
}
