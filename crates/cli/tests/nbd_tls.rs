//! TLS (STARTTLS) between the real `jbdev serve` binary and real clients:
//! nbdinfo and nbdcopy (libnbd, GnuTLS) with `nbds://` and `nbds+unix://`
//! URIs, qemu-io and qemu-img with `tls-creds-x509` / `tls-creds-psk`.
//! Certificates are made here with `openssl`, keys with `psktool`; each test
//! skips with a message when a tool is missing.

mod nbd_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nbd_common::*;

fn have_openssl(test: &str) -> bool {
    let ok = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP {test}: `openssl` is not installed (CI installs it)");
    }
    ok
}

/// Credentials for one test: a CA, a server directory in nbdkit's layout,
/// a client directory in GnuTLS's (libnbd, qemu), and a client directory
/// with the CA only (no client certificate).
struct Certs {
    server: PathBuf,
    client: PathBuf,
    no_client_cert: PathBuf,
}

/// A new temp dir with a volume of `size`, certificates made for the test,
/// and `jbdev serve` on it with `--tls-certificates` and `extra` flags
/// (also on `DIR/s.sock` with `unix`).
fn x509_server(tag: &str, size: &str, extra: &[&str], unix: bool) -> (TempDir, Certs, ServerProc) {
    let dir = TempDir::new(tag);
    let certs = make_certs(&dir);
    let img = dir.path("a.img");
    format_volume(&img, size);
    let sock = dir.path("s.sock");
    let mut args = vec![
        img.to_str().unwrap(),
        "--tls-certificates",
        certs.server.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let srv = ServerProc::start(&args, unix.then_some(sock.as_path()));
    (dir, certs, srv)
}

fn make_certs(dir: &TempDir) -> Certs {
    let p = |n: &str| dir.path(n).to_str().unwrap().to_string();
    let (server, client, no_cert) = (dir.path("srv"), dir.path("cli"), dir.path("nocert"));
    for d in [&server, &client, &no_cert] {
        std::fs::create_dir_all(d).unwrap();
    }
    let newkey = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca: Vec<&str> = vec!["req", "-x509"];
    let (ca_key, ca_cert) = (p("ca-key.pem"), p("ca-cert.pem"));
    ca.extend(newkey);
    ca.extend([
        "-keyout",
        &ca_key,
        "-out",
        &ca_cert,
        "-days",
        "2",
        "-subj",
        "/CN=jbdev test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run_ok("openssl", &ca, 60);
    let leaf = |name: &str, cn: &str, ext: &str, key: &Path, cert: &Path, serial: &str| {
        let ext_file = p(&format!("{name}.ext"));
        std::fs::write(&ext_file, ext).unwrap();
        let csr = p(&format!("{name}.csr"));
        let key = key.to_str().unwrap();
        let mut req: Vec<&str> = vec!["req"];
        req.extend(newkey);
        req.extend(["-keyout", key, "-out", &csr, "-subj", cn]);
        run_ok("openssl", &req, 60);
        run_ok(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_cert,
                "-CAkey",
                &ca_key,
                "-set_serial",
                serial,
                "-days",
                "2",
                "-extfile",
                &ext_file,
                "-out",
                cert.to_str().unwrap(),
            ],
            60,
        );
    };
    leaf(
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n",
        &server.join("server-key.pem"),
        &server.join("server-cert.pem"),
        "2",
    );
    leaf(
        "client",
        "/CN=jbdev test client",
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         basicConstraints=CA:FALSE\n",
        &client.join("client-key.pem"),
        &client.join("client-cert.pem"),
        "3",
    );
    for d in [&server, &client, &no_cert] {
        std::fs::copy(&ca_cert, d.join("ca-cert.pem")).unwrap();
    }
    Certs {
        server,
        client,
        no_client_cert: no_cert,
    }
}

/// `psktool -u USER -p DIR/keys.psk` (a fresh random key); returns the file.
fn make_psk(dir: &Path, user: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join("keys.psk");
    run_ok("psktool", &["-u", user, "-p", f.to_str().unwrap()], 30);
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(
        text.starts_with(&format!("{user}:")),
        "psktool wrote {text:?}"
    );
    f
}

fn tcp_port(srv: &ServerProc) -> String {
    let addr = srv.tcp.as_ref().expect("tcp listener");
    addr.rsplit_once(':').unwrap().1.to_string()
}

/// nbdinfo's first line says whether TLS was used.
fn nbdinfo_ok(uri: &str) -> String {
    let out = run_ok("nbdinfo", &[uri], 60);
    assert!(
        out.contains("with TLS") && out.contains("export-size: 67108864"),
        "nbdinfo {uri}: {out}"
    );
    out
}

fn nbdinfo_fails(args: &[&str]) -> String {
    let out = run_tool("nbdinfo", args, 60);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !out.status.success(),
        "nbdinfo {args:?} succeeded: {stdout}"
    );
    stdout + &String::from_utf8_lossy(&out.stderr)
}

/// qemu-io through `--object CREDS --image-opts OPTS`; fails the test on an
/// error or a pattern mismatch.
fn qemu_io_tls(creds: &str, opts: &str, cmds: &[&str]) -> String {
    let mut args = vec!["--object", creds, "--image-opts", opts];
    for c in cmds {
        args.extend(["-c", c]);
    }
    let out = run_ok("qemu-io", &args, 120);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io {cmds:?}: {out}"
    );
    out
}

/// A 16 MiB pattern copied in with nbdcopy over `uri_in`, copied out over
/// `uri_out`, compared.
fn nbdcopy_round_trip(dir: &TempDir, uri_in: &str, uri_out: &str) {
    let data = pattern(7, 16 << 20);
    let src = dir.path("src.raw");
    std::fs::write(&src, &data).unwrap();
    run_ok("nbdcopy", &["--flush", src.to_str().unwrap(), uri_in], 180);
    let dst = dir.path("dst.raw");
    run_ok("nbdcopy", &[uri_out, dst.to_str().unwrap()], 180);
    let back = std::fs::read(&dst).unwrap();
    assert_eq!(back.len(), 64 << 20);
    assert!(
        back[..data.len()] == data[..],
        "nbdcopy round trip over TLS differs"
    );
}

#[test]
fn x509_with_nbdinfo_nbdcopy_qemu_io_and_qemu_img() {
    if !have_openssl("tls_x509")
        || !have_tool("nbdinfo", "tls_x509")
        || !have_tool("nbdcopy", "tls_x509")
        || !have_tool("qemu-io", "tls_x509")
        || !have_tool("qemu-img", "tls_x509")
    {
        return;
    }
    // Credentials alone mean --tls=require.
    let (dir, certs, srv) = x509_server("tls-x509", "64M", &[], true);
    let sock = dir.path("s.sock");
    let port = tcp_port(&srv);
    let cli = certs.client.to_str().unwrap();
    let s = sock.to_str().unwrap();
    let tcp_tls = format!("nbds://127.0.0.1:{port}/?tls-certificates={cli}");
    let unix_tls = format!("nbds+unix:///?socket={s}&tls-certificates={cli}");
    nbdinfo_ok(&tcp_tls);
    nbdinfo_ok(&unix_tls);
    nbdcopy_round_trip(&dir, &tcp_tls, &unix_tls);

    let creds = format!("tls-creds-x509,id=tls0,dir={cli},endpoint=client");
    let tcp_opts = format!("driver=nbd,host=127.0.0.1,port={port},tls-creds=tls0");
    let unix_opts = format!("driver=nbd,path={s},tls-creds=tls0,tls-hostname=localhost");
    qemu_io_tls(
        &creds,
        &tcp_opts,
        &["write -f -P 0x5a 20M 1M", "write -P 0xa5 21M 4k", "flush"],
    );
    qemu_io_tls(
        &creds,
        &unix_opts,
        &["read -P 0x5a 20M 1M", "read -P 0xa5 21M 4k"],
    );
    let info = run_ok(
        "qemu-img",
        &["info", "--object", &creds, "--image-opts", &tcp_opts],
        60,
    );
    assert!(info.contains("virtual size: 64 MiB"), "{info}");

    // Without TLS nothing is visible: no export, no list.
    let plain = srv.tcp_uri();
    nbdinfo_fails(&[&plain]);
    let listed = nbdinfo_fails(&["--list", &plain]);
    assert!(!listed.contains("export="), "{listed}");
    assert!(srv.stop(), "server did not shut down cleanly");
}

#[test]
fn psk_with_nbdinfo_nbdcopy_qemu_io_and_qemu_img_and_a_wrong_key_fails() {
    if !have_tool("psktool", "tls_psk")
        || !have_tool("nbdinfo", "tls_psk")
        || !have_tool("nbdcopy", "tls_psk")
        || !have_tool("qemu-io", "tls_psk")
        || !have_tool("qemu-img", "tls_psk")
    {
        return;
    }
    let dir = TempDir::new("tls-psk");
    let keys = make_psk(&dir.path("psk"), "alice");
    let wrong = make_psk(&dir.path("wrong"), "alice");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    let sock = dir.path("s.sock");
    let srv = ServerProc::start(
        &[
            img.to_str().unwrap(),
            "--tls=require",
            "--tls-psk",
            keys.to_str().unwrap(),
        ],
        Some(&sock),
    );
    let port = tcp_port(&srv);
    let k = keys.to_str().unwrap();
    let s = sock.to_str().unwrap();
    let tcp_tls = format!("nbds://alice@127.0.0.1:{port}/?tls-psk-file={k}");
    let unix_tls = format!("nbds+unix://alice@/?socket={s}&tls-psk-file={k}");
    nbdinfo_ok(&tcp_tls);
    nbdinfo_ok(&unix_tls);
    nbdcopy_round_trip(&dir, &unix_tls, &tcp_tls);

    let psk_dir = dir.path("psk");
    let creds = format!(
        "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
        psk_dir.display()
    );
    let tcp_opts = format!("driver=nbd,host=127.0.0.1,port={port},tls-creds=tls0");
    let unix_opts = format!("driver=nbd,path={s},tls-creds=tls0");
    qemu_io_tls(&creds, &unix_opts, &["write -f -P 0x3c 30M 2M"]);
    qemu_io_tls(&creds, &tcp_opts, &["read -P 0x3c 30M 2M"]);
    let info = run_ok(
        "qemu-img",
        &["info", "--object", &creds, "--image-opts", &tcp_opts],
        60,
    );
    assert!(info.contains("virtual size: 64 MiB"), "{info}");

    // The same identity with another key, and an unknown identity.
    let w = wrong.to_str().unwrap();
    nbdinfo_fails(&[&format!("nbds://alice@127.0.0.1:{port}/?tls-psk-file={w}")]);
    let out = nbdinfo_fails(&[&format!(
        "nbds://mallory@127.0.0.1:{port}/?tls-psk-file={k}"
    )]);
    assert!(!out.contains("export-size"), "{out}");
    let wrong_creds = format!(
        "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
        dir.path("wrong").display()
    );
    let out = run_tool(
        "qemu-img",
        &["info", "--object", &wrong_creds, "--image-opts", &tcp_opts],
        60,
    );
    assert!(!out.status.success(), "qemu-img with a wrong key succeeded");
    let log = srv.log_text();
    assert!(log.contains("TLS: handshake failed"), "{log}");
    // The server keeps serving after failed handshakes.
    nbdinfo_ok(&tcp_tls);
    assert!(srv.stop(), "server did not shut down cleanly");
}

#[test]
fn verify_peer_refuses_a_client_without_a_certificate() {
    if !have_openssl("tls_verify_peer")
        || !have_tool("nbdinfo", "tls_verify_peer")
        || !have_tool("qemu-img", "tls_verify_peer")
    {
        return;
    }
    let (_dir, certs, srv) = x509_server("tls-verify", "64M", &["--tls-verify-peer"], false);
    let port = tcp_port(&srv);
    let with = certs.client.to_str().unwrap();
    let without = certs.no_client_cert.to_str().unwrap();
    nbdinfo_ok(&format!("nbds://127.0.0.1:{port}/?tls-certificates={with}"));
    let out = nbdinfo_fails(&[&format!(
        "nbds://127.0.0.1:{port}/?tls-certificates={without}"
    )]);
    assert!(!out.contains("export-size"), "{out}");
    let opts = format!("driver=nbd,host=127.0.0.1,port={port},tls-creds=tls0");
    for (d, ok) in [(with, true), (without, false)] {
        let creds = format!("tls-creds-x509,id=tls0,dir={d},endpoint=client");
        let out = run_tool(
            "qemu-img",
            &["info", "--object", &creds, "--image-opts", &opts],
            60,
        );
        assert_eq!(out.status.success(), ok, "qemu-img with {d}: {out:?}");
    }
    let log = srv.log_text();
    assert!(log.contains("TLS:"), "no failed handshake logged: {log}");
    assert!(srv.stop(), "server did not shut down cleanly");
}

#[test]
fn tls_on_serves_plain_and_tls_clients() {
    if !have_openssl("tls_on") || !have_tool("nbdinfo", "tls_on") {
        return;
    }
    let (_dir, certs, srv) = x509_server("tls-on", "64M", &["--tls=on"], false);
    let port = tcp_port(&srv);
    let cli = certs.client.to_str().unwrap();
    nbdinfo_ok(&format!("nbds://127.0.0.1:{port}/?tls-certificates={cli}"));
    let plain = run_ok("nbdinfo", &[&srv.tcp_uri()], 60);
    assert!(
        plain.contains("without TLS") && plain.contains("export-size: 67108864"),
        "{plain}"
    );
    let log = srv.log_text();
    assert!(
        log.contains("TLS true") && log.contains("TLS false"),
        "{log}"
    );
    assert!(srv.stop(), "server did not shut down cleanly");
}

// ------------------------------------------------------------ raw protocol

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_STRUCTURED_REPLY: u32 = 8;
const REP_ACK: u32 = 1;
const REP_ERR_INVALID: u32 = 0x8000_0003;
const REP_ERR_TLS_REQD: u32 = 0x8000_0005;

fn raw_connect(srv: &ServerProc) -> TcpStream {
    let s = TcpStream::connect(srv.tcp.as_ref().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut s = s;
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[8..16], &IHAVEOPT.to_be_bytes());
    s.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    s
}

fn send_option(s: &mut TcpStream, opt: u32, data: &[u8]) {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend(opt.to_be_bytes());
    m.extend((data.len() as u32).to_be_bytes());
    m.extend(data);
    s.write_all(&m).unwrap();
}

/// (option, reply type) of the next option reply; its data is skipped.
fn read_reply(s: &mut TcpStream) -> (u32, u32) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), REPLY_MAGIC);
    let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
    let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    assert!(len < 1 << 16, "reply of {len} bytes");
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).unwrap();
    (opt, typ)
}

/// True once the server has closed the connection (bounded by the read
/// timeout).
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // stray bytes (a TLS alert): keep reading
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// FORCEDTLS per the spec: before STARTTLS every option but STARTTLS and
/// ABORT is answered ERR_TLS_REQD, EXPORT_NAME ends the session, STARTTLS
/// with data is invalid; a client that stalls after STARTTLS is dropped at
/// the handshake deadline.
#[test]
fn require_mode_answers_tls_reqd_and_bounds_the_tls_handshake() {
    if !have_openssl("tls_require_raw") {
        return;
    }
    let (_dir, _certs, srv) = x509_server("tls-raw", "16M", &["--handshake-timeout", "3"], false);
    let mut s = raw_connect(&srv);
    let mut info = 0u32.to_be_bytes().to_vec(); // export "" ...
    info.extend(0u16.to_be_bytes()); // ... no info requests
    for (opt, data) in [
        (OPT_LIST, &[][..]),
        (OPT_INFO, &info[..]),
        (OPT_STRUCTURED_REPLY, &[][..]),
        (99, &[1, 2, 3][..]),
    ] {
        send_option(&mut s, opt, data);
        assert_eq!(read_reply(&mut s), (opt, REP_ERR_TLS_REQD), "option {opt}");
    }
    send_option(&mut s, OPT_STARTTLS, &[0]);
    assert_eq!(read_reply(&mut s), (OPT_STARTTLS, REP_ERR_INVALID));
    send_option(&mut s, OPT_EXPORT_NAME, &[]);
    assert!(
        closed_by_server(&mut s),
        "EXPORT_NAME before TLS was not refused"
    );

    // STARTTLS acknowledged, then no TLS handshake: dropped by the deadline.
    let mut s = raw_connect(&srv);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_reply(&mut s), (OPT_STARTTLS, REP_ACK));
    assert!(
        closed_by_server(&mut s),
        "stalled TLS handshake not dropped"
    );

    // Garbage instead of a ClientHello: dropped with a logged TLS error.
    let mut s = raw_connect(&srv);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_reply(&mut s), (OPT_STARTTLS, REP_ACK));
    s.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3, 4, 5])
        .unwrap();
    s.write_all(&[0x42; 4096]).unwrap();
    assert!(closed_by_server(&mut s), "garbage handshake not dropped");
    assert!(srv.stop(), "server did not shut down cleanly");
}

#[test]
fn bad_tls_flags_are_refused_before_serving() {
    let dir = TempDir::new("tls-flags");
    let img = dir.path("a.img");
    format_volume(&img, "16M");
    let i = img.to_str().unwrap();
    let missing = dir.path("missing");
    let m = missing.to_str().unwrap();
    let psk = dir.path("bad.psk");
    std::fs::write(&psk, "alice:not-hex\n").unwrap();
    for (args, want) in [
        (vec![i, "--tls=on"], "needs --tls-certificates"),
        (vec![i, "--tls=maybe"], "want off, on or require"),
        (vec![i, "--tls-verify-peer"], "--tls-certificates"),
        (
            vec![i, "--tls=on", "--tls-certificates", m, "--tls-verify-peer"],
            "use --tls=require",
        ),
        (
            vec![i, "--tls-certificates", m],
            "cannot load the TLS certificates",
        ),
        (
            vec![i, "--tls=off", "--tls-certificates", m],
            "--tls=off with TLS credentials",
        ),
        (
            vec![i, "--tls-psk", psk.to_str().unwrap()],
            "line 1: the key is not hex",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--listen", "127.0.0.1:0"]);
        assert_serve_refuses(&a, want);
    }
}

/// A TLS client (Python's ssl, after a hand-made STARTTLS) that asks for
/// 64 MiB of reads and never reads the replies.
const DEAF_TLS_CLIENT: &str = r#"
import socket, ssl, struct, sys, time
port, cafile, hold = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
IHAVEOPT = 0x49484156454F5054
s = socket.create_connection(("127.0.0.1", port), timeout=30)
s.recv(18)
s.sendall(struct.pack(">I", 3))
s.sendall(struct.pack(">QII", IHAVEOPT, 5, 0))
h = b""
while len(h) < 20:
    h += s.recv(20 - len(h))
assert struct.unpack(">QIII", h)[2] == 1, h
t = ssl.create_default_context(cafile=cafile).wrap_socket(s, server_hostname="localhost")
t.sendall(struct.pack(">QII", IHAVEOPT, 7, 6) + struct.pack(">IH", 0, 0))
buf = b""
while True:
    while len(buf) < 20:
        buf += t.recv(4096)
    _, _, typ, ln = struct.unpack(">QIII", buf[:20])
    while len(buf) < 20 + ln:
        buf += t.recv(4096)
    buf = buf[20 + ln:]
    if typ == 1:
        break
assert typ == 1, hex(typ)
for i in range(64):
    t.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, i, i << 20, 1 << 20))
print("DEAF-READY", flush=True)
time.sleep(hold)
"#;

/// The send timeout and progress floor hold through TLS: the replies go
/// out through the TLS writer's socket write, which a client that does not
/// read blocks; the server drops it and keeps serving others.
#[test]
fn a_tls_client_that_does_not_read_its_replies_is_dropped() {
    if !have_openssl("tls_deaf") || !have_tool("python3", "tls_deaf") {
        return;
    }
    let (dir, certs, srv) = x509_server("tls-deaf", "64M", &["--send-timeout", "3"], false);
    let script = dir.path("deaf.py");
    std::fs::write(&script, DEAF_TLS_CLIENT).unwrap();
    let ca = certs.server.join("ca-cert.pem");
    let mut deaf = Command::new("timeout")
        .args(["-k", "5", "120", "python3"])
        .arg(&script)
        .arg(tcp_port(&srv))
        .arg(&ca)
        .arg("100")
        .env("PATH", tool_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(deaf.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(
        line.trim(),
        "DEAF-READY",
        "the deaf client did not get going"
    );
    // Bounded wait for the server's verdict (the client holds on for 100 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let dropped = loop {
        if srv
            .log_text()
            .contains("dropping client: reply write failed")
        {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = deaf.kill();
    let _ = deaf.wait();
    assert!(dropped, "deaf TLS client not dropped:\n{}", srv.log_text());
    let cli = certs.client.to_str().unwrap();
    nbdinfo_ok(&format!(
        "nbds://127.0.0.1:{}/?tls-certificates={cli}",
        tcp_port(&srv)
    ));
    assert!(srv.stop(), "server did not shut down cleanly");
}

/// The handshake deadline holds while a client trickles a TLS record one
/// byte at a time (each byte arriving well within the socket's timeout).
#[test]
fn a_trickled_tls_handshake_is_dropped_at_the_handshake_deadline() {
    if !have_openssl("tls_trickle") {
        return;
    }
    let (_dir, _certs, srv) =
        x509_server("tls-trickle", "16M", &["--handshake-timeout", "3"], false);
    let mut s = raw_connect(&srv);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_reply(&mut s), (OPT_STARTTLS, REP_ACK));
    // A handshake record header announcing 16 KiB, then its body a byte per
    // 300 ms: at most 100 bytes (30 s) are sent, far from a whole record.
    let mut w = s.try_clone().unwrap();
    let trickler = std::thread::spawn(move || {
        if w.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00]).is_err() {
            return;
        }
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(300));
            if w.write_all(&[0x01]).is_err() {
                return;
            }
        }
    });
    assert!(
        closed_by_server(&mut s),
        "a trickled TLS handshake outlived the handshake deadline"
    );
    let _ = s.shutdown(std::net::Shutdown::Both);
    trickler.join().unwrap();
    assert!(srv.stop(), "server did not shut down cleanly");
}
