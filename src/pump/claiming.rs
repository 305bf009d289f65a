//! The claim side of [`Pump::run`](super::Pump::run): one loop that sweeps
//! when due, claims what each consumer has room for and one window ahead
//! ([`super::ahead`]), and starts each delivery that can start as a send
//! task of its own; a send that finishes starts the next one waiting for
//! its service itself ([`start_ready`]). Between claims the loop sleeps
//! until a NOTIFY, its sweep, a retry or probe time, a rate-limited
//! service's next tokens, or a service with half a window of room.
//!
//! Over 400 lines: claiming and starting sends share the pump's per-service
//! state, and a slot passes from a finished send to the next claim here;
//! apart, neither half shows how.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ahead::Ready;
use super::fence::Fence;
use super::recording::{answered, Answered, Record};
use super::{store, Shared};
use crate::delivery::outcome::{AttemptResult, Finished};
use crate::delivery::request::Target;
use crate::delivery::Claimed;
use crate::error::Result;
use crate::metrics as m;
use crate::services;
use crate::telemetry::TARGET;

/// How long the pump waits after a failed claim (database unreachable).
const CLAIM_ERROR_PAUSE: Duration = Duration::from_millis(250);

/// Claims and dispatches until shutdown. Dropping `done` at the end lets the
/// completer finish once the last send has reported.
///
/// After finding work the pump lingers: for `linger` it polls every
/// `poll_interval` instead of asking emitters to NOTIFY, so that a busy pump
/// costs producers nothing at commit. Idle for longer, it registers asleep
/// and waits for a NOTIFY, its sweep, a retry or probe time, a write-back
/// (which ends leases), or a finished send that frees a slot a claim was
/// short of.
pub(super) async fn claim_loop(
    shared: &Arc<Shared>,
    records: mpsc::UnboundedSender<Record>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let (linger, poll_interval) = (shared.cfg.linger(), shared.cfg.poll_interval());
    let mut rate = ClaimRate::new(Instant::now());
    let mut asleep = false;
    let mut last_work: Option<Instant> = None;
    let mut last_sweep: Option<Instant> = None;
    loop {
        // A busy pump never reaches the select below: look at shutdown and
        // the sweep here too.
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = shared.signals.sweep.notified() => last_sweep = None,
            _ = std::future::ready(()) => {}
        }
        if last_sweep.is_none_or(|at| at.elapsed() >= shared.cfg.sweep_interval()) {
            if last_sweep.is_some() {
                metrics::counter!(m::WAKEUPS, "source" => "sweep").increment(1);
            }
            // Deadlines need a scan of the queue: every tenth sweep is
            // often enough.
            sweep(shared, shared.cfg.sweep_interval() * 10).await;
            last_sweep = Some(Instant::now());
        }
        // What a write-back freed (a 410's slot) or left waiting starts.
        start_all_ready(shared, &records);
        let mut pause = None;
        // The turn's span is timed from here to its drop, never entered:
        // nothing under it makes spans of its own, and entering it at every
        // poll of the claim was the traces layer's largest cost per turn.
        let turn = turn_span(shared);
        match claim(shared, true).await {
            Ok((claimed, fence)) if !claimed.is_empty() => {
                let claimed = with_destinations(shared, claimed).await;
                turn.record("watchpump.claimed", claimed.len());
                // watchpump.claim() removed our sleeper row.
                asleep = false;
                // Poll only when busy: at a trickle, NOTIFY is cheap for
                // producers and wakes the pump sooner than a poll would.
                let busy = rate.add(claimed.len(), Instant::now())
                    >= shared.cfg.linger_above_per_sec as f64;
                if busy {
                    last_work = Some(Instant::now());
                }
                enqueue(shared, claimed, fence, &records);
                // Busy, claim again at once while a service has room for
                // half a window; with less, a finished request that leaves
                // that much wakes the loop. At a trickle, go to sleep now:
                // the claim that follows the sleeper row (below) is the one
                // more claim, and it sees what committed since this one. An
                // empty claim before it would cost the database a claim()
                // per delivery for nothing.
                if busy && shared.health.lock().unwrap().wants_claim(Instant::now()) {
                    continue;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "claim failed; trying again shortly");
                asleep = false;
                last_work = None;
                pause = Some(CLAIM_ERROR_PAUSE);
            }
        }
        drop(turn);
        let lingering = !asleep && last_work.is_some_and(|at| at.elapsed() < linger);
        if pause.is_none() && !asleep && !lingering {
            asleep = register_asleep(shared).await;
            continue; // one more claim closes the gap before emitters saw us asleep
        }
        if lingering {
            // Busy sending with every known service's queue ahead full: a
            // finished request wakes the loop for those, and the poll only
            // looks for other services' work, less often.
            let full = !shared.health.lock().unwrap().wants_claim(Instant::now());
            pause = Some(if full {
                poll_interval.max(FULL_POLL)
            } else {
                poll_interval
            });
        }
        let next_probe = shared.health.lock().unwrap().next_probe_at();
        let next_retry = shared.retries.lock().unwrap().next(Instant::now());
        let next_sweep = last_sweep.map(|at| at + shared.cfg.sweep_interval());
        let next_rate_claim = shared.rates.take_next_claim().map(Instant::from_std);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = shared.signals.wake.notified() => {}
            _ = shared.signals.sweep.notified() => last_sweep = None,
            _ = sleep_until(next_sweep) => {}
            _ = sleep_until(next_probe) => {}
            _ = sleep_until(next_retry) => {}
            _ = sleep_until(next_rate_claim) => {}
            _ = sleep_until(pause.map(|p| Instant::now() + p)) => {}
        }
    }
    give_back_all(shared, &records);
}

/// How often a busy pump whose known services all have their queues ahead
/// full polls for other work (instead of `WATCHPUMP_POLL_US`).
const FULL_POLL: Duration = Duration::from_millis(10);

/// Gives back everything waiting in the pump, unsent: it is stopping.
fn give_back_all(shared: &Shared, records: &mpsc::UnboundedSender<Record>) {
    let waiting = {
        let mut health = shared.health.lock().unwrap();
        let waiting = shared.ahead.lock().unwrap().take_all();
        for r in &waiting {
            health.unqueued(r.claimed.service_id, 1);
        }
        waiting
    };
    if !waiting.is_empty() {
        tracing::info!(
            n = waiting.len(),
            "stopping: giving back deliveries claimed ahead"
        );
        let _ = records.send(Record::Released(
            waiting.iter().map(Ready::claim_ref).collect(),
            "stop",
        ));
    }
}

/// Most deliveries one claim takes, whatever the free slots: bounds the
/// claim's statement (its rows, its locks, the result the pump reads) and
/// matches the largest batch written back at once (`COMPLETE_BATCH`).
pub(super) const MAX_CLAIM_ROWS: u32 = 1000;

/// What the global caps (`WATCHPUMP_MAX_IN_FLIGHT`,
/// `WATCHPUMP_MAX_IN_FLIGHT_BYTES`) leave for the next claim, or which cap
/// leaves nothing. `in_flight` counts what waits in the pump too: the
/// requests cap bounds what the pump holds, so the requests on the wire
/// stay under it whatever starts. With nothing in flight the whole byte budget is offered,
/// and a claim always takes its first change whatever its size, so payload
/// bytes in flight stay under the cap plus one payload (at most
/// `watchpump.max_payload_bytes()`'s 16 MiB ceiling), and a large payload
/// still goes, one change at a time.
fn claim_limits(
    cfg: &crate::config::PumpConfig,
    in_flight: u32,
    in_flight_bytes: u64,
) -> std::result::Result<store::ClaimLimits, &'static str> {
    let rows = cfg
        .max_in_flight
        .saturating_sub(in_flight)
        .min(MAX_CLAIM_ROWS);
    if rows == 0 {
        return Err("requests");
    }
    let bytes = cfg.max_in_flight_bytes.saturating_sub(in_flight_bytes);
    if bytes == 0 {
        return Err("bytes");
    }
    Ok(store::ClaimLimits {
        rows: rows as i32,
        bytes: bytes.min(i64::MAX as u64) as i64,
    })
}

/// Sleeps until `at`; with no time, never wakes.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn register_asleep(shared: &Shared) -> bool {
    match store::sleep(&shared.pool, &shared.name).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register as asleep; relying on the sweep");
            false
        }
    }
}

/// One claim with the current per-service limits (with a window ahead, or,
/// `ahead` false, only what can start at once) and what the global caps
/// leave; none at all when they leave nothing (a finished send wakes the
/// loop). The fence says until when they may start being sent.
pub(super) async fn claim(shared: &Shared, ahead: bool) -> Result<(Vec<Claimed>, Fence)> {
    let now = Instant::now();
    // Before the pool's wait and the round trip: the lease, which the
    // database starts later, ends no sooner than this plus the lease.
    let fence = Fence::after_claim(now, &shared.cfg);
    let (mut slots, in_flight) = {
        let health = shared.health.lock().unwrap();
        let slots = if ahead {
            health.slots(now)
        } else {
            health.slots_now(now)
        };
        (slots, health.total_in_flight() + health.total_queued())
    };
    let bytes = shared.in_flight_bytes.load(Ordering::Relaxed);
    metrics::gauge!(m::IN_FLIGHT_BYTES).set(bytes as f64);
    let limits = match claim_limits(&shared.cfg, in_flight, bytes) {
        Ok(limits) => limits,
        Err(cap) => {
            metrics::counter!(m::CLAIMS_HELD, "cap" => cap).increment(1);
            shared.claims_held.store(true, Ordering::Relaxed);
            return Ok((Vec::new(), fence));
        }
    };
    shared.claims_held.store(false, Ordering::Relaxed);
    // Rate-limited services (issue 20) get at most their tokens.
    let taken = super::rate::take(&shared.pool, &shared.rates, &mut slots).await?;
    let claimed = store::claim(
        &shared.pool,
        &shared.name,
        &slots,
        shared.cfg.lease(),
        limits,
        &shared.in_flight_bytes,
    )
    .await?;
    let mut found: HashMap<i64, u32> = HashMap::new();
    for c in &claimed {
        *found.entry(c.service_id).or_default() += 1;
    }
    super::rate::give_back(&shared.pool, &shared.rates, &taken, &found).await?;
    let mut health = shared.health.lock().unwrap();
    health.claim_found(&slots, &found);
    for id in taken.nothing_queued() {
        health.nothing_due(id);
    }
    // A probe that found nothing to send waits its pause like any other.
    for (i, id) in slots.service_ids.iter().enumerate() {
        if slots.probe[i] && !found.contains_key(id) {
            health.nothing_to_probe(*id, now);
        }
    }
    Ok((claimed, fence))
}

/// Pairs each claimed delivery with where and how it goes, loading the
/// services whose version says they changed. A service that cannot be read
/// (the database is gone, or its secret is sealed with a key this pump
/// lacks) keeps what was read of it before, if anything; without that its
/// deliveries are left to their lease. Each such service is logged once a
/// minute ([`super::repeats`]), not at every claim.
pub(super) async fn with_destinations(
    shared: &Shared,
    claimed: Vec<Claimed>,
) -> Vec<(Claimed, Arc<Target>)> {
    let stale: Vec<i64> = {
        let known = shared.destinations.lock().unwrap();
        let mut stale: Vec<i64> = claimed
            .iter()
            .filter(|c| {
                known
                    .get(&c.service_id)
                    .is_none_or(|t| t.destination.version != c.service_version)
            })
            .map(|c| c.service_id)
            .collect();
        stale.sort_unstable();
        stale.dedup();
        stale
    };
    if !stale.is_empty() {
        match services::destinations(&shared.pool, &stale).await {
            Ok(found) => {
                for (id, destination) in found {
                    let target = destination
                        .map_err(|e| e.to_string())
                        .and_then(|d| Target::new(d, &shared.cfg.producer));
                    match target {
                        Ok(t) => {
                            if shared.unreadable.lock().unwrap().recovered(id) {
                                tracing::info!(service = %t.destination.name, service_id = id, "the service can be read again; its deliveries go out");
                            }
                            shared.destinations.lock().unwrap().insert(id, Arc::new(t));
                        }
                        Err(e) => {
                            let due = shared.unreadable.lock().unwrap().failed(id, Instant::now());
                            let known = shared.destinations.lock().unwrap().contains_key(&id);
                            match due {
                                Some(unlogged) if known => {
                                    tracing::error!(error = %e, service_id = id, failed_since_last_logged = unlogged,
                                    "cannot read the service's changed row; its deliveries go on as this pump read it before \
                                     (each claim tries again), and this is logged once a minute while it lasts")
                                }
                                Some(unlogged) => {
                                    tracing::error!(error = %e, service_id = id, failed_since_last_logged = unlogged,
                                    "cannot read the service; its deliveries wait (each claim tries again), \
                                     and this is logged once a minute while it lasts")
                                }
                                None => {}
                            }
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot read the services; their deliveries wait for their lease")
            }
        }
    }
    let known = shared.destinations.lock().unwrap();
    claimed
        .into_iter()
        .filter_map(|c| known.get(&c.service_id).cloned().map(|d| (c, d)))
        .collect()
}

/// Queues claimed deliveries behind their services' others, then starts
/// what their windows have room for.
pub(super) fn enqueue(
    shared: &Arc<Shared>,
    claimed: Vec<(Claimed, Arc<Target>)>,
    fence: Fence,
    records: &mpsc::UnboundedSender<Record>,
) {
    metrics::histogram!(m::CLAIMED_BATCH_SIZE).record(claimed.len() as f64);
    let mut services: Vec<i64> = Vec::new();
    {
        let mut health = shared.health.lock().unwrap();
        let mut ahead = shared.ahead.lock().unwrap();
        for (delivery, target) in claimed {
            if let Some(lost) = &delivery.expired_lease_of {
                tracing::warn!(service = %target.destination.name, delivery_id = delivery.message.delivery_id, pump = %lost,
                    "lease ran out (that pump died or hung before reporting); sending again");
            }
            health.queued(delivery.service_id, &target.destination.name, 1);
            if !services.contains(&delivery.service_id) {
                services.push(delivery.service_id);
            }
            ahead.push(Ready {
                claimed: delivery,
                target,
                fence,
            });
        }
    }
    for service_id in services {
        start_ready(shared, service_id, records);
    }
}

/// [`start_ready`] for every service with deliveries waiting.
pub(super) fn start_all_ready(shared: &Arc<Shared>, records: &mpsc::UnboundedSender<Record>) {
    let services = shared.ahead.lock().unwrap().services();
    for service_id in services {
        start_ready(shared, service_id, records);
    }
}

/// Starts the deliveries of `service_id` waiting in the pump, oldest first,
/// while its window has room, each as a send task of its own. One whose
/// claim's fence has passed while it waited is given back unsent.
pub(super) fn start_ready(
    shared: &Arc<Shared>,
    service_id: i64,
    records: &mpsc::UnboundedSender<Record>,
) {
    let now = Instant::now();
    let mut late = Vec::new();
    let mut started = Vec::new();
    {
        let mut health = shared.health.lock().unwrap();
        let mut ahead = shared.ahead.lock().unwrap();
        while health.start(service_id, now) {
            let Some(ready) = ahead.pop(service_id) else {
                // Counted but not there (cannot happen): undo, and stop.
                health.abandoned(service_id);
                break;
            };
            if ready.fence.allows(now) {
                started.push(ready);
            } else {
                health.abandoned(service_id);
                late.push(ready);
            }
        }
        set_gauges(&health, service_id, started.first().or(late.first()));
    }
    if !late.is_empty() {
        for r in &late {
            warn_abandoned(r);
        }
        let _ = records.send(Record::Released(
            late.iter().map(Ready::claim_ref).collect(),
            "fence",
        ));
    }
    for ready in started {
        spawn_send(shared, ready, records.clone());
    }
}

/// The in-flight and waiting gauges of a service, named by one of its
/// deliveries' targets (none: nothing to name it by, nothing set).
fn set_gauges(health: &super::health::Health, service_id: i64, any: Option<&Ready>) {
    let Some(r) = any else { return };
    let service = r.target.destination.name.clone();
    metrics::gauge!(m::IN_FLIGHT, "service" => service.clone())
        .set(health.in_flight(service_id) as f64);
    metrics::gauge!(m::CLAIMED_AHEAD, "service" => service)
        .set(health.queued_of(service_id) as f64);
}

/// One send as a task of its own. It checks the claim's fence just before
/// it sends ([`super::fence`]): a delivery whose lease no longer covers the
/// request and the hold after it is given back unsent. When the answer is
/// in, its service's next waiting delivery starts at once; the outcome goes
/// to the write-back.
fn spawn_send(shared: &Arc<Shared>, ready: Ready, records: mpsc::UnboundedSender<Record>) {
    let shared = shared.clone();
    tokio::spawn(async move {
        let Ready {
            claimed,
            target,
            fence,
        } = ready;
        let service_id = claimed.service_id;
        if !fence.allows(Instant::now()) {
            abandon(&shared, &claimed, &target, &records);
            return;
        }
        let finished = shared.sender.send(claimed, target).await;
        // The consumer's slot is free as soon as it answered; the
        // outcome's write-back follows in a flush (the lease keeps the
        // (watch, object) until then). After a 410 the slot waits for the
        // write-back instead, and what waits of the gone watch goes back,
        // so that the watch's other deliveries are dropped before one of
        // them is sent.
        let gone = finished.result == AttemptResult::Gone;
        let came_back = !gone && answered(&shared, &finished);
        if gone {
            forget_watch(&shared, &finished);
        } else {
            give_back_excess(&shared, service_id, &records);
        }
        let _ = records.send(Record::Answered(Box::new(Answered {
            finished,
            came_back,
            slot_held: gone,
        })));
        if !gone {
            start_ready(&shared, service_id, &records);
            // Half a window of room, or a claim short of the global caps:
            // worth a claim now.
            if shared.claims_held.load(Ordering::Relaxed)
                || shared.health.lock().unwrap().wants_claim(Instant::now())
            {
                shared.signals.wake.notify_one();
            }
        }
    });
}

/// After a failure: what waits of the service beyond its halved window goes
/// back, all of it once the service is down.
fn give_back_excess(shared: &Shared, service_id: i64, records: &mpsc::UnboundedSender<Record>) {
    let back = {
        let mut health = shared.health.lock().unwrap();
        let excess = health.excess_queued(service_id);
        if excess == 0 {
            return;
        }
        let back = shared
            .ahead
            .lock()
            .unwrap()
            .take_newest(service_id, excess as usize);
        health.unqueued(service_id, back.len() as u32);
        back
    };
    let down = shared.health.lock().unwrap().is_down(service_id);
    let _ = records.send(Record::Released(
        back.iter().map(Ready::claim_ref).collect(),
        if down { "down" } else { "window" },
    ));
}

/// After a 410, and again once its write-back is done: what waits of the
/// gone watch in the pump is forgotten, never sent. The write-back drops it
/// with the watch (`watchpump.complete()`, which drops what this pump holds
/// of a gone watch), including what a claim took of it in between.
pub(super) fn forget_watch(shared: &Shared, gone: &Finished) {
    let service_id = gone.claimed.service_id;
    let mut health = shared.health.lock().unwrap();
    let forgotten = shared
        .ahead
        .lock()
        .unwrap()
        .take_watch(service_id, gone.claimed.message.watch_id);
    health.unqueued(service_id, forgotten.len() as u32);
    if !forgotten.is_empty() {
        metrics::counter!(m::CLAIMS_RELEASED, "reason" => "gone").increment(forgotten.len() as u64);
    }
}

/// A delivery whose lease no longer covers its request: not sent, given
/// back, its slot freed without counting for or against its consumer.
fn abandon(
    shared: &Arc<Shared>,
    delivery: &Claimed,
    target: &Target,
    records: &mpsc::UnboundedSender<Record>,
) {
    warn_abandoned_of(delivery, target);
    let in_flight = {
        let mut health = shared.health.lock().unwrap();
        health.abandoned(delivery.service_id);
        health.in_flight(delivery.service_id)
    };
    metrics::gauge!(m::IN_FLIGHT, "service" => target.destination.name.clone())
        .set(in_flight as f64);
    let _ = records.send(Record::Released(
        vec![(delivery.message.delivery_id, delivery.message.attempt)],
        "fence",
    ));
    start_ready(shared, delivery.service_id, records);
}

fn warn_abandoned(r: &Ready) {
    warn_abandoned_of(&r.claimed, &r.target);
}

fn warn_abandoned_of(delivery: &Claimed, target: &Target) {
    let service = target.destination.name.clone();
    tracing::warn!(service = %service, delivery_id = delivery.message.delivery_id,
        "lease too short to send (the claim, the database or the consumer was slow); given back unsent");
    metrics::counter!(m::SENDS_ABANDONED, "service" => service).increment(1);
}

/// A turn of the claim loop as a trace span: the claim (and the services'
/// destinations) and the dispatch of what it claimed; each send is a
/// trace of its own change's, not a child of this.
pub(super) fn turn_span(shared: &Shared) -> tracing::Span {
    tracing::info_span!(target: TARGET, parent: None, "watchpump.pump.turn",
        "watchpump.pump" = %shared.name, "watchpump.claimed" = 0)
}

/// The backstop: passed deadlines, missed notifications (expired leases
/// need nothing: a claim takes them again).
pub(super) async fn sweep(shared: &Shared, deadlines_every: Duration) {
    let _span = tracing::info_span!(target: TARGET, parent: None, "watchpump.sweep",
        "watchpump.pump" = %shared.name);
    match store::sweep(&shared.pool, &shared.name, deadlines_every).await {
        Ok(swept) => {
            for s in swept {
                if s.failed > 0 {
                    tracing::warn!(service = %s.service, n = s.failed, "deliveries failed: deadline passed");
                    metrics::counter!(m::DELIVERIES, "service" => s.service, "outcome" => "failed")
                        .increment(s.failed as u64);
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "sweep failed"),
    }
}

/// Deliveries claimed per second: the busier of the last full quarter
/// second and the current one so far.
#[derive(Debug)]
struct ClaimRate {
    window_start: Instant,
    claimed: usize,
    previous_per_sec: f64,
}

impl ClaimRate {
    const WINDOW: Duration = Duration::from_millis(250);

    fn new(now: Instant) -> Self {
        ClaimRate {
            window_start: now,
            claimed: 0,
            previous_per_sec: 0.0,
        }
    }

    /// Counts `n` deliveries claimed at `now` and returns the rate.
    fn add(&mut self, n: usize, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= Self::WINDOW {
            self.previous_per_sec = self.claimed as f64 / elapsed.as_secs_f64();
            self.window_start = now;
            self.claimed = 0;
        }
        self.claimed += n;
        let current = self.claimed as f64 / Self::WINDOW.as_secs_f64();
        self.previous_per_sec.max(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_rate_tells_a_trickle_from_a_busy_pump() {
        let start = Instant::now();
        let mut rate = ClaimRate::new(start);
        // 200 a second, one at a time: a trickle.
        let mut seen = 0.0;
        for i in 0..400u64 {
            seen = rate.add(1, start + Duration::from_millis(5 * i));
        }
        assert!(seen < 500.0, "a trickle: {seen}");
        // 2,000 a second in batches of 20: busy within the first window.
        let busy = start + Duration::from_secs(3);
        let mut seen = 0.0;
        for i in 0..10u64 {
            seen = rate.add(20, busy + Duration::from_millis(10 * i));
        }
        assert!(seen >= 500.0, "busy: {seen}");
        // Quiet for two seconds: a trickle again.
        assert!(rate.add(1, busy + Duration::from_secs(2)) < 500.0);
    }

    #[test]
    fn the_global_caps_bound_each_claim() {
        let mut cfg = crate::config::PumpConfig::new("git", "t");
        cfg.max_in_flight = 512;
        cfg.max_in_flight_bytes = 1000;
        let limits = claim_limits(&cfg, 500, 0).unwrap();
        assert_eq!((limits.rows, limits.bytes), (12, 1000));
        assert_eq!(claim_limits(&cfg, 0, 0).unwrap().rows, 512);
        assert_eq!(claim_limits(&cfg, 512, 0).unwrap_err(), "requests");
        assert_eq!(claim_limits(&cfg, 1, 1000).unwrap_err(), "bytes");
        assert_eq!(claim_limits(&cfg, 1, 400).unwrap().bytes, 600);
    }
}
