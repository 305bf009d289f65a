//! The pump: claims due deliveries, sends them, and records what happened.
//!
//! One loop ([`Pump::run`]) claims and dispatches; each send runs as its own
//! task; a completer task writes finished attempts back in batches. Between
//! claims the loop sleeps until a NOTIFY ([`wakeup`]), its sweep timer, a
//! finished send freeing a slot, or a down consumer's probe time.
//!
//! While it finds work, and for a short linger after, the pump polls; only
//! then does it register in `watchpump.sleepers` and claim once more, so
//! that emitters raise NOTIFY (which serialises their commits) only when a
//! pump may be asleep. A change committed in the gap between an emitter's
//! check and its commit is picked up by the next sweep at the latest.

pub mod health;
pub mod send;
pub mod store;
pub mod wakeup;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::PumpConfig;
use crate::delivery::outcome::{AttemptResult, Finished};
use crate::delivery::request::Target;
use crate::delivery::{Claimed, State};
use crate::error::{Error, Result};
use crate::metrics as m;
use crate::retry::Wakeups;
use crate::services;
use health::{Answer, Health, Transition};
use send::Sender;
use wakeup::Signals;

/// Most finished attempts written back in one statement.
const COMPLETE_BATCH: usize = 1000;
/// How long the pump waits after a failed claim (database unreachable).
const CLAIM_ERROR_PAUSE: Duration = Duration::from_millis(250);

/// A delivery pump. Several may run against one database.
pub struct Pump {
    shared: Arc<Shared>,
}

struct Shared {
    pool: PgPool,
    cfg: PumpConfig,
    name: String,
    sender: Sender,
    health: Mutex<Health>,
    signals: Arc<Signals>,
    /// When retries this pump scheduled fall due.
    retries: Mutex<Wakeups>,
    /// Each service's URL, name and signing keys, as of the version claim()
    /// reported.
    destinations: Mutex<HashMap<i64, Arc<Target>>>,
}

impl Pump {
    /// A pump on the database `pool` connects to. The pump opens its own
    /// few connections (see [`pump_pool`]); `pool` itself is not used.
    pub fn new(pool: PgPool, cfg: PumpConfig) -> Result<Self> {
        cfg.validate().map_err(Error::Config)?;
        let pool = pump_pool(&pool);
        let sender = Sender::new(&cfg).map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        let health = Health::new(
            cfg.service_concurrency,
            cfg.down_after_failures,
            cfg.retry_policy(),
        );
        let name = cfg.pump_name();
        let shared = Shared {
            pool,
            name,
            sender,
            health: Mutex::new(health),
            signals: Arc::new(Signals::default()),
            retries: Mutex::new(Wakeups::default()),
            destinations: Mutex::new(HashMap::new()),
            cfg,
        };
        Ok(Pump {
            shared: Arc::new(shared),
        })
    }

    /// This pump's name, as it appears in leases and attempts.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Runs until `shutdown` resolves, then stops claiming, lets the sends in
    /// flight finish (each is bounded by the request timeout), records them,
    /// and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let shared = self.shared;
        tracing::info!(pump = %shared.name, "pump started");
        let listener = tokio::spawn(wakeup::listen(shared.pool.clone(), shared.signals.clone()));
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let completer = tokio::spawn(complete_loop(shared.clone(), done_rx));

        claim_loop(&shared, done_tx, shutdown).await;

        listener.abort();
        let grace = shared.cfg.request_timeout() + Duration::from_secs(5);
        if tokio::time::timeout(grace, completer).await.is_err() {
            tracing::warn!("sends still in flight after {grace:?}; their leases will expire");
        }
        store::leave(&shared.pool, &shared.name).await?;
        tracing::info!(pump = %shared.name, "pump stopped");
        Ok(())
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

/// Connections of the pump's own, whose transactions commit without waiting
/// for the WAL to reach disk (`synchronous_commit = off`).
///
/// Waiting for the disk was most of a claim's time (a claim is a write), and
/// it is not needed for safety: a crash can lose at most the last fraction of
/// a second of claims and outcomes, and a lost claim leaves the delivery
/// pending, a lost outcome leaves it in flight until its lease expires;
/// either way it is sent again (deliveries are at least once, and consumers
/// de-duplicate by delivery id). The producer's own transactions, which
/// create the deliveries, keep their own setting.
pub fn pump_pool(pool: &PgPool) -> PgPool {
    let options = (*pool.connect_options())
        .clone()
        // claim() decides the order rule with a fresh snapshot per statement.
        .options([
            ("synchronous_commit", "off"),
            // (PostgreSQL reads the space escaped; sqlx does not escape it.)
            ("default_transaction_isolation", r"read\ committed"),
        ])
        .application_name("watchpump-pump");
    sqlx::postgres::PgPoolOptions::new()
        // The claim loop, the completer, the listener, and one to spare.
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options)
}

/// Claims and dispatches until shutdown. Dropping `done` at the end lets the
/// completer finish once the last send has reported.
///
/// After finding work the pump lingers: for `linger` it polls every
/// `poll_interval` instead of asking emitters to NOTIFY, so that a busy pump
/// costs producers nothing at commit. Idle for longer, it registers asleep
/// and waits for a NOTIFY, its sweep, a retry or probe time, or a finished
/// send.
async fn claim_loop(
    shared: &Arc<Shared>,
    done: mpsc::UnboundedSender<Answered>,
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
            sweep(shared).await;
            last_sweep = Some(Instant::now());
        }
        let mut pause = None;
        match claim(shared).await {
            Ok(claimed) if !claimed.is_empty() => {
                let claimed = with_destinations(shared, claimed).await;
                // watchpump.claim() removed our sleeper row.
                asleep = false;
                // Poll only when busy: at a trickle, NOTIFY is cheap for
                // producers and wakes the pump sooner than a poll would.
                if rate.add(claimed.len(), Instant::now()) >= shared.cfg.linger_above_per_sec as f64
                {
                    last_work = Some(Instant::now());
                }
                dispatch(shared, claimed, &done);
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "claim failed; trying again shortly");
                asleep = false;
                last_work = None;
                pause = Some(CLAIM_ERROR_PAUSE);
            }
        }
        let lingering = !asleep && last_work.is_some_and(|at| at.elapsed() < linger);
        if pause.is_none() && !asleep && !lingering {
            asleep = register_asleep(shared).await;
            continue; // one more claim closes the gap before emitters saw us asleep
        }
        if lingering {
            pause = Some(poll_interval);
        }
        let next_probe = shared.health.lock().unwrap().next_probe_at();
        let next_retry = shared.retries.lock().unwrap().next(Instant::now());
        let next_sweep = last_sweep.map(|at| at + shared.cfg.sweep_interval());
        tokio::select! {
            _ = &mut shutdown => break,
            _ = shared.signals.wake.notified() => {}
            _ = shared.signals.sweep.notified() => last_sweep = None,
            _ = sleep_until(next_sweep) => {}
            _ = sleep_until(next_probe) => {}
            _ = sleep_until(next_retry) => {}
            _ = sleep_until(pause.map(|p| Instant::now() + p)) => {}
        }
    }
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

/// One claim with the current per-service limits.
async fn claim(shared: &Shared) -> Result<Vec<Claimed>> {
    let now = Instant::now();
    let slots = shared.health.lock().unwrap().slots(now);
    let claimed = store::claim(&shared.pool, &shared.name, &slots, shared.cfg.lease()).await?;
    // A probe that found nothing to send waits its pause like any other.
    let mut health = shared.health.lock().unwrap();
    for (i, id) in slots.service_ids.iter().enumerate() {
        if slots.probe[i] && !claimed.iter().any(|c| c.service_id == *id) {
            health.nothing_to_probe(*id, now);
        }
    }
    Ok(claimed)
}

/// Pairs each claimed delivery with where and how it goes, loading the
/// services whose version says they changed. A service that cannot be read
/// (the database is gone) has its deliveries left to their lease.
async fn with_destinations(shared: &Shared, claimed: Vec<Claimed>) -> Vec<(Claimed, Arc<Target>)> {
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
    for id in stale {
        let target = services::destination(&shared.pool, id)
            .await
            .map_err(|e| e.to_string())
            .and_then(|d| Target::new(d, &shared.cfg.producer));
        match target {
            Ok(t) => {
                shared.destinations.lock().unwrap().insert(id, Arc::new(t));
            }
            Err(e) => {
                tracing::error!(error = %e, service_id = id, "cannot read the service; its deliveries wait for their lease")
            }
        }
    }
    let known = shared.destinations.lock().unwrap();
    claimed
        .into_iter()
        .filter_map(|c| known.get(&c.service_id).cloned().map(|d| (c, d)))
        .collect()
}

fn dispatch(
    shared: &Arc<Shared>,
    claimed: Vec<(Claimed, Arc<Target>)>,
    done: &mpsc::UnboundedSender<Answered>,
) {
    metrics::histogram!(m::CLAIMED_BATCH_SIZE).record(claimed.len() as f64);
    let now = Instant::now();
    let mut health = shared.health.lock().unwrap();
    for (delivery, target) in claimed {
        if let Some(lost) = &delivery.expired_lease_of {
            tracing::warn!(service = %target.destination.name, delivery_id = delivery.message.delivery_id, pump = %lost,
                "lease ran out (that pump died or hung before reporting); sending again");
        }
        let in_flight = health.claimed(delivery.service_id, &target.destination.name, now);
        metrics::gauge!(m::IN_FLIGHT, "service" => target.destination.name.clone())
            .set(in_flight as f64);
        let shared = shared.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let finished = shared.sender.send(delivery, target).await;
            // The consumer's slot is free as soon as it answered; the
            // outcome's write-back follows in a batch (the lease keeps the
            // (watch, object) until then). After a 410 the slot waits for
            // the write-back instead, so that the gone watch's other
            // deliveries are dropped before one of them is sent.
            let gone = finished.result == AttemptResult::Gone;
            let came_back = !gone && answered(&shared, &finished);
            let _ = done.send(Answered {
                finished,
                came_back,
                slot_held: gone,
            });
            if !gone {
                shared.signals.wake.notify_one();
            }
        });
    }
}

/// A finished attempt on its way to the write-back, and whether it showed
/// its consumer answering again after being down.
struct Answered {
    finished: Finished,
    came_back: bool,
    /// The consumer's slot is freed after the write-back (a 410).
    slot_held: bool,
}

/// What an answer says about its consumer: its slot is free again, and it
/// may have gone down or come back.
fn answered(shared: &Shared, f: &Finished) -> bool {
    let service = f.target.destination.name.as_str();
    metrics::histogram!(m::ATTEMPT_DURATION, "service" => service.to_string(), "result" => f.result.as_label())
        .record(f.duration.as_secs_f64());
    let mut health = shared.health.lock().unwrap();
    let transition = health.finished(f.claimed.service_id, Answer::of(&f.result), Instant::now());
    metrics::gauge!(m::IN_FLIGHT, "service" => service.to_string())
        .set(health.in_flight(f.claimed.service_id) as f64);
    match transition {
        Transition::WentDown => tracing::warn!(service, "consumer looks down; probing it"),
        Transition::CameBack => {
            tracing::info!(service, "consumer answers again; releasing its backlog");
            return true;
        }
        Transition::None => {}
    }
    false
}

/// The backstop: expired leases, passed deadlines, missed notifications.
async fn sweep(shared: &Shared) {
    // Deadlines need a scan of the queue: every tenth sweep is often enough.
    let deadlines_every = shared.cfg.sweep_interval() * 10;
    match store::sweep(&shared.pool, &shared.name, deadlines_every).await {
        Ok(swept) => {
            for s in swept {
                if s.expired_leases > 0 {
                    tracing::warn!(service = %s.service, n = s.expired_leases, "leases expired; deliveries are due again");
                }
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

/// Writes finished attempts back in batches until every sender is gone.
async fn complete_loop(shared: Arc<Shared>, mut done: mpsc::UnboundedReceiver<Answered>) {
    let mut batch = Vec::with_capacity(COMPLETE_BATCH);
    while let Some(first) = done.recv().await {
        batch.push(first);
        while batch.len() < COMPLETE_BATCH {
            match done.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        complete_batch(&shared, &batch).await;
        batch.clear();
        shared.signals.wake.notify_one();
    }
}

async fn complete_batch(shared: &Shared, batch: &[Answered]) {
    let finished: Vec<&Finished> = batch.iter().map(|a| &a.finished).collect();
    let settled = write_back(shared, &finished).await.unwrap_or_default();
    let now = Instant::now();
    {
        let health = shared.health.lock().unwrap();
        let by_id: HashMap<i64, &Finished> = finished
            .iter()
            .map(|f| (f.claimed.message.delivery_id, *f))
            .collect();
        let mut retries = shared.retries.lock().unwrap();
        for s in &settled {
            let finished = by_id.get(&s.delivery_id).copied();
            record_settled(&health, s, finished);
            let retry_at = match (finished.and_then(|f| f.result.retry_at()), s.state) {
                (Some(at), State::Pending) => Some(at),
                _ => None,
            };
            if let Some(at) = retry_at {
                retries.remember(at, now);
            }
        }
    }
    for a in batch {
        let came_back = a.came_back || (a.slot_held && answered(shared, &a.finished));
        if !came_back {
            continue;
        }
        let service_id = a.finished.claimed.service_id;
        if let Err(e) = store::release_backlog(&shared.pool, service_id).await {
            tracing::warn!(error = %e, service_id, "cannot release backlog");
        }
    }
}

/// `watchpump.complete()`, retried while the lease still protects the batch.
/// A batch the database refuses outright (bad data in one row) is written
/// row by row, so that one bad outcome cannot sink the others.
async fn write_back(shared: &Shared, batch: &[&Finished]) -> Option<Vec<store::Settled>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        match store::complete(&shared.pool, &shared.name, batch).await {
            Ok(settled) => return Some(settled),
            Err(e) if is_refused_data(&e) && batch.len() > 1 => {
                tracing::warn!(error = %e, n = batch.len(), "outcomes refused; writing them one by one");
                let mut settled = Vec::new();
                for one in batch.chunks(1) {
                    match store::complete(&shared.pool, &shared.name, one).await {
                        Ok(rows) => settled.extend(rows),
                        Err(e) => {
                            tracing::error!(error = %e, delivery_id = one[0].claimed.message.delivery_id,
                            "cannot record this attempt; its lease will expire and it will be sent again")
                        }
                    }
                }
                return Some(settled);
            }
            Err(e) if !is_refused_data(&e) && started.elapsed() + pause < shared.cfg.lease() => {
                tracing::warn!(error = %e, "cannot record attempts; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(error = %e, n = batch.len(), "cannot record attempts; leases will expire and they will be sent again");
                return None;
            }
        }
    }
}

/// A data error (SQLSTATE class 22 or 23): trying the same again cannot help.
fn is_refused_data(e: &Error) -> bool {
    match e {
        Error::Database(sqlx::Error::Database(d)) => d
            .code()
            .is_some_and(|c| c.starts_with("22") || c.starts_with("23")),
        _ => false,
    }
}

fn record_settled(health: &Health, s: &store::Settled, finished: Option<&Finished>) {
    let service = finished
        .map(|f| f.target.destination.name.clone())
        .or_else(|| health.name(s.service_id).map(str::to_string))
        .unwrap_or_else(|| s.service_id.to_string());
    let outcome = match s.state {
        State::Pending => "retry_scheduled",
        other => other.as_str(),
    };
    if let (Some(f), State::Delivered) = (finished, s.state) {
        let answered = f.started + chrono::Duration::from_std(f.duration).unwrap_or_default();
        let latency = (answered - f.claimed.message.occurred_at)
            .to_std()
            .unwrap_or_default();
        metrics::histogram!(m::DELIVERY_LATENCY, "service" => service.clone())
            .record(latency.as_secs_f64());
    }
    metrics::counter!(m::DELIVERIES, "service" => service, "outcome" => outcome.to_string())
        .increment(1);
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
}
