//! What the pump knows of each consumer service: how many deliveries it has
//! in flight there, and whether the service looks down.
//!
//! A service is down after `down_after` consecutive failed attempts. While
//! down it gets no deliveries but a single probe now and then (the pauses
//! are the retry policy's, [`RetryPolicy::first_probe_pause`]); the first
//! answer releases its whole backlog.
//! In-flight deliveries per service are capped so that a consumer that hangs
//! until timeout cannot take every slot.
//!
//! A claim takes up to one window more than the service has room for in
//! flight (issue 33): those wait in the pump (`pump/ahead.rs`) and start
//! as requests finish, so that a finished request never waits for a claim's
//! round trip. What waits counts here as `queued`: a claim asks for
//! `2 × window - in flight - queued`, and is worth making once that is at
//! least half a window ([`Health::wants_claim`]). A service that fails
//! gives back what waits beyond its (halved) window, and all of it when it
//! goes down ([`Health::excess_queued`]).

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
    /// Claimed and waiting in the pump for a request to free up.
    queued: u32,
    /// Its last claim took all the room it was offered: more may be due.
    more_due: bool,
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
    /// its window leaves free, and one window more to wait in the pump. A
    /// service earns its concurrency by answering
    /// (slow start, as TCP and adaptive load balancers do): it starts at
    /// `initial` requests in flight, each answer widens its window by one
    /// up to the per-service cap, and each failure halves it. A consumer
    /// that hangs therefore holds `initial` of the global budget
    /// (`WATCHPUMP_MAX_IN_FLIGHT`) until its requests time out, not the
    /// per-service cap: 300 services that never answer hold 300 requests,
    /// and a healthy consumer keeps the rest. (Services unknown to this
    /// pump get `initial` too: `default_free`.) A down service gets one
    /// probe, and only when nothing of it is in flight or waiting.
    pub fn slots(&self, now: Instant) -> Slots {
        self.slots_with(now, true)
    }

    /// [`Health::slots`] without the window claimed ahead: what can start at
    /// once ([`super::Pump::step`] sends everything it claims).
    pub fn slots_now(&self, now: Instant) -> Slots {
        self.slots_with(now, false)
    }

    fn slots_with(&self, now: Instant, ahead: bool) -> Slots {
        let mut slots = Slots {
            default_free: self.initial as i32,
            ..Slots::default()
        };
        for (id, s) in &self.services {
            let (free, probe) = match &s.down {
                Some(d) if s.in_flight == 0 && s.queued == 0 && now >= d.next_probe_at => (1, true),
                Some(_) => (0, false),
                None => (self.room(s, ahead) as i32, false),
            };
            slots.service_ids.push(*id);
            slots.free.push(free);
            slots.probe.push(probe);
        }
        slots
    }

    /// What a claim may take of a service that is up: its window (twice
    /// it, `ahead`) less what is in flight and waiting.
    fn room(&self, s: &Service, ahead: bool) -> u32 {
        let window = s.window.min(self.cap);
        let limit = if ahead { window * 2 } else { window };
        limit.saturating_sub(s.in_flight + s.queued)
    }

    /// Whether a claim is worth making for the services this pump knows:
    /// one that is up, whose last claim filled the room it had (so more may
    /// be due), has half a window of room or more; or a down one's probe is
    /// due. A service whose last claim found less than its room waits for
    /// news (a NOTIFY, a write-back, the sweep).
    pub fn wants_claim(&self, now: Instant) -> bool {
        self.services.values().any(|s| match &s.down {
            Some(d) => s.in_flight == 0 && s.queued == 0 && now >= d.next_probe_at,
            None => s.more_due && self.room(s, true) >= (s.window.min(self.cap) / 2).max(1),
        })
    }

    /// What a claim found: of each service offered `free` in `slots` (and
    /// of the others, offered `default_free`), how many it took
    /// (`claimed`, by service). A service that got all it was offered may
    /// have more due ([`Health::wants_claim`]).
    pub fn claim_found(&mut self, slots: &Slots, claimed: &HashMap<i64, u32>) {
        let initial = self.initial;
        for id in claimed.keys() {
            self.services.entry(*id).or_insert_with(|| Service {
                window: initial,
                ..Service::default()
            });
        }
        let offered: HashMap<i64, i32> = slots.service_ids.iter().copied().zip(slots.free.iter().copied()).collect();
        for (id, s) in self.services.iter_mut() {
            let offered = offered.get(id).copied().unwrap_or(slots.default_free);
            if offered > 0 {
                s.more_due = claimed.get(id).copied().unwrap_or(0) >= offered as u32;
            }
        }
    }

    /// `service_id` had nothing queued when its rate's tokens were taken
    /// (`crate::pump::rate::Taken::nothing_queued`): offered nothing, the
    /// claim learnt nothing of it, and it has no more due. Without this, a
    /// backlog whose last claim used every token left it "more due" until
    /// its next delivery, and every finished send claimed again for it.
    pub fn nothing_due(&mut self, service_id: i64) {
        if let Some(s) = self.services.get_mut(&service_id) {
            s.more_due = false;
        }
    }

    /// `n` deliveries of `service_id` were claimed and wait in the pump.
    pub fn queued(&mut self, service_id: i64, name: &str, n: u32) {
        let initial = self.initial;
        let s = self.services.entry(service_id).or_insert_with(|| Service {
            window: initial,
            ..Service::default()
        });
        if s.name != name {
            s.name = name.to_string();
        }
        s.queued += n;
    }

    /// Whether a waiting delivery of `service_id` may start now: the
    /// service is up and its window has room, or it is down and this is
    /// its probe (nothing else in flight). Starting moves it from waiting
    /// to in flight; a probe makes the next one wait a longer pause.
    pub fn start(&mut self, service_id: i64, now: Instant) -> bool {
        let cap = self.cap;
        let Some(s) = self.services.get_mut(&service_id) else {
            return false;
        };
        if s.queued == 0 {
            return false;
        }
        let may = match &s.down {
            Some(_) => s.in_flight == 0,
            None => s.in_flight < s.window.min(cap),
        };
        if !may {
            return false;
        }
        s.queued -= 1;
        s.in_flight += 1;
        if let Some(d) = &mut s.down {
            // This is the probe; the next one waits a longer pause.
            d.next_probe_at = now + d.probe_pause;
            d.probe_pause = self.policy.next_probe_pause(d.probe_pause);
        }
        true
    }

    /// `n` waiting deliveries of `service_id` leave the pump unsent (given
    /// back, or past their fence).
    pub fn unqueued(&mut self, service_id: i64, n: u32) {
        if let Some(s) = self.services.get_mut(&service_id) {
            s.queued = s.queued.saturating_sub(n);
        }
    }

    /// How many of `service_id`'s waiting deliveries it should give back:
    /// all of them while it is down, and what waits beyond its window
    /// otherwise (a failure halved it).
    pub fn excess_queued(&self, service_id: i64) -> u32 {
        self.services.get(&service_id).map_or(0, |s| match s.down {
            Some(_) => s.queued,
            None => s.queued.saturating_sub(s.window.min(self.cap)),
        })
    }

    /// A delivery to `service_id` was claimed and starts at once: [`Health::queued`]
    /// and [`Health::start`] together, for tests of the window.
    #[cfg(test)]
    pub fn claimed(&mut self, service_id: i64, name: &str, now: Instant) -> u32 {
        self.queued(service_id, name, 1);
        self.start(service_id, now);
        self.in_flight(service_id)
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

    pub fn in_flight(&self, service_id: i64) -> u32 {
        self.services.get(&service_id).map_or(0, |s| s.in_flight)
    }

    pub fn total_in_flight(&self) -> u32 {
        self.services.values().map(|s| s.in_flight).sum()
    }

    /// Deliveries waiting in the pump, of `service_id`.
    pub fn queued_of(&self, service_id: i64) -> u32 {
        self.services.get(&service_id).map_or(0, |s| s.queued)
    }

    /// Deliveries waiting in the pump, all services together.
    pub fn total_queued(&self) -> u32 {
        self.services.values().map(|s| s.queued).sum()
    }

    pub fn name(&self, service_id: i64) -> Option<&str> {
        self.services.get(&service_id).map(|s| s.name.as_str())
    }

    /// When the next probe of a down service is due, if any service is down.
    /// Only services with nothing in flight or waiting count: a probe waits
    /// for those.
    pub fn next_probe_at(&self) -> Option<Instant> {
        self.services
            .values()
            .filter(|s| s.in_flight == 0 && s.queued == 0)
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
mod tests;
