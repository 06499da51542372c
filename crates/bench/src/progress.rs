//! A progress bar over the planned run time of a scenario.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of one scenario, in milliseconds of planned measuring time.
/// Drawn on stderr when it is a terminal; hidden otherwise and in tests.
pub struct Progress {
    bar: ProgressBar,
    /// No bar and no step lines (tests).
    quiet: bool,
}

impl Progress {
    /// A bar for `planned` of measuring time.
    pub fn new(planned: Duration, visible: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(
            Some(planned.as_millis() as u64),
            if visible {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:32} {percent:>3}% {msg}",
            )
            .expect("static template is valid"),
        );
        Progress { bar, quiet: false }
    }

    /// A bar that draws and prints nothing.
    pub fn hidden() -> Progress {
        Progress {
            quiet: true,
            ..Progress::new(Duration::ZERO, false)
        }
    }

    /// Names the step now running.
    pub fn step(&self, msg: impl Into<String>) {
        let msg = msg.into();
        tracing::debug!("{msg}");
        self.bar.set_message(msg);
    }

    /// Books `d` of progress (never past the planned total).
    pub fn advance(&self, d: Duration) {
        let len = self.bar.length().unwrap_or(0);
        let pos = (self.bar.position() + d.as_millis() as u64).min(len.saturating_sub(1));
        self.bar.set_position(pos);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Prints a line above the bar.
    pub fn println(&self, line: impl AsRef<str>) {
        if self.quiet {
        } else if self.bar.is_hidden() {
            eprintln!("{}", line.as_ref());
        } else {
            self.bar.println(line.as_ref());
        }
    }
}
