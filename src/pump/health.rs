//! What the pump knows of each consumer service: how many deliveries it has
//! in flight there, and whether the service looks down.
//!
//! A service is down after `down_after` consecutive failed attempts. While
//! down it gets no deliveries but a single probe now and then (the pauses
//! are the retry policy's, [`RetryPolicy::first_probe_pause`]); the first
//! answer releases its whole backlog.
//! In-flight deliveries per service are capped so that a consumer that hangs
//! until timeout cannot take every slot.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::delivery::outcome::AttemptResult;
use crate::retry::RetryPolicy;

/// Per-service claim limits, in the shape `watchpump.claim()` takes them.
#[derive(Debug, Default)]
pub struct Slots {
    pub service_ids: Vec<i64>,
    pub free: Vec<i32>,
    pub probe: Vec<bool>,
    /// Limit for services this pump has not seen yet.
    pub default_free: i32,
}

/// How an attempt reflects on its consumer: it answered (2xx or 410), or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Answered,
    Failed,
}

impl Answer {
    /// What an attempt says about its consumer's health: only a 2xx or a
    /// 410 means it takes deliveries. Every other answer (a 4xx included),
    /// a timeout or a refused connection counts against it, so that a
    /// service that refuses everything is probed one delivery at a time
    /// like one that is down, instead of being sent its whole backlog on
    /// every retry. One 4xx among 2xx answers changes nothing: the count
    /// is of failures in a row.
    pub fn of(result: &AttemptResult) -> Answer {
        match result {
            AttemptResult::Retry { .. } => Answer::Failed,
            AttemptResult::Delivered { .. } | AttemptResult::Gone => Answer::Answered,
        }
    }
}

/// What an attempt changed about its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    WentDown,
    CameBack,
}

#[derive(Debug)]
struct Down {
    next_probe_at: Instant,
    probe_pause: Duration,
}

#[derive(Debug, Default)]
struct Service {
    name: String,
    in_flight: u32,
    consecutive_failures: u32,
    down: Option<Down>,
    /// Requests this service has earned in flight (see [`Health::slots`]).
    window: u32,
}

#[derive(Debug)]
pub struct Health {
    cap: u32,
    /// The window of a service that has not answered yet
    /// (`WATCHPUMP_INITIAL_CONCURRENCY`).
    initial: u32,
    down_after: u32,
    policy: RetryPolicy,
    services: HashMap<i64, Service>,
}

impl Health {
    pub fn new(cap: u32, initial: u32, down_after: u32, policy: RetryPolicy) -> Self {
        Health {
            cap,
            initial: initial.clamp(1, cap.max(1)),
            down_after: down_after.max(1),
            policy,
            services: HashMap::new(),
        }
    }

    /// How many deliveries of each service the next claim may take: what
    /// its window leaves free. A service earns its concurrency by answering
    /// (slow start, as TCP and adaptive load balancers do): it starts at
    /// `initial` requests in flight, each answer widens its window by one
    /// up to the per-service cap, and each failure halves it. A consumer
    /// that hangs therefore holds `initial` of the global budget
    /// (`WATCHPUMP_MAX_IN_FLIGHT`) until its requests time out, not the
    /// per-service cap: 300 services that never answer hold 300 requests,
    /// and a healthy consumer keeps the rest. (Services unknown to this
    /// pump get `initial` too: `default_free`.)
    pub fn slots(&self, now: Instant) -> Slots {
        let mut slots = Slots {
            default_free: self.initial as i32,
            ..Slots::default()
        };
        for (id, s) in &self.services {
            let (free, probe) = match &s.down {
                Some(d) if s.in_flight == 0 && now >= d.next_probe_at => (1, true),
                Some(_) => (0, false),
                None => (
                    s.window.min(self.cap).saturating_sub(s.in_flight) as i32,
                    false,
                ),
            };
            slots.service_ids.push(*id);
            slots.free.push(free);
            slots.probe.push(probe);
        }
        slots
    }

    /// A delivery to `service_id` was claimed and is about to be sent.
    pub fn claimed(&mut self, service_id: i64, name: &str, now: Instant) -> u32 {
        let initial = self.initial;
        let s = self.services.entry(service_id).or_insert_with(|| Service {
            window: initial,
            ..Service::default()
        });
        if s.name != name {
            s.name = name.to_string();
        }
        s.in_flight += 1;
        if let Some(d) = &mut s.down {
            // This is the probe; the next one waits a longer pause.
            d.next_probe_at = now + d.probe_pause;
            d.probe_pause = self.policy.next_probe_pause(d.probe_pause);
        }
        s.in_flight
    }

    /// An attempt to `service_id` finished with `answer`.
    pub fn finished(&mut self, service_id: i64, answer: Answer, now: Instant) -> Transition {
        let Some(s) = self.services.get_mut(&service_id) else {
            return Transition::None;
        };
        s.in_flight = s.in_flight.saturating_sub(1);
        match answer {
            Answer::Answered => {
                s.consecutive_failures = 0;
                s.window = (s.window + 1).min(self.cap);
                if s.down.take().is_some() {
                    Transition::CameBack
                } else {
                    Transition::None
                }
            }
            Answer::Failed => {
                s.consecutive_failures += 1;
                s.window = (s.window / 2).max(1);
                if s.down.is_none() && s.consecutive_failures >= self.down_after {
                    let first_pause = self.policy.first_probe_pause();
                    s.down = Some(Down {
                        next_probe_at: now + first_pause,
                        probe_pause: self.policy.next_probe_pause(first_pause),
                    });
                    Transition::WentDown
                } else {
                    Transition::None
                }
            }
        }
    }

    /// A claimed delivery was not sent after all (its lease ran short,
    /// [`super::fence`]): its slot is free, and it says nothing about the
    /// consumer.
    pub fn abandoned(&mut self, service_id: i64) {
        if let Some(s) = self.services.get_mut(&service_id) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    /// A due probe found no pending delivery: wait a pause before asking again.
    pub fn nothing_to_probe(&mut self, service_id: i64, now: Instant) {
        if let Some(d) = self
            .services
            .get_mut(&service_id)
            .and_then(|s| s.down.as_mut())
        {
            d.next_probe_at = now + d.probe_pause;
        }
    }

    /// Whether `service_id` has as many requests in flight as its window
    /// allows (or is down, one probe at a time): a claim gets none of it.
    pub fn is_full(&self, service_id: i64) -> bool {
        self.services
            .get(&service_id)
            .is_some_and(|s| s.down.is_some() || s.in_flight >= s.window.min(self.cap))
    }

    pub fn in_flight(&self, service_id: i64) -> u32 {
        self.services.get(&service_id).map_or(0, |s| s.in_flight)
    }

    pub fn total_in_flight(&self) -> u32 {
        self.services.values().map(|s| s.in_flight).sum()
    }

    pub fn name(&self, service_id: i64) -> Option<&str> {
        self.services.get(&service_id).map(|s| s.name.as_str())
    }

    /// When the next probe of a down service is due, if any service is down.
    /// Only services with nothing in flight count: a probe waits for those.
    pub fn next_probe_at(&self) -> Option<Instant> {
        self.services
            .values()
            .filter(|s| s.in_flight == 0)
            .filter_map(|s| s.down.as_ref().map(|d| d.next_probe_at))
            .min()
    }

    pub fn is_down(&self, service_id: i64) -> bool {
        self.services
            .get(&service_id)
            .is_some_and(|s| s.down.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::tests::policy;

    fn slot_of(slots: &Slots, id: i64) -> (i32, bool) {
        let i = slots.service_ids.iter().position(|s| *s == id).unwrap();
        (slots.free[i], slots.probe[i])
    }

    #[test]
    fn only_a_2xx_or_a_410_counts_as_an_answer() {
        use crate::delivery::outcome::Failure;
        let retry = |failure| AttemptResult::Retry {
            at: chrono::Utc::now(),
            failure,
        };
        for failure in [
            Failure::Status(400),
            Failure::Status(404),
            Failure::Status(429),
            Failure::Status(302),
            Failure::Status(503),
            Failure::Timeout,
            Failure::Connect,
        ] {
            assert_eq!(Answer::of(&retry(failure)), Answer::Failed, "{failure:?}");
        }
        assert_eq!(
            Answer::of(&AttemptResult::Delivered { status: 204 }),
            Answer::Answered
        );
        assert_eq!(Answer::of(&AttemptResult::Gone), Answer::Answered);
    }

    #[test]
    fn a_service_earns_its_concurrency_by_answering() {
        let now = Instant::now();
        let mut h = Health::new(64, 1, 3, policy());
        assert_eq!(
            h.slots(now).default_free,
            1,
            "an unknown service: one at a time"
        );
        h.claimed(1, "a", now);
        assert_eq!(slot_of(&h.slots(now), 1), (0, false));
        for _ in 0..10 {
            h.finished(1, Answer::Answered, now);
            h.claimed(1, "a", now);
        }
        h.finished(1, Answer::Answered, now);
        assert_eq!(
            slot_of(&h.slots(now), 1),
            (12, false),
            "each answer widens it by one"
        );
        h.claimed(1, "a", now);
        h.finished(1, Answer::Failed, now);
        assert_eq!(slot_of(&h.slots(now), 1), (6, false), "a failure halves it");
        // 300 services that never answer hold one request each.
        for id in 100..400 {
            h.claimed(id, "hanging", now);
        }
        assert_eq!(slot_of(&h.slots(now), 150), (0, false));
        assert_eq!(h.total_in_flight(), 300);
    }

    #[test]
    fn in_flight_is_capped_per_service() {
        let now = Instant::now();
        let mut h = Health::new(2, 2, 3, policy());
        h.claimed(1, "a", now);
        assert_eq!(slot_of(&h.slots(now), 1), (1, false));
        h.claimed(1, "a", now);
        assert_eq!(slot_of(&h.slots(now), 1), (0, false));
        assert_eq!(h.slots(now).default_free, 2);
        h.finished(1, Answer::Answered, now);
        assert_eq!(slot_of(&h.slots(now), 1), (1, false));
    }

    #[test]
    fn a_service_is_full_when_its_window_is_in_flight_or_it_is_down() {
        let now = Instant::now();
        let mut h = Health::new(2, 1, 1, policy());
        assert!(!h.is_full(1), "unknown: nothing in flight");
        h.claimed(1, "a", now);
        assert!(h.is_full(1), "the first window is one request");
        h.finished(1, Answer::Answered, now);
        assert!(!h.is_full(1));
        h.claimed(1, "a", now);
        assert!(!h.is_full(1), "an answer widened the window to two");
        h.claimed(1, "a", now);
        assert!(h.is_full(1), "two in flight, the cap");
        h.finished(1, Answer::Failed, now);
        assert!(h.is_full(1), "down after one failure: probes only");
    }

    #[test]
    fn a_failing_service_is_probed_one_at_a_time_and_comes_back() {
        let now = Instant::now();
        let mut h = Health::new(8, 8, 2, policy());
        h.claimed(1, "a", now);
        h.claimed(1, "a", now);
        assert_eq!(h.finished(1, Answer::Failed, now), Transition::None);
        assert_eq!(h.finished(1, Answer::Failed, now), Transition::WentDown);
        assert_eq!(
            slot_of(&h.slots(now), 1),
            (0, false),
            "no claim until the probe is due"
        );
        let later = h.next_probe_at().unwrap();
        assert_eq!(slot_of(&h.slots(later), 1), (1, true));
        h.claimed(1, "a", later);
        assert_eq!(
            slot_of(&h.slots(later + Duration::from_secs(5)), 1),
            (0, false),
            "one probe at a time"
        );
        assert_eq!(h.finished(1, Answer::Failed, later), Transition::None);
        assert!(h.next_probe_at().unwrap() > later, "the pause grows");
        let again = h.next_probe_at().unwrap();
        h.claimed(1, "a", again);
        assert_eq!(h.finished(1, Answer::Answered, again), Transition::CameBack);
        // Its window, halved by each failure to 1, widens again answer by
        // answer: 2 now.
        assert_eq!(slot_of(&h.slots(again), 1), (2, false));
    }
}
