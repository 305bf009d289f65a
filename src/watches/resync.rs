//! Resync (issue 20, docs/protocol.md "Resync"): the newest retained change
//! of every object a watch covers, that matches its filters, queued again
//! for it as a replayed delivery (`"replay": true` in the body). The rules
//! are SQL's (`sql/functions/0700_consumer.sql`, "RESYNC"); this is their
//! one caller, for the API and the CLI alike.
//!
//! [`start`] takes the service's one resync slot (one resync per service at
//! a time, issue 34) and counts what the watch covers; [`run`] goes through
//! the objects in batches of [`BATCH`], each its own short transaction,
//! then gives the slot back. The API answers 202 after
//! [`start_for_consumer`], which also takes the objects from the service's
//! daily replay budget, and runs [`run`] in a task of its own
//! ([`spawn_for_consumer`], which gives back what was not queued); the
//! operator's panel and CLI use [`start`], without a budget.

use sqlx::PgPool;

use crate::db::consumer as db;
pub use crate::db::consumer::{ConsumerStarted, Started};
use crate::error::{Error, Result};

/// Objects per batch: one transaction each, holding at most this many of
/// the order rule's stream locks (a claim that meets one skips that
/// (watch, object) until the batch commits) and queueing at most this
/// many deliveries.
pub const BATCH: i32 = 200;

/// What a finished resync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Done {
    /// Objects looked at.
    pub objects: i64,
    /// Replays queued (an object with no matching retained change, or with
    /// the same or newer news already queued, gets none).
    pub queued: i64,
}

/// Takes the watch's resync slot, as the operator (the CLI and the panel:
/// no replay budget). Another service's watch, or a removed one, is
/// [`Error::NotFound`]; a service with a resync running is a database
/// error with SQLSTATE 54000 (the API's 429; [`is_running`]).
pub async fn start(pool: &PgPool, service_id: i64, watch_id: i64, max: u32) -> Result<Started> {
    let max = i32::try_from(max).unwrap_or(i32::MAX);
    let started = db::resync_start(pool, service_id, watch_id, max).await;
    counted(started.map_err(Error::raised), |s| s.truncated)
}

/// [`start`] for a consumer, through the API: one resync per service at a
/// time as [`start`], and at most as many objects as the service's replay
/// budget holds (`watchpump.consumer_resync_start()`); a spent budget is a
/// database error with SQLSTATE 54000 too ([`is_out_of_replays`]). The
/// caller runs it with [`spawn_for_consumer`], which gives back to the
/// budget the replays it did not queue.
pub async fn start_for_consumer(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    max: u32,
) -> Result<ConsumerStarted> {
    let max = i32::try_from(max).unwrap_or(i32::MAX);
    let started = db::consumer_resync_start(pool, service_id, watch_id, max).await;
    counted(started.map_err(Error::raised), |s| s.truncated)
}

/// A start counted in `watchpump_resyncs_total` by its outcome (truncated,
/// started, or refused while another runs); other errors are not counted.
fn counted<T>(started: Result<T>, truncated: impl Fn(&T) -> bool) -> Result<T> {
    let outcome = match &started {
        Ok(s) if truncated(s) => Some("truncated"),
        Ok(_) => Some("started"),
        Err(e) if is_running(e) => Some("refused"),
        Err(_) => None,
    };
    if let Some(outcome) = outcome {
        metrics::counter!(crate::metrics::RESYNCS, "outcome" => outcome).increment(1);
    }
    started
}

/// Whether a 54000 from [`start_for_consumer`] says the replay budget is
/// spent (rather than that a resync of the service runs).
pub fn is_out_of_replays(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d)
        if d.code().as_deref() == Some("54000") && d.message().contains("used up its replays"))
}

/// Whether `e` is [`start`]'s refusal of a second resync of a service (or,
/// from [`start_for_consumer`], of a spent replay budget).
pub fn is_running(e: &Error) -> bool {
    matches!(e, Error::Database(sqlx::Error::Database(d)) if d.code().as_deref() == Some("54000"))
}

/// Goes through at most `max` objects of the watch, [`BATCH`] at a time,
/// then gives the slot back (also when a batch fails).
pub async fn run(pool: &PgPool, watch_id: i64, max: u32) -> Result<Done> {
    let done = batches(pool, watch_id, max).await;
    finish(pool, watch_id, done).await
}

/// Gives the slot back, whatever `done` says, and returns it.
async fn finish(pool: &PgPool, watch_id: i64, done: Result<Done>) -> Result<Done> {
    let finished = db::resync_finish(pool, watch_id).await;
    let done = done?;
    finished?;
    Ok(done)
}

async fn batches(pool: &PgPool, watch_id: i64, max: u32) -> Result<Done> {
    let mut done = Done::default();
    let mut after: Option<String> = None;
    loop {
        let limit = (i64::from(max) - done.objects).min(i64::from(BATCH));
        if limit <= 0 {
            return Ok(done);
        }
        let db::ResyncBatch {
            last_object: last,
            objects,
            queued,
        } = db::resync_batch(pool, watch_id, after.as_deref(), limit as i32).await?;
        done.objects += i64::from(objects);
        done.queued += i64::from(queued);
        metrics::counter!(crate::metrics::RESYNC_REPLAYS).increment(queued as u64);
        if i64::from(objects) < limit {
            return Ok(done);
        }
        after = last;
    }
}

/// [`run`] over the `objects` [`start_for_consumer`] took from the
/// service's budget, in a task of its own. The replays it did not queue go
/// back to the budget before the slot is given back, so that the
/// service's next resync (which needs the slot) sees them; a resync that
/// fails partway gives nothing back (what it queued is not known then).
pub fn spawn_for_consumer(pool: PgPool, service_id: i64, watch_id: i64, objects: u32) {
    tokio::spawn(async move {
        let done = batches(&pool, watch_id, objects).await;
        if let Ok(done) = &done {
            let unused = i64::from(objects) - done.queued;
            let unused = i32::try_from(unused.max(0)).unwrap_or(i32::MAX);
            let given = db::give_back_replays(&pool, service_id, unused).await;
            if let Err(e) = given {
                tracing::warn!(watch_id, error = %e, "cannot give unused replays back");
            }
        }
        logged(watch_id, finish(&pool, watch_id, done).await);
    });
}

/// [`run`] in a task of its own, for the operator's panel: its outcome is
/// logged.
pub fn spawn(pool: PgPool, watch_id: i64, max: u32) {
    tokio::spawn(async move {
        logged(watch_id, run(&pool, watch_id, max).await);
    });
}

/// A resync task's end, in the log: the objects it went through and the
/// replays it queued, or why it failed.
fn logged(watch_id: i64, outcome: Result<Done>) {
    match outcome {
        Ok(done) => tracing::info!(
            watch_id,
            objects = done.objects,
            queued = done.queued,
            "resync done"
        ),
        Err(e) => tracing::warn!(watch_id, error = %e, "resync failed; it may be asked again"),
    }
}
