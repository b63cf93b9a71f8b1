//! The guest's network identity (`reidentify`'s `net`): MAC, IPv4 address and default
//! route of one interface, set with the classic interface ioctls (no `ip` binary in
//! the guest is assumed). A branch child or a restored guest wakes up with its
//! source's identity; the host gives it its own.
use std::io;
use std::net::Ipv4Addr;

use zygote_proto::{ErrorBody, ErrorCode, NetIdentity};

/// `struct rtentry` (linux/route.h) on 64-bit Linux; not in every libc flavour.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

const SIOCADDRT: libc::c_ulong = 0x890B;
const RTF_UP: libc::c_ushort = 0x0001;
const RTF_GATEWAY: libc::c_ushort = 0x0002;

/// A checked [`NetIdentity`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub interface: String,
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub mac: [u8; 6],
}

fn bad(message: String) -> ErrorBody {
    ErrorBody::new(ErrorCode::BadRequest, message)
}

/// Checks every field (nothing is applied on a bad request).
pub fn validate(n: &NetIdentity) -> Result<Plan, ErrorBody> {
    let name_ok = !n.interface.is_empty()
        && n.interface.len() < libc::IFNAMSIZ
        && n.interface
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !name_ok {
        return Err(bad(format!("invalid interface name {:?}", n.interface)));
    }
    let (addr, prefix) = n
        .address
        .split_once('/')
        .ok_or_else(|| bad(format!("address {:?} needs a /prefix", n.address)))?;
    let address: Ipv4Addr = addr
        .parse()
        .map_err(|_| bad(format!("invalid IPv4 address {addr:?}")))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (1..=32).contains(p))
        .ok_or_else(|| bad(format!("invalid prefix length in {:?}", n.address)))?;
    let gateway: Ipv4Addr = n
        .gateway
        .parse()
        .map_err(|_| bad(format!("invalid gateway {:?}", n.gateway)))?;
    let mask = u32::MAX << (32 - u32::from(prefix));
    if u32::from(gateway) & mask != u32::from(address) & mask || gateway == address {
        return Err(bad(format!(
            "gateway {gateway} is not another address on {}",
            n.address
        )));
    }
    let bytes: Vec<u8> = n
        .mac
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad(format!("invalid MAC {:?}", n.mac)))?;
    let mac: [u8; 6] = bytes
        .try_into()
        .map_err(|_| bad(format!("invalid MAC {:?}", n.mac)))?;
    if mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(bad(format!("MAC {} is not a unicast address", n.mac)));
    }
    Ok(Plan {
        interface: n.interface.clone(),
        address,
        prefix,
        gateway,
        mac,
    })
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) on Linux.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

struct Socket(libc::c_int);

impl Socket {
    fn new() -> io::Result<Socket> {
        // SAFETY: plain socket(2).
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Socket(fd))
    }

    fn ioctl<T>(&self, what: &str, op: libc::c_ulong, arg: &mut T) -> io::Result<()> {
        // SAFETY: `arg` is the struct `op` expects (ifreq / rtentry), owned by the caller.
        if unsafe { libc::ioctl(self.0, op as _, arg as *mut T) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
        }
        Ok(())
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(self.0) };
    }
}

/// Sets MAC, address/netmask, up, default route. The address change drops the
/// interface's routes (the kernel flushes them with the old address), so the route is
/// added afterwards; "exists" is fine.
pub fn apply(p: &Plan) -> io::Result<()> {
    let sock = Socket::new()?;
    let mut req = ifreq(&p.interface);
    sock.ioctl("SIOCGIFHWADDR", libc::SIOCGIFHWADDR, &mut req)?;
    // SAFETY: the kernel filled ifru_hwaddr.
    let current = unsafe { req.ifr_ifru.ifru_hwaddr };
    if current.sa_data[..6].iter().map(|&b| b as u8).ne(p.mac) {
        let mut req = ifreq(&p.interface);
        // SAFETY: a zeroed sockaddr: every bit pattern is valid.
        let mut hw: libc::sockaddr = unsafe { std::mem::zeroed() };
        hw.sa_family = libc::ARPHRD_ETHER;
        for (dst, src) in hw.sa_data.iter_mut().zip(p.mac) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_hwaddr = hw;
        sock.ioctl("SIOCSIFHWADDR", libc::SIOCSIFHWADDR, &mut req)?;
    }
    let mut req = ifreq(&p.interface);
    req.ifr_ifru.ifru_addr = sockaddr_in(p.address);
    sock.ioctl("SIOCSIFADDR", libc::SIOCSIFADDR, &mut req)?;
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(p.prefix)));
    let mut req = ifreq(&p.interface);
    req.ifr_ifru.ifru_netmask = sockaddr_in(mask);
    sock.ioctl("SIOCSIFNETMASK", libc::SIOCSIFNETMASK, &mut req)?;
    crate::system::interface_up(&p.interface)?;
    let mut dev: Vec<libc::c_char> = p
        .interface
        .bytes()
        .map(|b| b as libc::c_char)
        .chain([0])
        .collect();
    let mut route = RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr_in(p.gateway),
        rt_genmask: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_flags: RTF_UP | RTF_GATEWAY,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: dev.as_mut_ptr(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    match sock.ioctl("SIOCADDRT", SIOCADDRT, &mut route) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(address: &str, gateway: &str, mac: &str) -> NetIdentity {
        NetIdentity {
            interface: "eth0".into(),
            address: address.into(),
            gateway: gateway.into(),
            mac: mac.into(),
        }
    }

    #[test]
    fn a_good_identity_is_planned() {
        let p = validate(&ident("10.213.0.7/16", "10.213.0.1", "02:7a:63:00:00:06")).unwrap();
        assert_eq!(p.address, Ipv4Addr::new(10, 213, 0, 7));
        assert_eq!(p.prefix, 16);
        assert_eq!(p.mac, [2, 0x7a, 0x63, 0, 0, 6]);
    }

    /// A tap named `name` in the calling thread's network namespace, kept while the
    /// returned descriptor is open.
    fn tap(name: &str) -> io::Result<std::fs::File> {
        const TUNSETIFF: libc::c_ulong = 0x400454ca;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")?;
        let mut req = ifreq(name);
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF takes an ifreq; `req` outlives the call.
        if unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                TUNSETIFF as _,
                &mut req,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }

    #[test]
    fn an_identity_is_applied_to_a_real_interface() {
        // In a network namespace of this thread's own, on a tap standing in for eth0;
        // twice, as a branch child's guest gets its second identity.
        let run = std::thread::spawn(|| -> Result<String, String> {
            // SAFETY: unshare affects only this thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Ok(format!("skip: {}", io::Error::last_os_error()));
            }
            let _tap = match tap("eth0") {
                Ok(t) => t,
                Err(e) => return Ok(format!("skip: no tap ({e})")),
            };
            let first = ident("10.213.0.7/16", "10.213.0.1", "02:7a:63:00:00:06");
            let second = ident("10.213.0.9/16", "10.213.0.1", "02:7a:63:00:00:08");
            for n in [&first, &second] {
                apply(&validate(n).unwrap()).map_err(|e| e.to_string())?;
            }
            let sock = Socket::new().map_err(|e| e.to_string())?;
            let mut req = ifreq("eth0");
            sock.ioctl("SIOCGIFADDR", libc::SIOCGIFADDR, &mut req)
                .map_err(|e| e.to_string())?;
            // SAFETY: the kernel filled an AF_INET address.
            let sin: libc::sockaddr_in = unsafe { std::mem::transmute(req.ifr_ifru.ifru_addr) };
            let mut req = ifreq("eth0");
            sock.ioctl("SIOCGIFHWADDR", libc::SIOCGIFHWADDR, &mut req)
                .map_err(|e| e.to_string())?;
            // SAFETY: the kernel filled ifru_hwaddr.
            let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
            let routes = std::fs::read_to_string("/proc/thread-self/net/route")
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "{} {:02x?} {}",
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                &hw.sa_data[..6].iter().map(|&b| b as u8).collect::<Vec<_>>(),
                routes
                    .lines()
                    .filter(|l| l.starts_with("eth0\t00000000"))
                    .count()
            ))
        });
        let got = run.join().unwrap().unwrap();
        if let Some(why) = got.strip_prefix("skip: ") {
            eprintln!("skipping: cannot make a network namespace with a tap here: {why}");
            return;
        }
        assert_eq!(
            got, "10.213.0.9 [02, 7a, 63, 00, 00, 08] 1",
            "address, MAC, one default route"
        );
    }

    #[test]
    fn bad_identities_are_refused() {
        for (a, g, m, why) in [
            (
                "10.213.0.7",
                "10.213.0.1",
                "02:00:00:00:00:01",
                "needs a /prefix",
            ),
            ("10.213.0.7/33", "10.213.0.1", "02:00:00:00:00:01", "prefix"),
            (
                "10.213.0.7/16",
                "10.9.0.1",
                "02:00:00:00:00:01",
                "not another address",
            ),
            (
                "10.213.0.7/16",
                "10.213.0.7",
                "02:00:00:00:00:01",
                "not another address",
            ),
            (
                "10.213.0.7/16",
                "10.213.0.1",
                "03:00:00:00:00:01",
                "unicast",
            ),
            (
                "10.213.0.7/16",
                "10.213.0.1",
                "02:00:00:00:01",
                "invalid MAC",
            ),
            ("x/16", "10.213.0.1", "02:00:00:00:00:01", "invalid IPv4"),
        ] {
            let e = validate(&ident(a, g, m)).unwrap_err();
            assert!(e.message.contains(why), "{a} {g} {m}: {}", e.message);
        }
        let mut long = ident("10.213.0.7/16", "10.213.0.1", "02:00:00:00:00:01");
        long.interface = "x".repeat(16);
        assert!(validate(&long).unwrap_err().message.contains("interface"));
    }
}
