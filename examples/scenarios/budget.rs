//! `make bench SCENARIOS=fanout-budget` (issue 17, fan-out across
//! services): the worst `emit()` that any set of consumers can cause once
//! the fan-out budget (`src/watches/fanout.rs`) is full.
//!
//! Every watch is created through `watches::create`, so that the caps
//! decide what fits; the budget is filled on the emitted object
//! (`acme/web/refs/heads/main`) and its prefixes, round robin over the
//! services, until it refuses. Two mixes, each measured with 100 emits of
//! the filters scenario's 2,000-path payload (no filter matches, so every
//! filter reads every path), each in a transaction of its own, rolled back:
//!
//! - rows: 20 services with unfiltered watches only: the most queue rows one
//!   emit can write;
//! - filters: services with the dearest filters their own cap allows (24
//!   units on the object each, distinct so that none is evaluated once for
//!   two), until the budget refuses, the rest of it topped up with
//!   unfiltered watches.
//!
//! Reported: emit p50 and p99 as the producer sees them, and the rows one
//! emit wrote.

use std::time::Instant;

use serde_json::json;
use sqlx::{Connection, PgConnection};
use watchpump::watches::fanout::MAX_UNITS_PER_OBJECT;
use watchpump::watches::{self, Filters, NewWatch};

use super::filters::{payload, SHAPES};
use super::{percentile, Bench, Outcome};

const OBJECT: &str = "acme/web/refs/heads/main";
const COVERING: [&str; 3] = [OBJECT, "acme/web/", "acme/"];
const EMITS: usize = 100;

pub async fn budget(b: Bench) -> Outcome {
    let payload = payload();
    let services = services_with(&b, "rows", 20).await;
    let placed = fill_unfiltered(&b, &services, 0).await;
    let rows = measure(&b, &payload).await;
    for (service, id) in placed {
        watches::remove(&b.pool, service, id, "bench")
            .await
            .unwrap();
    }

    let dear = services_with(&b, "dear", 40).await;
    let mut filtered = 0;
    'fill: for (n, service) in dear.iter().enumerate() {
        for i in 0.. {
            let object = COVERING[i % COVERING.len()];
            let filter = (SHAPES[1].filter)(n * 10_000 + i);
            match create(&b, *service, object, Some(filter)).await {
                Ok(_) => filtered += 1,
                Err(e) if e.to_string().contains("across all services") => break 'fill,
                Err(e) if e.to_string().contains("may cost at most") => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    fill_unfiltered(&b, &services, 1_000_000).await;
    let filters = measure(&b, &payload).await;

    let line = format!(
        "budget {MAX_UNITS_PER_OBJECT} units on one object: unfiltered watches of 20 services: \
         emit p50 {:.1} ms, p99 {:.1} ms, {} rows; {filtered} distinct filters + unfiltered: \
         p50 {:.1} ms, p99 {:.1} ms, {} rows (target p99 <= 50 ms, <= 20,000 rows)",
        rows.p50, rows.p99, rows.rows, filters.p50, filters.p99, filters.rows
    );
    Outcome {
        line,
        json: json!({
            "budget_units": MAX_UNITS_PER_OBJECT, "emits": EMITS,
            "rows_mix": {"p50_ms": rows.p50, "p99_ms": rows.p99, "max_ms": rows.max, "rows": rows.rows},
            "filters_mix": {"filters": filtered, "p50_ms": filters.p50, "p99_ms": filters.p99,
                            "max_ms": filters.max, "rows": filters.rows},
            "target": "emit p99 <= 50 ms, <= 20,000 rows per emit"}),
    }
}

async fn services_with(b: &Bench, prefix: &str, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let s = watchpump::services::add_within(
            &b.pool,
            &format!("{prefix}{i}"),
            "http://127.0.0.1:9",
            &watchpump::destinations::Destinations::loopback(),
        )
        .await
        .unwrap();
        ids.push(s.service.id);
    }
    ids
}

/// Unfiltered watches round robin over `services` and the covering objects
/// until the budget refuses one; returns (service, watch id) of each.
async fn fill_unfiltered(b: &Bench, services: &[i64], first: usize) -> Vec<(i64, i64)> {
    let mut placed = Vec::new();
    for i in first.. {
        let service = services[i % services.len()];
        let object = COVERING[(i / services.len()) % COVERING.len()];
        match create(b, service, object, None).await {
            Ok(id) => placed.push((service, id)),
            Err(e) if e.to_string().contains("across all services") => break,
            Err(e) => panic!("{e}"),
        }
    }
    placed
}

async fn create(
    b: &Bench,
    service_id: i64,
    object: &str,
    filter: Option<String>,
) -> watchpump::Result<i64> {
    let new = NewWatch {
        resource: format!("r{}", rand_tag()),
        object: object.into(),
        filters: Filters {
            kinds: None,
            match_path: filter,
        },
        resync: false,
    };
    watches::create(&b.pool, service_id, &new)
        .await
        .map(|(w, _)| w.id)
}

fn rand_tag() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

struct Measured {
    p50: f64,
    p99: f64,
    max: f64,
    rows: i64,
}

/// `EMITS` emits on one connection (warmed up on another object), each
/// rolled back after counting its rows.
async fn measure(b: &Bench, payload: &serde_json::Value) -> Measured {
    let mut conn = PgConnection::connect(&b.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    watchpump::emit(&mut tx, "warm/up", "push", payload)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut ms = Vec::with_capacity(EMITS);
    let mut rows = 0;
    for _ in 0..EMITS {
        let mut tx = conn.begin().await.unwrap();
        let start = Instant::now();
        let change = watchpump::emit(&mut tx, OBJECT, "push", payload)
            .await
            .unwrap();
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        rows = sqlx::query_scalar("select count(*) from watchpump.queue where change_id = $1")
            .bind(change)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
    }
    ms.sort_by(f64::total_cmp);
    Measured {
        p50: percentile(&ms, 0.50),
        p99: percentile(&ms, 0.99),
        max: ms[ms.len() - 1],
        rows,
    }
}
