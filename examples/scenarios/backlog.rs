//! `make bench SCENARIOS=backlog`: does a claim cost the same at any
//! backlog depth (issue 33)? One service, one watch, a backlog emitted with
//! the pump stopped (each change to an object of its own, as a consumer
//! that was down overnight, or a producer's import, leaves it); then the
//! pump starts and the clock runs from its start to the 20,000th arrival.
//! First from a backlog of 20,000, then, in the same database, from one
//! of 1,000,000 (`WATCHPUMP_BENCH_BACKLOG=20000,1000000` sets the depths).
//! The ratio of the two rates is the figure: 1.0 is a claim whose cost
//! does not depend on the backlog.
//!
//! The backlog is emitted by SQL in one transaction per depth (up to 1,000,000 changes)
//! (`watchpump.emit()` over `generate_series`) and then analyzed, as
//! autovacuum would after such an insert: the pump's plans are made from
//! statistics that know the queue is deep. A checkpoint follows, so that
//! the deep emit's WAL is not still being written out while the pump
//! drains (a backlog of a night is built across many checkpoints). After
//! the first 20,000, the
//! pump is stopped (its last outcomes written back) and what is left of
//! the backlog is removed before the next depth.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Bench, Consumer, Outcome};

/// Deliveries timed at each depth.
const TIMED: usize = 20_000;

/// Changes emitted per transaction while the backlog is built.
const EMIT_BATCH: usize = 1_000_000;

pub async fn backlog(b: Bench) -> Outcome {
    let depths: Vec<usize> = std::env::var("WATCHPUMP_BENCH_BACKLOG")
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![20_000, 1_000_000]);
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    let mut runs = Vec::new();
    for (round, &depth) in depths.iter().enumerate() {
        let emitted = Instant::now();
        let mut left = depth;
        let mut batch = 0;
        while left > 0 {
            let n = left.min(EMIT_BATCH);
            sqlx::query(
                "select count(watchpump.emit('acme/backlog/r' || $1::int || '/b' || $2::int || '/' || i, 'push',
                                             jsonb_build_object('after', '9f2c1e', 'n', i)))
                 from generate_series(1, $3::int) i",
            )
            .bind(round as i32)
            .bind(batch)
            .bind(n as i32)
            .execute(&b.pool)
            .await
            .unwrap();
            left -= n;
            batch += 1;
        }
        let emit_s = emitted.elapsed().as_secs_f64();
        sqlx::query("analyze watchpump.queue")
            .execute(&b.pool)
            .await
            .unwrap();
        // A deep backlog's emit writes gigabytes of WAL and sets off a
        // checkpoint that would still be writing while the pump drains:
        // each page the pump then touches first costs a full-page image.
        // A backlog of a night was built across many checkpoints; so each
        // depth starts after one, and the figure is the claim's.
        sqlx::query("checkpoint").execute(&b.pool).await.unwrap();
        let before = consumer.received();
        b.db_time_reset().await;
        let start = Instant::now();
        let pump = b.pump(&[]);
        let timed = TIMED.min(depth);
        let all = consumer
            .wait_for(before + timed, Duration::from_secs(600))
            .await;
        let elapsed = start.elapsed().as_secs_f64();
        let cpu = pump.cpu_seconds();
        pump.stop();
        let db_us = b.db_us_per_delivery(timed).await;
        let rate = timed as f64 / elapsed;
        // What the pump did not get to, gone before the next depth.
        sqlx::query("delete from watchpump.queue")
            .execute(&b.pool)
            .await
            .unwrap();
        runs.push(json!({"depth": depth, "timed": timed, "seconds": elapsed, "deliveries_per_s": rate,
                         "emit_seconds": emit_s, "pump_cpu_us_per_delivery": cpu * 1e6 / timed as f64,
                         "db_us_per_delivery": db_us, "complete": all}));
    }
    let rate = |i: usize| runs[i]["deliveries_per_s"].as_f64().unwrap_or(f64::NAN);
    let ratio = if runs.len() >= 2 {
        rate(runs.len() - 1) / rate(0)
    } else {
        f64::NAN
    };
    let parts: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "from {}: {:.0}/s (DB {:.1} µs, pump CPU {:.0} µs a delivery){}",
                r["depth"],
                r["deliveries_per_s"].as_f64().unwrap_or(f64::NAN),
                r["db_us_per_delivery"].as_f64().unwrap_or(f64::NAN),
                r["pump_cpu_us_per_delivery"].as_f64().unwrap_or(f64::NAN),
                if r["complete"].as_bool() == Some(true) {
                    ""
                } else {
                    " INCOMPLETE"
                }
            )
        })
        .collect();
    Outcome {
        line: format!(
            "first {TIMED} of a backlog, 1 service: {}; deepest/shallowest {ratio:.2}",
            parts.join("; ")
        ),
        json: json!({"runs": runs, "ratio_deepest_to_shallowest": ratio}),
    }
}
