//! `zygote shell ID [-- CMD...]`: an interactive terminal in a sandbox, like
//! `docker exec -it` (the daemon's `GET /v1/sandboxes/{id}/pty` WebSocket).
//!
//! When stdin is a terminal it is put in raw mode, so every key (Ctrl-C included)
//! goes to the guest's terminal, which does the echoing and line editing; the local
//! terminal's size is sent at the start and again on every SIGWINCH. The original
//! mode is restored on every way out: the program's exit, an error, a panic
//! (the guard's drop) and SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to this process, which
//! are caught and end the session (the remote program is killed).
//!
//! When stdin is not a terminal (a pipe, a file) nothing is changed locally: the
//! input is forwarded as typed keys once the program has shown something (or after
//! [`PIPE_START`]): keys typed into a terminal before a shell has set up its line
//! editor can be lost. The end of the input becomes Ctrl-D (end of file for the guest
//! terminal's reader), repeated every [`EOF_REPEAT`] until the program ends, since
//! one that arrives while the program switches terminal modes is dropped by the
//! terminal. The terminal echoes input, so the output includes it.
//!
//! The exit status is the remote program's, or 128 + its signal.
use std::io::{Read, Write};
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use zygote_api::pty_client::{self, PtyEvent, PtyOptions};

use super::daemon_client::ApiArgs;

/// Longest wait for the program's first output before piped input is sent anyway.
const PIPE_START: Duration = Duration::from_secs(2);
/// How often end-of-file (Ctrl-D) is sent again after piped input ended.
const EOF_REPEAT: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct ShellArgs {
    /// Sandbox id.
    id: String,
    /// Program and arguments (default: the guest user's login shell).
    #[arg(last = true)]
    cmd: Vec<String>,
    /// KEY=VALUE, repeatable.
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    /// Working directory in the guest (default: the user's home).
    #[arg(long)]
    cwd: Option<String>,
    #[command(flatten)]
    api: ApiArgs,
}

/// The terminal's size, (cols, rows), if `fd` is a terminal that knows it.
fn window_size(fd: libc::c_int) -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ writes one winsize.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

/// The local terminal in raw mode for as long as this lives.
struct RawMode {
    fd: libc::c_int,
    saved: libc::termios,
}

impl RawMode {
    fn enter(fd: libc::c_int) -> std::io::Result<RawMode> {
        // SAFETY: tcgetattr/tcsetattr read and write one termios.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut saved) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(fd, libc::TCSANOW, &raw) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(RawMode { fd, saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the termios read in `enter`.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

pub fn run(args: ShellArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    // SAFETY: isatty only inspects the descriptor.
    let interactive = unsafe { libc::isatty(0) } == 1;
    let (cols, rows) = window_size(1)
        .or_else(|| window_size(0))
        .unwrap_or((80, 24));
    let mut opts = PtyOptions {
        cols,
        rows,
        cmd: args.cmd,
        env: Vec::new(),
        cwd: args.cwd,
    };
    // The guest terminal should speak what the local one understands.
    if let Some(term) = std::env::var("TERM").ok().filter(|t| !t.is_empty()) {
        opts.env.push(("TERM".into(), term));
    }
    opts.env.extend(super::exec::env_pairs(&args.env)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a tokio runtime")?;
    let (writer, reader) = rt.block_on(pty_client::open(&client, &args.id, &opts))?;
    // Only once the program runs: an HTTP error is printed with the terminal intact.
    let raw = if interactive {
        Some(RawMode::enter(0).context("setting the terminal to raw mode")?)
    } else {
        None
    };
    let result = rt.block_on(session(writer, reader, interactive));
    drop(raw);
    result
}

/// Reads stdin on a thread of its own (a blocking read cannot be cancelled; the
/// process exits under it at the end). `None` marks the end of input.
fn stdin_reader() -> mpsc::Receiver<Option<Vec<u8>>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

async fn session(
    mut writer: pty_client::PtyWriter,
    mut reader: pty_client::PtyReader,
    interactive: bool,
) -> anyhow::Result<i32> {
    let mut input = stdin_reader();
    let mut input_open = true;
    let mut last_input = b'\n';
    // Piped input waits for the program to show something (see the module docs).
    let mut input_ready = interactive;
    let start_anyway = tokio::time::sleep(PIPE_START);
    tokio::pin!(start_anyway);
    let mut eof_repeat = tokio::time::interval(EOF_REPEAT);
    let mut winch = signal(SignalKind::window_change())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            ev = reader.next() => match ev? {
                PtyEvent::Output(data) => {
                    input_ready = true;
                    // A closed stdout only loses output; the session goes on to its exit.
                    let _ = stdout.write_all(&data).and_then(|_| stdout.flush());
                }
                PtyEvent::Exit { exit_code, signal } => {
                    return Ok(exit_code.unwrap_or(128 + signal.unwrap_or(0)));
                }
                PtyEvent::Error { code, message } => {
                    eprint!("\r\nzygote: {message} ({code})\r\n");
                }
                PtyEvent::Closed => anyhow::bail!("the daemon closed the terminal before the program ended"),
            },
            _ = &mut start_anyway, if !input_ready => input_ready = true,
            data = input.recv(), if input_open && input_ready => match data.flatten() {
                Some(bytes) => {
                    last_input = bytes.last().copied().unwrap_or(last_input);
                    writer.input(&bytes).await?;
                }
                None => {
                    input_open = false;
                    if !interactive {
                        // Ctrl-D ends the input at the start of a line; mid-line it
                        // only ends the line.
                        let eof: &[u8] = if last_input == b'\n' { &[4] } else { &[4, 4] };
                        writer.input(eof).await?;
                        eof_repeat.reset();
                    }
                }
            },
            _ = eof_repeat.tick(), if !interactive && !input_open => writer.input(&[4]).await?,
            _ = winch.recv() => {
                if let Some((cols, rows)) = window_size(1).or_else(|| window_size(0)) {
                    writer.resize(cols, rows).await?;
                }
            }
            _ = int.recv() => return Ok(130),
            _ = term.recv() => return Ok(128 + libc::SIGTERM),
            _ = hup.recv() => return Ok(128 + libc::SIGHUP),
            _ = quit.recv() => return Ok(128 + libc::SIGQUIT),
        }
    }
}
