//! The history's statements (`sql/functions/0200_history.sql`): its
//! partitions by day and retention.

use sqlx::{PgConnection, PgPool};

/// What one call of `watchpump.prune()` deleted (a retired day's rows are
/// the statistics' estimate), and whether there is more to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneBatch {
    pub deliveries: i32,
    pub failed: i32,
    pub changes: i32,
    pub more: bool,
}

/// `watchpump.prune()`: one batch of at most `batch` rows past their
/// retention (seconds), and one retired day.
pub async fn prune(
    pool: &PgPool,
    retention_secs: f64,
    failed_retention_secs: f64,
    batch: i32,
) -> sqlx::Result<PruneBatch> {
    sqlx::query_as!(
        PruneBatch,
        r#"select deliveries as "deliveries!", failed as "failed!", changes as "changes!",
                  more as "more!"
           from watchpump.prune(make_interval(secs => $1), make_interval(secs => $2), $3)"#,
        retention_secs,
        failed_retention_secs,
        batch
    )
    .fetch_one(pool)
    .await
}

/// Seconds since the end of the oldest day (or the v2 tables) that
/// retention has not retired yet, kept partitions aside; none without one.
pub async fn oldest_day_age(pool: &PgPool) -> sqlx::Result<Option<f64>> {
    sqlx::query_scalar!(
        "select extract(epoch from now() - min(p.to_at))::float8
         from watchpump.partitions p where not p.kept"
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.add_partitions_ahead()`: today's partitions and the next
/// days'.
pub async fn add_partitions_ahead(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("select from watchpump.add_partitions_ahead()")
        .execute(conn)
        .await?;
    Ok(())
}
