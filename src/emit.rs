//! The producer's side: record a change in the producer's own transaction.

use sqlx::PgConnection;
use tracing::Instrument;

use crate::error::Result;
use crate::telemetry::{self, TARGET};

/// Records a change of `object` and writes one delivery per matching live
/// watch, inside the caller's transaction: commit and the deliveries go out,
/// roll back and nothing is ever sent. Returns the change's id.
///
/// Emitters to one object queue on its sequence counter until they commit,
/// so sequence numbers per object follow commit order.
///
/// With traces on (README, "Traces"), it runs in a span, a child of the
/// caller's current span, whose W3C trace context the change keeps (set as
/// `watchpump.traceparent` and `watchpump.tracestate` for the rest of the
/// transaction, as an SQL caller would): every attempt to deliver it joins
/// that trace.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> watchpump::error::Result<()> {
/// let mut tx = pool.begin().await?;
/// // ... the producer's own writes ...
/// watchpump::emit(&mut tx, "acme/web/refs/heads/main", "push", &serde_json::json!({"after": "9f2c"})).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn emit(
    conn: &mut PgConnection,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
) -> Result<i64> {
    let span = tracing::info_span!(target: TARGET, "watchpump.emit",
        otel.kind = "internal", watchpump.object = object, watchpump.kind = kind,
        watchpump.change_id = tracing::field::Empty);
    let change_id: i64 = match telemetry::of(&span) {
        // One round trip either way: the settings are made in a CTE the
        // statement reads before it calls emit().
        Some(trace) => {
            sqlx::query_scalar(
                "with context as materialized (
                 select set_config('watchpump.traceparent', $4, true),
                        set_config('watchpump.tracestate', coalesce($5, ''), true))
             select watchpump.emit($1, $2, $3) from context",
            )
            .bind(object)
            .bind(kind)
            .bind(sqlx::types::Json(payload))
            .bind(trace.header())
            .bind(trace.tracestate)
            .fetch_one(conn)
            .instrument(span.clone())
            .await?
        }
        None => {
            sqlx::query_scalar("select watchpump.emit($1, $2, $3)")
                .bind(object)
                .bind(kind)
                .bind(sqlx::types::Json(payload))
                .fetch_one(conn)
                .await?
        }
    };
    span.record("watchpump.change_id", change_id);
    Ok(change_id)
}
