//! One delivery as the operator reads it (`0600_operator.sql`'s
//! `delivery_log`, `attempts` and `delivery_history`, and `0500_delivery.sql`'s
//! `message()`): the delivery, the request as sent, each attempt, its
//! history and its change's trace: what the panel's delivery page, the
//! admin API's `/api/v1/admin/deliveries/{id}` and `watchpump deliveries
//! show` read.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::DeliveryRow;
use crate::delivery::State;

/// One delivery, in any state.
pub async fn delivery(pool: &PgPool, id: i64) -> sqlx::Result<Option<DeliveryRow>> {
    sqlx::query_as!(
        DeliveryRow,
        r#"select delivery_id as "delivery_id!", created_at as "created_at!", service as "service!",
                  watch_id as "watch_id!", resource as "resource!", watch_object as "watch_object!",
                  object as "object!", kind as "kind!", change_id as "change_id!",
                  sequence as "sequence!", state as "state!: State", attempts as "attempts!",
                  next_attempt_at as "next_attempt_at!", deadline as "deadline!",
                  finished_at as "finished_at?", last_status as "last_status?",
                  last_error as "last_error?", superseded_by as "superseded_by?",
                  last_action as "last_action?"
           from watchpump.delivery_log where delivery_id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// One attempt to send a delivery (`watchpump.attempts`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = AdminAttempt)]
pub struct Attempt {
    /// The first attempt this row stands for.
    pub attempt: i32,
    /// How many identical failed attempts in a row the row stands for
    /// (`attempt` to `attempt + repeats - 1`); 1 for most.
    pub repeats: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: f64,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub response_head: Option<String>,
    pub pump: String,
}

pub async fn attempts(pool: &PgPool, delivery_id: i64) -> sqlx::Result<Vec<Attempt>> {
    sqlx::query_as!(
        Attempt,
        r#"select attempt as "attempt!", repeats as "repeats!", started_at as "started_at!",
                  duration_ms as "duration_ms!", status as "status?", error as "error?",
                  response_head as "response_head?", pump as "pump!"
           from watchpump.attempts where delivery_id = $1 order by attempt, id"#,
        delivery_id
    )
    .fetch_all(pool)
    .await
}

/// A row of `watchpump.delivery_history`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub event: String,
    pub detail: Option<String>,
}

pub async fn history(pool: &PgPool, delivery_id: i64) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as!(
        Event,
        r#"select at as "at!", event as "event!", detail as "detail?"
           from watchpump.delivery_history
           where delivery_id = $1 order by at, seq"#,
        delivery_id
    )
    .fetch_all(pool)
    .await
}

/// The W3C `traceparent` the change was emitted under, if any.
pub async fn change_traceparent(pool: &PgPool, change_id: i64) -> sqlx::Result<Option<String>> {
    Ok(sqlx::query_scalar!(
        "select traceparent from watchpump.changes where id = $1",
        change_id
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}
