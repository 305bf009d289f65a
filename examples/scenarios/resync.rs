//! `resync` (issue 20): a resync of 10,000 objects, and what it costs the
//! producer. 10,000 objects under `acme/obj/` each have one change, emitted
//! before the consumer's watch exists (so nothing is queued yet). Then, in
//! interleaved rounds (A, B, A, B, so that the shared machine's noise hits
//! both sides):
//!
//! - A: 4 producer connections emit for 5 s, one change per transaction, to
//!   objects a second watch of the same service covers (`acme/live/`);
//! - B: the same producers while a resync of the `acme/obj/` watch runs
//!   (in this process, as the API's task runs it: batches of 200 objects);
//!   the resync's time, and the producers' emit-and-commit p99 meanwhile.
//!
//! No pump runs: the cost measured is the resync's reads and the queue rows
//! it writes, beside the producers' own. Replays are deleted between rounds
//! so that each resync queues all 10,000 again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{percentile, Bench, Consumer, Outcome};

const OBJECTS: usize = 10_000;

pub async fn resync(b: Bench) -> Outcome {
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    let service = services[0];
    // The objects' history, 500 changes a transaction.
    for chunk in (0..OBJECTS).collect::<Vec<_>>().chunks(500) {
        let mut tx = b.pool.begin().await.unwrap();
        for i in chunk {
            watchpump::emit(
                &mut tx,
                &format!("acme/obj/{i:05}"),
                "push",
                &json!({"n": i}),
            )
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    b.watch(service, "acme/obj/").await;
    b.watch(service, "acme/live/").await;
    let watch: i64 =
        sqlx::query_scalar("select id from watchpump.watches where object = 'acme/obj/'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    sqlx::query("analyze").execute(&b.pool).await.unwrap();

    let mut rounds = Vec::new();
    for round in 0..4 {
        let with_resync = round % 2 == 1;
        sqlx::query("delete from watchpump.queue")
            .execute(&b.pool)
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..4)
            .map(|w| tokio::spawn(produce(b.pool.clone(), w, stop.clone())))
            .collect();
        let mut resync_s = None;
        let mut queued = 0;
        if with_resync {
            let started = Instant::now();
            let s = watchpump::watches::resync::start(&b.pool, service, watch, 10_000)
                .await
                .unwrap();
            assert_eq!(s.objects as usize, OBJECTS);
            let done = watchpump::watches::resync::run(&b.pool, watch, 10_000)
                .await
                .unwrap();
            queued = done.queued;
            resync_s = Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_secs(if with_resync { 0 } else { 5 })).await;
        stop.store(true, Ordering::SeqCst);
        let mut latencies: Vec<f64> = Vec::new();
        for p in producers {
            latencies.extend(p.await.unwrap());
        }
        latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rounds.push((with_resync, resync_s, queued, latencies));
    }
    let summary = |resync: bool| {
        let all: Vec<&(bool, Option<f64>, i64, Vec<f64>)> =
            rounds.iter().filter(|r| r.0 == resync).collect();
        let p99: Vec<f64> = all.iter().map(|r| percentile(&r.3, 0.99)).collect();
        let p50: Vec<f64> = all.iter().map(|r| percentile(&r.3, 0.50)).collect();
        let n: usize = all.iter().map(|r| r.3.len()).sum();
        (p50, p99, n)
    };
    let (a50, a99, an) = summary(false);
    let (b50, b99, bn) = summary(true);
    let times: Vec<f64> = rounds.iter().filter_map(|r| r.1).collect();
    let queued: Vec<i64> = rounds.iter().filter(|r| r.0).map(|r| r.2).collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    Outcome {
        line: format!(
            "resync of {OBJECTS} objects: {} s (queued {:?}); emit+commit p50/p99 without {:?}/{:?} ms ({an} emits), during {:?}/{:?} ms ({bn} emits); load {}",
            times.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(", "),
            queued,
            a50.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>(),
            a99.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>(),
            b50.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>(),
            b99.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>(),
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        ),
        json: json!({"objects": OBJECTS, "resync_s": times, "queued": queued,
                     "emit_p50_ms_without": a50, "emit_p99_ms_without": a99,
                     "emit_p50_ms_during": b50, "emit_p99_ms_during": b99,
                     "emits_without": an, "emits_during": bn, "loadavg": load.trim()}),
    }
}

/// One producer connection: a change per transaction until `stop`; each
/// emit-and-commit's milliseconds.
async fn produce(pool: sqlx::PgPool, w: usize, stop: Arc<AtomicBool>) -> Vec<f64> {
    let mut took = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        watchpump::emit(
            &mut tx,
            &format!("acme/live/p{w}/{}", n % 100),
            "push",
            &json!({"n": n}),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        took.push(started.elapsed().as_secs_f64() * 1000.0);
        n += 1;
    }
    took
}
