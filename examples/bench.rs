//! `make bench`: watchpump against a real PostgreSQL, a real pump process
//! (target/release/watchpump serve) and real HTTP consumers on loopback in
//! this process. Prints one line per scenario and writes JSON to
//! target/bench/. See BENCHMARKS.md for the figures and how to read them.
//!
//! Clocks: latencies compare the consumer's arrival time with the producer's
//! wall clock read right after its COMMIT returned (same machine, same clock).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;

const PRODUCER_TOKEN: &str = "bench-producer-token";

#[path = "scenarios/backlog.rs"]
mod backlog;
#[path = "scenarios/bounds.rs"]
mod bounds;
#[path = "scenarios/budget.rs"]
mod budget;
#[path = "scenarios/emit.rs"]
mod emit;
#[path = "scenarios/filters.rs"]
mod filters;
#[path = "scenarios/hanging.rs"]
mod hanging;
#[path = "scenarios/history.rs"]
mod history;
#[path = "scenarios/legs.rs"]
mod legs;
#[path = "scenarios/peer.rs"]
mod peer;
#[path = "scenarios/resync.rs"]
mod resync;
#[path = "scenarios/scale.rs"]
mod scale;
#[path = "scenarios/send_floor.rs"]
mod send_floor;
/// The v2 schema and its fill, shared with tests/history.rs.
#[path = "../tests/fixtures/storage_v2/mod.rs"]
mod storage_v2;
#[path = "scenarios/traces.rs"]
mod traces;
#[path = "scenarios/upgrade.rs"]
mod upgrade;

#[tokio::main]
async fn main() {
    // send-floor's client process (examples/scenarios/send_floor.rs).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--send-floor-client") {
        send_floor::client(&args[2], args[3].parse().unwrap()).await;
        return;
    }
    // The pumps it starts inherit the key their signing secrets are sealed with.
    if std::env::var_os("WATCHPUMP_SECRET_KEY").is_none() {
        std::env::set_var(
            "WATCHPUMP_SECRET_KEY",
            "YmVuY2ggb25seTogYSBmaXhlZCBzZWNyZXQga2V5ISE=",
        );
    }
    let admin = std::env::var("WATCHPUMP_BENCH_DATABASE_URL")
        .expect("WATCHPUMP_BENCH_DATABASE_URL (run `make bench`)");
    let only: Vec<String> = std::env::args().skip(1).collect();
    std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench")).unwrap();
    let scenarios: Vec<(&str, Scenario)> = vec![
        ("trickle", |b| Box::pin(trickle(b))),
        ("trickle-legs", |b| Box::pin(legs::legs(b))),
        ("bulk-1", |b| Box::pin(bulk_one(b))),
        ("bulk", |b| Box::pin(bulk(b))),
        ("backlog", |b| Box::pin(backlog::backlog(b))),
        ("fanout", |b| Box::pin(fanout(b))),
        ("emit", |b| Box::pin(emit::emit(b))),
        ("producer", |b| Box::pin(producer(b))),
        ("supersession", |b| Box::pin(supersession(b))),
        ("recovery", |b| Box::pin(recovery(b))),
        ("filters", |b| Box::pin(filters::filters(b))),
        ("payload-rss", |b| Box::pin(bounds::payload_rss(b))),
        ("answers", |b| Box::pin(bounds::answers(b))),
        ("fanout-budget", |b| Box::pin(budget::budget(b))),
        ("hanging", |b| Box::pin(hanging::hanging(b))),
        ("history", |b| Box::pin(history::history(b))),
        ("scale", |b| Box::pin(scale::scale(b))),
        ("traces", |b| Box::pin(traces::traces(b))),
        ("resync", |b| Box::pin(resync::resync(b))),
        ("send-floor", |_| Box::pin(send_floor::send_floor())),
        ("upgrade-v2", |b| Box::pin(upgrade::upgrade_v2(b))),
        ("peer", |b| Box::pin(peer::peer(b))),
    ];
    println!(
        "watchpump bench — {} cores, {}",
        num_cpus(),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    for (name, run) in scenarios {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let bench = Bench::new(&admin, name).await;
        let result = run(bench).await;
        println!("{name:<14} {}", result.line);
        let json = serde_json::to_string_pretty(&result.json).unwrap();
        std::fs::write(
            format!(
                concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench/{}.json"),
                name
            ),
            json,
        )
        .unwrap();
    }
}

/// A scenario: given a fresh database, run and report.
type Scenario = fn(Bench) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome>>>;

struct Outcome {
    line: String,
    json: serde_json::Value,
}

/// A fresh database for one scenario.
struct Bench {
    pool: PgPool,
    url: String,
}

impl Bench {
    async fn new(admin: &str, name: &str) -> Bench {
        let db = format!("wpbench_{}", name.replace('-', "_"));
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
        let pool = watchpump::server::connect(&url, 16).await.unwrap();
        // Where PostgreSQL spends its time, for reading a scenario afterwards
        // (`select * from pg_stat_statements` in wpbench_<scenario>).
        sqlx::query("create extension if not exists pg_stat_statements")
            .execute(&pool)
            .await
            .unwrap();
        watchpump::schema::migrate(&pool).await.unwrap();
        Bench { pool, url }
    }

    /// Starts counting database time afresh ([`Bench::db_us_per_delivery`]).
    async fn db_time_reset(&self) {
        sqlx::query("select pg_stat_statements_reset()")
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// PostgreSQL's execution time in `claim()` and `complete()` (which
    /// settles, so `settle()` is inside it) since [`Bench::db_time_reset`],
    /// in this scenario's database, per delivery, in µs: the issue's
    /// "database time per delivery", from pg_stat_statements (loaded by the
    /// bench cluster only: scripts/dev-postgres.sh).
    async fn db_us_per_delivery(&self, deliveries: usize) -> f64 {
        let ms: f64 = sqlx::query_scalar(
            "select coalesce(sum(s.total_exec_time), 0)::float8 from pg_stat_statements s
             where s.dbid = (select oid from pg_database where datname = current_database())
               and s.toplevel and s.query ~ 'watchpump\\.(claim|complete|settle)\\('",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap();
        ms * 1000.0 / deliveries.max(1) as f64
    }

    /// Registers `n` consumer services pointing at `consumer`'s listeners.
    async fn services(&self, consumer: &Consumer) -> Vec<i64> {
        let mut ids = Vec::new();
        for (i, addr) in consumer.addrs.iter().enumerate() {
            let s = watchpump::services::add_within(
                &self.pool,
                &format!("svc{i}"),
                &format!("http://{addr}"),
                &watchpump::destinations::Destinations::loopback(),
            )
            .await
            .unwrap();
            ids.push(s.service.id);
        }
        ids
    }

    async fn watch(&self, service_id: i64, object: &str) {
        let new = watchpump::watches::NewWatch {
            resource: "r".into(),
            object: object.into(),
            filters: Default::default(),
            resync: false,
        };
        watchpump::watches::create(&self.pool, service_id, &new)
            .await
            .unwrap();
    }

    async fn emit(&self, object: &str) -> (i64, SystemTime) {
        let mut tx = self.pool.begin().await.unwrap();
        let id = watchpump::emit(
            &mut tx,
            object,
            "push",
            &json!({"after": "9f2c1e", "paths": ["src/main.rs"]}),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        (id, SystemTime::now())
    }

    async fn count(&self, state: &str) -> i64 {
        sqlx::query_scalar("select count(*) from watchpump.deliveries where state = $1")
            .bind(state)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    fn pump(&self, extra: &[(&str, &str)]) -> PumpProcess {
        let mut cmd = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/release/watchpump"
        ));
        cmd.arg("serve")
            .env("DATABASE_URL", &self.url)
            .env("WATCHPUMP_ALLOWED_DESTINATIONS", "127.0.0.0/8,::1")
            .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", "git")
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .expect("target/release/watchpump (make bench builds it)");
        PumpProcess::profiled(child)
    }
}

impl PumpProcess {
    /// `child`, with WATCHPUMP_BENCH_PERF=1 (or `dwarf`) a CPU profile of it,
    /// target/bench/pump-<pid>.perf (read with `perf report -i`).
    fn profiled(child: Child) -> PumpProcess {
        let perf = std::env::var("WATCHPUMP_BENCH_PERF").ok().map(|how| {
            // WATCHPUMP_BENCH_PERF=dwarf unwinds by DWARF: slower, but it
            // sees through the allocator and std, which frame pointers
            // do not.
            let graph = if how == "dwarf" { "dwarf,16384" } else { "fp" };
            Command::new("perf")
                .args([
                    "record",
                    "-e",
                    "cpu-clock",
                    "-F",
                    "999",
                    "--call-graph",
                    graph,
                    "-p",
                ])
                .arg(child.id().to_string())
                .arg("-o")
                .arg(format!(
                    concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench/pump-{}.perf"),
                    child.id()
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("perf (apt-get install linux-perf)")
        });
        PumpProcess { child, perf }
    }
}

struct PumpProcess {
    child: Child,
    perf: Option<Child>,
}

impl PumpProcess {
    /// CPU seconds used so far (user + system).
    fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(&format!("/proc/{}/stat", self.child.id()))
    }

    /// Peak resident memory in MiB.
    fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib_of(&format!("/proc/{}/status", self.child.id()))
    }

    fn stop(mut self) {
        if let Some(mut perf) = self.perf.take() {
            let _ = Command::new("kill")
                .args(["-INT", &perf.id().to_string()])
                .status();
            let _ = perf.wait();
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// Consumers on loopback: one listener per service, recording arrivals.
#[derive(Clone)]
struct Consumer {
    addrs: Vec<SocketAddr>,
    state: Arc<ConsumerState>,
}

struct ConsumerState {
    received: AtomicUsize,
    arrivals: Mutex<Vec<(i64, i64, SystemTime)>>, // change_id, sequence, arrival
    delay_ms: AtomicU64,
}

#[derive(Deserialize)]
struct Delivery {
    change_id: i64,
    sequence: i64,
}

impl Consumer {
    async fn start(n: usize) -> Consumer {
        let state = Arc::new(ConsumerState {
            received: AtomicUsize::new(0),
            arrivals: Mutex::new(Vec::with_capacity(64 * 1024)),
            delay_ms: AtomicU64::new(0),
        });
        let mut addrs = Vec::new();
        for _ in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(listener.local_addr().unwrap());
            Self::serve(listener, state.clone());
        }
        Consumer { addrs, state }
    }

    fn serve(listener: tokio::net::TcpListener, state: Arc<ConsumerState>) {
        let app = Router::new()
            .route("/{*path}", post(receive))
            .with_state(state);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }

    fn received(&self) -> usize {
        self.state.received.load(Ordering::Relaxed)
    }

    async fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.received() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

async fn receive(State(state): State<Arc<ConsumerState>>, body: Bytes) -> StatusCode {
    let at = SystemTime::now();
    let delay = state.delay_ms.load(Ordering::Relaxed);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let Ok(d) = serde_json::from_slice::<Delivery>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    state
        .arrivals
        .lock()
        .unwrap()
        .push((d.change_id, d.sequence, at));
    state.received.fetch_add(1, Ordering::Relaxed);
    StatusCode::OK
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// 200 changes/s for 20 s (or WATCHPUMP_BENCH_TRICKLE), one watch each, each
/// in its own transaction.
async fn trickle(b: Bench) -> Outcome {
    // WATCHPUMP_BENCH_TRICKLE="rate,seconds" overrides the issue's 200/s x 20 s.
    let (rate, seconds) = std::env::var("WATCHPUMP_BENCH_TRICKLE")
        .ok()
        .and_then(|v| {
            let (r, s) = v.split_once(',')?;
            Some((r.trim().parse().ok()?, s.trim().parse().ok()?))
        })
        .unwrap_or((200u64, 20u64));
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    let pump = b.pump(&[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut committed = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    let total = (rate * seconds) as usize;
    for n in 0..total {
        tick.tick().await;
        let (id, at) = b.emit(&format!("acme/repo/refs/heads/b{}", n % 500)).await;
        committed.insert(id, at);
    }
    let all = consumer.wait_for(total, Duration::from_secs(30)).await;
    pump.stop();
    let mut ms: Vec<f64> = consumer
        .state
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(change, _, at)| {
            let c = committed.get(change)?;
            Some(match at.duration_since(*c) {
                Ok(d) => d.as_secs_f64() * 1000.0,
                Err(e) => -e.duration().as_secs_f64() * 1000.0,
            })
        })
        .collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (p50, p99, max) = (
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN),
    );
    Outcome {
        line: format!(
            "{rate}/s for {seconds}s: commit->consumer p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms ({} of {total} arrived{})",
            ms.len(),
            if all { "" } else { ", INCOMPLETE" }
        ),
        json: json!({"rate_per_s": rate, "seconds": seconds, "changes": total, "arrived": ms.len(),
                     "p50_ms": p50, "p99_ms": p99, "max_ms": max, "clock": "producer wall clock after COMMIT vs consumer arrival"}),
    }
}

/// The peer comparison's first row: 20,000 changes to distinct objects, one
/// watch, one consumer, emitted in one transaction with no pump running;
/// then the pump process starts, and the clock runs from its start to the
/// last arrival.
async fn bulk_one(b: Bench) -> Outcome {
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    let total = 20_000;
    let mut tx = b.pool.begin().await.unwrap();
    for n in 0..total {
        watchpump::emit(
            &mut tx,
            &format!("acme/repo/refs/heads/b{n}"),
            "push",
            &json!({"after": "9f2c1e", "paths": ["src/main.rs"]}),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    b.db_time_reset().await;
    let work = WorkCpu::now(&b.pool).await;
    let start = Instant::now();
    let extra: Vec<(String, String)> = std::env::var("WATCHPUMP_BENCH_PUMP_ENV")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let extra: Vec<(&str, &str)> = extra
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let pump = b.pump(&extra);
    let all = consumer.wait_for(total, Duration::from_secs(120)).await;
    let elapsed = start.elapsed().as_secs_f64();
    // The last outcomes are written after the last arrival; let them land
    // before reading the pump's CPU time.
    while b.count("delivered").await < total as i64 && start.elapsed() < Duration::from_secs(130) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (cpu, rss) = (pump.cpu_seconds(), pump.peak_rss_mib());
    let (postgres_cpu, consumer_cpu) = work.since();
    pump.stop();
    let db_us = b.db_us_per_delivery(total).await;
    let rate = total as f64 / elapsed;
    let cpu_us = cpu * 1e6 / total as f64;
    let per = |s: f64| s * 1e6 / total as f64;
    let work_us = per(cpu + postgres_cpu + consumer_cpu);
    Outcome {
        line: format!(
            "{total} deliveries, 1 service: {rate:.0} deliveries/s from pump start to last arrival ({elapsed:.2} s), pump CPU {cpu_us:.0} µs/delivery, DB {db_us:.1} µs/delivery (claim + complete), CPU of the work {work_us:.0} µs/delivery (PostgreSQL {:.0}, consumer {:.0}), peak RSS {rss:.1} MiB{}",
            per(postgres_cpu),
            per(consumer_cpu),
            if all { "" } else { " INCOMPLETE" }
        ),
        json: json!({"deliveries": total, "services": 1, "seconds": elapsed, "deliveries_per_s": rate,
                     "pump_cpu_s": cpu, "pump_cpu_us_per_delivery": cpu_us, "pump_peak_rss_mib": rss,
                     "db_us_per_delivery": db_us, "work_cpu_us_per_delivery": work_us,
                     "postgres_cpu_us_per_delivery": per(postgres_cpu),
                     "consumer_cpu_us_per_delivery": per(consumer_cpu)}),
    }
}

/// 50,000 pending deliveries across 10 services, then the pump starts.
async fn bulk(b: Bench) -> Outcome {
    let consumer = Consumer::start(10).await;
    let services = b.services(&consumer).await;
    for s in &services {
        b.watch(*s, "acme/").await;
    }
    // 5,000 changes to distinct objects x 10 watches, emitted in batches.
    let changes = 5000;
    for chunk in 0..(changes / 500) {
        let mut tx = b.pool.begin().await.unwrap();
        for n in 0..500 {
            watchpump::emit(
                &mut tx,
                &format!("acme/repo/refs/heads/b{chunk}-{n}"),
                "push",
                &json!({"n": n}),
            )
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    let total = changes * 10;
    assert_eq!(b.count("pending").await as usize, total);
    b.db_time_reset().await;
    let start = Instant::now();
    let pump = b.pump(&[]);
    let all = consumer.wait_for(total, Duration::from_secs(120)).await;
    let elapsed = start.elapsed().as_secs_f64();
    // Let the last completions land before reading the pump's figures.
    while b.count("delivered").await < total as i64 && start.elapsed() < Duration::from_secs(130) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_marked = start.elapsed().as_secs_f64();
    let (cpu, rss) = (pump.cpu_seconds(), pump.peak_rss_mib());
    pump.stop();
    let db_us = b.db_us_per_delivery(total).await;
    let rate = total as f64 / elapsed;
    Outcome {
        line: format!(
            "{total} deliveries, 10 services: {rate:.0} deliveries/s (all received in {elapsed:.2} s, all marked delivered in {all_marked:.2} s), pump CPU {cpu:.2} s, DB {db_us:.1} µs/delivery (claim + complete), peak RSS {rss:.1} MiB{}",
            if all { "" } else { " INCOMPLETE" }
        ),
        json: json!({"deliveries": total, "services": 10, "seconds_to_receive": elapsed, "seconds_to_mark": all_marked,
                     "deliveries_per_s": rate, "pump_cpu_s": cpu, "pump_peak_rss_mib": rss,
                     "db_us_per_delivery": db_us}),
    }
}

/// One change matched by 1,000 watches.
async fn fanout(b: Bench) -> Outcome {
    let consumer = Consumer::start(10).await;
    let services = b.services(&consumer).await;
    for i in 0..1000 {
        let new = watchpump::watches::NewWatch {
            resource: format!("r{i}"),
            object: "acme/web/refs/heads/main".into(),
            filters: Default::default(),
            resync: false,
        };
        watchpump::watches::create(&b.pool, services[i % 10], &new)
            .await
            .unwrap();
    }
    let pump = b.pump(&[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Warm the plans once on another object, then measure.
    b.emit("acme/other").await;
    let mut tx = b.pool.begin().await.unwrap();
    let t = Instant::now();
    watchpump::emit(
        &mut tx,
        "acme/web/refs/heads/main",
        "push",
        &json!({"after": "9f2c"}),
    )
    .await
    .unwrap();
    let emit_ms = t.elapsed().as_secs_f64() * 1000.0;
    tx.commit().await.unwrap();
    let committed = Instant::now();
    let all = consumer.wait_for(1000, Duration::from_secs(30)).await;
    let all_ms = committed.elapsed().as_secs_f64() * 1000.0;
    pump.stop();
    Outcome {
        line: format!(
            "1 change x 1000 watches: emit {emit_ms:.2} ms in the producer's transaction, all 1000 delivered {all_ms:.1} ms after commit{}",
            if all { "" } else { " INCOMPLETE" }
        ),
        json: json!({"watches": 1000, "emit_ms": emit_ms, "all_delivered_ms": all_ms}),
    }
}

/// The peer comparison's third and fourth rows: 8 connections for 10 s
/// each, a transaction being one insert into the producer's own table,
/// alone, then with `emit()`, without a pump and with one running and
/// delivering.
async fn producer(b: Bench) -> Outcome {
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    sqlx::query("create table producer_pushes (id bigserial primary key, repo text, ref text, after text, at timestamptz default now())")
        .execute(&b.pool)
        .await
        .unwrap();
    let seconds = 10;
    let plain = commits_per_second(&b.pool, seconds, false).await;
    let without_pump = commits_per_second(&b.pool, seconds, true).await;
    let pump = b.pump(&[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with_pump = commits_per_second(&b.pool, seconds, true).await;
    let cpu = pump.cpu_seconds();
    consumer.wait_for(1, Duration::from_secs(5)).await;
    pump.stop();
    Outcome {
        line: format!(
            "8 connections x {seconds}s: plain insert {plain:.0} commits/s; insert + emit {without_pump:.0} without the pump ({:.2} of plain), {with_pump:.0} with it running ({:.2}); consumer received {}",
            without_pump / plain,
            with_pump / plain,
            consumer.received()
        ),
        json: json!({"connections": 8, "seconds": seconds, "plain_commits_per_s": plain,
                     "emit_commits_per_s_without_pump": without_pump, "emit_commits_per_s_with_pump": with_pump,
                     "ratio_without_pump": without_pump / plain, "ratio_with_pump": with_pump / plain,
                     "pump_cpu_s": cpu, "received": consumer.received()}),
    }
}

async fn commits_per_second(pool: &PgPool, seconds: u64, emit: bool) -> f64 {
    let stop = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for w in 0..8 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                let mut tx = pool.begin().await.unwrap();
                let branch = format!("b{}", n % 50);
                sqlx::query("insert into producer_pushes (repo, ref, after) values ($1, $2, $3)")
                    .bind(format!("repo{w}"))
                    .bind(&branch)
                    .bind("9f2c1e")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                if emit {
                    watchpump::emit(
                        &mut tx,
                        &format!("acme/repo{w}/refs/heads/{branch}"),
                        "push",
                        &json!({"after": "9f2c1e"}),
                    )
                    .await
                    .unwrap();
                }
                tx.commit().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / seconds as f64
}

/// 10,000 changes to one object while the consumer answers in 50 ms.
async fn supersession(b: Bench) -> Outcome {
    let consumer = Consumer::start(1).await;
    consumer.state.delay_ms.store(50, Ordering::Relaxed);
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/web/refs/heads/main").await;
    let pump = b.pump(&[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let mut last = 0;
    for _ in 0..10_000 {
        last = b.emit("acme/web/refs/heads/main").await.0;
    }
    let emit_s = start.elapsed().as_secs_f64();
    let delivered = wait_until(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, bool>("select exists (select 1 from watchpump.deliveries where change_id = $1 and state = 'delivered')")
            .bind(last)
            .fetch_one(&b.pool)
            .await
            .unwrap()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    pump.stop();
    let arrivals = consumer.state.arrivals.lock().unwrap().clone();
    let newest_last = arrivals.iter().max_by_key(|a| a.2).map(|a| a.0) == Some(last);
    let superseded = b.count("superseded").await;
    Outcome {
        line: format!(
            "10000 changes to one object in {emit_s:.1} s, consumer 50 ms: consumer received {} deliveries, last = newest: {newest_last}, {superseded} superseded{}",
            arrivals.len(),
            if delivered { "" } else { " (newest NOT delivered)" }
        ),
        json: json!({"changes": 10000, "consumer_delay_ms": 50, "received": arrivals.len(), "last_is_newest": newest_last,
                     "superseded": superseded, "emit_seconds": emit_s}),
    }
}

/// 10,000 deliveries to a consumer that refuses connections, their retries
/// minutes ahead; then it comes back.
async fn recovery(b: Bench) -> Outcome {
    let placeholder = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = placeholder.local_addr().unwrap();
    drop(placeholder); // refuse connections on addr
    let service = watchpump::services::add_within(
        &b.pool,
        "deploy",
        &format!("http://{addr}"),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap()
    .service;
    b.watch(service.id, "acme/").await;
    let pump = b.pump(&[
        ("WATCHPUMP_RETRY_INITIAL_MS", "300000"),
        ("WATCHPUMP_RETRY_MAX_MS", "600000"),
    ]);
    for chunk in 0..20 {
        let mut tx = b.pool.begin().await.unwrap();
        for n in 0..500 {
            watchpump::emit(
                &mut tx,
                &format!("acme/repo/refs/heads/b{chunk}-{n}"),
                "push",
                &json!({}),
            )
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    // Wait until the pump has tried and the service is down. The deliveries
    // it attempted wait minutes; the others are due but held back by probing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting_minutes: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.deliveries where state = 'pending' and next_attempt_at > now() + interval '1 minute'",
    )
    .fetch_one(&b.pool)
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let state = Arc::new(ConsumerState {
        received: AtomicUsize::new(0),
        arrivals: Mutex::new(Vec::new()),
        delay_ms: AtomicU64::new(0),
    });
    let consumer = Consumer {
        addrs: vec![addr],
        state: state.clone(),
    };
    let back = Instant::now();
    Consumer::serve(listener, state);
    let all = consumer.wait_for(10_000, Duration::from_secs(60)).await;
    let seconds = back.elapsed().as_secs_f64();
    pump.stop();
    Outcome {
        line: format!(
            "10000 deliveries ({waiting_minutes} of them backed off for minutes): all delivered {seconds:.2} s after the consumer came back{}",
            if all { "" } else { " INCOMPLETE" }
        ),
        json: json!({"deliveries": 10000, "backed_off_for_minutes": waiting_minutes, "seconds_after_recovery": seconds}),
    }
}

async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// A process's CPU seconds so far (user + system), from its
/// `/proc/<pid>/stat`.
fn cpu_seconds_of(stat_path: &str) -> f64 {
    stat_fields(stat_path)
        .map(|f| (f.utime + f.stime) / 100.0)
        .unwrap_or(0.0)
}

/// The fields of a `/proc/<pid>/stat` the meters read, in clock ticks.
struct StatFields {
    ppid: u32,
    utime: f64,
    stime: f64,
    /// Of its children that have exited and been waited for.
    cutime: f64,
    cstime: f64,
}

fn stat_fields(stat_path: &str) -> Option<StatFields> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let num = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Some(StatFields {
        ppid: fields.get(1)?.parse().ok()?,
        utime: num(11),
        stime: num(12),
        cutime: num(13),
        cstime: num(14),
    })
}

/// The CPU the work of a scenario costs, whatever else the host runs: the
/// bench cluster's PostgreSQL (its postmaster, its live processes, and
/// those that exited), the pump, and this process (the consumer), in CPU
/// seconds. Taken before and after, the difference is the issue's "whole
/// machine's CPU a delivery", without other tenants of a shared host.
#[derive(Clone, Copy)]
struct WorkCpu {
    postmaster: u32,
    postgres: f64,
    bench: f64,
}

impl WorkCpu {
    /// Now, for the cluster `pool` is connected to (on this host).
    async fn now(pool: &PgPool) -> WorkCpu {
        let backend: i32 = sqlx::query_scalar("select pg_backend_pid()")
            .fetch_one(pool)
            .await
            .unwrap();
        let postmaster = stat_fields(&format!("/proc/{backend}/stat")).map_or(0, |f| f.ppid);
        WorkCpu {
            postmaster,
            postgres: postgres_cpu_seconds(postmaster),
            bench: cpu_seconds_of("/proc/self/stat"),
        }
    }

    /// PostgreSQL's and this process's CPU seconds since `self`.
    fn since(&self) -> (f64, f64) {
        (
            postgres_cpu_seconds(self.postmaster) - self.postgres,
            cpu_seconds_of("/proc/self/stat") - self.bench,
        )
    }
}

/// A PostgreSQL cluster's CPU seconds so far: its postmaster's, its live
/// children's, and those of its children that exited.
fn postgres_cpu_seconds(postmaster: u32) -> f64 {
    let Some(own) = stat_fields(&format!("/proc/{postmaster}/stat")) else {
        return 0.0;
    };
    let mut ticks = own.utime + own.stime + own.cutime + own.cstime;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(f) = stat_fields(&format!("/proc/{pid}/stat")) {
            if f.ppid == postmaster {
                ticks += f.utime + f.stime;
            }
        }
    }
    ticks / 100.0
}

/// A process's peak resident memory in MiB, from its `/proc/<pid>/status`.
fn peak_rss_mib_of(status_path: &str) -> f64 {
    std::fs::read_to_string(status_path)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
