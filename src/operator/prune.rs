//! Bounded tables: `watchpump.prune()` creates the history's partitions
//! ahead, retires one whole day past retention per call (the failed
//! deliveries kept longer, and what they need, go to a small `<day>_kept`
//! partition that replaces the day, itself retired after the failed
//! retention), and deletes rows of the DEFAULT partitions past their
//! retention in small batches (`sql/functions/0200_history.sql`). This
//! repeats it until it says there is no more.

use std::time::Duration;

use sqlx::PgPool;

use crate::db::history;
use crate::error::Result;
use crate::metrics as m;

/// Batches one round deletes at most, so a large backlog of old rows is
/// worked off over several rounds instead of holding the pool.
const MAX_BATCHES: usize = 200;
/// Pause between batches: lets the pump's statements in between and
/// autovacuum keep up.
const PAUSE: Duration = Duration::from_millis(20);

/// Rows deleted in one round (a retired day's are the statistics' estimate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub deliveries: i64,
    pub failed: i64,
    pub changes: i64,
}

/// Prunes in batches of `batch` until `watchpump.prune()` says it is done.
pub async fn run(
    pool: &PgPool,
    retention: Duration,
    failed_retention: Duration,
    batch: u32,
) -> Result<Pruned> {
    let mut total = Pruned::default();
    for _ in 0..MAX_BATCHES {
        let done = history::prune(
            pool,
            retention.as_secs_f64(),
            failed_retention.as_secs_f64(),
            batch as i32,
        )
        .await?;
        total.deliveries += i64::from(done.deliveries);
        total.failed += i64::from(done.failed);
        total.changes += i64::from(done.changes);
        if !done.more {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    record(pool, &total).await;
    Ok(total)
}

/// Exports what a round did ([`m::PRUNED`], [`m::PRUNE_LAST_SUCCESS`]) and
/// how far back the history reaches ([`m::HISTORY_OLDEST_DAY_AGE`]), so
/// that an alert sees retention stop. The round has succeeded by then: a
/// failure to read the history's age only leaves that gauge as it was.
async fn record(pool: &PgPool, pruned: &Pruned) {
    let counts = [pruned.deliveries, pruned.failed, pruned.changes];
    for (what, rows) in m::PRUNED_KINDS.iter().zip(counts) {
        metrics::counter!(m::PRUNED, "what" => *what).increment(rows.max(0) as u64);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    metrics::gauge!(m::PRUNE_LAST_SUCCESS).set(now.as_secs_f64());
    match oldest_day_age(pool).await {
        Ok(age) => metrics::gauge!(m::HISTORY_OLDEST_DAY_AGE).set(age),
        Err(e) => tracing::warn!(error = %e, "cannot read the history's oldest day"),
    }
}

/// Seconds since the end of the oldest day (or the v2 tables) that
/// retention has not retired yet, kept partitions aside; 0 without one.
async fn oldest_day_age(pool: &PgPool) -> Result<f64> {
    let age = history::oldest_day_age(pool).await?;
    Ok(age.unwrap_or(0.0).max(0.0))
}
