//! The operator's statements (`sql/functions/0600_operator.sql`): the
//! views the panel, the admin API and the CLI read (`backlog`,
//! `delivery_log`, `attempts`, `delivery_history`, `watch_list`), retry,
//! the warnings to notify, and the backlog gauges.
//!
//! The room is split by what its statements serve, one part a file in
//! `operator/`, each re-exported here so that callers name
//! `db::operator::x` whichever part holds it:
//!
//! - `listing.rs`: the listing pages of deliveries and watches, planned
//!   with their values, and `explain` of them (the room's one statement
//!   built at run time);
//! - `one_delivery.rs`: one delivery, the request as sent, its attempts,
//!   its history and its change's trace;
//! - `warnings.rs`: the warnings to notify, from folding failures to
//!   handing them on;
//! - `gauges.rs`: the metrics' backlog gauges and their lock.
//!
//! This file holds the rest: the `backlog` view, retry (the action the
//! admin API, the panel and the CLI share), the operator task's lock, the
//! panel's small reads of a service and a watch, and the CLI's emit.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

mod gauges;
mod listing;
mod one_delivery;
mod warnings;

pub use gauges::{
    backlog_counts, consumer_gauges, service_names, trace_context_malformed, try_backlog_lock,
    BacklogCount,
};
pub use listing::{
    explain, newest_failures, page_by_id, page_by_time, watches, DeliveryRow, Explained, Page,
    WatchRow, Watches,
};
pub use one_delivery::{attempts, change_traceparent, delivery, history, Attempt, Event};
pub use warnings::{
    due_warnings, fold_failures, warning_attempted, warnings, Due, Folded, Warning,
};

/// A row of `watchpump.backlog`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Backlog {
    pub service_id: i64,
    pub service: String,
    pub pending: i64,
    pub in_flight: i64,
    pub due_now: i64,
    pub failed_24h: i64,
    /// Seconds the oldest due delivery has waited; none when nothing is due.
    pub oldest_due_age_secs: Option<f64>,
    pub last_delivered_at: Option<DateTime<Utc>>,
    pub last_failed_at: Option<DateTime<Utc>>,
    pub retrying: i64,
    pub looks_down: bool,
}

pub async fn backlog(pool: &PgPool) -> sqlx::Result<Vec<Backlog>> {
    sqlx::query_as!(
        Backlog,
        r#"select service_id as "service_id!", service as "service!", pending as "pending!",
                  in_flight as "in_flight!", due_now as "due_now!", failed_24h as "failed_24h!",
                  extract(epoch from oldest_due_age)::float8 as "oldest_due_age_secs?",
                  last_delivered_at as "last_delivered_at?", last_failed_at as "last_failed_at?",
                  retrying as "retrying!", looks_down as "looks_down!"
           from watchpump.backlog order by service"#
    )
    .fetch_all(pool)
    .await
}

/// The id of the service named `name`, removed or not.
pub async fn service_id(pool: &PgPool, name: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("select id from watchpump.services where name = $1", name)
        .fetch_optional(pool)
        .await
}

/// `watchpump.retry()`: the state the delivery had. Its refusals are
/// raised (P0002, 55000).
pub async fn retry(pool: &PgPool, delivery_id: i64, actor: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"select watchpump.retry($1, $2) as "previous!""#,
        delivery_id,
        actor
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.retry_failed()`: how many deliveries were requeued.
pub async fn retry_failed(
    pool: &PgPool,
    service: &str,
    since: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"select watchpump.retry_failed($1, $2, $3) as "requeued!""#,
        service,
        since,
        actor
    )
    .fetch_one(pool)
    .await
}

/// Takes the operator task's session lock, if no other pump holds it.
pub async fn try_operator_lock(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select pg_try_advisory_lock(hashtext('watchpump.operator')) as "taken!""#
    )
    .fetch_one(conn)
    .await
}

/// The live watch's service: its id and name.
pub async fn live_watch_owner(pool: &PgPool, watch_id: i64) -> sqlx::Result<Option<(i64, String)>> {
    let row = sqlx::query!(
        "select s.id, s.name from watchpump.watches w
         join watchpump.services s on s.id = w.service_id
         where w.id = $1 and w.removed_at is null",
        watch_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.id, r.name)))
}

/// Whether the service is paused, and how many of its live watches are.
pub async fn pauses(pool: &PgPool, service_id: i64) -> sqlx::Result<(bool, i64)> {
    let row = sqlx::query!(
        r#"select s.paused_at is not null as "paused!",
                  (select count(*) from watchpump.watches w
                   where w.service_id = s.id and w.paused_at is not null
                     and w.removed_at is null) as "paused_watches!"
           from watchpump.services s where s.id = $1"#,
        service_id
    )
    .fetch_one(pool)
    .await?;
    Ok((row.paused, row.paused_watches))
}

/// `watchpump.emit()` (`0150_emit.sql`) as the CLI calls it, with no trace
/// context ([`crate::emit::emit`] is the producer's call), and how many
/// deliveries the change made, in the caller's transaction.
pub async fn emit_counted(
    conn: &mut PgConnection,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
) -> sqlx::Result<(i64, i64)> {
    let change_id = sqlx::query_scalar!(
        r#"select watchpump.emit($1, $2, $3) as "change_id!""#,
        object,
        kind,
        payload
    )
    .fetch_one(&mut *conn)
    .await?;
    let deliveries = sqlx::query_scalar!(
        r#"select count(*) as "n!" from watchpump.deliveries where change_id = $1"#,
        change_id
    )
    .fetch_one(conn)
    .await?;
    Ok((change_id, deliveries))
}
