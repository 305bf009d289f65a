//! The warnings to notify (`0600_operator.sql`): failures folded into one
//! warning a service, the warnings due handed on and their attempts
//! recorded (the operator task's, `crate::operator::notify`), and the
//! warnings listed for the admin API.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// A warning to the notify service.
#[derive(Debug, Clone, Serialize)]
pub struct Warning {
    pub id: i64,
    pub service: String,
    pub state: String,
    pub failed: i32,
    pub folded: i32,
    pub oldest_created_at: DateTime<Utc>,
    pub first_failed_at: DateTime<Utc>,
    pub last_failed_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub send_after: DateTime<Utc>,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Warnings, newest first, of one service or of all.
pub async fn warnings(
    pool: &PgPool,
    service: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<Warning>> {
    sqlx::query_as!(
        Warning,
        "select w.id, s.name as service, w.state, w.failed, w.folded, w.oldest_created_at,
                w.first_failed_at, w.last_failed_at, w.created_at, w.send_after, w.attempts,
                w.next_attempt_at, w.last_status, w.last_error, w.finished_at
         from watchpump.warnings w join watchpump.services s on s.id = w.service_id
         where $1::text is null or s.name = $1
         order by w.id desc limit $2",
        service,
        limit,
    )
    .fetch_all(pool)
    .await
}

/// What a step of folding did for one service
/// (`watchpump.fold_failures()`).
#[derive(Debug, Clone)]
pub struct Folded {
    pub warning_id: i64,
    pub service: String,
    /// Failures added to the warning.
    pub added: i32,
    /// True when the failures joined a pending warning or opened one held
    /// back by the fold window: they raise no warning of their own now.
    pub folded: bool,
}

/// Drains the failure inbox into warnings, at most one a service per
/// `every_secs`; a warning is retried for as long as a delivery is
/// (`watchpump.delivery_window()`).
pub async fn fold_failures(pool: &PgPool, every_secs: f64) -> sqlx::Result<Vec<Folded>> {
    sqlx::query_as!(
        Folded,
        r#"select f.warning_id as "warning_id!", f.service as "service!", f.added as "added!",
                  not f.opened or w.send_after > now() as "folded!"
           from watchpump.fold_failures(make_interval(secs => $1), watchpump.delivery_window()) f
           join watchpump.warnings w on w.id = f.warning_id"#,
        every_secs
    )
    .fetch_all(pool)
    .await
}

/// A warning as notify receives it.
#[derive(Debug, Clone, Serialize)]
pub struct Due {
    pub warning_id: i64,
    pub service: String,
    pub failed: i32,
    pub folded: i32,
    pub oldest_created_at: DateTime<Utc>,
    pub first_failed_at: DateTime<Utc>,
    pub last_failed_at: DateTime<Utc>,
    #[serde(skip)]
    pub attempts: i32,
}

/// The first `limit` warnings due now, oldest first.
pub async fn due_warnings(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<Due>> {
    sqlx::query_as!(
        Due,
        "select w.id as warning_id, s.name as service, w.failed, w.folded,
                w.oldest_created_at, w.first_failed_at, w.last_failed_at, w.attempts
         from watchpump.warnings w join watchpump.services s on s.id = w.service_id
         where w.state = 'pending' and w.send_after <= now() and w.next_attempt_at <= now()
         order by w.id limit $1",
        limit
    )
    .fetch_all(pool)
    .await
}

/// `watchpump.warning_attempted()`: records one attempt to hand a warning
/// on; its state after (none if the warning is gone).
pub async fn warning_attempted(
    pool: &PgPool,
    warning_id: i64,
    outcome: &str,
    status: Option<i32>,
    error: Option<&str>,
    next: DateTime<Utc>,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "select watchpump.warning_attempted($1, $2, $3, $4, $5)",
        warning_id,
        outcome,
        status,
        error,
        next
    )
    .fetch_one(pool)
    .await
}
