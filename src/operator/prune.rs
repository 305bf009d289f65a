//! Bounded tables: `watchpump.prune()` creates the history's partitions
//! ahead, retires one whole day past retention per call (the failed
//! deliveries kept longer, and what they need, are copied to the DEFAULT
//! partitions first), and deletes kept rows past their retention in small
//! batches (`sql/functions/0300_operator.sql`). This repeats it until it
//! says there is no more.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Result;

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
        let (deliveries, failed, changes, more): (i32, i32, i32, bool) = sqlx::query_as(
            "select deliveries, failed, changes, more
             from watchpump.prune(make_interval(secs => $1), make_interval(secs => $2), $3)",
        )
        .bind(retention.as_secs_f64())
        .bind(failed_retention.as_secs_f64())
        .bind(batch as i32)
        .fetch_one(pool)
        .await?;
        total.deliveries += i64::from(deliveries);
        total.failed += i64::from(failed);
        total.changes += i64::from(changes);
        if !more {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    Ok(total)
}
