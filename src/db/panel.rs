//! The panel's sessions (`watchpump.panel_sessions`, made by
//! `sql/migrations/0002_operator.sql`): the database keeps only each
//! session's key hash (`crate::operator::auth`).

use sqlx::PgPool;

/// Starts a session that ends after `ttl_secs`.
pub async fn create_session(pool: &PgPool, key_hash: &[u8], ttl_secs: f64) -> sqlx::Result<()> {
    sqlx::query!(
        "insert into watchpump.panel_sessions (key_hash, expires_at)
         values ($1, now() + make_interval(secs => $2))",
        key_hash,
        ttl_secs
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether a live session has this key hash.
pub async fn session_valid(pool: &PgPool, key_hash: &[u8]) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select exists (select 1 from watchpump.panel_sessions
                          where key_hash = $1 and expires_at > now()) as "valid!""#,
        key_hash
    )
    .fetch_one(pool)
    .await
}

pub async fn end_session(pool: &PgPool, key_hash: &[u8]) -> sqlx::Result<()> {
    sqlx::query!(
        "delete from watchpump.panel_sessions where key_hash = $1",
        key_hash
    )
    .execute(pool)
    .await?;
    Ok(())
}
