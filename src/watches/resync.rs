//! Resync (issue 20, docs/protocol.md "Resync"): the newest retained change
//! of every object a watch covers, that matches its filters, queued again
//! for it as a replayed delivery (`"replay": true` in the body). The rules
//! are SQL's (`sql/functions/0500_consumer.sql`, "RESYNC"); this is their
//! one caller, for the API and the CLI alike.
//!
//! [`start`] takes the watch's one resync slot and counts what it covers;
//! [`run`] goes through the objects in batches of [`BATCH`], each its own
//! short transaction, then gives the slot back. The API answers 202 after
//! [`start`] and runs [`run`] in a task of its own ([`spawn`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::{Error, Result};

/// Objects per batch: one transaction each, holding at most this many of
/// the order rule's stream locks (a claim that meets one skips that
/// (watch, object) until the batch commits) and queueing at most this
/// many deliveries.
pub const BATCH: i32 = 200;

/// What a resync was started on: how many objects it goes through (at most
/// WATCHPUMP_RESYNC_MAX_OBJECTS), whether the watch covers more than that,
/// and where the retained history begins (changes older than it were
/// pruned, and an object whose every change was pruned is not replayed).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Started {
    pub watch_id: i64,
    pub objects: i32,
    pub truncated: bool,
    pub history_from: Option<DateTime<Utc>>,
}

/// What a finished resync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Done {
    /// Objects looked at.
    pub objects: i64,
    /// Replays queued (an object with no matching retained change, or with
    /// the same or newer news already queued, gets none).
    pub queued: i64,
}

/// Takes the watch's resync slot. Another service's watch, or a removed
/// one, is [`Error::NotFound`]; a watch with a resync running is a database
/// error with SQLSTATE 54000 (the API's 429; [`is_running`]).
pub async fn start(pool: &PgPool, service_id: i64, watch_id: i64, max: u32) -> Result<Started> {
    let started: Result<Started> = sqlx::query_as(
        "select $2::bigint as watch_id, objects, truncated, history_from
         from watchpump.resync_start($1, $2, $3)",
    )
    .bind(service_id)
    .bind(watch_id)
    .bind(i32::try_from(max).unwrap_or(i32::MAX))
    .fetch_one(pool)
    .await
    .map_err(Error::raised);
    let outcome = match &started {
        Ok(s) if s.truncated => Some("truncated"),
        Ok(_) => Some("started"),
        Err(e) if is_running(e) => Some("refused"),
        Err(_) => None,
    };
    if let Some(outcome) = outcome {
        metrics::counter!(crate::metrics::RESYNCS, "outcome" => outcome).increment(1);
    }
    started
}

/// Whether `e` is [`start`]'s refusal of a second resync of a watch.
pub fn is_running(e: &Error) -> bool {
    matches!(e, Error::Database(sqlx::Error::Database(d)) if d.code().as_deref() == Some("54000"))
}

/// Goes through at most `max` objects of the watch, [`BATCH`] at a time,
/// then gives the slot back (also when a batch fails).
pub async fn run(pool: &PgPool, watch_id: i64, max: u32) -> Result<Done> {
    let done = batches(pool, watch_id, max).await;
    let finished = sqlx::query("select watchpump.resync_finish($1)")
        .bind(watch_id)
        .execute(pool)
        .await;
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
        let (last, objects, queued): (Option<String>, i32, i32) = sqlx::query_as(
            "select last_object, objects, queued from watchpump.resync_batch($1, $2, $3)",
        )
        .bind(watch_id)
        .bind(&after)
        .bind(limit as i32)
        .fetch_one(pool)
        .await?;
        done.objects += i64::from(objects);
        done.queued += i64::from(queued);
        metrics::counter!(crate::metrics::RESYNC_REPLAYS).increment(queued as u64);
        if i64::from(objects) < limit {
            return Ok(done);
        }
        after = last;
    }
}

/// [`run`] in a task of its own, for the API: its outcome is logged.
pub fn spawn(pool: PgPool, watch_id: i64, max: u32) {
    tokio::spawn(async move {
        match run(&pool, watch_id, max).await {
            Ok(done) => tracing::info!(
                watch_id,
                objects = done.objects,
                queued = done.queued,
                "resync done"
            ),
            Err(e) => tracing::warn!(watch_id, error = %e, "resync failed; it may be asked again"),
        }
    });
}
