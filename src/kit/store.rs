//! The kit's calls into its SQL (`sql/kit/functions/0100_inbox_functions.sql`), where
//! the inbox's rules are written for a DBA to read.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::kit::delivery::Delivery;
use crate::kit::error::{Error, Result};

/// What the inbox made of a verified delivery (`watchpump_inbox.receive()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    New,
    Duplicate,
    Stale,
    UnknownWatch,
    RemovedWatch,
}

/// Records `d` in the transaction `tx` belongs to, and says what to do.
pub(crate) async fn receive(tx: &mut PgConnection, d: &Delivery) -> Result<Received> {
    let verdict: String = sqlx::query_scalar(
        "select watchpump_inbox.receive($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&d.producer)
    .bind(d.delivery_id)
    .bind(d.watch_id)
    .bind(d.change_id)
    .bind(&d.object)
    .bind(&d.kind)
    .bind(d.sequence)
    .bind(d.occurred_at)
    .bind(d.attempt)
    .bind(sqlx::types::Json(&d.payload))
    .fetch_one(tx)
    .await?;
    match verdict.as_str() {
        "new" => Ok(Received::New),
        "duplicate" => Ok(Received::Duplicate),
        "stale" => Ok(Received::Stale),
        "unknown_watch" => Ok(Received::UnknownWatch),
        "removed_watch" => Ok(Received::RemovedWatch),
        other => Err(Error::Invalid(format!(
            "watchpump_inbox.receive() said {other:?}: is the kit's schema newer than this build?"
        ))),
    }
}

/// Records a watch the producer returned for this consumer.
pub(crate) async fn remember_watch(
    pool: &PgPool,
    producer: &str,
    watch_id: i64,
    resource: &str,
    object: &str,
    filters: &serde_json::Value,
) -> Result<()> {
    sqlx::query("select watchpump_inbox.remember_watch($1, $2, $3, $4, $5)")
        .bind(producer)
        .bind(watch_id)
        .bind(resource)
        .bind(object)
        .bind(sqlx::types::Json(filters))
        .execute(pool)
        .await?;
    Ok(())
}

/// Marks a watch removed; deliveries for it are answered 410 from now on.
pub(crate) async fn forget_watch(
    pool: &PgPool,
    producer: &str,
    watch_id: i64,
    reason: &str,
) -> Result<bool> {
    Ok(
        sqlx::query_scalar("select watchpump_inbox.forget_watch($1, $2, $3)")
            .bind(producer)
            .bind(watch_id)
            .bind(reason)
            .fetch_one(pool)
            .await?,
    )
}

/// A watch as the kit knows it (`watchpump_inbox.watch_list`).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct KnownWatch {
    pub producer: String,
    pub watch_id: i64,
    pub resource: String,
    pub object: String,
    pub filters: serde_json::Value,
    pub registered_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub removed_reason: Option<String>,
    pub live: bool,
}

/// The watches this consumer registered at `producer`, live and removed,
/// oldest first.
pub async fn known_watches(pool: &PgPool, producer: &str) -> Result<Vec<KnownWatch>> {
    Ok(sqlx::query_as(
        "select producer, watch_id, resource, object, filters, registered_at,
                removed_at, removed_reason, live
         from watchpump_inbox.watch_list where producer = $1 order by watch_id",
    )
    .bind(producer)
    .fetch_all(pool)
    .await?)
}

/// Deletes the inbox's records of deliveries received before `before`, in
/// batches of 1,000 (so no long transaction holds back vacuum); returns how
/// many. Replays of pruned deliveries are still refused by the positions per
/// (watch, object). Run it from a daily job.
pub async fn prune(pool: &PgPool, before: DateTime<Utc>) -> Result<u64> {
    const BATCH: i32 = 1000;
    let mut total = 0u64;
    loop {
        let n: i32 = sqlx::query_scalar("select watchpump_inbox.prune($1, $2)")
            .bind(before)
            .bind(BATCH)
            .fetch_one(pool)
            .await?;
        total += n as u64;
        if n < BATCH {
            return Ok(total);
        }
    }
}
