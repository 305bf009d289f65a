//! Fencing: a pump starts a request only while its lease covers the whole
//! request and the hold after it, by its own monotonic clock.
//!
//! A lease is written by the database (`lease_until = now() + lease` in
//! `watchpump.claim()`), where `now()` is when the claim's transaction
//! began, which is after this pump asked for it. So, taking [`Instant`]
//! just before the claim is asked for (the pool's wait included), the lease
//! ends no sooner than `asked + lease` on this pump's clock (clock *rates*
//! differ by parts per million; wall clocks and their steps play no part).
//! Another pump may take the delivery, or a newer one of its (watch,
//! object), only once the lease ended (or the pump recorded an outcome).
//!
//! A request started at `t` ends, answered or not, by `t + request
//! timeout` (reqwest's timeout covers connecting, sending and the
//! answer). After an attempt with no answer the consumer may still be
//! working on it, so the next request of its (watch, object) waits `hold`
//! more (`complete()` holds the stream, or the lease still runs). A request
//! whose connection broke sooner (its answer cut off by the network, after
//! the consumer had it) is held as if it had run its whole timeout: the
//! consumer is owed the same time to finish whichever way the pump lost
//! it. Hence the rule checked here, just before a request is signed and
//! sent:
//!
//! > start only if `now + request timeout + hold <= asked + lease`
//!
//! and a delivery that misses it is abandoned unsent: its slot is freed,
//! nothing is recorded, and its lease runs out, after which any pump claims
//! it again. A pump cut off from the database therefore stops starting
//! requests `lease - request timeout - hold` after its last claim, and what
//! it has on the wire ends a hold before its leases do, whether or not it
//! can record the outcome. This is the fencing argument written beside the
//! order rule at the top of `sql/functions/0500_delivery.sql`.
//!
//! One more way a request outlives the pump's interest in it: its bytes,
//! written but not acknowledged (the network to the consumer is cut), stay
//! in the kernel's send queue after the pump gave up and closed the
//! connection, and are retransmitted, and arrive, once the partition heals.
//! The HTTP client's sockets therefore carry `TCP_USER_TIMEOUT` of half the
//! hold ([`unacknowledged_limit`]): the kernel drops unacknowledged bytes
//! that long after it first sent them, so a request arrives at the latest
//! half a hold after the pump gave up, and the consumer still has the other
//! half before the next one (the partition fault of `make chaos` cuts pumps
//! off from their consumers to show it).

use std::time::Duration;

use tokio::time::Instant;

use crate::config::PumpConfig;

/// The latest moment the deliveries of one claim may start being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    send_by: Instant,
}

impl Fence {
    /// The fence for a claim asked for at `asked` with `cfg`'s lease,
    /// request timeout and hold.
    pub fn after_claim(asked: Instant, cfg: &PumpConfig) -> Fence {
        Fence::new(
            asked,
            cfg.lease(),
            cfg.request_timeout(),
            cfg.hold_after_no_answer(),
        )
    }

    fn new(asked: Instant, lease: Duration, request: Duration, hold: Duration) -> Fence {
        // validate() makes lease > request + hold; saturate all the same.
        let slack = lease.saturating_sub(request).saturating_sub(hold);
        Fence {
            send_by: asked + slack,
        }
    }

    /// Whether a request may start at `now`.
    pub fn allows(&self, now: Instant) -> bool {
        now <= self.send_by
    }
}

/// `TCP_USER_TIMEOUT` for the sockets to consumers: half the hold after no
/// answer, at least 100 ms (see above). On a healthy network bytes are
/// acknowledged within a round trip; a consumer slow to *answer* is not
/// affected (its side acknowledged the request).
pub fn unacknowledged_limit(cfg: &PumpConfig) -> Duration {
    (cfg.hold_after_no_answer() / 2).max(Duration::from_millis(100))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_may_start_only_while_the_lease_covers_the_request_and_the_hold() {
        let asked = Instant::now();
        let ms = Duration::from_millis;
        let fence = Fence::new(asked, ms(2500), ms(1000), ms(750));
        assert!(fence.allows(asked));
        assert!(fence.allows(asked + ms(750)));
        assert!(!fence.allows(asked + ms(751)));
        // A lease too short for the request leaves no time at all.
        let none = Fence::new(asked, ms(500), ms(1000), ms(0));
        assert!(!none.allows(asked + ms(1)));
    }
}
