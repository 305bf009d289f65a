//! Claims ahead of free slots (issue 33): deliveries a claim took beyond
//! what could start at once wait here, per service, in the order claimed,
//! each with the fence of its claim, and start as requests of their service
//! finish, without waiting for another claim's round trip (graphile-worker's
//! local queue, `src/localQueue.ts`, does the same for jobs).
//!
//! What waits here is leased like what is in flight: no other pump sends
//! it, and its (watch, object) sends nothing else meanwhile (the order
//! rule). How much waits is [`super::health::Health`]'s business (one
//! window per service at most). It leaves in one of four ways:
//!
//! - it starts, when its service has room ([`super::claiming::start_ready`]);
//! - it is given back to the database unsent (`watchpump.release()`), when
//!   the pump stops, when its service fails (what waits beyond the halved
//!   window) or goes down (all of it), when its watch answered 410, or when
//!   its fence passed while it waited;
//! - the pump crashes: its lease runs out and any pump claims it again, as
//!   for a delivery in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::fence::Fence;
use crate::delivery::request::Target;
use crate::delivery::Claimed;

/// A claimed delivery waiting to be sent: where it goes, and until when it
/// may start.
pub(super) struct Ready {
    pub(super) claimed: Claimed,
    pub(super) target: Arc<Target>,
    pub(super) fence: Fence,
}

impl Ready {
    /// The delivery and attempt `watchpump.release()` takes to give it back.
    pub(super) fn claim_ref(&self) -> (i64, i32) {
        (
            self.claimed.message.delivery_id,
            self.claimed.message.attempt,
        )
    }
}

/// The deliveries waiting in the pump, by service, oldest claimed first.
#[derive(Default)]
pub(super) struct Ahead {
    by_service: HashMap<i64, VecDeque<Ready>>,
}

impl Ahead {
    /// Adds a claimed delivery behind its service's others.
    pub(super) fn push(&mut self, ready: Ready) {
        self.by_service
            .entry(ready.claimed.service_id)
            .or_default()
            .push_back(ready);
    }

    /// The oldest waiting delivery of `service_id`.
    pub(super) fn pop(&mut self, service_id: i64) -> Option<Ready> {
        let queue = self.by_service.get_mut(&service_id)?;
        let ready = queue.pop_front();
        if queue.is_empty() {
            self.by_service.remove(&service_id);
        }
        ready
    }

    /// The newest `n` waiting deliveries of `service_id`, to give back.
    pub(super) fn take_newest(&mut self, service_id: i64, n: usize) -> Vec<Ready> {
        let Some(queue) = self.by_service.get_mut(&service_id) else {
            return Vec::new();
        };
        let keep = queue.len().saturating_sub(n);
        let taken: Vec<Ready> = queue.drain(keep..).collect();
        if queue.is_empty() {
            self.by_service.remove(&service_id);
        }
        taken
    }

    /// Every waiting delivery of `watch_id` (its consumer answered 410).
    pub(super) fn take_watch(&mut self, service_id: i64, watch_id: i64) -> Vec<Ready> {
        let Some(queue) = self.by_service.get_mut(&service_id) else {
            return Vec::new();
        };
        let (taken, kept): (VecDeque<Ready>, VecDeque<Ready>) = queue
            .drain(..)
            .partition(|r| r.claimed.message.watch_id == watch_id);
        *queue = kept;
        if queue.is_empty() {
            self.by_service.remove(&service_id);
        }
        taken.into()
    }

    /// Everything waiting, to give back when the pump stops.
    pub(super) fn take_all(&mut self) -> Vec<Ready> {
        self.by_service
            .drain()
            .flat_map(|(_, queue)| queue)
            .collect()
    }

    /// The services with deliveries waiting.
    pub(super) fn services(&self) -> Vec<i64> {
        self.by_service.keys().copied().collect()
    }
}
