//! `make bench SCENARIOS=send-floor` (issue 18): the least CPU the pump's
//! HTTP side costs a delivery on this host, beside bulk-1's pump CPU.
//!
//! A process of its own (this binary, `--send-floor-client URL N`) sends N
//! deliveries shaped like bulk-1's through the pump's own
//! [`watchpump::pump::send::Sender`] (the same client, pool, signing,
//! body and answer handling), as many at a time as a pump sends to one
//! service (`WATCHPUMP_SERVICE_CONCURRENCY`'s default, from the pump's own
//! configuration), to the bench's consumer in this process. It has no database: no claim,
//! no write-back, no listener, no sweep. Its CPU time per delivery is what
//! the pump cannot spend less than on the send path alone; bulk-1's pump
//! CPU less this figure is what the rest of the pump costs.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use watchpump::delivery::outcome::AttemptResult;
use watchpump::delivery::request::Target;
use watchpump::delivery::{Claimed, Message, Payload};
use watchpump::pump::send::Sender;

use super::{Consumer, Outcome};

const DELIVERIES: usize = 50_000;

pub async fn send_floor() -> Outcome {
    let consumer = Consumer::start(1).await;
    let url = format!("http://{}", consumer.addrs[0]);
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let before = consumer.received();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--send-floor-client", &url, &DELIVERIES.to_string()])
            .output()
            .expect("the send-floor client");
        assert!(
            out.status.success(),
            "send-floor client: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let received = consumer.received() - before;
        // And the one that warmed the pool.
        assert_eq!(received, DELIVERIES + 1, "the consumer received {received}");
        rounds.push(report);
    }
    let cpu: Vec<f64> = rounds
        .iter()
        .map(|r| r["cpu_us_per_delivery"].as_f64().unwrap())
        .collect();
    let rate: Vec<f64> = rounds
        .iter()
        .map(|r| r["deliveries_per_s"].as_f64().unwrap())
        .collect();
    Outcome {
        line: format!(
            "{DELIVERIES} sends, {} at a time, no database, 3 runs: client CPU {} µs/delivery, {} deliveries/s",
            rounds[0]["concurrency"],
            cpu.iter()
                .map(|c| format!("{c:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
            rate.iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        json: json!({"deliveries": DELIVERIES, "runs": rounds}),
    }
}

/// The client process: sends `n` deliveries to `url`, prints its CPU time
/// per delivery as JSON.
pub async fn client(url: &str, n: usize) {
    let mut cfg = watchpump::config::PumpConfig::new("git", "bench-producer-token");
    cfg.allowed_destinations = Some(watchpump::destinations::Destinations::loopback());
    let sender = Sender::new(&cfg).expect("the pump's HTTP client");
    let destination = watchpump::services::Destination {
        version: 1,
        name: "svc0".into(),
        base_url: url.into(),
        current: watchpump::signing::SigningSecret::generate(),
        previous: None,
    };
    let target = Arc::new(Target::new(destination, "git").expect("the events URL"));
    // Warm the pool, as a pump's first deliveries do.
    sender.send(claimed(0), target.clone()).await;
    let next = Arc::new(AtomicI64::new(1));
    let cpu_before = super::cpu_seconds_of("/proc/self/stat");
    let started = Instant::now();
    let concurrency = cfg.service_concurrency;
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (sender, target, next) = (sender.clone(), target.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id > n as i64 {
                        break;
                    }
                    let finished = sender.send(claimed(id), target.clone()).await;
                    assert!(
                        matches!(finished.result, AttemptResult::Delivered { .. }),
                        "{:?}",
                        finished.error
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let elapsed = started.elapsed();
    let cpu = super::cpu_seconds_of("/proc/self/stat") - cpu_before;
    println!(
        "{}",
        json!({
            "concurrency": concurrency,
            "cpu_s": cpu,
            "cpu_us_per_delivery": cpu * 1e6 / n as f64,
            "deliveries_per_s": n as f64 / elapsed.max(Duration::from_micros(1)).as_secs_f64(),
        })
    );
}

/// A delivery shaped like bulk-1's.
fn claimed(id: i64) -> Claimed {
    Claimed {
        message: Message {
            delivery_id: id,
            change_id: id,
            watch_id: 1,
            attempt: 1,
            resource: "r".into(),
            object: format!("acme/repo/refs/heads/b{id}"),
            kind: "push".into(),
            sequence: 1,
            occurred_at: chrono::Utc::now(),
            payload: Payload::new(r#"{"after": "9f2c1e", "paths": ["src/main.rs"]}"#.into()),
            replay: false,
        },
        service_id: 1,
        service_version: 1,
        expired_lease_of: None,
        trace: None,
    }
}
