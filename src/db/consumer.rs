//! The consumer API's statements (`sql/functions/0700_consumer.sql`:
//! resync, redeliver, ping) and its reads of a service's own deliveries,
//! through the operator's views (`watchpump.delivery_log`,
//! `watchpump.attempts`; its message is `db::delivery::message`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::delivery::State;

/// Whether the database answers: the API's `/healthz`.
pub async fn ping_database(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query_scalar!(r#"select 1 as "one""#)
        .fetch_one(pool)
        .await?;
    Ok(())
}

// --- Resync ---------------------------------------------------------------

/// What a resync was started on: how many objects it goes through (at most
/// WATCHPUMP_RESYNC_MAX_OBJECTS), whether the watch covers more than that,
/// and where the retained history begins (changes older than it were
/// pruned, and an object whose every change was pruned is not replayed).
#[derive(Debug, Clone, Serialize)]
pub struct Started {
    pub watch_id: i64,
    pub objects: i32,
    pub truncated: bool,
    pub history_from: Option<DateTime<Utc>>,
}

/// A consumer's resync, started within its service's daily replay budget
/// ([`consumer_resync_start`]): [`Started`], and what is left of the
/// budget.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Resync)]
pub struct ConsumerStarted {
    pub watch_id: i64,
    /// Objects the resync goes through: those the watch covers, at most WATCHPUMP_RESYNC_MAX_OBJECTS and at most the replays left in the service's daily budget.
    pub objects: i32,
    /// The watch covers more objects than the resync goes through (the bound, or the replay budget); the rest are not replayed.
    pub truncated: bool,
    /// Where the retained history of changes begins: older changes were pruned.
    pub history_from: Option<DateTime<Utc>>,
    /// Replays the service's resyncs may still queue now, after this one's
    /// objects were taken from its budget.
    pub replays_left: i32,
    /// The budget: replays a day (`watchpump.settings.replays_per_day`).
    pub replays_per_day: i32,
}

/// `watchpump.resync_start()`: the service's resync slot, without a replay
/// budget; P0002 for another service's watch, 54000 while a resync of the
/// service runs.
pub async fn resync_start(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    max: i32,
) -> sqlx::Result<Started> {
    sqlx::query_as!(
        Started,
        r#"select $2::bigint as "watch_id!", objects as "objects!", truncated as "truncated!",
                  history_from
           from watchpump.resync_start($1, $2, $3)"#,
        service_id,
        watch_id,
        max
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.consumer_resync_start()`: [`resync_start`] within the
/// service's replay budget (54000 when it is spent).
pub async fn consumer_resync_start(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    max: i32,
) -> sqlx::Result<ConsumerStarted> {
    sqlx::query_as!(
        ConsumerStarted,
        r#"select $2::bigint as "watch_id!", objects as "objects!", truncated as "truncated!",
                  history_from, replays_left as "replays_left!",
                  replays_per_day as "replays_per_day!"
           from watchpump.consumer_resync_start($1, $2, $3)"#,
        service_id,
        watch_id,
        max
    )
    .fetch_one(pool)
    .await
}

/// What one `watchpump.resync_batch()` went through: the last object (the
/// next batch's start), the objects looked at and the replays queued.
pub struct ResyncBatch {
    pub last_object: Option<String>,
    pub objects: i32,
    pub queued: i32,
}

/// The watch's objects after `after`, `limit` of them, in one transaction.
pub async fn resync_batch(
    pool: &PgPool,
    watch_id: i64,
    after: Option<&str>,
    limit: i32,
) -> sqlx::Result<ResyncBatch> {
    sqlx::query_as!(
        ResyncBatch,
        r#"select last_object, objects as "objects!", queued as "queued!"
           from watchpump.resync_batch($1, $2, $3)"#,
        watch_id,
        after,
        limit
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.resync_finish()`: gives the service's resync slot back.
pub async fn resync_finish(pool: &PgPool, watch_id: i64) -> sqlx::Result<()> {
    sqlx::query!(
        r#"select watchpump.resync_finish($1) as "finished""#,
        watch_id
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `watchpump.give_back_replays()`: replays a resync did not queue go back
/// to the service's budget.
pub async fn give_back_replays(pool: &PgPool, service_id: i64, unused: i32) -> sqlx::Result<()> {
    sqlx::query!(
        r#"select watchpump.give_back_replays($1, $2) as "given""#,
        service_id,
        unused
    )
    .execute(pool)
    .await?;
    Ok(())
}

// --- Redeliver and ping ---------------------------------------------------

/// `watchpump.redeliver()`: the delivery's state before it was queued
/// again; 54000 within a minute of its last redelivery.
pub async fn redeliver(
    pool: &PgPool,
    service_id: i64,
    delivery_id: i64,
    actor: &str,
) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"select watchpump.redeliver($1, $2, $3) as "previous_state!""#,
        service_id,
        delivery_id,
        actor
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.ping()`: the ping's delivery id; 54000 within `every_secs`
/// of the watch's previous ping.
pub async fn ping(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    every_secs: f64,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select watchpump.ping($1, $2, make_interval(secs => $3)) as "delivery_id!""#,
        service_id,
        watch_id,
        every_secs
    )
    .fetch_one(pool)
    .await
}

// --- A service's deliveries -----------------------------------------------

// One delivery as `watchpump.delivery_log` shows it to its consumer: the
// consumer API's `Delivery` (`crate::resources::deliveries::consumer::Entry`).
/// One of the caller's deliveries.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Delivery)]
pub struct DeliveryEntry {
    pub id: i64,
    pub watch_id: i64,
    pub object: String,
    pub kind: String,
    pub change_id: i64,
    pub sequence: i64,
    pub state: State,
    /// Attempts made so far (a claim counts the attempt it starts).
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub next_attempt_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The status of the last answer; null before any, or when the last
    /// attempt got none.
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub superseded_by: Option<i64>,
}

/// The service's delivery `id`, None when it has none of that id.
pub async fn delivery_entry(
    pool: &PgPool,
    service_id: i64,
    id: i64,
) -> sqlx::Result<Option<DeliveryEntry>> {
    sqlx::query_as!(
        DeliveryEntry,
        r#"select delivery_id as "id!", watch_id as "watch_id!", object as "object!",
                  kind as "kind!", change_id as "change_id!", sequence as "sequence!",
                  state as "state!: State", attempts as "attempts!", created_at as "created_at!",
                  next_attempt_at as "next_attempt_at!", finished_at, last_status, last_error,
                  superseded_by
           from watchpump.delivery_log
           where delivery_id = $1 and service_id = $2"#,
        id,
        service_id
    )
    .fetch_optional(pool)
    .await
}

/// One attempt, or a run of identical failed attempts folded into one row
/// (`attempt` to `last_attempt`, `repeats` of them, `statuses` counting the
/// answers: `{"503": 4, "no answer": 2}`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Attempt {
    pub attempt: i32,
    pub last_attempt: i32,
    /// Identical failures in a row folded into this row.
    pub repeats: i32,
    pub started_at: DateTime<Utc>,
    pub last_started_at: Option<DateTime<Utc>>,
    pub duration_ms: f64,
    /// The (last) answer's status; null when there was no answer.
    pub status: Option<i32>,
    pub error: Option<String>,
    pub response_head: Option<String>,
    /// The answers counted: {"503": 4, "no answer": 2}.
    #[schema(value_type = Option<Object>)]
    pub statuses: Option<Value>,
}

/// The delivery's attempts, folded runs as one row each, in order.
pub async fn attempts(pool: &PgPool, delivery_id: i64) -> sqlx::Result<Vec<Attempt>> {
    sqlx::query_as!(
        Attempt,
        r#"select attempt as "attempt!", attempt + repeats - 1 as "last_attempt!",
                  repeats as "repeats!", started_at as "started_at!", last_started_at,
                  duration_ms as "duration_ms!", status, error, response_head, statuses
           from watchpump.attempts where delivery_id = $1 order by attempt, id"#,
        delivery_id
    )
    .fetch_all(pool)
    .await
}
