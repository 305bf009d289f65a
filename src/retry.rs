//! The retry policy, in one place: when a failed delivery (or a warning to
//! notify) is tried again, how a consumer's `Retry-After` is honoured, when
//! retrying stops, and how a consumer that is down is probed. The pump
//! ([`crate::pump`]) and the warnings ([`crate::operator::notify`]) both
//! ask [`RetryPolicy`].
//!
//! # The rule, and where each part of it lives
//!
//! - **What is retried**: any attempt but a 2xx (delivered) or a 410 (gone),
//!   [`crate::delivery::outcome::AttemptResult`].
//! - **When**: exponential back-off from `--retry-initial-ms`, doubling per
//!   attempt up to `--retry-max-ms`, with ±25% jitter so that a consumer
//!   that comes back is not hit by every retry at once; a consumer's
//!   `Retry-After` (seconds) lengthens a delay, never shortens it, and is
//!   capped by the same maximum ([`RetryPolicy::delay`]). Warnings back off the same way, without
//!   jitter ([`RetryPolicy::backoff`]).
//! - **Until when**: every delivery has a deadline, set when it is emitted
//!   to `now() + watchpump.delivery_window()` (24 hours unless
//!   `watchpump.settings` says otherwise, read at every emit;
//!   `sql/functions/0050_settings.sql`) and renewed when an operator retries it. `watchpump.complete()`
//!   (`0500_delivery.sql`) schedules a retry whose back-off would pass the
//!   deadline *at* the deadline, and fails a delivery only once an attempt
//!   at or after its deadline failed; `watchpump.sweep()` fails the ones a
//!   down consumer never got to; a warning's deadline is
//!   the same window, checked by `watchpump.warning_attempted()`
//!   (`0600_operator.sql`).
//! - **Newer news first**: a retry is superseded, not sent, when newer news
//!   of its (watch, object) waits (`watchpump.supersede_older()`).
//! - **On time**: the pump wakes up when a retry it scheduled falls due
//!   ([`Wakeups`]), not only at its next sweep.
//! - **A consumer that is down** (`--down-after` failures in a row) gets one
//!   probe at a time instead of its backlog; the pause between probes
//!   starts at a tenth of `--probe-interval-ms` and doubles up to it
//!   ([`RetryPolicy::first_probe_pause`], [`RetryPolicy::next_probe_pause`],
//!   used by [`crate::pump::health`]). The first answer releases the
//!   backlog (`watchpump.release_backlog()`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::time::Instant;

/// Random spread of a back-off delay, either way.
const JITTER: f64 = 0.25;

/// The shortest pause between probes of a consumer that is down.
const MIN_PROBE_PAUSE: Duration = Duration::from_millis(10);

/// Retry times a pump remembers to wake up for; later ones wait for the
/// sweep.
const MAX_WAKEUPS: usize = 10_000;

/// The bounds of every retry delay and probe pause (`PumpConfig`'s
/// `retry_initial_ms`, `retry_max_ms` and `probe_interval_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// The longest pause between probes of a consumer that is down.
    pub probe_max: Duration,
}

impl RetryPolicy {
    /// When to try a delivery again after failed attempt number `attempt`
    /// (1 for the first): [`RetryPolicy::delay`] from now.
    pub fn retry_at(&self, attempt: i32, retry_after: Option<Duration>) -> DateTime<Utc> {
        Utc::now() + self.delay(attempt, retry_after)
    }

    /// The back-off with jitter, lengthened (never shortened) by the
    /// consumer's `Retry-After`, at most `max`. A consumer that answers
    /// `Retry-After: 1` to every attempt therefore still backs off
    /// exponentially: letting it replace the back-off retried each of
    /// 10,000 deliveries every second for a day.
    pub fn delay(&self, attempt: i32, retry_after: Option<Duration>) -> Duration {
        let spread = rand::thread_rng().gen_range(1.0 - JITTER..=1.0 + JITTER);
        let backoff = self.backoff(attempt).mul_f64(spread);
        backoff.max(retry_after.unwrap_or_default()).min(self.max)
    }

    /// The back-off without jitter: `initial` doubled per attempt after
    /// the first, at most `max`.
    pub fn backoff(&self, attempt: i32) -> Duration {
        let exponent = attempt.saturating_sub(1).clamp(0, 30) as u32;
        self.initial
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(self.max)
    }

    /// The pause before the first probe of a consumer that just went down.
    pub fn first_probe_pause(&self) -> Duration {
        (self.probe_max / 10).max(MIN_PROBE_PAUSE)
    }

    /// The pause after `pause`: twice as long, at most `probe_max`.
    pub fn next_probe_pause(&self, pause: Duration) -> Duration {
        (pause * 2).min(self.probe_max)
    }
}

/// `Retry-After` as a number of seconds (its HTTP-date form is not read).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// When the retries a pump scheduled fall due, soonest first, so that a
/// retry goes out on time rather than at the next sweep.
#[derive(Debug, Default)]
pub struct Wakeups {
    due: BinaryHeap<Reverse<Instant>>,
}

impl Wakeups {
    /// Remembers a retry at `at` (wall clock), as seen at `now`; beyond
    /// `MAX_WAKEUPS` it is left to the sweep.
    pub fn remember(&mut self, at: DateTime<Utc>, now: Instant) {
        if self.due.len() < MAX_WAKEUPS {
            let wait = (at - Utc::now()).to_std().unwrap_or_default();
            self.due.push(Reverse(now + wait));
        }
    }

    /// The soonest remembered retry still ahead of `now`; passed ones are
    /// forgotten (the claim that follows a wake-up takes them).
    pub fn next(&mut self, now: Instant) -> Option<Instant> {
        while self.due.peek().is_some_and(|Reverse(at)| *at <= now) {
            self.due.pop();
        }
        self.due.peek().map(|Reverse(at)| *at)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The policy unit tests share: 1 s doubling to 60 s, probes up to 1 s.
    pub(crate) fn policy() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            probe_max: Duration::from_secs(1),
        }
    }

    #[test]
    fn retry_delays_grow_with_jitter_and_stay_bounded() {
        let p = policy();
        let d1 = p.delay(1, None);
        let d3 = p.delay(3, None);
        let d20 = p.delay(20, None);
        assert!(
            d1 >= Duration::from_millis(750) && d1 <= Duration::from_millis(1250),
            "{d1:?}"
        );
        assert!(
            d3 >= Duration::from_millis(3000) && d3 <= Duration::from_millis(5000),
            "{d3:?}"
        );
        assert!(d20 <= Duration::from_secs(60), "{d20:?}");
        assert_eq!(p.backoff(1), Duration::from_secs(1));
        assert_eq!(p.backoff(3), Duration::from_secs(4));
        assert_eq!(p.backoff(40), Duration::from_secs(60));
    }

    #[test]
    fn retry_after_lengthens_the_back_off_and_never_shortens_it() {
        let p = policy();
        let at = |at: DateTime<Utc>| (at - Utc::now()).num_milliseconds();
        assert!((29_000..=30_000).contains(&at(p.retry_at(1, Some(Duration::from_secs(30))))));
        assert!(at(p.retry_at(1, Some(Duration::from_secs(7200)))) <= 60_000);
        assert!(at(p.retry_at(1, Some(Duration::from_secs(0)))) >= 700);
        // Attempt 6 backs off 32 s (+-25%); asking for 1 s does not shorten it.
        let d = p.delay(6, Some(Duration::from_secs(1)));
        assert!(d >= Duration::from_secs(24), "{d:?}");
        assert_eq!(parse_retry_after(" 30 "), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn probe_pauses_double_up_to_the_probe_interval() {
        let p = policy();
        assert_eq!(p.first_probe_pause(), Duration::from_millis(100));
        assert_eq!(
            p.next_probe_pause(Duration::from_millis(800)),
            Duration::from_secs(1)
        );
        let tiny = RetryPolicy {
            probe_max: Duration::from_millis(20),
            ..p
        };
        assert_eq!(tiny.first_probe_pause(), MIN_PROBE_PAUSE);
    }

    #[test]
    fn wakeups_come_soonest_first_and_forget_passed_ones() {
        let now = Instant::now();
        let mut w = Wakeups::default();
        w.remember(Utc::now() + chrono::Duration::seconds(20), now);
        w.remember(Utc::now() + chrono::Duration::seconds(10), now);
        let first = w.next(now).unwrap();
        assert!(first < now + Duration::from_secs(11), "{first:?}");
        assert!(w.next(first).unwrap() > now + Duration::from_secs(19));
        assert_eq!(w.next(now + Duration::from_secs(30)), None);
    }
}
