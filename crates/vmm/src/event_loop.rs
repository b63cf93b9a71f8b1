//! The VMM's one event thread: epoll over device eventfds and backend sockets.
//!
//! Handlers may add and remove fds at any time through an [`EventRegistrar`] (e.g. a vsock
//! device accepting connections). The thread can be parked outside epoll_wait, holding no
//! locks, so that the process can fork safely (see the branch code), and stopped.
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// Reacts to readiness of the fds it registered.
pub trait EventHandler: Send {
    /// `fd` is ready with `events` (EPOLLIN/EPOLLOUT/EPOLLHUP... bits).
    fn handle_event(&mut self, fd: RawFd, events: EventSet, registrar: &EventRegistrar);
}

pub type SharedHandler = Arc<Mutex<dyn EventHandler>>;

const CONTROL_TOKEN: u64 = 0;

/// Add/remove fds on the loop; cheap to clone and usable from any thread.
#[derive(Clone)]
pub struct EventRegistrar {
    inner: Arc<Registry>,
}

struct Registry {
    epoll: Epoll,
    handlers: Mutex<HashMap<u64, (RawFd, SharedHandler)>>,
    next_token: AtomicU64,
}

impl EventRegistrar {
    /// Watch `fd` for `events`, dispatching to `handler`. Returns a token for `remove`.
    pub fn add(&self, fd: RawFd, events: EventSet, handler: SharedHandler) -> std::io::Result<u64> {
        let token = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        self.inner
            .handlers
            .lock()
            .unwrap()
            .insert(token, (fd, handler));
        if let Err(e) =
            self.inner
                .epoll
                .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
        {
            self.inner.handlers.lock().unwrap().remove(&token);
            return Err(e);
        }
        Ok(token)
    }

    /// Stop watching the fd registered under `token`.
    pub fn remove(&self, token: u64) {
        if let Some((fd, _)) = self.inner.handlers.lock().unwrap().remove(&token) {
            let _ = self
                .inner
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
    }

    /// Change the interest set of a registered fd (e.g. add EPOLLOUT while backlogged).
    pub fn modify(&self, token: u64, events: EventSet) -> std::io::Result<()> {
        let fd = match self.inner.handlers.lock().unwrap().get(&token) {
            Some((fd, _)) => *fd,
            None => return Ok(()),
        };
        self.inner
            .epoll
            .ctl(ControlOperation::Modify, fd, EpollEvent::new(events, token))
    }

    pub fn len(&self) -> usize {
        self.inner.handlers.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Want {
    Run,
    Park,
    Stop,
}

struct Control {
    want: Mutex<(Want, bool)>, // (wanted, parked)
    cv: Condvar,
    wake: EventFd,
}

/// Owner side of the running event thread.
pub struct EventLoop {
    registrar: EventRegistrar,
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

impl EventLoop {
    pub fn start() -> std::io::Result<Self> {
        let registrar = EventRegistrar {
            inner: Arc::new(Registry {
                epoll: Epoll::new()?,
                handlers: Mutex::new(HashMap::new()),
                next_token: AtomicU64::new(CONTROL_TOKEN + 1),
            }),
        };
        let control = Arc::new(Control {
            want: Mutex::new((Want::Run, false)),
            cv: Condvar::new(),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
        });
        registrar.inner.epoll.ctl(
            ControlOperation::Add,
            std::os::fd::AsRawFd::as_raw_fd(&control.wake),
            EpollEvent::new(EventSet::IN, CONTROL_TOKEN),
        )?;
        let (reg, ctl) = (registrar.clone(), control.clone());
        let thread = std::thread::Builder::new()
            .name("events".into())
            .spawn(move || run(reg, ctl))?;
        Ok(Self {
            registrar,
            control,
            thread: Some(thread),
        })
    }

    pub fn registrar(&self) -> &EventRegistrar {
        &self.registrar
    }

    fn set_want(&self, want: Want) {
        self.control.want.lock().unwrap().0 = want;
        self.control.cv.notify_all();
        let _ = self.control.wake.write(1);
    }

    /// Park the thread outside epoll_wait and any handler; returns once parked.
    pub fn park(&self) {
        self.set_want(Want::Park);
        let mut st = self.control.want.lock().unwrap();
        while !st.1 && self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
            st = self
                .control
                .cv
                .wait_timeout(st, std::time::Duration::from_millis(10))
                .unwrap()
                .0;
        }
    }

    pub fn unpark(&self) {
        self.set_want(Want::Run);
    }

    pub fn stop(&mut self) {
        self.set_want(Want::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EventLoop {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(registrar: EventRegistrar, control: Arc<Control>) {
    let mut events = vec![EpollEvent::default(); 64];
    loop {
        {
            let mut st = control.want.lock().unwrap();
            loop {
                match st.0 {
                    Want::Run => {
                        st.1 = false;
                        break;
                    }
                    Want::Stop => return,
                    Want::Park => {
                        st.1 = true;
                        control.cv.notify_all();
                        st = control.cv.wait(st).unwrap();
                    }
                }
            }
        }
        let n = match registrar.inner.epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("event loop epoll_wait failed: {e}");
                return;
            }
        };
        for ev in &events[..n] {
            let token = ev.data();
            if token == CONTROL_TOKEN {
                let _ = control.wake.read();
                continue;
            }
            // Look the handler up per event: an earlier handler in this batch may have
            // removed it.
            let entry = registrar
                .inner
                .handlers
                .lock()
                .unwrap()
                .get(&token)
                .cloned();
            if let Some((fd, handler)) = entry {
                handler
                    .lock()
                    .unwrap()
                    .handle_event(fd, ev.event_set(), &registrar);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::mpsc::{channel, Sender};
    use std::time::Duration;

    struct Echo {
        evt: EventFd,
        tx: Sender<u64>,
    }
    impl EventHandler for Echo {
        fn handle_event(&mut self, _fd: RawFd, _ev: EventSet, _r: &EventRegistrar) {
            if let Ok(v) = self.evt.read() {
                let _ = self.tx.send(v);
            }
        }
    }

    #[test]
    fn dispatches_parks_and_resumes() {
        let mut el = EventLoop::start().unwrap();
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let (tx, rx) = channel();
        let fd = evt.as_raw_fd();
        let writer = evt.try_clone().unwrap();
        let token = el
            .registrar()
            .add(fd, EventSet::IN, Arc::new(Mutex::new(Echo { evt, tx })))
            .unwrap();
        writer.write(3).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 3);

        el.park();
        writer.write(5).unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "parked loop must not dispatch"
        );
        el.unpark();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 5);

        el.registrar().remove(token);
        assert!(el.registrar().is_empty());
        writer.write(7).unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        el.stop();
    }
}
