//! `make bench SCENARIOS=traces` (issue 21): what traces cost the pump.
//!
//! bulk-1 (20,000 changes emitted in one transaction, then the pump starts;
//! deliveries per second to the last arrival, and the pump's CPU per
//! delivery) and trickle (200 changes a second for 20 s, each in its own
//! transaction; commit to arrival p50/p99), in turn, each on a fresh
//! database, with:
//!
//! - `today`: the binary of WATCHPUMP_BENCH_BASELINE_BIN (the main branch's
//!   build, before traces), if set, on a database it migrated itself;
//! - `off`: this build, no OTLP endpoint, changes emitted without context;
//! - `on 100%`: an endpoint (a collector in this process that decodes every
//!   OTLP/protobuf request and counts the spans), each change emitted under
//!   its own sampled traceparent (a producer request of its own);
//! - `on 1%`: the same, with 1% of the producers' traceparents sampled and
//!   the pump's own root spans sampled at 1% (parentbased_traceidratio).
//!
//! Twice round, interleaved, so that the machine's drift shows as the
//! difference between the two rounds of one mode.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::json;
use sqlx::PgPool;

use super::{percentile, Bench, Consumer, Outcome};

const BULK: usize = 20_000;
const RATE: u64 = 200;
const SECONDS: u64 = 20;

#[derive(Clone)]
struct Mode {
    name: String,
    /// The share of producer traceparents sampled; None: no context, no
    /// endpoint.
    sampled: Option<f64>,
    /// The binary, if not this build's.
    baseline: Option<String>,
}

pub async fn traces(b: Bench) -> Outcome {
    let admin = std::env::var("WATCHPUMP_BENCH_DATABASE_URL").unwrap();
    // One baseline binary, or several: `name=path,name=path` (a bare path
    // is named "today").
    let baselines = std::env::var("WATCHPUMP_BENCH_BASELINE_BIN").unwrap_or_default();
    let spans = Arc::new(AtomicUsize::new(0));
    let endpoint = collector(spans.clone()).await;
    let mut modes = Vec::new();
    // `name=path@1.0` runs that binary with traces on, sampling 1.0 (an
    // A/B of two builds of the traces path itself).
    for entry in baselines.split(',').filter(|e| !e.trim().is_empty()) {
        let (name, bin) = entry.split_once('=').unwrap_or(("today", entry));
        let (bin, sampled) = match bin.rsplit_once('@') {
            Some((bin, ratio)) => (bin, ratio.trim().parse::<f64>().ok()),
            None => (bin, None),
        };
        modes.push(Mode {
            name: name.trim().to_string(),
            sampled,
            baseline: Some(bin.trim().to_string()),
        });
    }
    for (name, sampled) in [("off", None), ("on 100%", Some(1.0)), ("on 1%", Some(0.01))] {
        modes.push(Mode {
            name: name.to_string(),
            sampled,
            baseline: None,
        });
    }
    // WATCHPUMP_BENCH_TRACES_MODES="off,on 100%" keeps those modes only;
    // WATCHPUMP_BENCH_TRACES_ROUNDS=1 runs one round (for a quick look).
    if let Ok(keep) = std::env::var("WATCHPUMP_BENCH_TRACES_MODES") {
        let keep: Vec<&str> = keep.split(',').map(str::trim).collect();
        modes.retain(|m| keep.contains(&m.name.as_str()));
    }
    let rounds: u32 = std::env::var("WATCHPUMP_BENCH_TRACES_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    drop(b);
    let mut lines = Vec::new();
    let mut results = Vec::new();
    for round in 1..=rounds {
        for mode in &modes {
            let bin = mode
                .baseline
                .clone()
                .unwrap_or_else(|| this_build().to_string());
            let before = spans.load(Ordering::Relaxed);
            let bulk = bulk_one(&admin, &bin, mode, &endpoint).await;
            // WATCHPUMP_BENCH_TRACES_TRICKLE=0 leaves trickle out.
            let trickle = if std::env::var("WATCHPUMP_BENCH_TRACES_TRICKLE").is_ok_and(|t| t == "0")
            {
                (f64::NAN, f64::NAN)
            } else {
                trickle(&admin, &bin, mode, &endpoint).await
            };
            tokio::time::sleep(Duration::from_secs(6)).await; // the last export
            let exported = spans.load(Ordering::Relaxed) - before;
            let line = format!(
                "round {round} {:<10} bulk-1 {:>6.0}/s, {:>3.0} µs CPU/delivery | trickle p50 {:.2} ms, p99 {:.2} ms | {exported} spans at the collector",
                mode.name, bulk.0, bulk.1, trickle.0, trickle.1
            );
            println!("  {line}");
            lines.push(line);
            results.push(
                json!({"round": round, "mode": mode.name, "bulk1_per_s": bulk.0,
                "bulk1_cpu_us_per_delivery": bulk.1, "trickle_p50_ms": trickle.0,
                "trickle_p99_ms": trickle.1, "spans_exported": exported}),
            );
        }
    }
    Outcome {
        line: format!("{} runs (see the lines above)", lines.len()),
        json: json!({"runs": results}),
    }
}

/// A fresh database, migrated by `bin` itself (so that the baseline build
/// gets its own schema).
async fn fresh(admin: &str, bin: &str) -> (PgPool, String) {
    let db = "wpbench_traces_run";
    let admin_pool = watchpump::server::connect(admin, 1).await.unwrap();
    sqlx::query(&format!("drop database if exists {db} with (force)"))
        .execute(&admin_pool)
        .await
        .unwrap();
    sqlx::query(&format!("create database {db}"))
        .execute(&admin_pool)
        .await
        .unwrap();
    admin_pool.close().await;
    let url = format!("{}/{db}", admin.rsplit_once('/').unwrap().0);
    let status = Command::new(bin)
        .arg("migrate")
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    assert!(status.success(), "{bin} migrate");
    (watchpump::server::connect(&url, 16).await.unwrap(), url)
}

/// A bench on a fresh database with one service and a watch on `acme/`.
async fn setup(admin: &str, bin: &str, consumer: &Consumer) -> Bench {
    let (pool, url) = fresh(admin, bin).await;
    let b = Bench { pool, url };
    let service = if bin == this_build() {
        b.services(consumer).await[0]
    } else {
        // The baseline's schema may predate this build's service columns:
        // its own CLI registers the service.
        let status = Command::new(bin)
            .args(["services", "add", "svc0", "--json", "--base-url"])
            .arg(format!("http://{}", consumer.addrs[0]))
            .args(["--allowed-destinations", "127.0.0.0/8,::1"])
            .env("DATABASE_URL", &b.url)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "{bin} services add");
        let service: i64 =
            sqlx::query_scalar("select id from watchpump.services where name = 'svc0'")
                .fetch_one(&b.pool)
                .await
                .unwrap();
        // And a plain watch on `acme/`, written as that schema's insert.
        sqlx::query(
            "insert into watchpump.watches (service_id, resource, object, kinds, filters)
             values ($1, 'r', 'acme/', null, '{}')",
        )
        .bind(service)
        .execute(&b.pool)
        .await
        .unwrap();
        return b;
    };
    b.watch(service, "acme/").await;
    b
}

/// This build's release binary (`make bench` builds it).
fn this_build() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/watchpump")
}

fn pump_env(mode: &Mode, endpoint: &str) -> Vec<(&'static str, String)> {
    match mode.sampled {
        None => vec![],
        Some(ratio) => vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_string()),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".into()),
            ("OTEL_TRACES_SAMPLER_ARG", ratio.to_string()),
        ],
    }
}

/// A producer request's trace context, sampled with probability `ratio`.
fn traceparent(ratio: f64) -> String {
    traceparent_of(rand::random::<u128>() | 1, rand::random::<f64>() < ratio)
}

/// The trace context of a producer request in trace `trace_id`.
pub(super) fn traceparent_of(trace_id: u128, sampled: bool) -> String {
    format!(
        "00-{trace_id:032x}-{:016x}-{}",
        rand::random::<u64>() | 1,
        if sampled { "01" } else { "00" }
    )
}

const PAYLOAD: &str = r#"{"after": "9f2c1e", "paths": ["src/main.rs"]}"#;

async fn emit(conn: &mut sqlx::PgConnection, object: &str, mode: &Mode) -> i64 {
    match mode.sampled {
        None => {
            let payload: serde_json::Value = serde_json::from_str(PAYLOAD).unwrap();
            watchpump::emit(conn, object, "push", &payload)
                .await
                .unwrap()
        }
        Some(ratio) => emit_under(conn, object, &traceparent(ratio)).await,
    }
}

/// A change emitted as a producer's request with `traceparent` emits it
/// (its transaction's `watchpump.traceparent`).
pub(super) async fn emit_under(
    conn: &mut sqlx::PgConnection,
    object: &str,
    traceparent: &str,
) -> i64 {
    sqlx::query_scalar(
        "with c as materialized (select set_config('watchpump.traceparent', $3, true))
             select watchpump.emit($1, 'push', $2::jsonb) from c",
    )
    .bind(object)
    .bind(PAYLOAD)
    .bind(traceparent)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Deliveries per second from the pump's start to the last arrival, and the
/// pump's CPU µs per delivery.
async fn bulk_one(admin: &str, bin: &str, mode: &Mode, endpoint: &str) -> (f64, f64) {
    let consumer = Consumer::start(1).await;
    let b = setup(admin, bin, &consumer).await;
    let mut tx = b.pool.begin().await.unwrap();
    for n in 0..BULK {
        emit(&mut tx, &format!("acme/repo/refs/heads/b{n}"), mode).await;
    }
    tx.commit().await.unwrap();
    let env = pump_env(mode, endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let start = Instant::now();
    let pump = pump_process(&b, bin, &env);
    consumer.wait_for(BULK, Duration::from_secs(120)).await;
    let elapsed = start.elapsed().as_secs_f64();
    while b.count("delivered").await < BULK as i64 && start.elapsed() < Duration::from_secs(130) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = pump.cpu_seconds();
    pump.stop();
    (BULK as f64 / elapsed, cpu * 1e6 / BULK as f64)
}

/// Commit-to-arrival p50 and p99 at 200 changes a second.
async fn trickle(admin: &str, bin: &str, mode: &Mode, endpoint: &str) -> (f64, f64) {
    let consumer = Consumer::start(1).await;
    let b = setup(admin, bin, &consumer).await;
    let env = pump_env(mode, endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let pump = pump_process(&b, bin, &env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut committed = std::collections::HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    let total = (RATE * SECONDS) as usize;
    for n in 0..total {
        tick.tick().await;
        let mut tx = b.pool.begin().await.unwrap();
        let id = emit(&mut tx, &format!("acme/repo/refs/heads/b{}", n % 500), mode).await;
        tx.commit().await.unwrap();
        committed.insert(id, SystemTime::now());
    }
    consumer.wait_for(total, Duration::from_secs(30)).await;
    pump.stop();
    let mut ms: Vec<f64> = consumer
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
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (percentile(&ms, 0.5), percentile(&ms, 0.99))
}

/// The pump process: this build through [`Bench::pump`], or the baseline
/// binary with the same settings.
fn pump_process(b: &Bench, bin: &str, env: &[(&str, &str)]) -> super::PumpProcess {
    if bin == this_build() {
        return b.pump(env);
    }
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .env("DATABASE_URL", &b.url)
        .env("WATCHPUMP_ALLOWED_DESTINATIONS", "127.0.0.0/8,::1")
        .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", "git")
        .env("WATCHPUMP_PRODUCER_TOKEN", super::PRODUCER_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    super::PumpProcess::profiled(cmd.spawn().unwrap())
}

/// An OTLP/HTTP collector on loopback that decodes each request and counts
/// its spans; returns the endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`). It runs
/// on a thread and runtime of its own, as a collector is a process of its
/// own: decoding a batch of 512 spans must not hold up the consumer's
/// answers, which run on this process's runtime.
async fn collector(spans: Arc<AtomicUsize>) -> String {
    serve_apart(
        Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans),
    )
}

/// Serves `app` on a loopback port, on a thread and runtime of its own
/// (see [`collector`]); returns its URL.
pub(super) fn serve_apart(app: Router) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap()
        });
    });
    format!("http://{addr}")
}

async fn receive(State(spans): State<Arc<AtomicUsize>>, body: Bytes) -> axum::http::StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return axum::http::StatusCode::BAD_REQUEST;
    };
    let n: usize = request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum();
    spans.fetch_add(n, Ordering::Relaxed);
    axum::http::StatusCode::OK
}
