use super::*;

/// A ClientHello body with `extensions` (type, data).
fn hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut h = vec![3, 3];
    h.extend_from_slice(&[7; 32]); // random
    h.push(32);
    h.extend_from_slice(&[9; 32]); // session id
    h.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]); // cipher suites
    h.extend_from_slice(&[1, 0]); // compression: null
    let mut ext = Vec::new();
    for (kind, data) in extensions {
        ext.extend_from_slice(&kind.to_be_bytes());
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(data);
    }
    h.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    h.extend_from_slice(&ext);
    h
}

fn sni_ext(name: &[u8]) -> (u16, Vec<u8>) {
    let mut entry = vec![0];
    entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
    entry.extend_from_slice(name);
    let mut data = (entry.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(&entry);
    (0, data)
}

/// `body` as a handshake message in TLS records of at most `chunk` bytes each.
fn records(body: &[u8], chunk: usize) -> Vec<u8> {
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(body);
    let mut out = Vec::new();
    for part in hs.chunks(chunk) {
        out.extend_from_slice(&[0x16, 3, 1]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn padding(n: usize) -> (u16, Vec<u8>) {
    (21, vec![0; n])
}

#[test]
fn the_server_name_of_a_client_hello() {
    let body = hello(&[(10, vec![0, 2, 0, 29]), sni_ext(b"PyPI.org"), padding(40)]);
    let whole = records(&body, 16384);
    assert_eq!(
        sniff(&whole),
        Sniffed::Tls {
            host: "pypi.org".into()
        }
    );
    // Every prefix needs more, never a wrong answer.
    for cut in 0..whole.len() {
        assert_eq!(sniff(&whole[..cut]), Sniffed::NeedMore, "cut at {cut}");
    }
    // Split across records (a large hello, post-quantum key shares).
    let big = hello(&[padding(3000), sni_ext(b"files.pythonhosted.org")]);
    assert_eq!(
        sniff(&records(&big, 1000)),
        Sniffed::Tls {
            host: "files.pythonhosted.org".into()
        }
    );
    // No SNI at all, or no extensions.
    assert_eq!(
        sniff(&records(&hello(&[padding(8)]), 16384)),
        Sniffed::Unnamed(NoName::NoSni)
    );
    let mut bare = hello(&[]);
    bare.truncate(bare.len() - 2);
    assert_eq!(
        sniff(&records(&bare, 16384)),
        Sniffed::Unnamed(NoName::NoSni)
    );
}

#[test]
fn hostile_client_hellos_name_nothing() {
    let bad = |bytes: Vec<u8>| match sniff(&bytes) {
        Sniffed::Unnamed(_) => {}
        other => panic!("{other:?} from {bytes:?}"),
    };
    // An address, odd bytes, an over-long name, an empty one as the server name.
    for name in [&b"10.0.0.1"[..], b"a\0b.com", b"a b.com", b"", &[b'a'; 300]] {
        let body = hello(&[sni_ext(name)]);
        bad(records(&body, 16384));
    }
    // An extension length past the end; an SNI list length past its extension.
    let mut body = hello(&[sni_ext(b"pypi.org")]);
    let n = body.len();
    body[n - 15] = 0xff;
    bad(records(&body, 16384));
    let mut ext = sni_ext(b"pypi.org");
    ext.1[1] = 0xff;
    bad(records(&hello(&[ext]), 16384));
    // A record that is not a handshake, a zero-length record, a huge declared
    // handshake, another handshake type.
    bad(vec![0x16, 3, 1, 0, 0]);
    bad(vec![0x16, 3, 1, 0x40, 0x01, 1]);
    let mut huge = records(&hello(&[sni_ext(b"pypi.org")]), 16384);
    huge[6] = 0xff;
    bad(huge);
    let mut server_hello = records(&hello(&[sni_ext(b"pypi.org")]), 16384);
    server_hello[5] = 2;
    bad(server_hello);
    let mut mixed = records(&hello(&[padding(3000), sni_ext(b"a.org")]), 1000);
    mixed[1005] = 0x17;
    bad(mixed);
    // A never-ending ClientHello is cut at the bound.
    let mut endless = vec![0x16, 3, 1, 0x40, 0x00, 1, 0, 0xff, 0xff];
    endless.resize(MAX_SNIFF_BYTES + 10, 0);
    bad(endless);
}

#[test]
fn the_host_of_an_http_request() {
    let req = b"GET /simple/requests/?x=1 HTTP/1.1\r\nUser-Agent: t\r\nHOST: PyPI.org:80\r\n\r\n";
    assert_eq!(
        sniff(req),
        Sniffed::Http {
            host: "pypi.org".into(),
            method: "GET".into(),
            path: "/simple/requests/?x=1".into()
        }
    );
    for cut in 1..req.len() {
        assert_eq!(sniff(&req[..cut]), Sniffed::NeedMore, "cut at {cut}");
    }
    let abs = b"GET http://pypi.org/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
    assert!(matches!(sniff(abs), Sniffed::Http { .. }));
}

#[test]
fn hostile_http_heads_name_nothing() {
    let cases: [(&[u8], NoName); 7] = [
        (b"GET / HTTP/1.1\r\n\r\n", NoName::NoHost),
        (
            b"GET / HTTP/1.1\r\nHost: a.org\r\nHost: b.org\r\n\r\n",
            NoName::NoHost,
        ),
        (
            b"GET http://evil.org/ HTTP/1.1\r\nHost: a.org\r\n\r\n",
            NoName::NoHost,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
            NoName::NotAName,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a.org\xff\r\n\r\n",
            NoName::Malformed,
        ),
        (b"SSH-2.0-OpenSSH\r\n\r\n", NoName::UnknownProtocol),
        (
            b"GET / SPDY/3\r\nHost: a.org\r\n\r\n",
            NoName::UnknownProtocol,
        ),
    ];
    for (bytes, why) in cases {
        assert_eq!(
            sniff(bytes),
            Sniffed::Unnamed(why),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(
        sniff(b"\x00\x01"),
        Sniffed::Unnamed(NoName::UnknownProtocol)
    );
    assert_eq!(
        sniff(b"GETTINGVERYLONGMETHODNAME"),
        Sniffed::Unnamed(NoName::UnknownProtocol)
    );
    // A head that never ends is cut at the bound.
    let mut endless = b"GET / HTTP/1.1\r\nX: ".to_vec();
    endless.resize(MAX_SNIFF_BYTES, b'a');
    assert_eq!(sniff(&endless), Sniffed::Unnamed(NoName::Malformed));
}
