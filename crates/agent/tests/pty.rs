//! pty_open / pty_input / pty_resize over a real agent process: echo, output, the
//! terminal's size, Ctrl-C, exit status, validation, and a host that goes away.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use common::*;
use zygote_proto::client::{AgentClient, ClientError, PtyControl};
use zygote_proto::{ErrorCode, ExecResult, PtyOpenRequest, MAX_PTY_INPUT};

/// A running pty whose output is collected by a background thread.
struct Pty {
    control: PtyControl,
    pid: u32,
    output: Arc<Mutex<Vec<u8>>>,
    done: JoinHandle<Result<ExecResult, ClientError>>,
}

impl Pty {
    fn open(client: &AgentClient, argv: &[&str], cols: u16, rows: u16) -> Pty {
        let req = PtyOpenRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("PS1".into(), "$ ".into())]),
            cols,
            rows,
            ..Default::default()
        };
        let handle = client.open_pty(req).expect("open pty");
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = output.clone();
        let control = handle.control();
        let pid = handle.pid();
        let done =
            thread::spawn(move || handle.wait(|data| sink.lock().unwrap().extend_from_slice(data)));
        Pty {
            control,
            pid,
            output,
            done,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Wait until the output contains `needle`; panics with the
    /// output so far if it does not within 10 s.
    fn expect(&self, needle: &str) {
        let found = eventually(Duration::from_secs(10), || self.text().contains(needle));
        assert!(found, "{needle:?} never appeared in {:?}", self.text());
    }

    fn finish(self) -> ExecResult {
        self.done.join().unwrap().expect("pty exit")
    }
}

#[test]
fn a_shell_echoes_runs_commands_resizes_and_exits_with_its_status() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let pty = Pty::open(&client, &["sh"], 80, 24);
    pty.control.input(b"echo hi-$((40+2)); tty\n").unwrap();
    // The terminal echoes the typed line, then the command's output follows.
    pty.expect("echo hi-$((40+2)); tty");
    pty.expect("hi-42");
    pty.expect("/dev/pts/");

    pty.control.input(b"stty size\n").unwrap();
    pty.expect("24 80");
    pty.control.resize(132, 50).unwrap();
    pty.control.input(b"stty size\n").unwrap();
    pty.expect("50 132");

    pty.control.input(b"exit 3\n").unwrap();
    let result = pty.finish();
    assert_eq!(result.exit_code, Some(3), "{result:?}");
    assert_eq!(result.signal, None);
}

#[test]
fn ctrl_c_interrupts_the_foreground_program_not_the_shell() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let pty = Pty::open(&client, &["sh"], 80, 24);
    // The output (not the echo of the typed line) says the shell runs the command.
    pty.control.input(b"echo sl''eeping; sleep 100\n").unwrap();
    pty.expect("sleeping\r\n");
    thread::sleep(Duration::from_millis(300));
    pty.control.input(&[0x03]).unwrap();
    pty.expect("^C");
    // SIGINT is 2: the shell reports 128+2 and is still there to say so.
    pty.control.input(b"echo status=$?\n").unwrap();
    pty.expect("status=130");
    pty.control.input(b"exit\n").unwrap();
    assert_eq!(pty.finish().exit_code, Some(0));
}

#[test]
fn a_program_sees_a_terminal_and_term_is_set() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let script = "test -t 0 && test -t 1 && echo \"tty:$TERM\"; exit 0";
    let pty = Pty::open(&client, &["sh", "-c", script], 80, 24);
    let result = pty.done.join().unwrap().unwrap();
    assert_eq!(result.exit_code, Some(0));
    let text = String::from_utf8_lossy(&pty.output.lock().unwrap()).into_owned();
    assert!(text.contains("tty:xterm-256color"), "{text:?}");
}

#[test]
fn bad_requests_are_refused_and_the_pty_goes_on() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    for (cols, rows) in [(0, 24), (80, 0), (1001, 24), (80, 1001)] {
        let req = PtyOpenRequest {
            argv: vec!["sh".into()],
            cols,
            rows,
            ..Default::default()
        };
        let err = client.open_pty(req).err().expect("refused");
        assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{cols}x{rows}");
    }
    let req = PtyOpenRequest {
        argv: vec!["sh\0".into()],
        cols: 80,
        rows: 24,
        ..Default::default()
    };
    assert_eq!(
        client.open_pty(req).err().unwrap().code(),
        Some(ErrorCode::BadRequest)
    );
    let req = PtyOpenRequest {
        argv: vec!["/nonexistent/program".into()],
        cols: 80,
        rows: 24,
        ..Default::default()
    };
    assert_eq!(
        client.open_pty(req).err().unwrap().code(),
        Some(ErrorCode::SpawnFailed)
    );

    let pty = Pty::open(&client, &["sh"], 80, 24);
    let err = pty.control.resize(0, 10).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let err = pty
        .control
        .input(&vec![b'x'; MAX_PTY_INPUT + 1])
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    pty.control.input(b"stty size\n").unwrap();
    pty.expect("24 80");
    let control = pty.control.clone();
    pty.control.input(b"exit 0\n").unwrap();
    assert_eq!(pty.finish().exit_code, Some(0));
    // The pty is no longer open.
    assert_eq!(
        control.input(b"x").unwrap_err().code(),
        Some(ErrorCode::NotFound)
    );
}

#[test]
fn a_program_that_does_not_read_input_gets_busy_not_a_stuck_agent() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let pty = Pty::open(&client, &["sleep", "30"], 80, 24);
    let chunk = vec![b'x'; 16 * 1024];
    let mut busy = false;
    for _ in 0..64 {
        match pty.control.input(&chunk) {
            Ok(()) => {}
            Err(e) if e.code() == Some(ErrorCode::Busy) => {
                busy = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(busy, "1 MiB of unread input was all accepted");
    // The connection still answers at once.
    client.health().unwrap();
    pty.control.kill(libc::SIGKILL).unwrap();
    assert_eq!(pty.finish().signal, Some(libc::SIGKILL));
}

#[test]
fn a_host_that_goes_away_leaves_no_process_of_the_session() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let pty = Pty::open(&client, &["sh"], 80, 24);
    let marker = agent.path("bg.pid");
    // A background job (its own process group under job control) that ignores SIGHUP.
    // `st''arted`: the terminal echoes the typed line, so only the shell's output
    // holds "started", once the marker is written.
    let line = format!("trap '' HUP; sleep 300 & echo $! > {marker}; echo st''arted\n");
    pty.control.input(line.as_bytes()).unwrap();
    pty.expect("started");
    let bg: u32 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!is_dead(bg));
    let shell = pty.pid;
    client.close();
    assert!(
        eventually(Duration::from_secs(10), || is_dead(shell) && is_dead(bg)),
        "shell {shell} or its background job {bg} outlived the connection"
    );
}
