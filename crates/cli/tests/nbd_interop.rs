//! Interop of the real `jbdev serve` binary with real NBD clients: nbdinfo,
//! qemu-io, qemu-img, nbdcopy, nbdsh and fio, over TCP and a unix socket.
//! Each test skips with a message when its client tool is missing.

mod nbd_common;

use nbd_common::*;
use std::os::unix::fs::MetadataExt;

#[test]
fn nbdinfo_json_shows_the_transmission_flags_over_tcp_and_unix() {
    if !have_tool("nbdinfo", "nbdinfo_json") {
        return;
    }
    let dir = TempDir::new("nbdinfo");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    let sock = dir.path("s.sock");
    let srv = ServerProc::start(&[img.to_str().unwrap()], Some(&sock));
    for uri in [srv.tcp_uri(), srv.unix_uri()] {
        let out = run_ok("nbdinfo", &["--json", &uri], 60);
        let v: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo json");
        assert_eq!(v["protocol"], "newstyle-fixed", "{out}");
        assert_eq!(v["structured"], true, "{out}");
        let e = &v["exports"][0];
        for flag in [
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_fast_zero",
            "can_df",
            "can_cache",
            "can_multi_conn",
        ] {
            assert_eq!(e[flag], true, "{flag} over {uri}: {out}");
        }
        assert_eq!(e["is_read_only"], false, "{out}");
        assert_eq!(e["export-size"], 64u64 << 20, "{out}");
        assert_eq!(e["block_size_minimum"], 1, "{out}");
        assert_eq!(e["block_size_preferred"], 4096, "{out}");
        assert_eq!(e["block_size_maximum"], 64u64 << 20, "{out}");
        let contexts = e["contexts"].as_array().expect("contexts");
        assert!(contexts.iter().any(|c| c == "base:allocation"), "{out}");
    }
    assert!(srv.stop(), "server did not shut down cleanly");
}

#[test]
fn read_only_and_named_exports_are_listed_and_flagged() {
    if !have_tool("nbdinfo", "read_only_exports") {
        return;
    }
    let dir = TempDir::new("nbdinfo-ro");
    let a = dir.path("a.img");
    let b = dir.path("b.img");
    format_volume(&a, "16M");
    format_volume(&b, "32M");
    let export_b = format!("disk-b={},description=second disk, spare", b.display());
    let srv = ServerProc::start(
        &[a.to_str().unwrap(), "--export", &export_b, "--read-only"],
        None,
    );
    let out = run_ok("nbdinfo", &["--list", "--json", &srv.tcp_uri()], 60);
    // Descriptions are what the operator set, never a path of the host.
    assert!(
        !out.contains(dir.0.to_str().unwrap()),
        "a path leaked: {out}"
    );
    assert!(!out.contains(".img"), "a file name leaked: {out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let exports = v["exports"].as_array().expect("exports");
    assert_eq!(exports.len(), 2, "{out}");
    let b_info = exports
        .iter()
        .find(|e| e["export-name"] == "disk-b")
        .expect("disk-b listed");
    assert_eq!(b_info["export-size"], 32u64 << 20, "{out}");
    assert_eq!(b_info["description"], "second disk, spare", "{out}");
    let default = exports
        .iter()
        .find(|e| e["export-name"] == "")
        .expect("default export listed");
    assert!(default["description"].is_null(), "{out}");
    for e in exports {
        assert_eq!(e["is_read_only"], true, "{out}");
        assert_eq!(e["can_trim"], false, "{out}");
        assert_eq!(e["can_zero"], false, "{out}");
    }
    assert!(srv.stop());
}

fn qemu_io(uri: &str, cache_none: bool, cmds: &[&str]) -> String {
    let mut args: Vec<&str> = vec!["-f", "raw"];
    if cache_none {
        args.extend(["-t", "none"]);
    }
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let out = run_ok("qemu-io", &args, 120);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io {cmds:?} on {uri}: {out}"
    );
    out
}

#[test]
fn qemu_io_pattern_writes_and_reads_with_fua_and_cache_none() {
    if !have_tool("qemu-io", "qemu_io_patterns") {
        return;
    }
    let dir = TempDir::new("qemu-io");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    let sock = dir.path("s.sock");
    let srv = ServerProc::start(&[img.to_str().unwrap()], Some(&sock));
    let tcp = srv.tcp_uri();
    let unix = srv.unix_uri();
    // Writes over TCP (FUA and plain, aligned and not), reads over unix.
    qemu_io(
        &tcp,
        false,
        &[
            "write -f -P 0x5a 0 1M",
            "write -P 0xa5 1M 192k",
            "write -f -P 0x11 3000000 777",
            "flush",
        ],
    );
    qemu_io(
        &unix,
        true,
        &[
            "read -P 0x5a 0 1M",
            "read -P 0xa5 1M 192k",
            "read -P 0x11 3000000 777",
            "read -P 0 3000777 4096",
            "write -f -P 0x77 8M 64k",
            "read -P 0x77 8M 64k",
        ],
    );
    // A pattern that is not there must be reported: the check can fail.
    let out = run_tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x5b 0 4096", &tcp],
        60,
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("verification failed"),
        "wrong pattern was not detected"
    );
    assert!(srv.stop(), "server did not shut down cleanly");
    // Everything survives a clean restart.
    let srv = ServerProc::start(&[img.to_str().unwrap()], None);
    qemu_io(
        &srv.tcp_uri(),
        true,
        &[
            "read -P 0x5a 0 1M",
            "read -P 0xa5 1M 192k",
            "read -P 0x11 3000000 777",
            "read -P 0x77 8M 64k",
        ],
    );
    assert!(srv.stop());
}

#[test]
fn qemu_img_convert_then_compare() {
    if !have_tool("qemu-img", "qemu_img_convert") {
        return;
    }
    let dir = TempDir::new("qemu-img");
    let img = dir.path("a.img");
    format_volume(&img, "16M");
    qemu_img_convert_compare_on(&dir, img.to_str().unwrap());
}

/// qemu-img convert of a 16 MiB source with holes into the volume served
/// from `volume` (16 MiB at least), compare, and a compare that must fail.
fn qemu_img_convert_compare_on(dir: &TempDir, volume: &str) {
    // A random source with holes: random 256 KiB runs every other MiB.
    let src = dir.path("src.raw");
    let mut data = vec![0u8; 16 << 20];
    for (i, chunk) in data.chunks_mut(1 << 20).enumerate() {
        if i % 2 == 0 {
            chunk[..256 << 10].copy_from_slice(&pattern(i as u64 + 1, 256 << 10));
        }
    }
    std::fs::write(&src, &data).unwrap();
    let srv = ServerProc::start(&[volume], None);
    let uri = srv.tcp_uri();
    let s = src.to_str().unwrap();
    run_ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", s, &uri],
        120,
    );
    run_ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s, &uri],
        120,
    );
    // A one-byte difference must make compare fail.
    data[5 << 20] ^= 1;
    std::fs::write(&src, &data).unwrap();
    let out = run_tool(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s, &uri],
        120,
    );
    assert_eq!(out.status.code(), Some(1), "compare missed a difference");
    assert!(srv.stop());
}

#[test]
fn nbdcopy_round_trip_with_multi_conn() {
    if !have_tool("nbdcopy", "nbdcopy_round_trip") {
        return;
    }
    let dir = TempDir::new("nbdcopy");
    let img = dir.path("a.img");
    format_volume(&img, "32M");
    nbdcopy_round_trip_on(&dir, img.to_str().unwrap());
}

/// nbdcopy of 32 MiB into the volume served from `volume` over TCP (4
/// connections), and back out over a unix socket.
fn nbdcopy_round_trip_on(dir: &TempDir, volume: &str) {
    let src = dir.path("src.raw");
    let data = pattern(42, 32 << 20);
    std::fs::write(&src, &data).unwrap();
    let sock = dir.path("s.sock");
    let srv = ServerProc::start(&[volume], Some(&sock));
    let s = src.to_str().unwrap();
    run_ok(
        "nbdcopy",
        &[
            "--flush",
            "--connections=4",
            "--requests=16",
            s,
            &srv.tcp_uri(),
        ],
        180,
    );
    let dst = dir.path("dst.raw");
    let d = dst.to_str().unwrap();
    run_ok("nbdcopy", &["--connections=4", &srv.unix_uri(), d], 180);
    let back = std::fs::read(&dst).unwrap();
    assert!(back == data, "nbdcopy round trip differs");
    assert!(srv.stop());
}

const NBDSH_SCRIPT: &str = r#"
import nbd
K = 1024
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.can_multi_conn() and h.can_fua() and h.can_zero() and h.can_trim()
data = bytes((i * 7 + 3) % 251 for i in range(256 * K))
h.pwrite(data, 0, nbd.CMD_FLAG_FUA)
h.zero(64 * K, 64 * K)
h.zero(16 * K, 192 * K, nbd.CMD_FLAG_NO_HOLE)  # (count, offset)
h.trim(64 * K, 128 * K)
h.flush()
assert h.pread(64 * K, 0) == data[:64 * K]
assert h.pread(64 * K, 64 * K) == bytes(64 * K)
assert h.pread(64 * K, 128 * K) == bytes(64 * K)
assert h.pread(16 * K, 192 * K) == bytes(16 * K)
assert h.pread(48 * K, 208 * K) == data[208 * K:]
h.pwrite(b'\x42' * (4 * K), 300 * K)
try:
    h.zero(4 * K, 300 * K, nbd.CMD_FLAG_FAST_ZERO)  # 4 KiB at 300 KiB
except nbd.Error as e:
    assert e.errnum == 95, e
    # ENOTSUP must leave the contents alone
    assert h.pread(4 * K, 300 * K) == b'\x42' * (4 * K)
else:
    assert h.pread(4 * K, 300 * K) == bytes(4 * K)

got = []
def cb(meta, off, entries, err):
    got.append((meta, off, list(entries)))
    return 0
h.block_status(1024 * K, 0, cb)
assert len(got) == 1 and got[0][0] == nbd.CONTEXT_BASE_ALLOCATION, got
ents = got[0][2]
assert len(ents) >= 2 and len(ents) % 2 == 0, ents
pos = 0
for i in range(0, len(ents), 2):
    length, flags = ents[i], ents[i + 1]
    assert length > 0
    if flags & nbd.STATE_ZERO:
        # whatever is reported as zero must read as zeroes
        end = min(pos + length, 1024 * K)
        assert h.pread(end - pos, pos) == bytes(end - pos), (pos, length)
    if pos < 64 * K:
        assert not flags & nbd.STATE_ZERO, (pos, flags)
    pos += length
assert pos >= 1  # at least one byte described

one = []
h.block_status(1024 * K, 0, lambda m, o, e, err: one.append(list(e)) or 0,
               nbd.CMD_FLAG_REQ_ONE)
assert len(one) == 1 and len(one[0]) == 2 and one[0][0] <= 1024 * K, one
h.flush()
h.shutdown()
print("NBDSH-OK")
"#;

#[test]
fn nbdsh_zero_trim_block_status_and_flush() {
    if !have_tool("nbdsh", "nbdsh") {
        return;
    }
    let dir = TempDir::new("nbdsh");
    let img = dir.path("a.img");
    format_volume(&img, "16M");
    let sock = dir.path("s.sock");
    let srv = ServerProc::start(&[img.to_str().unwrap()], Some(&sock));
    for uri in [srv.tcp_uri(), srv.unix_uri()] {
        let out = run_ok(
            "nbdsh",
            &["--base-allocation", "-u", &uri, "-c", NBDSH_SCRIPT],
            120,
        );
        assert!(out.contains("NBDSH-OK"), "{out}");
    }
    assert!(srv.stop());
}

#[test]
fn fio_nbd_engine_with_verify() {
    if !fio_has_nbd("fio_verify") {
        return;
    }
    let dir = TempDir::new("fio");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    fio_verify_on(img.to_str().unwrap());
}

/// True if fio is installed and has its nbd engine (else prints why not).
fn fio_has_nbd(test: &str) -> bool {
    if !have_tool("fio", test) {
        return false;
    }
    let engines = run_tool("fio", &["--enghelp"], 30);
    let ok = String::from_utf8_lossy(&engines.stdout).contains("nbd");
    if !ok {
        eprintln!("SKIP {test}: this fio has no nbd engine");
    }
    ok
}

/// fio's nbd engine: 16 MiB of 4 KiB random writes at QD32, verified, on
/// the volume served from `volume` (16 MiB at least).
fn fio_verify_on(volume: &str) {
    let srv = ServerProc::start(&[volume], None);
    let uri = format!("--uri={}", srv.tcp_uri());
    let out = run_ok(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--size=16M",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=terse",
        ],
        300,
    );
    assert!(!out.is_empty());
    assert!(srv.stop());
}

#[test]
fn socket_activation_and_stdio_mode() {
    if !have_tool("nbdinfo", "socket_activation") || !have_tool("nbdsh", "stdio_mode") {
        return;
    }
    let dir = TempDir::new("activation");
    let img = dir.path("a.img");
    format_volume(&img, "8M");
    let i = img.to_str().unwrap();
    let out = run_ok(
        "nbdinfo",
        &["--json", "--", "[", JBDEV, "serve", i, "]"],
        60,
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["exports"][0]["export-size"], 8u64 << 20, "{out}");
    assert_eq!(v["exports"][0]["can_multi_conn"], true, "{out}");
    // Listeners of its own as well: refused, not silently ignored.
    let out = run_tool(
        "nbdinfo",
        &["--", "[", JBDEV, "serve", i, "--listen", "127.0.0.1:0", "]"],
        60,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("drop --listen and --socket"), "{err}");

    let script = format!(
        "import nbd\nh.connect_command(['{JBDEV}', 'serve', '-s', '{i}'])\n\
         h.pwrite(b'jbdev' * 1000, 4096, nbd.CMD_FLAG_FUA)\n\
         assert h.pread(5000, 4096) == b'jbdev' * 1000\n\
         h.shutdown()\nprint('STDIO-OK')\n"
    );
    let out = run_ok("nbdsh", &["-c", &script], 60);
    assert!(out.contains("STDIO-OK"), "{out}");
    // The stdio server flushed and closed the volume: a new server sees it.
    let script = format!(
        "h.connect_command(['{JBDEV}', 'serve', '-s', '{i}'])\n\
         assert h.pread(5000, 4096) == b'jbdev' * 1000\nprint('REOPEN-OK')\n"
    );
    let out = run_ok("nbdsh", &["-c", &script], 60);
    assert!(out.contains("REOPEN-OK"), "{out}");
}

#[test]
fn trim_and_write_zeroes_of_4_gib() {
    if !have_tool("nbdsh", "trim_4gib") {
        return;
    }
    let dir = TempDir::new("trim4g");
    let img = dir.path("big.img");
    format_volume(&img, "5G"); // sparse: nothing is written but metadata
    let srv = ServerProc::start(&[img.to_str().unwrap()], None);
    let script = r#"
import nbd
G = 1024 ** 3
h.pwrite(b"a" * 4096, 4096 * 1000)
h.pwrite(b"b" * 4096, 4 * G + 4096)
h.trim(4 * G - 4096, 0, nbd.CMD_FLAG_FUA)       # the largest compact length, aligned
assert h.pread(4096, 4096 * 1000) == bytes(4096)
assert h.pread(4096, 4 * G + 4096) == b"b" * 4096  # beyond the range: untouched
h.pwrite(b"c" * 4096, 4096 * 2000)
h.zero(2 ** 32 - 1, 1)                           # unaligned, maximal length
assert h.pread(4096, 4096 * 2000) == bytes(4096)
assert h.pread(1, 2 ** 32 - 1) == b"\0"
assert h.pread(4096, 4 * G + 4096) == b"b" * 4096
print("BIG-OK")
"#;
    let out = run_ok("nbdsh", &["-u", &srv.tcp_uri(), "-c", script], 300);
    assert!(out.contains("BIG-OK"), "{out}");
    assert!(srv.stop());
}

/// libnbd sends requests up to the advertised maximum: a single 48 MiB and
/// 64 MiB write and read each go through (a 48 MiB write used to end the
/// connection); FAST_ZERO succeeds where zeroing is a hole punch and is
/// refused, changing nothing, where it would journal zero blocks.
#[test]
fn large_requests_and_honest_fast_zero_through_libnbd() {
    if !have_tool("nbdsh", "large_requests") {
        return;
    }
    let dir = TempDir::new("large");
    let img = dir.path("a.img");
    format_volume(&img, "256M");
    let srv = ServerProc::start(&[img.to_str().unwrap()], None);
    let script = r#"
import nbd
M = 1024 * 1024
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 64 * M
for size, off in ((48 * M, 0), (64 * M, 64 * M)):
    d = bytes((i * 31 + size) % 251 for i in range(251)) * (size // 251) + bytes(size % 251)
    h.pwrite(d, off, nbd.CMD_FLAG_FUA)
    assert h.pread(size, off) == d, size
# A 32 MiB zero is zeroed in place: FAST_ZERO must succeed.
h.zero(32 * M, 128 * M, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(32 * M, 128 * M) == bytes(32 * M)
assert h.pread(4096, 64 * M) != bytes(4096)
# 4 KiB would be journaled as a zero block: ENOTSUP, contents unchanged.
h.pwrite(b"\x42" * 4096, 200 * M)
try:
    h.zero(4096, 200 * M, nbd.CMD_FLAG_FAST_ZERO)
    raise AssertionError("a journaled zero was called fast")
except nbd.Error as e:
    assert e.errnum == 95, e
assert h.pread(4096, 200 * M) == b"\x42" * 4096
h.zero(4096, 200 * M)
assert h.pread(4096, 200 * M) == bytes(4096)
h.shutdown()
print("LARGE-OK")
"#;
    let out = run_ok("nbdsh", &["-u", &srv.tcp_uri(), "-c", script], 300);
    assert!(out.contains("LARGE-OK"), "{out}");
    assert!(srv.stop());
}

/// NBD's `NO_HOLE`: a write-zeroes with it keeps a preallocated image's
/// space, journaled (4 KiB .. 1 MiB) and zeroed in place (32 MiB) alike,
/// and reads back as zeroes; with FAST_ZERO as well it is refused
/// (ENOTSUP) and changes nothing, since keeping the range allocated may
/// mean writing zero blocks. Plain zeroes of the same range then free the
/// space, so the measure would see a punch. (Session 22's adversarial pass:
/// the flag was dropped, and 4 MiB of a `--preallocate`d image were
/// punched out.)
#[test]
fn no_hole_zeroes_keep_a_preallocated_image_allocated() {
    if !have_tool("nbdsh", "no_hole_zeroes") {
        return;
    }
    let dir = TempDir::new("nohole");
    let img = dir.path("a.img");
    let p = img.to_str().unwrap();
    run_ok(
        JBDEV,
        &["format", p, "--size", "128M", "--preallocate"],
        120,
    );
    let srv = ServerProc::start(&[p], None);
    let script = format!(
        r#"
import os, nbd
M = 1024 * 1024
img = {p:?}
def blocks():
    h.flush()
    return os.stat(img).st_blocks * 512
d = bytes((i * 13 + 5) % 251 for i in range(251)) * (48 * M // 251)
h.pwrite(d[:40 * M], 8 * M, nbd.CMD_FLAG_FUA)
before = blocks()
h.zero(4096, 8 * M, nbd.CMD_FLAG_NO_HOLE)
h.zero(M, 9 * M, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
h.zero(32 * M, 16 * M, nbd.CMD_FLAG_NO_HOLE)
for off, n in ((8 * M, 4096), (9 * M, M), (16 * M, 32 * M)):
    assert h.pread(n, off) == bytes(n), (off, n)
assert h.pread(4096, 12 * M) == d[4 * M:4 * M + 4096]
h.pwrite(b"\x42" * 4096, 10 * M)
for n in (4096, 32 * M):
    try:
        h.zero(n, 10 * M, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FAST_ZERO)
        raise AssertionError("NO_HOLE with FAST_ZERO was called fast")
    except nbd.Error as e:
        assert e.errnum == 95, e
    assert h.pread(4096, 10 * M) == b"\x42" * 4096
# The server checkpoints what it journaled when it stops; measured here
# once everything is home.
print("BEFORE", before)
h.shutdown()
"#
    );
    let out = run_ok("nbdsh", &["-u", &srv.tcp_uri(), "-c", &script], 300);
    assert!(srv.stop());
    let before: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("BEFORE "))
        .unwrap_or_else(|| panic!("no figure in {out}"))
        .trim()
        .parse()
        .unwrap();
    let after = std::fs::metadata(&img).unwrap().blocks() * 512;
    assert!(
        after >= before,
        "NO_HOLE zeroes deallocated {} bytes of a preallocated image",
        before - after
    );
    // The control: the same large range zeroed without NO_HOLE is punched.
    let srv = ServerProc::start(&[p], None);
    run_ok(
        "nbdsh",
        &[
            "-u",
            &srv.tcp_uri(),
            "-c",
            "h.zero(32 * 1024 * 1024, 16 * 1024 * 1024)\nh.flush()",
        ],
        300,
    );
    assert!(srv.stop());
    let punched = std::fs::metadata(&img).unwrap().blocks() * 512;
    assert!(
        punched + (16 << 20) <= after,
        "a plain 32 MiB zero freed only {} bytes",
        after.saturating_sub(punched)
    );
}

/// qemu 10 negotiates extended headers (64-bit lengths): writes, reads,
/// zeroes and trims beyond 4 GiB in one request, and block status with
/// 64-bit descriptors (qemu-img map), checked against what was written.
#[test]
fn extended_headers_with_qemu() {
    if !have_tool("qemu-io", "extended_headers") || !have_tool("qemu-img", "extended_headers") {
        return;
    }
    let dir = TempDir::new("exthdr");
    let img = dir.path("big.img");
    format_volume(&img, "6G"); // sparse
    let srv = ServerProc::start(&[img.to_str().unwrap()], None);
    let uri = srv.tcp_uri();
    let out = qemu_io(
        &uri,
        true,
        &[
            "write -P 0x11 0 1M",
            "write -P 0x22 5G 1M",
            // 4.5 GiB of fast zeroes (FAST_ZERO: a hole punch), as few
            // requests as qemu likes: 64-bit lengths allow one.
            "write -z -u -n 1M 4607M",
            "read -P 0x11 0 1M",
            "read -P 0 1M 1M",
            "read -P 0 4G 1M",
            "read -P 0x22 5G 1M",
            "discard 5G 1M",
            "read -P 0 5G 1M",
            "write -P 0x33 5632M 64k",
        ],
    );
    assert!(!out.contains("error") && !out.contains("failed"), "{out}");
    let log = srv.log_text();
    assert!(
        log.contains("Extended headers"),
        "qemu did not negotiate extended headers:\n{log}"
    );
    let map = run_ok(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", &uri],
        120,
    );
    let v: serde_json::Value = serde_json::from_str(&map).expect("map json");
    let extents = v.as_array().expect("extents");
    let covered: u64 = extents.iter().map(|e| e["length"].as_u64().unwrap()).sum();
    assert_eq!(covered, 6u64 << 30, "{map}");
    // The first MiB holds data; a zero extent spans most of the image in
    // one descriptor only if 64-bit lengths are in use.
    assert_eq!(extents[0]["data"], true, "{map}");
    assert!(
        extents
            .iter()
            .any(|e| e["zero"] == true && e["length"].as_u64().unwrap() > (4u64 << 30)),
        "no zero extent above 4 GiB in one piece: {map}"
    );
    let tail = extents
        .iter()
        .find(|e| e["start"].as_u64() == Some(5632 << 20))
        .expect("extent at 5632 MiB");
    assert_eq!(tail["data"], true, "{map}");
    assert!(srv.stop());
}

/// The same clients against a volume homed on Ceph RBD (the throwaway test
/// cluster), journal internal and on a second RBD image.
#[cfg(feature = "rbd")]
mod rbd {
    use super::*;
    use jbdev_device::rbd::test_cluster;

    /// Formats an RBD-homed volume of `size` with the CLI; `None` (skip)
    /// when Ceph is not installed.
    fn rbd_volume(size: &str, rbd_journal: bool) -> Option<String> {
        let conf = match test_cluster::ensure() {
            Ok(c) => c,
            Err(why) => {
                eprintln!("SKIP: {why}");
                return None;
            }
        };
        let home = test_cluster::target(&conf, &test_cluster::unique_image("nbd"));
        let journal = test_cluster::target(&conf, &test_cluster::unique_image("nbd-j"));
        let mut args = vec![
            "format",
            home.as_str(),
            "--size",
            size,
            "--journal-size",
            "8M",
        ];
        if rbd_journal {
            args.extend(["--journal", journal.as_str()]);
        }
        run_ok(JBDEV, &args, 120);
        Some(home)
    }

    #[test]
    fn qemu_img_convert_then_compare_on_rbd() {
        if !have_tool("qemu-img", "qemu_img_convert_then_compare_on_rbd") {
            return;
        }
        let Some(vol) = rbd_volume("16M", false) else {
            return;
        };
        qemu_img_convert_compare_on(&TempDir::new("qemu-img-rbd"), &vol);
    }

    #[test]
    fn nbdcopy_round_trip_on_rbd_with_rbd_journal() {
        if !have_tool("nbdcopy", "nbdcopy_round_trip_on_rbd") {
            return;
        }
        let Some(vol) = rbd_volume("32M", true) else {
            return;
        };
        nbdcopy_round_trip_on(&TempDir::new("nbdcopy-rbd"), &vol);
    }

    #[test]
    fn fio_nbd_engine_with_verify_on_rbd_with_rbd_journal() {
        if !fio_has_nbd("fio_verify_on_rbd") {
            return;
        }
        let Some(vol) = rbd_volume("32M", true) else {
            return;
        };
        fio_verify_on(&vol);
    }

    /// A second server on the same image is refused at once, naming the
    /// holder, while the first one serves.
    #[test]
    fn a_second_server_is_refused_with_the_holder() {
        let Some(vol) = rbd_volume("16M", false) else {
            return;
        };
        let srv = ServerProc::start(&[&vol], None);
        let out = run_tool(JBDEV, &["serve", &vol, "--listen", "127.0.0.1:0"], 60);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a second server started");
        assert!(err.contains("held by"), "no holder named: {err}");
        eprintln!("second server: {}", err.lines().last().unwrap_or_default());
        let info = run_ok(JBDEV, &["info", &vol], 60);
        assert!(info.contains("rbd lock        held by"), "info: {info}");
        assert!(srv.stop());
    }
}
