//! The listing pages of the operator's room (`0600_operator.sql`): pages
//! of deliveries (`delivery_log`) by id, by time, and the newest
//! failures, and pages of watches (`watch_list`), each run in a
//! transaction planned with its values ([`custom_plans`]). Apart from the
//! rest of the room because these statements are the ones whose plans
//! matter at volume.
//!
//! The deliveries' pages are in `*.sql` beside this file, read by both the
//! macro that checks them and [`explain`], so that tests can read the
//! plan of exactly what runs (`tests/history.rs` does, at volume).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::delivery::State;

// What the operator's front ends show of a delivery
// (`crate::operator::store::Delivery`, the admin API's `AdminDelivery`).
/// A row of `watchpump.delivery_log`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = AdminDelivery)]
pub struct DeliveryRow {
    pub delivery_id: i64,
    pub created_at: DateTime<Utc>,
    pub service: String,
    pub watch_id: i64,
    pub resource: String,
    pub watch_object: String,
    pub object: String,
    pub kind: String,
    pub change_id: i64,
    pub sequence: i64,
    pub state: State,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub superseded_by: Option<i64>,
    pub last_action: Option<String>,
}

/// What a page of deliveries is restricted to: each field may be absent.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    /// One of the six states (`crate::delivery::State::as_str`).
    pub state: Option<&'a str>,
    pub service_id: Option<i64>,
    pub watch_id: Option<i64>,
    /// An exact object.
    pub object: Option<&'a str>,
    /// Objects starting with this.
    pub object_prefix: Option<&'a str>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// The keyset cursor: the previous page's last delivery.
    pub after: Option<i64>,
    pub limit: i64,
}

/// `operator/page_by_id.sql`: a page by id, newest first; the next page is
/// `id < after`.
pub async fn page_by_id(pool: &PgPool, p: &Page<'_>) -> sqlx::Result<Vec<DeliveryRow>> {
    custom_plans(pool, async |c| {
        sqlx::query_file_as!(
            DeliveryRow,
            "src/db/operator/page_by_id.sql",
            p.state,
            p.service_id,
            p.watch_id,
            p.object,
            p.object_prefix,
            p.since,
            p.until,
            p.after,
            p.limit,
        )
        .fetch_all(c)
        .await
    })
    .await
}

/// `operator/page_by_time.sql`: a time window's page in creation order,
/// newest first; the next page is what comes after the delivery `after`.
/// Only `since`, `until` (required), `after` and `limit` are read.
pub async fn page_by_time(
    pool: &PgPool,
    until: DateTime<Utc>,
    p: &Page<'_>,
) -> sqlx::Result<Vec<DeliveryRow>> {
    custom_plans(pool, async |c| {
        sqlx::query_file_as!(
            DeliveryRow,
            "src/db/operator/page_by_time.sql",
            p.since,
            until,
            p.after,
            p.limit,
        )
        .fetch_all(c)
        .await
    })
    .await
}

/// `operator/newest_failures.sql`: the most recent failures, across
/// services.
pub async fn newest_failures(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<DeliveryRow>> {
    custom_plans(pool, async |c| {
        sqlx::query_file_as!(DeliveryRow, "src/db/operator/newest_failures.sql", limit)
            .fetch_all(c)
            .await
    })
    .await
}

/// `statement` in a transaction whose statements are planned with their
/// values each time they run (a custom plan), never with the generic plan
/// PostgreSQL may settle on after five runs of a prepared statement: the
/// pages' optional
/// conditions (`$n is null or ...`) then fold away or into constants, and
/// the planner sees which partial index fits, how rare a service is and
/// the limit, as if they were written in. A generic plan would keep one
/// index for every filter (`tests/listing.rs` checks that none is made).
async fn custom_plans<T>(
    pool: &PgPool,
    statement: impl AsyncFnOnce(&mut PgConnection) -> sqlx::Result<T>,
) -> sqlx::Result<T> {
    let mut tx = pool.begin().await?;
    sqlx::query!("set local plan_cache_mode = force_custom_plan")
        .execute(&mut *tx)
        .await?;
    let answer = statement(&mut *tx).await?;
    tx.commit().await?;
    Ok(answer)
}

/// A statement of this file whose plan tests read.
#[derive(Debug, Clone, Copy)]
pub enum Explained<'a> {
    PageById(Page<'a>),
    PageByTime(DateTime<Utc>, Page<'a>),
    NewestFailures(i64),
}

/// The plan of `statement` with its values bound, as `explain` (e.g.
/// `"explain (costs off)"`) prints it. The one statement here built at
/// run time: EXPLAIN's options come first, then the very text the checked
/// function sends. Sent unnamed, so that its plan is a custom plan, as
/// the function's is (`custom_plans()`).
pub async fn explain(
    pool: &PgPool,
    explain: &str,
    statement: Explained<'_>,
) -> sqlx::Result<Vec<String>> {
    let sql = match statement {
        Explained::PageById(_) => include_str!("page_by_id.sql"),
        Explained::PageByTime(..) => include_str!("page_by_time.sql"),
        Explained::NewestFailures(_) => include_str!("newest_failures.sql"),
    };
    let sql = format!("{explain} {sql}");
    let query = sqlx::query_scalar(&sql);
    let query = match statement {
        Explained::PageById(p) => query
            .bind(p.state)
            .bind(p.service_id)
            .bind(p.watch_id)
            .bind(p.object)
            .bind(p.object_prefix)
            .bind(p.since)
            .bind(p.until)
            .bind(p.after)
            .bind(p.limit),
        Explained::PageByTime(until, p) => {
            query.bind(p.since).bind(until).bind(p.after).bind(p.limit)
        }
        Explained::NewestFailures(limit) => query.bind(limit),
    };
    query.persistent(false).fetch_all(pool).await
}

/// A row of `watchpump.watch_list`.
#[derive(Debug, Clone, Serialize)]
pub struct WatchRow {
    pub watch_id: i64,
    pub service: String,
    pub resource: String,
    pub object: String,
    pub filters: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub removed_reason: Option<String>,
}

/// What a page of watches is restricted to: each field may be absent.
#[derive(Debug, Clone, Copy)]
pub struct Watches<'a> {
    pub service: Option<&'a str>,
    pub resource: Option<&'a str>,
    pub object: Option<&'a str>,
    /// Live (true) or removed (false) watches only.
    pub live: Option<bool>,
    /// The keyset cursor: the previous page's last watch.
    pub after: Option<i64>,
    pub limit: i64,
}

/// A page of watches, newest first, planned with its values
/// (`custom_plans()`).
pub async fn watches(pool: &PgPool, w: &Watches<'_>) -> sqlx::Result<Vec<WatchRow>> {
    custom_plans(pool, async |c| {
        sqlx::query_as!(
            WatchRow,
            r#"select watch_id as "watch_id!", service as "service!", resource as "resource!",
                      object as "object!", filters as "filters!", created_at as "created_at!",
                      removed_at as "removed_at?", removed_reason as "removed_reason?"
               from watchpump.watch_list
               where ($1::text is null or service = $1)
                 and ($2::text is null or resource = $2)
                 and ($3::text is null or object = $3)
                 and ($4::boolean is null or live = $4)
                 and ($5::bigint is null or watch_id < $5)
               order by watch_id desc
               limit $6"#,
            w.service,
            w.resource,
            w.object,
            w.live,
            w.after,
            w.limit,
        )
        .fetch_all(c)
        .await
    })
    .await
}
