//! The real `jbdev serve` with an external journal file that is deleted
//! under it, with the real `nbdcopy`: what was acknowledged is salvaged
//! home before the server stops taking writes, `jbdev journal reset` gives
//! the volume a new journal, and a restarted server serves every byte.
//! Before session 19 the journaled writes went with the deleted file and
//! the volume could not be opened again at all.

mod nbd_common;

use nbd_common::*;

#[test]
fn a_deleted_external_journal_loses_nothing_and_the_volume_serves_again_after_a_reset() {
    if !have_tool("nbdcopy", "a_deleted_external_journal_loses_nothing") {
        return;
    }
    let dir = TempDir::new("journal-lost");
    let (img, jnl) = (dir.path("v.img"), dir.path("j.jnl"));
    let img_s = img.to_str().unwrap();
    format_with_journal(&img, &jnl, "32M", "32M");
    let src = dir.path("src.raw");
    std::fs::write(&src, pattern(19, 8 << 20)).unwrap();
    let srv = ServerProc::start(&[img_s], None);
    let uri = srv.tcp_uri();
    // 64 KiB requests are journaled (below --direct-write-threshold), and
    // --flush makes them durable: acknowledged, and in the journal only
    // (a 32 MiB journal is far from its checkpoint threshold).
    run_ok(
        "nbdcopy",
        &[
            "--flush",
            "--request-size=65536",
            src.to_str().unwrap(),
            &uri,
        ],
        120,
    );
    std::fs::remove_file(&jnl).unwrap();
    // The journal watch notices within 250 ms; the salvage then runs.
    srv.wait_for_log("salvage complete");
    let log = srv.log_text();
    assert!(log.contains("was deleted"), "{log}");
    let mut srv = srv;
    srv.signal("TERM");
    let st = srv.wait_exit(std::time::Duration::from_secs(60));
    assert!(
        st.is_some_and(|s| !s.success()),
        "the stop reports the abort: {st:?}"
    );
    // Its last line says how the salvage ended and the next step, not the
    // abort's advice for a running process (session 25's docs pass).
    srv.wait_for_log("jbdev: error: closing");
    let log = srv.log_text();
    let last = log
        .lines()
        .find(|l| l.starts_with("jbdev: error: closing"))
        .unwrap_or_default();
    assert!(
        last.contains("the salvage is complete")
            && last.contains("jbdev journal reset")
            && !last.contains("/proc/"),
        "{last}"
    );
    drop(srv);
    // Without its journal the volume does not open; a reset fixes that.
    let o = run_tool(JBDEV, &["check", img_s], 60);
    assert!(!o.status.success(), "check without the journal");
    let out = run_ok(JBDEV, &["journal", "reset", img_s], 60);
    assert!(out.contains("created"), "{out}");
    run_ok(JBDEV, &["check", img_s], 60);
    let srv = ServerProc::start(&[img_s], None);
    let back = dir.path("back.raw");
    run_ok("nbdcopy", &[&srv.tcp_uri(), back.to_str().unwrap()], 120);
    assert!(srv.stop());
    let got = std::fs::read(&back).unwrap();
    assert!(
        got[..8 << 20] == pattern(19, 8 << 20)[..],
        "the copy is not what was acknowledged"
    );
}

/// Two volumes whose journals are both lost fail to close, and the stop
/// reports both: what became of each one's acknowledged writes (session
/// 33's multi-export pass: only the last volume's close error was shown,
/// the first one's salvage outcome was dropped).
#[test]
fn every_volume_that_fails_to_close_is_reported() {
    let dir = TempDir::new("two-journals-lost");
    let mut exports = Vec::new();
    let mut journals = Vec::new();
    for n in ["a", "b"] {
        let (img, jnl) = (
            dir.path(&format!("v{n}.img")),
            dir.path(&format!("j{n}.jnl")),
        );
        format_with_journal(&img, &jnl, "16M", "4M");
        exports.push(format!("{n}={}", img.display()));
        journals.push(jnl);
    }
    let args = [
        "--export",
        exports[0].as_str(),
        "--export",
        exports[1].as_str(),
    ];
    let mut srv = ServerProc::start(&args, None);
    for j in &journals {
        std::fs::remove_file(j).unwrap();
    }
    assert!(
        poll_until(std::time::Duration::from_secs(60), || srv
            .log_text()
            .matches("salvage complete")
            .count()
            >= 2),
        "both salvages: {}",
        srv.log_text()
    );
    srv.signal("TERM");
    let st = srv.wait_exit(std::time::Duration::from_secs(60));
    assert!(st.is_some_and(|s| !s.success()), "{st:?}");
    srv.wait_for_log("jbdev: error:");
    let log = srv.log_text();
    let (_, last) = log.split_once("jbdev: error:").expect("the error");
    assert!(last.contains("2 volumes failed to close"), "{last}");
    for n in ["va.img", "vb.img"] {
        assert!(
            last.contains(&format!("closing {}", dir.path(n).display())),
            "{n} not reported: {last}"
        );
    }
}
