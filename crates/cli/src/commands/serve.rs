//! `zygote serve`: run the daemon (the same code as `zygoted`).
pub type ServeArgs = zygote_daemon::ServeArgs;

pub fn run(args: ServeArgs) -> anyhow::Result<i32> {
    zygote_daemon::server::serve_blocking(args)?;
    Ok(0)
}
