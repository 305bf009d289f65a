//! The pump: claims due deliveries, sends them, and records what happened.
//!
//! One loop ([`Pump::run`], `claiming.rs`) claims, one window ahead of each
//! consumer's free requests (`ahead.rs`); each send runs as its own task
//! ([`send`]) and starts the next delivery waiting for its consumer when it
//! finishes; a write-back task writes finished attempts, and deliveries
//! given back unsent, in flushes (`recording.rs`). Between claims the loop
//! sleeps until a NOTIFY ([`wakeup`]), its sweep timer, a consumer with
//! half a window of room, or a down consumer's probe time ([`health`]).
//! [`Pump::step`] does one turn of all that in order, for tests to drive.
//!
//! While it finds work, and for a short linger after, the pump polls; only
//! then does it register in `watchpump.sleepers` and claim once more, so
//! that emitters raise NOTIFY (which serialises their commits) only when a
//! pump may be asleep. A change committed in the gap between an emitter's
//! check and its commit is picked up by the next sweep at the latest.

mod ahead;
mod claiming;
pub mod fence;
pub mod health;
pub mod rate;
mod recording;
mod repeats;
pub mod send;
pub mod store;
pub mod wakeup;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::config::PumpConfig;
use crate::delivery::request::Target;
use crate::delivery::State;
use crate::error::{Error, Result};
use crate::retry::Wakeups;
use health::Health;
use send::Sender;
use wakeup::Signals;

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
    /// Deliveries claimed ahead, waiting for a request to free up. Locked
    /// after `health` when both are.
    ahead: Mutex<ahead::Ahead>,
    signals: Arc<Signals>,
    /// When retries this pump scheduled fall due.
    retries: Mutex<Wakeups>,
    /// Each service's URL, name and signing keys, as of the version claim()
    /// reported.
    destinations: Mutex<HashMap<i64, Arc<Target>>>,
    /// Services whose row could not be read (their secret sealed with a key
    /// this pump lacks): logged once a minute each, not at every claim.
    unreadable: Mutex<repeats::Repeats>,
    /// Payload bytes held by deliveries in flight, each change's once
    /// ([`crate::delivery::Payload::metered`]); capped by
    /// `WATCHPUMP_MAX_IN_FLIGHT_BYTES`.
    in_flight_bytes: Arc<AtomicU64>,
    /// Whether the last claim was held back by a global cap
    /// (`WATCHPUMP_MAX_IN_FLIGHT`, `WATCHPUMP_MAX_IN_FLIGHT_BYTES`): then
    /// every finished send wakes the claim loop, as each frees room.
    claims_held: AtomicBool,
    /// Whether any service has a rate (issue 20, [`rate::Limited`]).
    rates: rate::Limited,
}

impl Pump {
    /// A pump on the database `pool` connects to. The pump opens its own
    /// few connections (see [`pump_pool`]); `pool` itself is not used.
    pub fn new(pool: PgPool, cfg: PumpConfig) -> Result<Self> {
        cfg.validate().map_err(Error::Config)?;
        let pool = pump_pool(&pool, cfg.hold_after_no_answer(), cfg.request_timeout());
        let sender = Sender::new(&cfg).map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        let health = Health::new(
            cfg.service_concurrency,
            cfg.initial_concurrency,
            cfg.down_after_failures,
            cfg.retry_policy(),
        );
        let name = cfg.pump_name();
        let shared = Shared {
            pool,
            name,
            sender,
            health: Mutex::new(health),
            ahead: Mutex::new(ahead::Ahead::default()),
            signals: Arc::new(Signals::default()),
            retries: Mutex::new(Wakeups::default()),
            destinations: Mutex::new(HashMap::new()),
            unreadable: Mutex::new(repeats::Repeats::new(repeats::LOG_EVERY)),
            in_flight_bytes: Arc::new(AtomicU64::new(0)),
            claims_held: AtomicBool::new(false),
            rates: rate::Limited::default(),
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

    /// Runs until `shutdown` resolves, then stops claiming, gives back what
    /// it claimed ahead and has not sent, lets the sends in flight finish
    /// (each is bounded by the request timeout), records them, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let shared = self.shared;
        tracing::info!(pump = %shared.name, "pump started");
        let listener = tokio::spawn(wakeup::listen(shared.pool.clone(), shared.signals.clone()));
        let (records_tx, records_rx) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(recording::record_loop(shared.clone(), records_rx));

        claiming::claim_loop(&shared, records_tx, shutdown).await;

        listener.abort();
        let grace = shared.cfg.request_timeout() + Duration::from_secs(5);
        if tokio::time::timeout(grace, recorder).await.is_err() {
            tracing::warn!("sends still in flight after {grace:?}; their leases will expire");
        }
        // Best effort: a pump stopping while the database restarts cannot
        // take its sleeper row away, and need not; the sweep forgets a
        // sleeper row that stops being refreshed within a minute, and
        // until then producers only NOTIFY for nothing.
        if let Err(e) = store::leave(&shared.pool, &shared.name).await {
            tracing::warn!(error = %e, "could not remove this pump's sleeper row; the sweep will");
        }
        tracing::info!(pump = %shared.name, "pump stopped");
        Ok(())
    }

    /// One turn of the pump, in order and to its end: sweep (deadlines
    /// included), claim what is due, send it, and record every answer
    /// before returning. [`Pump::run`] does the same across tasks (claiming
    /// while earlier sends are on the wire, writing back in batches, sleeping
    /// between turns); a test drives `step` instead, with no loop to poll and
    /// no timer to wait for.
    pub async fn step(&self) -> Result<Step> {
        let shared = &self.shared;
        claiming::sweep(shared, Duration::ZERO).await;
        let turn = claiming::turn_span(shared);
        // Only what can start at once: a step sends all it claims.
        let (claimed, fence) = claiming::claim(shared, false).await?;
        let claimed = claiming::with_destinations(shared, claimed).await;
        let sent = claimed.len();
        turn.record("watchpump.claimed", sent);
        let (records_tx, mut records_rx) = mpsc::unbounded_channel();
        claiming::enqueue(shared, claimed, fence, &records_tx);
        drop(turn);
        drop(records_tx);
        let mut flush = recording::Flush::default();
        while let Some(record) = records_rx.recv().await {
            flush.add(record);
        }
        let settled = recording::write_flush(shared, flush).await;
        Ok(Step {
            sent,
            settled: settled
                .into_iter()
                .map(|s| (s.delivery_id, s.state))
                .collect(),
        })
    }
}

/// What one [`Pump::step`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// Deliveries claimed and sent.
    pub sent: usize,
    /// The deliveries the answers settled, with their states: each one sent
    /// (`Pending` when a retry is scheduled), and any other a 410 dropped
    /// with its watch.
    pub settled: Vec<(i64, State)>,
}

/// Connections of the pump's own, whose transactions commit without waiting
/// for the WAL to reach disk (`synchronous_commit = off`), except claims.
///
/// A crash can lose the last fraction of a second of outcomes: a lost
/// outcome leaves its delivery in flight until its lease expires, and it is
/// sent again (deliveries are at least once, and consumers de-duplicate by
/// delivery id). A lost *claim* would be worse: another pump could take the
/// (watch, object) while this one's request is on the wire, an overlap. So
/// `watchpump.claim()` commits durably itself (issue 19; also to a
/// synchronous standby, so that a failover keeps every lease). The
/// producer's own transactions, which create the deliveries, keep their own
/// setting.
///
/// `hold_after_no_answer` and `request_timeout` go to `watchpump.complete()`
/// as the session settings `watchpump.hold_after_no_answer` and
/// `watchpump.request_timeout` (placeholder settings, read with
/// `current_setting(..., true)`): after an attempt with no answer it holds
/// the (watch, object) for the hold, counted from when the request timeout
/// would have ended the request ([`fence`]). Like the settings above
/// it needs session pooling, not a transaction-pooling proxy.
pub fn pump_pool(
    pool: &PgPool,
    hold_after_no_answer: Duration,
    request_timeout: Duration,
) -> PgPool {
    let hold = format!("{}ms", hold_after_no_answer.as_millis());
    let timeout = format!("{}ms", request_timeout.as_millis());
    let options = (*pool.connect_options())
        .clone()
        // claim() decides the order rule with a fresh snapshot per statement.
        .options([
            ("synchronous_commit", "off"),
            // (PostgreSQL reads the space escaped; sqlx does not escape it.)
            ("default_transaction_isolation", r"read\ committed"),
            ("watchpump.hold_after_no_answer", hold.as_str()),
            ("watchpump.request_timeout", timeout.as_str()),
        ])
        .application_name("watchpump-pump");
    sqlx::postgres::PgPoolOptions::new()
        // The claim loop, the write-back, the listener, and one to spare.
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options)
}
