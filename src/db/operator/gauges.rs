//! The metrics' backlog gauges (`crate::metrics::backlog`): the lock that
//! lets one pump read them, each service's backlog counts
//! (`backlog_counts()`, `0600_operator.sql`), each consumer's paused
//! watches and rate, the services' names and the malformed trace
//! contexts' count. Each runs on the gauges' own connection.

use sqlx::PgConnection;

/// Takes the backlog gauges' session lock, if no other pump holds it.
pub async fn try_backlog_lock(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(r#"select pg_try_advisory_lock(hashtext('watchpump.backlog')) as "taken!""#)
        .fetch_one(conn)
        .await
}

/// One service's backlog, as `watchpump.backlog_counts()` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct BacklogCount {
    pub service: String,
    pub pending: i64,
    pub in_flight: i64,
    pub due_now: i64,
    pub failed_24h: i64,
    /// Seconds; 0 when nothing is due.
    pub oldest_due_age: f64,
}

pub async fn backlog_counts(conn: &mut PgConnection) -> sqlx::Result<Vec<BacklogCount>> {
    sqlx::query_as!(
        BacklogCount,
        r#"select service as "service!", pending as "pending!", in_flight as "in_flight!",
                  due_now as "due_now!", failed_24h as "failed_24h!",
                  oldest_due_age as "oldest_due_age!"
           from watchpump.backlog_counts()"#
    )
    .fetch_all(conn)
    .await
}

/// Each live consumer's paused watches and rate
/// (`watchpump.consumer_gauges()`).
pub async fn consumer_gauges(
    conn: &mut PgConnection,
) -> sqlx::Result<Vec<(String, i64, Option<i32>)>> {
    let rows = sqlx::query!(
        r#"select service as "service!", paused_watches as "paused_watches!", rate
           from watchpump.consumer_gauges()"#
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.service, r.paused_watches, r.rate))
        .collect())
}

/// Every service's name, removed or not.
pub async fn service_names(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("select name from watchpump.services")
        .fetch_all(conn)
        .await
}

/// Trace contexts emit() ignored as malformed: a sequence
/// (`0009_trace_context.sql`), read without a lock.
pub async fn trace_context_malformed(conn: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select case when is_called then last_value else 0 end as "malformed!"
           from watchpump.trace_context_malformed"#
    )
    .fetch_one(conn)
    .await
}
