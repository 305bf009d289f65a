//! `make bench SCENARIOS=upgrade-v2` (issue 18): how long `migrate` takes
//! to bring a v2 database with 1 M deliveries of history to storage v3.
//!
//! The scenario's database is put back to v2 (the schema of main at
//! 505c60a, `tests/fixtures/storage_v2`) and filled by SQL with 1.1 M
//! changes over 8 days: 1 M settled deliveries (one in twenty failed,
//! with its attempt) and 111,111 queued. After a checkpoint, `migrate`
//! runs as `serve` runs it at start; then every row is counted where it
//! was. Migration 0008 attaches the v2 tables as partitions rather than
//! copying them (docs/operator.md, "Upgrading a v2 database"), so the
//! figure is one scan of each table to prove its CHECK constraint.

use std::time::Instant;

use serde_json::json;

use super::storage_v2;
use super::{Bench, Outcome};

/// Changes filled: nine in ten are settled, so 1,000,000 deliveries.
const CHANGES: i64 = 1_111_112;

pub async fn upgrade_v2(b: Bench) -> Outcome {
    sqlx::raw_sql("drop schema watchpump cascade")
        .execute(&b.pool)
        .await
        .unwrap();
    watchpump::sql_files::apply(&b.pool, "watchpump", &storage_v2::files())
        .await
        .unwrap();
    let filling = Instant::now();
    sqlx::raw_sql(&storage_v2::fill(CHANGES))
        .execute(&b.pool)
        .await
        .unwrap();
    for sql in ["vacuum analyze", "checkpoint"] {
        sqlx::query(sql).execute(&b.pool).await.unwrap();
    }
    let fill_s = filling.elapsed().as_secs_f64();
    let before = counts(&b).await;

    let started = Instant::now();
    let applied = watchpump::schema::migrate(&b.pool).await.unwrap();
    let migrate_s = started.elapsed().as_secs_f64();

    let after = counts(&b).await;
    assert_eq!(before, after, "rows before and after the upgrade");
    Outcome {
        line: format!(
            "{} v2 deliveries ({} changes, {} attempts, {} queued): migrate {migrate_s:.2} s \
             ({} files applied; filled in {fill_s:.0} s), every row kept",
            before[1],
            before[0],
            before[2],
            before[3],
            applied.len()
        ),
        json: json!({"changes": before[0], "settled": before[1], "attempts": before[2],
                     "queued": before[3], "migrate_s": migrate_s, "fill_s": fill_s,
                     "applied": applied}),
    }
}

/// Rows of changes, settled, attempt_log and queue.
async fn counts(b: &Bench) -> Vec<i64> {
    let mut rows = Vec::new();
    for table in ["changes", "settled", "attempt_log", "queue"] {
        let n: i64 = sqlx::query_scalar(&format!("select count(*) from watchpump.{table}"))
            .fetch_one(&b.pool)
            .await
            .unwrap();
        rows.push(n);
    }
    rows
}
