//! The write-back side of [`Pump::run`](super::Pump::run), off the send
//! path (issue 33): finished attempts and deliveries given back unsent
//! wait here and are written in one flush, at most a flush interval after
//! the first of them (`WATCHPUMP_FLUSH_INTERVAL_MS`, 10 ms: at 10,000
//! deliveries a second, flushes of about 100), or at once when
//! [`COMPLETE_BATCH`] are waiting, a consumer answered 410 or the pump
//! stops: `watchpump.release()` for what goes back, then
//! `watchpump.complete()` for the attempts, each one statement. What they
//! settled to becomes metrics, retry wake-ups and a released backlog for a
//! consumer that came back.
//!
//! A request's slot is free as soon as its answer is in
//! ([`answered`]); the next delivery of its service starts from the queue
//! ahead without waiting for the flush. Its (watch, object) waits for the
//! flush: the lease, which the flush ends, keeps newer news of it from
//! being claimed, so newer news waits at most one flush interval for an
//! older delivery's outcome. A crash loses at most the outcomes not yet
//! flushed: those deliveries are sent again when their leases run out
//! (at least once, as ever).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::health::{Answer, Health, Transition};
use super::{store, Shared};
use crate::delivery::outcome::Finished;
use crate::delivery::State;
use crate::error::Error;
use crate::metrics as m;
use crate::telemetry::TARGET;

/// Most finished attempts written back in one statement.
pub(super) const COMPLETE_BATCH: usize = 1000;

/// What the write-back is given.
pub(super) enum Record {
    /// A finished attempt (boxed: it is most of what goes through, and ten
    /// times the size of the other).
    Answered(Box<Answered>),
    /// Claimed deliveries given back unsent, (delivery, attempt) each, and
    /// why (the label of `watchpump_claims_released_total`).
    Released(Vec<(i64, i32)>, &'static str),
}

/// One flush's worth of records.
#[derive(Default)]
pub(super) struct Flush {
    pub(super) answered: Vec<Answered>,
    released: Vec<(i64, i32)>,
    /// A 410 or a stop is in it: written without waiting for more.
    urgent: bool,
}

impl Flush {
    pub(super) fn add(&mut self, record: Record) {
        match record {
            Record::Answered(a) => {
                self.urgent |= a.slot_held;
                self.answered.push(*a);
            }
            Record::Released(claims, reason) => {
                metrics::counter!(m::CLAIMS_RELEASED, "reason" => reason)
                    .increment(claims.len() as u64);
                self.urgent |= reason == "stop";
                self.released.extend(claims);
            }
        }
    }
}

/// A finished attempt on its way to the write-back, and whether it showed
/// its consumer answering again after being down.
pub(super) struct Answered {
    pub(super) finished: Finished,
    pub(super) came_back: bool,
    /// The consumer's slot is freed after the write-back (a 410).
    pub(super) slot_held: bool,
}

/// What an answer says about its consumer: its slot is free again, and it
/// may have gone down or come back.
pub(super) fn answered(shared: &Shared, f: &Finished) -> bool {
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

/// Writes back what it is given, a flush at a time, until every sender is
/// gone.
pub(super) async fn record_loop(shared: Arc<Shared>, mut records: mpsc::UnboundedReceiver<Record>) {
    let mut open = true;
    while open {
        let Some(first) = records.recv().await else {
            break;
        };
        let mut flush = Flush::default();
        flush.add(first);
        let until = Instant::now() + shared.cfg.flush_interval();
        while flush.answered.len() < COMPLETE_BATCH && !flush.urgent {
            match tokio::time::timeout_at(until, records.recv()).await {
                Ok(Some(record)) => flush.add(record),
                Ok(None) => {
                    open = false;
                    break;
                }
                Err(_) => break,
            }
        }
        // What else is already waiting goes too.
        while flush.answered.len() < COMPLETE_BATCH {
            match records.try_recv() {
                Ok(record) => flush.add(record),
                Err(_) => break,
            }
        }
        write_flush(&shared, flush).await;
        shared.signals.wake.notify_one();
    }
}

/// Writes one flush: what goes back first (so that a 410's watch removal in
/// the same flush drops them), then the attempts; acts on what they settled
/// to, and returns that.
pub(super) async fn write_flush(shared: &Shared, flush: Flush) -> Vec<store::Settled> {
    if !flush.released.is_empty() {
        if let Err(e) = store::release(&shared.pool, &shared.name, &flush.released).await {
            tracing::warn!(error = %e, n = flush.released.len(),
                "cannot give back deliveries claimed ahead; they go again when their leases run out");
        }
    }
    if flush.answered.is_empty() {
        return Vec::new();
    }
    complete_batch(shared, &flush.answered).await
}

/// Writes one batch of attempts back and acts on what it settled to;
/// returns that.
async fn complete_batch(shared: &Shared, batch: &[Answered]) -> Vec<store::Settled> {
    let finished: Vec<&Finished> = batch.iter().map(|a| &a.finished).collect();
    let span = tracing::info_span!(target: TARGET, parent: None, "watchpump.record",
        "watchpump.pump" = %shared.name, "watchpump.attempts" = finished.len());
    // Timed from here to its drop, not entered at every poll (as the
    // turn's span: src/pump/claiming.rs).
    let settled = write_back(shared, &finished).await.unwrap_or_default();
    drop(span);
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
            // complete() may have moved the retry earlier, to the deadline.
            let retry_at = match (finished.and_then(|f| f.result.retry_at()), s.state) {
                (Some(at), State::Pending) => Some(s.next_attempt_at.map_or(at, |due| due.min(at))),
                _ => None,
            };
            if let Some(at) = retry_at {
                retries.remember(at, now);
            }
        }
    }
    for a in batch {
        if a.slot_held {
            // What a claim took of the gone watch since its 410: dropped by
            // this write-back, forgotten here before the slot frees.
            super::claiming::forget_watch(shared, &a.finished);
        }
        let came_back = a.came_back || (a.slot_held && answered(shared, &a.finished));
        if !came_back {
            continue;
        }
        let service_id = a.finished.claimed.service_id;
        if let Err(e) = store::release_backlog(&shared.pool, service_id).await {
            tracing::warn!(error = %e, service_id, "cannot release backlog");
        }
    }
    settled
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
