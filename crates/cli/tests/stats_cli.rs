//! `jbdev stats` (report #12 of session 19): against the real `jbdev serve
//! --metrics`, an aborted volume and its salvage are shown, a newline in an
//! export name stays on its row, and `--count` alone prints that many
//! reports; command-line mistakes are usage errors (exit 64); an endpoint
//! that never answers is reported as a timeout, with its address.

mod nbd_common;

use nbd_common::*;

/// `jbdev stats ARGS`: exit code, stdout, stderr.
fn stats(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["stats"];
    all.extend_from_slice(args);
    let o = run_tool(JBDEV, &all, 60);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Before: `stats nonsense` and `--interval 0` exited 1 (README: usage
/// errors exit 64), and `--count 2` without `--watch` printed one report.
#[test]
fn command_line_mistakes_are_usage_errors() {
    let dir = TempDir::new("stats-usage");
    let file = dir.path("v.img");
    std::fs::write(&file, b"x").unwrap();
    for (args, want) in [
        (vec!["nonsense"], "bad target \"nonsense\""),
        (vec!["10810", "--interval", "0"], "between 0.05 and 3600"),
        (
            vec!["10810", "--interval", "soon"],
            "not a number of seconds",
        ),
        (vec!["10810", "--count", "0"], "--count"),
        (vec![file.to_str().unwrap()], "is a file"),
    ] {
        let (code, _, err) = stats(&args);
        assert_eq!(code, Some(64), "stats {args:?}: {err}");
        assert!(err.contains(want), "stats {args:?}: {err}");
    }
}

/// Before: "Resource temporarily unavailable (os error 11)".
#[test]
fn a_silent_endpoint_is_a_timeout_with_its_address() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts and keeps every connection open, never answering.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let (code, _, err) = stats(&[&port.to_string()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "timed out after 5 s waiting for an answer from 127.0.0.1:{port}"
        )),
        "{err}"
    );
    assert!(!err.contains("os error 11"), "{err}");
}

#[test]
fn stats_of_a_real_server_show_names_on_one_row_and_an_aborted_volume() {
    let dir = TempDir::new("stats-server");
    let (img, jnl, other) = (dir.path("v.img"), dir.path("v.jnl"), dir.path("o.img"));
    let img_s = img.to_str().unwrap();
    format_with_journal(&img, &jnl, "32M", "8M");
    format_volume(&other, "16M");
    // An export whose name holds a newline.
    let export = format!("two\nlines={}", other.display());
    let srv = ServerProc::start(
        &[img_s, "--export", &export, "--metrics", "127.0.0.1:0"],
        None,
    );
    let url = srv.metrics_url();

    // FUA writes, acknowledged and in the journal only.
    let c = client_after_fua_writes(&srv, "", 16);
    c.disconnect().unwrap();
    // The default export has requests: its row, and the volume's, show.
    let (code, out, err) = stats(&[&url, "--interval", "0.05", "--count", "2"]);
    assert_eq!(code, Some(0), "{err}");
    // --count alone: two reports, not one.
    assert_eq!(out.matches("commits/s").count(), 2, "{out}");
    let first = out.split("\njbdev serve").next().unwrap();
    assert!(
        first
            .lines()
            .any(|l| l.contains("v.img") && l.ends_with("  ok")),
        "{first}"
    );
    assert!(!first.contains('!'), "{first}");
    // A request on the newline export gives it a row: escaped, one line.
    let addr: jbdev_nbd::client::Address = srv.tcp.clone().unwrap().parse().unwrap();
    let mut c = jbdev_nbd::client::Client::connect(&addr, "two\nlines").expect("nbd connect");
    let reply = c
        .call(jbdev_nbd::proto::CMD_FLUSH, 0, 0, 0, &[])
        .expect("flush");
    assert!(reply.is_ok(), "{reply:?}");
    c.disconnect().unwrap();
    let (code, out, err) = stats(&[&url, "--interval", "0.05"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().any(|l| l.starts_with("two\\nlines ")), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("lines")), "{out}");

    // The journal file deleted under the server: the volume aborts and
    // the salvage writes the 16 blocks home.
    std::fs::remove_file(&jnl).unwrap();
    srv.wait_for_log("salvage complete");
    let (code, out, err) = stats(&[&url, "--interval", "0.05"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .any(|l| l.contains("v.img") && l.ends_with("  ABORTED,salvaged")),
        "{out}"
    );
    assert!(
        out.contains("v.img: journal ABORTED; salvage complete (")
            && out.contains(
                "every committed write (every write a flush or FUA acknowledged) is on the volume"
            ),
        "{out}"
    );
    // The other volume is fine.
    assert!(
        out.lines()
            .any(|l| l.contains("o.img") && l.ends_with("  ok")),
        "{out}"
    );
    assert!(!srv.stop(), "the stop reports the abort");
}
