//! Command-line flags and kernel command-line keys.
//!
//! As PID 1 the agent gets no useful argv, so its listeners can also be set on
//! the kernel command line. Explicit flags win; otherwise the kernel command
//! line adjusts the defaults (vsock 1024 and TCP 0.0.0.0:10240).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use zygote_proto::{
    CMDLINE_PORT_KEY, CMDLINE_TCP_KEY, CMDLINE_VSOCK_KEY, DEFAULT_TCP_PORT, DEFAULT_VSOCK_PORT,
};

pub const USAGE: &str = "\
usage: zygote-agent [OPTIONS]

Serves the zygote agent protocol (see zygote-proto's PROTOCOL.md).

Listeners (any combination, each repeatable; without any, the defaults apply:
vsock port 1024 and TCP 0.0.0.0:10240, adjustable on the kernel command line
with zygote.agent.tcp=PORT|ADDR:PORT|off, zygote.agent.vsock=PORT|off and
zygote.agent.port=NAME):
  --tcp [ADDR:]PORT     listen on TCP (a bare port means 0.0.0.0:PORT)
  --unix PATH           listen on a Unix socket (a stale socket file is replaced)
  --vsock PORT          listen on AF_VSOCK, any CID
  --port NAME           serve the virtio-serial port NAME (one host connection
                        at a time; served again after the host reconnects)

Behaviour:
  --no-system-changes   reidentify only validates and reports (no entropy,
                        hostname or clock changes); shutdown is refused.
                        For running on a host in tests.
  --subreaper           become a child subreaper and reap every orphan, as
                        PID 1 does (lets host tests exercise the reaper)
  --help, --version
";

/// Where to listen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listeners {
    pub tcp: Vec<SocketAddr>,
    pub unix: Vec<PathBuf>,
    pub vsock: Vec<u32>,
    /// virtio-serial port names.
    pub ports: Vec<String>,
}

impl Listeners {
    pub fn is_empty(&self) -> bool {
        self.tcp.is_empty()
            && self.unix.is_empty()
            && self.vsock.is_empty()
            && self.ports.is_empty()
    }

    /// The defaults, adjusted by `zygote.agent.*` keys in `cmdline`.
    pub fn from_cmdline(cmdline: &str) -> Result<Self, ConfigError> {
        let mut l = Listeners {
            tcp: vec![any_addr(DEFAULT_TCP_PORT)],
            unix: Vec::new(),
            vsock: vec![DEFAULT_VSOCK_PORT],
            ports: Vec::new(),
        };
        for word in cmdline.split_ascii_whitespace() {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            if key == CMDLINE_TCP_KEY {
                l.tcp = if value == "off" {
                    Vec::new()
                } else {
                    vec![parse_tcp(key, value)?]
                };
            } else if key == CMDLINE_PORT_KEY {
                l.ports = vec![parse_port_name(key, value)?];
            } else if key == CMDLINE_VSOCK_KEY {
                l.vsock = if value == "off" {
                    Vec::new()
                } else {
                    vec![parse_num(key, value)?]
                };
            }
        }
        Ok(l)
    }
}

/// Parsed command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    pub listeners: Listeners,
    pub no_system_changes: bool,
    pub subreaper: bool,
    pub help: bool,
    pub version: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown option {0:?}")]
    UnknownOption(String),
    #[error("option {0} needs a value")]
    MissingValue(String),
    #[error("invalid value {value:?} for {option}")]
    BadValue { option: String, value: String },
}

fn any_addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
}

fn bad(option: &str, value: &str) -> ConfigError {
    ConfigError::BadValue {
        option: option.to_string(),
        value: value.to_string(),
    }
}

fn parse_num<T: std::str::FromStr>(option: &str, value: &str) -> Result<T, ConfigError> {
    value.parse().map_err(|_| bad(option, value))
}

/// A virtio-serial port name: what QEMU's `virtserialport,name=` accepts and
/// the guest lists in /sys/class/virtio-ports/*/name.
fn parse_port_name(option: &str, value: &str) -> Result<String, ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(value.to_string())
    } else {
        Err(bad(option, value))
    }
}

fn parse_tcp(option: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(any_addr(port));
    }
    value.parse().map_err(|_| bad(option, value))
}

/// Parse flags (without the program name). `--opt value` and `--opt=value`
/// are both accepted.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Args, ConfigError> {
    let mut out = Args::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |inline: Option<String>| {
            inline
                .or_else(|| it.next())
                .ok_or_else(|| ConfigError::MissingValue(flag.clone()))
        };
        match flag.as_str() {
            "--tcp" => {
                let v = value(inline)?;
                out.listeners.tcp.push(parse_tcp("--tcp", &v)?);
            }
            "--unix" => out.listeners.unix.push(PathBuf::from(value(inline)?)),
            "--vsock" => {
                let v = value(inline)?;
                out.listeners.vsock.push(parse_num("--vsock", &v)?);
            }
            "--port" => {
                let v = value(inline)?;
                out.listeners.ports.push(parse_port_name("--port", &v)?);
            }
            "--no-system-changes" if inline.is_none() => out.no_system_changes = true,
            "--subreaper" if inline.is_none() => out.subreaper = true,
            "--help" | "-h" if inline.is_none() => out.help = true,
            "--version" | "-V" if inline.is_none() => out.version = true,
            _ => return Err(ConfigError::UnknownOption(arg)),
        }
    }
    Ok(out)
}

/// The listeners to use: explicit flags, else defaults adjusted by `cmdline`.
pub fn resolve_listeners(args: &Args, cmdline: &str) -> Result<Listeners, ConfigError> {
    if !args.listeners.is_empty() {
        return Ok(args.listeners.clone());
    }
    Listeners::from_cmdline(cmdline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, ConfigError> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags() {
        let a = args(&[
            "--tcp",
            "127.0.0.1:9000",
            "--tcp=7000",
            "--unix",
            "/tmp/a.sock",
            "--vsock=52",
            "--no-system-changes",
        ])
        .unwrap();
        assert_eq!(
            a.listeners.tcp,
            vec!["127.0.0.1:9000".parse().unwrap(), any_addr(7000)]
        );
        assert_eq!(a.listeners.unix, vec![PathBuf::from("/tmp/a.sock")]);
        assert_eq!(a.listeners.vsock, vec![52]);
        assert!(a.no_system_changes && !a.subreaper);
    }

    #[test]
    fn flag_errors() {
        assert_eq!(
            args(&["--tcp"]),
            Err(ConfigError::MissingValue("--tcp".into()))
        );
        assert!(matches!(
            args(&["--vsock", "x"]),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            args(&["--tcp", "70000"]),
            Err(ConfigError::BadValue { .. })
        ));
        assert_eq!(
            args(&["--frobnicate"]),
            Err(ConfigError::UnknownOption("--frobnicate".into()))
        );
        assert!(args(&["--subreaper=1"]).is_err());
    }

    #[test]
    fn cmdline_defaults_and_overrides() {
        let d = Listeners::from_cmdline("console=ttyS0 root=/dev/vda quiet").unwrap();
        assert_eq!(d.tcp, vec![any_addr(10240)]);
        assert_eq!(d.vsock, vec![1024]);

        let l = Listeners::from_cmdline(
            "console=ttyS0 zygote.agent.tcp=2222 zygote.agent.vsock=off ip=10.0.2.15::10.0.2.2",
        )
        .unwrap();
        assert_eq!(l.tcp, vec![any_addr(2222)]);
        assert!(l.vsock.is_empty());

        let l = Listeners::from_cmdline("zygote.agent.tcp=10.0.2.15:80 zygote.agent.vsock=99\n")
            .unwrap();
        assert_eq!(l.tcp, vec!["10.0.2.15:80".parse().unwrap()]);
        assert_eq!(l.vsock, vec![99]);

        let l = Listeners::from_cmdline("zygote.agent.tcp=off zygote.agent.port=org.zygote.agent")
            .unwrap();
        assert!(l.tcp.is_empty());
        assert_eq!(l.ports, vec!["org.zygote.agent".to_string()]);

        assert!(Listeners::from_cmdline("zygote.agent.vsock=nope").is_err());
        assert!(Listeners::from_cmdline("zygote.agent.port=../../dev/sda").is_err());
        assert!(args(&["--port", ""]).is_err());
    }

    #[test]
    fn flags_beat_cmdline() {
        let a = args(&["--unix", "/x"]).unwrap();
        let l = resolve_listeners(&a, "zygote.agent.tcp=1").unwrap();
        assert_eq!(l.unix, vec![PathBuf::from("/x")]);
        assert!(l.tcp.is_empty() && l.vsock.is_empty());
        let l = resolve_listeners(&Args::default(), "zygote.agent.tcp=1").unwrap();
        assert_eq!(l.tcp, vec![any_addr(1)]);
    }
}
