//! The schemas' own statements: whether the producer's schema is there,
//! and which of its roles exist.

use sqlx::PgPool;

/// Whether this database has the `watchpump` schema (its bookkeeping
/// table): the CLI's commands other than `migrate` refuse one without it.
#[cfg(feature = "producer")]
pub async fn watchpump_schema_exists(pool: &PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select to_regclass('watchpump.schema_migrations') is not null as "exists!""#
    )
    .fetch_one(pool)
    .await
}
