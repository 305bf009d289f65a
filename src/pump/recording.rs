//! The write-back side of [`Pump::run`](super::Pump::run): finished
//! attempts reach `watchpump.complete()` in batches, and what they settled
//! to becomes metrics, retry wake-ups and a released backlog for a
//! consumer that came back.

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

/// Writes finished attempts back in batches until every sender is gone.
pub(super) async fn complete_loop(
    shared: Arc<Shared>,
    mut done: mpsc::UnboundedReceiver<Answered>,
) {
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

/// Writes one batch back and acts on what it settled to; returns that.
pub(super) async fn complete_batch(shared: &Shared, batch: &[Answered]) -> Vec<store::Settled> {
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
