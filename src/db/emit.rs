//! The producer's statements (`sql/functions/0150_emit.sql`): a change, or
//! a batch of them, recorded in the caller's transaction. The span, the
//! trace context and the public signatures are `crate::emit`'s.
//!
//! With a trace context, the settings `watchpump.traceparent` and
//! `watchpump.tracestate` are made for the rest of the transaction (as an
//! SQL caller would) in a CTE the statement reads before it calls emit():
//! one round trip either way.

use sqlx::types::Json;
use sqlx::PgExecutor;

/// `watchpump.emit()`: the change's id.
pub async fn emit(
    conn: impl PgExecutor<'_>,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select watchpump.emit($1, $2, $3) as "change_id!""#,
        object,
        kind,
        payload,
    )
    .fetch_one(conn)
    .await
}

/// [`emit`] with the caller's W3C trace context (`traceparent`, and
/// `tracestate` if any), which the change keeps.
pub async fn emit_traced(
    conn: impl PgExecutor<'_>,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
    traceparent: &str,
    tracestate: Option<&str>,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"with context as materialized (
               select set_config('watchpump.traceparent', $4, true),
                      set_config('watchpump.tracestate', coalesce($5, ''), true))
           select watchpump.emit($1, $2, $3) as "change_id!" from context"#,
        object,
        kind,
        payload,
        traceparent,
        tracestate,
    )
    .fetch_one(conn)
    .await
}

/// `watchpump.emit_many()`: the changes' ids, in the order given. The three
/// arrays are the changes' columns, of one length.
pub async fn emit_many(
    conn: impl PgExecutor<'_>,
    objects: &[&str],
    kinds: &[&str],
    payloads: &[Json<&serde_json::Value>],
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        r#"select watchpump.emit_many($1, $2, $3) as "change_ids!""#,
        // Borrowed, not copied: the macro checks `text[]` and `jsonb[]`
        // against arrays of owned values only.
        objects as _,
        kinds as _,
        payloads as _,
    )
    .fetch_one(conn)
    .await
}

/// [`emit_many`] with the caller's W3C trace context, as [`emit_traced`].
pub async fn emit_many_traced(
    conn: impl PgExecutor<'_>,
    objects: &[&str],
    kinds: &[&str],
    payloads: &[Json<&serde_json::Value>],
    traceparent: &str,
    tracestate: Option<&str>,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        r#"with context as materialized (
               select set_config('watchpump.traceparent', $4, true),
                      set_config('watchpump.tracestate', coalesce($5, ''), true))
           select watchpump.emit_many($1, $2, $3) as "change_ids!" from context"#,
        objects as _,
        kinds as _,
        payloads as _,
        traceparent,
        tracestate,
    )
    .fetch_one(conn)
    .await
}
