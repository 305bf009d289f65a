//! `make bench SCENARIOS=hanging` (issue 17 item 5): what consumers that
//! never answer cost a healthy one.
//!
//! 300 services, each with 64 watches on a prefix of its own and a loopback
//! listener that accepts connections and never answers; one healthy
//! consumer with one watch. The pump process runs with its defaults. First
//! a baseline: 300 changes to the healthy consumer at 20 a second, each
//! timed from the producer's commit to its arrival. Then one change per
//! hanging service (300 x 64 = 19,200 deliveries that hang until the
//! request timeout), and the same 300 changes to the healthy consumer at
//! once. Reported: the healthy consumer's p50/p99 in both phases (the added
//! delay is the difference), and the most sockets the pump held (its open
//! files, sampled every 100 ms).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::net::TcpListener;

use super::{percentile, Bench, Consumer, Outcome};

const HANGING: usize = 300;
const WATCHES_EACH: usize = 64;
const CHANGES: usize = 300;
const RATE: u64 = 20;

pub async fn hanging(b: Bench) -> Outcome {
    let _ = watchpump::edge::raise_open_file_limit();
    let healthy = Consumer::start(1).await;
    let ok = b.services(&healthy).await[0];
    b.watch(ok, "ok/").await;
    for i in 0..HANGING {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let s = watchpump::services::add_within(
            &b.pool,
            &format!("hang{i}"),
            &format!("http://{addr}"),
            &watchpump::destinations::Destinations::loopback(),
        )
        .await
        .unwrap();
        sqlx::query(
            "insert into watchpump.watches (service_id, resource, object)
             select $1, 'r' || g, $2 from generate_series(1, $3) g",
        )
        .bind(s.service.id)
        .bind(format!("hang/{i}/"))
        .bind(WATCHES_EACH as i64)
        .execute(&b.pool)
        .await
        .unwrap();
    }
    let pump = b.pump(&[]);
    let pid = pump.child.id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = phase(&b, &healthy, 0).await;

    let most = Arc::new(AtomicUsize::new(0));
    let seen = most.clone();
    let sampling = tokio::spawn(async move {
        loop {
            let open = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
            seen.fetch_max(open, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut tx = b.pool.begin().await.unwrap();
    for i in 0..HANGING {
        watchpump::emit(&mut tx, &format!("hang/{i}/x"), "push", &json!({}))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let attacked = phase(&b, &healthy, CHANGES).await;
    sampling.abort();
    let most_fds = most.load(Ordering::Relaxed);
    pump.stop();
    let line = format!(
        "{HANGING} services x {WATCHES_EACH} deliveries hanging + 1 healthy: healthy p50 {:.1} ms, \
         p99 {:.1} ms ({} of {CHANGES} arrived; alone: p50 {:.1} ms, p99 {:.1} ms); added p99 \
         {:.1} ms (target <= 100 ms); most open files of the pump {most_fds}",
        attacked.p50,
        attacked.p99,
        attacked.arrived,
        base.p50,
        base.p99,
        attacked.p99 - base.p99,
    );
    Outcome {
        line,
        json: json!({"hanging_services": HANGING, "deliveries_each": WATCHES_EACH,
                     "changes": CHANGES, "rate_per_s": RATE,
                     "alone": {"p50_ms": base.p50, "p99_ms": base.p99, "arrived": base.arrived},
                     "with_hanging": {"p50_ms": attacked.p50, "p99_ms": attacked.p99,
                                      "max_ms": attacked.max, "arrived": attacked.arrived},
                     "added_p99_ms": attacked.p99 - base.p99,
                     "pump_most_open_files": most_fds,
                     "target": "added p99 <= 100 ms"}),
    }
}

struct Phase {
    p50: f64,
    p99: f64,
    max: f64,
    arrived: usize,
}

/// `CHANGES` changes to the healthy consumer at `RATE` a second; `already`
/// arrived before.
async fn phase(b: &Bench, healthy: &Consumer, already: usize) -> Phase {
    let mut committed: HashMap<i64, SystemTime> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    for n in 0..CHANGES {
        tick.tick().await;
        let (id, at) = b.emit(&format!("ok/{}", n + already)).await;
        committed.insert(id, at);
    }
    healthy
        .wait_for(already + CHANGES, Duration::from_secs(60))
        .await;
    let mut ms: Vec<f64> = healthy
        .state
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(change, _, at)| {
            let c = committed.get(change)?;
            Some(
                at.duration_since(*c)
                    .map_or(0.0, |d| d.as_secs_f64() * 1000.0),
            )
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    Phase {
        p50: percentile(&ms, 0.5),
        p99: percentile(&ms, 0.99),
        max: ms.last().copied().unwrap_or(f64::NAN),
        arrived: ms.len(),
    }
}
