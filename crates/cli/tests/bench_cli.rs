//! `jbdev bench` through the real binary: its arguments, exit status and
//! output files. (The scenarios themselves are tested in crates/bench.)

use std::process::{Command, Output};

fn jbdev(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .args(args)
        .output()
        .expect("run jbdev")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

/// Report #4: a `--duration` of 0, below the documented minimum of 0.1 s,
/// negative, NaN, infinite or above an hour is a usage error (exit 64)
/// before anything runs. The missing `--device` is never reached; a
/// duration that is accepted fails on it (exit 1). (The old bench accepted
/// every one of them, clamped to 0.05..3600 s, and printed MET/MISS
/// verdicts from 0.1 s runs.)
#[test]
fn a_duration_outside_its_range_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-device");
    let bench = |secs: &str| {
        jbdev(&[
            "bench",
            "sync-writers",
            "--no-plots",
            "--no-progress",
            "--device",
            missing.to_str().unwrap(),
            &format!("--duration={secs}"),
        ])
    };
    for secs in ["0", "-1", "0.01", "NaN", "inf", "3601", "soon"] {
        let o = bench(secs);
        assert_eq!(o.status.code(), Some(64), "--duration {secs}: {}", text(&o));
        assert!(
            text(&o).contains("--duration") && text(&o).contains("from 0.1 to 3600 seconds")
                || secs == "soon",
            "--duration {secs}: {}",
            text(&o)
        );
    }
    for secs in ["0.1", "2.5"] {
        let o = bench(secs);
        assert_eq!(o.status.code(), Some(1), "--duration {secs}: {}", text(&o));
        assert!(text(&o).contains("no-such-device"), "{}", text(&o));
    }
}
