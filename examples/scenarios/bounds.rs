//! `make bench SCENARIOS="payload-rss answers"` (issue 17, "bounded at any
//! volume"): what a large payload fanned out, and a consumer's answer
//! pattern, cost the pump and the producer's database.
//!
//! - `payload-rss`: one consumer service with 64 unfiltered watches on
//!   `big/`, one change with a payload of 1 MiB (emit()'s default limit),
//!   then 10 MiB and 16 MiB (the most `watchpump.max_payload_bytes` may
//!   allow), each in a database of its own and a pump process of its own;
//!   the consumer holds each request 200 ms, so that all 64 are on the wire
//!   at once. Reported: the pump's peak RSS (VmHWM) once all 64 arrived.
//! - `answers`: the attack of issue 17's H2. 10,000 watches of one service
//!   (one per object, by SQL: the point is what answers cost, whatever the
//!   caps on watches), one change each, and an endpoint that answers a
//!   different 4xx every time with `Retry-After: 1`, for 60 s. Reported:
//!   attempt_log rows (inserted and updated), WAL bytes, and attempts made.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::json;

use super::{Bench, Outcome};

const WATCHES: usize = 64;

pub async fn payload_rss(b: Bench) -> Outcome {
    let admin = format!("{}/postgres", b.url.rsplit_once('/').unwrap().0);
    drop(b);
    let mut figures = Vec::new();
    let mut line = Vec::new();
    for mib in [1usize, 10, 16] {
        let b = Bench::new(&admin, &format!("payload_rss_{mib}")).await;
        let (rss, all) = one_payload(&b, mib).await;
        line.push(format!(
            "{mib} MiB: {rss:.0} MiB{}",
            if all { "" } else { " INCOMPLETE" }
        ));
        figures.push(json!({"payload_mib": mib, "watches": WATCHES, "pump_peak_rss_mib": rss, "complete": all}));
    }
    Outcome {
        line: format!(
            "{WATCHES} watches x one payload, pump peak RSS: {}",
            line.join(", ")
        ),
        json: json!(figures),
    }
}

/// One change of `mib` MiB to 64 watches; the pump's peak RSS.
async fn one_payload(b: &Bench, mib: usize) -> (f64, bool) {
    let arrived = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/{*path}", post(slow_sink))
        .layer(DefaultBodyLimit::disable())
        .with_state(arrived.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let service = watchpump::services::add_within(
        &b.pool,
        "big",
        &format!("http://{addr}"),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap()
    .service;
    sqlx::query(
        "insert into watchpump.watches (service_id, resource, object)
         select $1, 'r' || i, 'big/' from generate_series(1, $2) i",
    )
    .bind(service.id)
    .bind(WATCHES as i32)
    .execute(&b.pool)
    .await
    .unwrap();
    let mut tx = b.pool.begin().await.unwrap();
    sqlx::query("select set_config('watchpump.max_payload_bytes', '16777216', true)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // {"a": "..."} of mib MiB of JSON text.
    let payload = json!({ "a": "x".repeat(mib * 1024 * 1024 - 9) });
    watchpump::emit(&mut tx, "big/one", "push", &payload)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    drop(payload);
    let pump = b.pump(&[("WATCHPUMP_ALLOWED_DESTINATIONS", "127.0.0.0/8")]);
    let started = Instant::now();
    while arrived.load(Ordering::Relaxed) < WATCHES as u64
        && started.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = arrived.load(Ordering::Relaxed) == WATCHES as u64;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = pump.peak_rss_mib();
    pump.stop();
    (rss, all)
}

async fn slow_sink(State(arrived): State<Arc<AtomicU64>>, body: axum::body::Bytes) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(body);
    arrived.fetch_add(1, Ordering::Relaxed);
    StatusCode::OK
}

/// What the endpoint of `answers` has answered so far.
struct Answers {
    attempts: AtomicU64,
}

pub async fn answers(b: Bench) -> Outcome {
    let state = Arc::new(Answers {
        attempts: AtomicU64::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/{*path}", post(changing_4xx))
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let service = watchpump::services::add_within(
        &b.pool,
        "refuser",
        &format!("http://{addr}"),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap()
    .service;
    let n = 10_000;
    sqlx::query(
        "insert into watchpump.watches (service_id, resource, object)
         select $1, 'r', 'acme/' || i from generate_series(1, $2) i",
    )
    .bind(service.id)
    .bind(n)
    .execute(&b.pool)
    .await
    .unwrap();
    sqlx::query("select watchpump.emit('acme/' || i, 'push', '{}') from generate_series(1, $1) i")
        .bind(n)
        .execute(&b.pool)
        .await
        .unwrap();
    let wal_before: String = sqlx::query_scalar("select pg_current_wal_lsn()::text")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    let seconds = 60;
    let pump = b.pump(&[("WATCHPUMP_ALLOWED_DESTINATIONS", "127.0.0.0/8")]);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    pump.stop();
    let (rows, wal): (i64, i64) = sqlx::query_as(
        "select (select count(*) from watchpump.attempt_log),
                pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::int8",
    )
    .bind(&wal_before)
    .fetch_one(&b.pool)
    .await
    .unwrap();
    let attempts = state.attempts.load(Ordering::Relaxed);
    let per_delivery_hour = rows as f64 / n as f64 * 3600.0 / seconds as f64;
    Outcome {
        line: format!(
            "{n} deliveries, a different 4xx each time with Retry-After: 1, {seconds} s: {attempts} attempts, {rows} attempt_log rows ({per_delivery_hour:.2} per delivery per hour at this pace), {:.1} MB of WAL",
            wal as f64 / 1e6
        ),
        json: json!({"deliveries": n, "seconds": seconds, "attempts": attempts, "attempt_log_rows": rows,
                     "rows_per_delivery_per_hour": per_delivery_hour, "wal_bytes": wal}),
    }
}

async fn changing_4xx(State(state): State<Arc<Answers>>) -> (StatusCode, HeaderMap) {
    let n = state.attempts.fetch_add(1, Ordering::Relaxed);
    let status = [400, 401, 403, 404, 409, 422][(n % 6) as usize];
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", "1".parse().unwrap());
    (StatusCode::from_u16(status).unwrap(), headers)
}
