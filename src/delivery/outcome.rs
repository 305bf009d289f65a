//! What one attempt came to, as one type: [`AttemptResult`]. The delivery's
//! fate (what `watchpump.complete()` is told), what the attempt says about
//! its consumer's health, and the metric label are all read from it.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::request::Target;
use super::Claimed;

/// What an attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    /// 2xx: the consumer stored it.
    Delivered { status: u16 },
    /// 410: the consumer's resource is gone; drop the watch.
    Gone,
    /// Anything else: ask again at `at` ([`crate::retry`]), unless
    /// `watchpump.complete()` finds the deadline passed or newer news waiting.
    Retry { at: DateTime<Utc>, failure: Failure },
}

/// Why an attempt is to be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An answer other than 2xx and 410.
    Status(u16),
    /// No answer within the request timeout.
    Timeout,
    /// No connection, or it broke before the answer.
    Connect,
}

impl AttemptResult {
    /// The `result` label of `watchpump_attempt_duration_seconds`: `2xx`,
    /// `410`, `3xx`, `4xx`, `5xx`, `timeout` or `connect_error`.
    pub fn as_label(&self) -> &'static str {
        match self {
            AttemptResult::Delivered { .. } => "2xx",
            AttemptResult::Gone => "410",
            AttemptResult::Retry { failure, .. } => match failure {
                Failure::Status(500..=599) => "5xx",
                Failure::Status(400..=499) => "4xx",
                Failure::Status(_) => "3xx",
                Failure::Timeout => "timeout",
                Failure::Connect => "connect_error",
            },
        }
    }

    /// What `watchpump.complete()` records: `delivered`, `gone` or `retry`.
    pub fn as_outcome(&self) -> &'static str {
        match self {
            AttemptResult::Delivered { .. } => "delivered",
            AttemptResult::Gone => "gone",
            AttemptResult::Retry { .. } => "retry",
        }
    }

    /// The HTTP status the consumer answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            AttemptResult::Delivered { status } => Some(*status),
            AttemptResult::Gone => Some(410),
            AttemptResult::Retry {
                failure: Failure::Status(status),
                ..
            } => Some(*status),
            AttemptResult::Retry { .. } => None,
        }
    }

    /// When to try again, for a retry.
    pub fn retry_at(&self) -> Option<DateTime<Utc>> {
        match self {
            AttemptResult::Retry { at, .. } => Some(*at),
            _ => None,
        }
    }
}

/// A finished attempt, on its way to `watchpump.complete()`.
#[derive(Debug)]
pub struct Finished {
    pub claimed: Claimed,
    /// Where it went, as of the claim.
    pub target: Arc<Target>,
    pub result: AttemptResult,
    /// What went wrong, as stored with the attempt: `HTTP 503 Service
    /// Unavailable`, or the connection's error with its causes.
    pub error: Option<String>,
    /// The head of the consumer's answer, masked.
    pub response_head: Option<String>,
    pub started: DateTime<Utc>,
    pub duration: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(failure: Failure) -> AttemptResult {
        AttemptResult::Retry {
            at: Utc::now(),
            failure,
        }
    }

    #[test]
    fn labels_name_the_class_of_answer() {
        assert_eq!(AttemptResult::Delivered { status: 204 }.as_label(), "2xx");
        assert_eq!(AttemptResult::Gone.as_label(), "410");
        assert_eq!(retry(Failure::Status(302)).as_label(), "3xx");
        assert_eq!(retry(Failure::Status(429)).as_label(), "4xx");
        assert_eq!(retry(Failure::Status(503)).as_label(), "5xx");
        assert_eq!(retry(Failure::Timeout).as_label(), "timeout");
        assert_eq!(retry(Failure::Connect).as_label(), "connect_error");
        assert_eq!(retry(Failure::Timeout).status(), None);
        assert_eq!(AttemptResult::Gone.status(), Some(410));
    }
}
