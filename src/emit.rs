//! The producer's side: record a change in the producer's own transaction.

use sqlx::PgConnection;

use crate::error::Result;

/// Records a change of `object` and writes one delivery per matching live
/// watch, inside the caller's transaction: commit and the deliveries go out,
/// roll back and nothing is ever sent. Returns the change's id.
///
/// Emitters to one object queue on its sequence counter until they commit,
/// so sequence numbers per object follow commit order.
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
    let change_id: i64 = sqlx::query_scalar("select watchpump.emit($1, $2, $3)")
        .bind(object)
        .bind(kind)
        .bind(sqlx::types::Json(payload))
        .fetch_one(conn)
        .await?;
    Ok(change_id)
}
