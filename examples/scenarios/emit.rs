//! `make bench SCENARIOS=emit`: what a producer pays for recording its
//! changes (issue 33's target: 20,000 emits in one transaction take at most
//! 3× a plain insert of the same 20,000 payloads into a table of the
//! producer's). The pump is not running: this is the producer's own
//! transaction alone, from `BEGIN` to the end of `COMMIT`, with one
//! matching watch.
//!
//! Four ways of writing 20,000 changes, each one transaction of one
//! statement run in SQL (`generate_series`), so that no client round trip
//! is counted, alternated for `ROUNDS` rounds (the median is reported):
//!
//! - **plain**: the payloads inserted into a table of the producer's;
//! - **emit()**: one `watchpump.emit()` call per change;
//! - **emit_many()**: one `watchpump.emit_many()` call over arrays;
//! - **rows**: the rows `emit_many()` wrote (changes, queue, objects),
//!   copied into tables shaped like watchpump's with the same indexes:
//!   PostgreSQL's own row work for them, the floor under any `emit()`.

use std::time::Instant;

use serde_json::json;

use super::{Bench, Consumer, Outcome};

/// Changes a transaction.
const CHANGES: i32 = 20_000;

/// Rounds of the four, alternated.
const ROUNDS: usize = 5;

pub async fn emit(b: Bench) -> Outcome {
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    for sql in [
        "create table producer_pushes (id bigserial primary key, object text, kind text, payload jsonb)",
        // The floor's tables: watchpump's columns, defaults and indexes,
        // without partitions, triggers or foreign keys.
        "create table floor_changes (like watchpump.changes including all)",
        "create table floor_queue (like watchpump.queue including all)",
        "create table floor_objects (like watchpump.objects including all)",
    ] {
        sqlx::query(sql).execute(&b.pool).await.unwrap();
    }
    let mut times: [Vec<f64>; 4] = Default::default();
    for round in 0..ROUNDS as i32 {
        let base = format!("acme/emit/r{round}");
        times[0].push(
            timed(
                &b,
                "insert into producer_pushes (object, kind, payload)
                 select $1 || '/' || i, 'push', jsonb_build_object('after', '9f2c1e', 'n', i)
                 from generate_series(1, $2::int) i",
                &format!("{base}/plain"),
            )
            .await,
        );
        times[1].push(
            timed(
                &b,
                "select count(watchpump.emit($1 || '/' || i, 'push', jsonb_build_object('after', '9f2c1e', 'n', i)))
                 from generate_series(1, $2::int) i",
                &format!("{base}/one"),
            )
            .await,
        );
        let last_change: i64 =
            sqlx::query_scalar("select coalesce(max(id), 0) from watchpump.changes")
                .fetch_one(&b.pool)
                .await
                .unwrap();
        let many = format!("{base}/many");
        times[2].push(
            timed(
                &b,
                "select cardinality(watchpump.emit_many(array_agg($1 || '/' || i), array_agg('push'::text),
                                                        array_agg(jsonb_build_object('after', '9f2c1e', 'n', i))))
                 from generate_series(1, $2::int) i",
                &many,
            )
            .await,
        );
        times[3].push(rows_floor(&b, last_change, &many).await);
        // The pump is not running: the queue would only grow.
        sqlx::query("delete from watchpump.queue")
            .execute(&b.pool)
            .await
            .unwrap();
    }
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let [plain, one, many, rows] = [
        median(&times[0]),
        median(&times[1]),
        median(&times[2]),
        median(&times[3]),
    ];
    Outcome {
        line: format!(
            "{CHANGES} changes in one transaction (median of {ROUNDS}): plain insert {:.0} ms; \
             emit() {:.0} ms ({:.1}x plain, {:.1} µs a change); emit_many() {:.0} ms ({:.1}x); \
             the same rows in watchpump's tables {:.0} ms ({:.1}x)",
            plain * 1e3,
            one * 1e3,
            one / plain,
            one * 1e6 / CHANGES as f64,
            many * 1e3,
            many / plain,
            rows * 1e3,
            rows / plain,
        ),
        json: json!({"changes": CHANGES, "rounds": ROUNDS,
                     "plain_s": times[0], "emit_s": times[1], "emit_many_s": times[2], "rows_s": times[3],
                     "median_plain_s": plain, "median_emit_s": one, "median_emit_many_s": many,
                     "median_rows_s": rows, "emit_to_plain": one / plain,
                     "emit_many_to_plain": many / plain, "rows_to_plain": rows / plain}),
    }
}

/// One transaction of `sql` (bound to a distinct object prefix and the
/// number of changes), `BEGIN` to the end of `COMMIT`, in seconds.
async fn timed(b: &Bench, sql: &str, prefix: &str) -> f64 {
    let started = Instant::now();
    let mut tx = b.pool.begin().await.unwrap();
    sqlx::query(sql)
        .bind(prefix)
        .bind(CHANGES)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    started.elapsed().as_secs_f64()
}

/// The rows `emit_many()` wrote for the objects under `prefix` (changes
/// after `last_change`), copied in one transaction into the floor's tables.
async fn rows_floor(b: &Bench, last_change: i64, prefix: &str) -> f64 {
    let started = Instant::now();
    let mut tx = b.pool.begin().await.unwrap();
    sqlx::query("insert into floor_changes select * from watchpump.changes where id > $1")
        .bind(last_change)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("insert into floor_queue select * from watchpump.queue where change_id > $1")
        .bind(last_change)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "insert into floor_objects select * from watchpump.objects where object like $1 || '/%'",
    )
    .bind(prefix)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    started.elapsed().as_secs_f64()
}
