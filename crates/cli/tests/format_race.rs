//! `jbdev format` racing another creator of the same path (found by an
//! adversarial pass, session 21): a format that failed removed the path it
//! had seen missing, even when another process had created (and was using)
//! the volume there in between; and two formats of one new path could both
//! succeed, the first reporting a uuid that no longer existed. A format now
//! creates files exclusively, removes only what it created while it still
//! holds the lock, and repeats its overwrite check under the lock.

use std::process::{Command, Stdio};

mod cli_common;
use cli_common::text;

/// Runs two `jbdev format` of one new path at once, `rounds` times; returns
/// per round the two outputs (success, text).
fn race(rounds: usize, dir: &std::path::Path) -> Vec<[(bool, String); 2]> {
    let img = dir.join("c.img");
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_jbdev"))
            .args(["format", img.to_str().unwrap(), "--size", "16M"])
            .args(["--journal-size", "1M"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start jbdev format")
    };
    (0..rounds)
        .map(|_| {
            let _ = std::fs::remove_file(&img);
            let (a, b) = (start(), start());
            let out = [a, b].map(|c| {
                let o = c.wait_with_output().unwrap();
                (o.status.success(), text(&o))
            });
            // What must hold whatever the interleaving.
            let ok: Vec<&String> = out.iter().filter(|o| o.0).map(|o| &o.1).collect();
            assert!(
                ok.len() <= 1,
                "two formats of one new path both succeeded without --force: {out:?}"
            );
            if let Some(said) = ok.first() {
                let info = cli_common::jbdev(&["info", img.to_str().unwrap()]);
                assert!(
                    info.status.success(),
                    "the format that succeeded left no volume behind: it said {said:?}; \
                     info: {}",
                    text(&info)
                );
                // The uuid alone: a format that found the loser's empty
                // file goes on to say it grew it, on the next line.
                let uuid = said
                    .rsplit("uuid ")
                    .next()
                    .and_then(|t| t.split_whitespace().next())
                    .unwrap_or_default();
                assert!(
                    text(&info).contains(uuid),
                    "the volume on disk is not the one the successful format reported \
                     ({uuid}): {}",
                    text(&info)
                );
            }
            out
        })
        .collect()
}

/// Before: 9 of 12 rounds had both formats succeed, and in 3 of 12 the one
/// that said "formatted" left no file (the other removed it on failing).
#[test]
fn two_formats_of_one_new_path_never_both_win_nor_remove_the_winner() {
    let dir = tempfile::tempdir().unwrap();
    let rounds = race(12, dir.path());
    // Every round, exactly one format won: the other was refused (the
    // volume is there now, or it is locked).
    for out in &rounds {
        let loser = out.iter().find(|o| !o.0);
        let Some((_, msg)) = loser else {
            panic!("no format won: {out:?}")
        };
        // The volume (or, caught mid-format, its journal) is there, or
        // the path is locked.
        assert!(
            msg.contains("formatting would destroy it") || msg.contains("already open"),
            "the refused format's message: {msg}"
        );
        assert!(!msg.contains("panicked"), "{msg}");
    }
}
