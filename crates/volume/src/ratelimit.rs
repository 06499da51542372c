//! A log limiter shared by the engine and the NBD server: an error a busy
//! client can hit on every request must not flood the log.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// At most one event per interval passes; the others are counted.
pub struct RateLimit {
    interval: Duration,
    /// When the last event passed, and the events held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimit {
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(events held back since the last one that passed)` if an event
    /// at `now` passes.
    pub fn pass(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock();
        match st.0 {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                st.1 += 1;
                None
            }
            _ => {
                let held = st.1;
                *st = (Some(now), 0);
                Some(held)
            }
        }
    }

    /// What to add to the log line of an event that passed: " (N more
    /// WHAT in the last S s not logged)", or nothing when none were held
    /// back.
    pub fn held_note(&self, held: u64, what: &str) -> String {
        if held == 0 {
            return String::new();
        }
        format!(
            " ({held} more {what} in the last {} s not logged)",
            self.interval.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_one_event_per_interval_passes_and_the_rest_are_counted() {
        let t0 = Instant::now();
        let r = RateLimit::new(Duration::from_secs(10));
        assert_eq!(r.pass(t0), Some(0));
        assert_eq!(r.pass(t0 + Duration::from_secs(1)), None);
        assert_eq!(r.pass(t0 + Duration::from_secs(9)), None);
        assert_eq!(r.pass(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(r.pass(t0 + Duration::from_secs(11)), None);
        assert_eq!(r.held_note(0, "errors"), "");
        assert_eq!(
            r.held_note(2, "errors"),
            " (2 more errors in the last 10 s not logged)"
        );
    }
}
