//! The consumer kit's statements (`sql/kit/functions/0100_inbox_functions.sql`,
//! the `watchpump_inbox` schema in the consumer's own database), where the
//! inbox's rules are written for a DBA to read.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::kit::delivery::Delivery;

/// `watchpump_inbox.receive()`: records `d` in the caller's transaction;
/// its verdict (`new`, `duplicate`, `stale`, `unknown_watch`,
/// `removed_watch`).
pub async fn receive(tx: &mut PgConnection, d: &Delivery) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"select watchpump_inbox.receive($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) as "verdict!""#,
        d.producer,
        d.delivery_id,
        d.watch_id,
        d.change_id,
        d.object,
        d.kind,
        d.sequence,
        d.occurred_at,
        d.attempt,
        d.payload,
    )
    .fetch_one(tx)
    .await
}

/// `watchpump_inbox.remember_watch()`: a watch the producer returned.
pub async fn remember_watch(
    pool: &PgPool,
    producer: &str,
    watch_id: i64,
    resource: &str,
    object: &str,
    filters: &serde_json::Value,
) -> sqlx::Result<()> {
    sqlx::query!(
        "select watchpump_inbox.remember_watch($1, $2, $3, $4, $5)",
        producer,
        watch_id,
        resource,
        object,
        filters
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `watchpump_inbox.forget_watch()`: whether the watch was live.
pub async fn forget_watch(
    pool: &PgPool,
    producer: &str,
    watch_id: i64,
    reason: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select watchpump_inbox.forget_watch($1, $2, $3) as "forgotten!""#,
        producer,
        watch_id,
        reason
    )
    .fetch_one(pool)
    .await
}

/// A watch as the kit knows it (`watchpump_inbox.watch_list`).
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// The watches registered at `producer`, live and removed, oldest first.
pub async fn known_watches(pool: &PgPool, producer: &str) -> sqlx::Result<Vec<KnownWatch>> {
    sqlx::query_as!(
        KnownWatch,
        r#"select producer as "producer!", watch_id as "watch_id!", resource as "resource!",
                  object as "object!", filters as "filters!", registered_at as "registered_at!",
                  removed_at as "removed_at?", removed_reason as "removed_reason?",
                  live as "live!"
           from watchpump_inbox.watch_list where producer = $1 order by watch_id"#,
        producer
    )
    .fetch_all(pool)
    .await
}

/// `watchpump_inbox.prune()`: deletes at most `batch` records of
/// deliveries received before `before`; how many.
pub async fn prune(pool: &PgPool, before: DateTime<Utc>, batch: i32) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"select watchpump_inbox.prune($1, $2) as "pruned!""#,
        before,
        batch
    )
    .fetch_one(pool)
    .await
}
