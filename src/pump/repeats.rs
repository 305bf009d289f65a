//! One log line per service per interval for an error that comes back at
//! every claim: a pump without the key that sealed a service's secret (a
//! `secrets rekey` it has not caught up with) cannot sign for that service,
//! and said so for every claim that held one of its deliveries: 327 ERROR
//! lines in 6 s, burying the one line that says which key to set.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How often a service's unreadable row is logged while it lasts.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(60);

/// When each failing service was last logged, and how often it failed
/// since.
#[derive(Debug)]
pub(super) struct Repeats {
    every: Duration,
    failing: HashMap<i64, (Instant, u64)>,
}

impl Repeats {
    pub(super) fn new(every: Duration) -> Repeats {
        Repeats {
            every,
            failing: HashMap::new(),
        }
    }

    /// Service `id` failed again at `now`: `Some(n)` when it is time to
    /// log it (`n` failures were not logged since the last line), `None`
    /// when the last line is recent enough.
    pub(super) fn failed(&mut self, id: i64, now: Instant) -> Option<u64> {
        match self.failing.get_mut(&id) {
            Some((logged, quiet)) if now.duration_since(*logged) < self.every => {
                *quiet += 1;
                None
            }
            Some((logged, quiet)) => {
                let unlogged = *quiet;
                *logged = now;
                *quiet = 0;
                Some(unlogged)
            }
            None => {
                self.failing.insert(id, (now, 0));
                Some(0)
            }
        }
    }

    /// Service `id` is readable again: whether it had been failing.
    pub(super) fn recovered(&mut self, id: i64) -> bool {
        self.failing.remove(&id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_service_is_logged_once_an_interval_with_what_was_not() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut r = Repeats::new(s(60));
        assert_eq!(r.failed(1, t0), Some(0), "the first failure is logged");
        assert_eq!(r.failed(2, t0), Some(0), "each service on its own");
        for i in 1..=300 {
            assert_eq!(r.failed(1, t0 + Duration::from_millis(i * 20)), None);
        }
        assert_eq!(r.failed(1, t0 + s(60)), Some(300));
        assert_eq!(r.failed(1, t0 + s(61)), None);
        assert!(r.recovered(1));
        assert!(!r.recovered(1));
        assert_eq!(r.failed(1, t0 + s(62)), Some(0), "a new run of failures");
    }
}
