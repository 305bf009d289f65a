//! The producer's side: record a change in the producer's own transaction.

use sqlx::types::Json;
use sqlx::PgConnection;
use tracing::Instrument;

use crate::db::emit as db;
use crate::error::Result;
use crate::telemetry::{self, TARGET};

/// Records a change of `object` and writes one delivery per matching live
/// watch, inside the caller's transaction: commit and the deliveries go out,
/// roll back and nothing is ever sent. Returns the change's id.
///
/// Emitters to one object queue on its sequence counter until they commit,
/// so sequence numbers per object follow commit order.
///
/// With traces on (docs/operator.md, "Traces"), it runs in a span, a child of the
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
    let change_id = match telemetry::of(&span) {
        Some(trace) => {
            db::emit_traced(
                conn,
                object,
                kind,
                payload,
                &trace.header(),
                trace.tracestate.as_deref(),
            )
            .instrument(span.clone())
            .await?
        }
        None => db::emit(conn, object, kind, payload).await?,
    };
    span.record("watchpump.change_id", change_id);
    Ok(change_id)
}

/// One change of a batch for [`emit_many`]: what [`emit`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    pub object: &'a str,
    pub kind: &'a str,
    pub payload: &'a serde_json::Value,
}

/// Records a batch of changes, in the order given, and their deliveries,
/// inside the caller's transaction, in one statement
/// (`watchpump.emit_many()`): what [`emit`] does for each, for far less
/// than a call each. Every rule of [`emit`] holds for each change; the
/// first one refused refuses the batch, and nothing of it is written.
/// Changes to one object take consecutive sequences in the order given. At
/// most 100,000 changes a call. Returns the changes' ids, in the order
/// given.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> watchpump::error::Result<()> {
/// use watchpump::emit::Change;
/// let payload = serde_json::json!({"after": "9f2c"});
/// let mut tx = pool.begin().await?;
/// let ids = watchpump::emit::emit_many(&mut tx, &[
///     Change { object: "acme/web/refs/heads/main", kind: "push", payload: &payload },
///     Change { object: "acme/web/refs/heads/dev", kind: "push", payload: &payload },
/// ]).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn emit_many(conn: &mut PgConnection, changes: &[Change<'_>]) -> Result<Vec<i64>> {
    let span = tracing::info_span!(target: TARGET, "watchpump.emit_many",
        otel.kind = "internal", watchpump.changes = changes.len());
    let objects: Vec<&str> = changes.iter().map(|c| c.object).collect();
    let kinds: Vec<&str> = changes.iter().map(|c| c.kind).collect();
    let payloads: Vec<Json<&serde_json::Value>> = changes.iter().map(|c| Json(c.payload)).collect();
    let ids = match telemetry::of(&span) {
        Some(trace) => {
            let (header, state) = (trace.header(), trace.tracestate.as_deref());
            db::emit_many_traced(conn, &objects, &kinds, &payloads, &header, state)
                .instrument(span.clone())
                .await?
        }
        None => db::emit_many(conn, &objects, &kinds, &payloads).await?,
    };
    Ok(ids)
}
