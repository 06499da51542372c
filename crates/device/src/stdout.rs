//! A command's output on stdout, without panicking when stdout goes away.
//!
//! `println!` panics ("failed printing to stdout") when stdout is a closed
//! pipe (the Rust runtime ignores SIGPIPE, so the write returns `EPIPE`) or
//! a full device. The `jbdev` command and its benchmarks print with
//! [`outln!`](crate::outln) and [`out!`](crate::out) instead, which return a
//! [`StdoutError`] for `?`; the command turns a broken pipe into a quiet
//! exit and any other failure into an error line.

/// Writing to stdout failed: `jbdev: error: writing to stdout: ...`, exit 1
/// (a closed pipe ends the command quietly instead).
#[derive(Debug)]
pub struct StdoutError(pub std::io::Error);

impl StdoutError {
    /// Whether the reader went away (a closed pipe, `| head -1`).
    pub fn is_broken_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

impl std::fmt::Display for StdoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "writing to stdout: {}", self.0)
    }
}

impl std::error::Error for StdoutError {}

/// `println!` that returns a [`StdoutError`] instead of panicking when
/// stdout cannot be written (`>/dev/full`, a closed pipe where SIGPIPE is
/// ignored): use it with `?` for everything a command prints.
///
/// `outln!(to W, ...)` writes to `W` instead, a writer that stands for
/// stdout (a benchmark's table goes to stdout in `jbdev bench` and to a
/// buffer in tests).
#[macro_export]
macro_rules! outln {
    (to $w:expr $(, $($arg:tt)*)?) => {{
        // Unused when `W` is a `dyn Write`, whose methods need no import.
        #[allow(unused_imports)]
        use std::io::Write as _;
        writeln!($w $(, $($arg)*)?).map_err($crate::stdout::StdoutError)
    }};
    ($($arg:tt)*) => {
        $crate::outln!(to std::io::stdout().lock(), $($arg)*)
    };
}

/// `print!` counterpart of [`outln!`](crate::outln); flushes, so a partial
/// line is seen at once. In `out!(to W, ...)`, `W` is a place (a variable),
/// named twice: for the write and for the flush.
#[macro_export]
macro_rules! out {
    (to $w:expr $(, $($arg:tt)*)?) => {{
        #[allow(unused_imports)]
        use std::io::Write as _;
        write!($w $(, $($arg)*)?)
            .and_then(|()| $w.flush())
            .map_err($crate::stdout::StdoutError)
    }};
    ($($arg:tt)*) => {{
        let mut o = std::io::stdout().lock();
        $crate::out!(to o, $($arg)*)
    }};
}

#[cfg(test)]
mod tests {
    use super::StdoutError;

    #[test]
    fn a_closed_pipe_is_an_error_not_a_panic() {
        // Like stdout into `| head -1` once head is gone (the Rust runtime
        // ignores SIGPIPE, so the write fails with EPIPE).
        let (reader, mut w) = std::io::pipe().unwrap();
        drop(reader);
        let e: StdoutError = crate::outln!(to w, "line {}", 1).unwrap_err();
        assert!(e.is_broken_pipe());
        assert_eq!(
            e.to_string(),
            "writing to stdout: Broken pipe (os error 32)"
        );
        assert!(crate::out!(to w, "x").unwrap_err().is_broken_pipe());
        let d: &mut dyn std::io::Write = &mut w;
        assert!(crate::outln!(to d).unwrap_err().is_broken_pipe());
    }

    #[test]
    fn lines_reach_the_writer() {
        let mut v: Vec<u8> = Vec::new();
        crate::outln!(to v, "a {}", 1).unwrap();
        crate::outln!(to v).unwrap();
        crate::out!(to v, "b").unwrap();
        assert_eq!(v, b"a 1\n\nb");
    }
}
