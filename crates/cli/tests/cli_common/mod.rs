//! Helpers shared by the tests that run the `jbdev` binary's commands
//! (`cli_admin`, `bench_cli`).

use std::process::{Command, Output};

/// Runs `jbdev ARGS...` to its end.
pub fn jbdev(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .args(args)
        .output()
        .expect("run jbdev")
}

/// A command's stdout and stderr, as one text.
pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}
