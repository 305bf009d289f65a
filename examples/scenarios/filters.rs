//! `make bench SCENARIOS=filters` (issue 9, "a consumer cannot hurt the
//! producer"): what a hostile consumer's filters can make one `emit()` cost.
//!
//! One service holds 10,000 watches (one short, so that the cap refuses
//! before the watch count does), every one with a filter as dear as the
//! language and the caps allow, created through `watches::create` so that
//! the caps decide what fits. The emitted object (`acme/web/refs/heads/main`)
//! gets the most the per-object cap allows, spread over the object and its
//! prefixes; the rest sit on other objects, as many per object as the cap
//! allows. Each shape of dear filter is measured in turn (topped up to the
//! cap with one-unit filters): 100 emits of a 2,000-path payload that no
//! filter matches (so every filter reads every path), each in a transaction
//! of its own, on a backend that starts fresh for the shape and is warmed up
//! on another object (so the first measured emit compiles the regexes).
//! Reported: emit p50 and p99 as the producer sees them, and the backend's
//! peak memory (VmHWM, read from /proc; the bench runs on the database's
//! machine).

use std::time::Instant;

use serde_json::json;
use sqlx::{Connection, PgConnection};
use watchpump::watches::cap::MAX_FILTER_COST_PER_OBJECT;
use watchpump::watches::filter;
use watchpump::watches::{self, Filters, NewWatch, MAX_WATCHES_PER_SERVICE};

use super::{percentile, Bench, Outcome};

const OBJECT: &str = "acme/web/refs/heads/main";
const COVERING: [&str; 3] = [OBJECT, "acme/web/", "acme/"];
const EMITS: usize = 100;
const PATHS: usize = 2_000;

/// A family of dear filters; `i` makes each one distinct, so that emit()
/// can not evaluate two of them once. (Within the 256 characters a filter
/// may have.)
pub(super) struct Shape {
    pub(super) name: &'static str,
    pub(super) filter: fn(usize) -> String,
}

fn or_all(n: usize, each: impl Fn(usize) -> String) -> String {
    (0..n).map(each).collect::<Vec<_>>().join(" || ")
}

pub(super) const SHAPES: &[Shape] = &[
    Shape {
        name: "16 string < per filter",
        filter: |i| {
            let conds = or_all(15, |k| format!(r#"@ < "b{k}""#));
            format!(r#"$.paths[*] ? (@ < "a{i}" || {conds})"#)
        },
    },
    Shape {
        name: "one string < per filter",
        filter: |i| format!(r#"$.paths[*] ? (@ < "a{i}")"#),
    },
    Shape {
        name: "16 == after 8 wildcards",
        filter: |i| {
            let conds = or_all(15, |k| format!(r#"@ == "z{k}""#));
            format!(r#"$.paths[*][*][*][*] ? (@[*][*][*][*] == "z{i}" || {conds})"#)
        },
    },
    Shape {
        name: "like_regex of weight 16 (.* x15)",
        filter: |i| {
            format!(
                r#"$.paths[*] ? (@ like_regex "{}Q{}")"#,
                ".*".repeat(14),
                char::from(b'A' + (i % 26) as u8)
            )
        },
    },
    Shape {
        name: "like_regex [a-z]*[0-9]* x6, flag i",
        filter: |i| {
            format!(
                r#"$.paths[*] ? (@ like_regex "{}Q{}" flag "i")"#,
                "[a-z]*[0-9]*".repeat(6),
                i % 10
            )
        },
    },
    Shape {
        name: "four like_regex of weight 1",
        filter: |i| {
            let conds = or_all(4, |k| {
                let letter = char::from(b'A' + ((i * 4 + k) % 26) as u8);
                format!(r#"@ like_regex "{letter}""#)
            });
            format!("$.paths[*] ? ({conds})")
        },
    },
];

pub async fn filters(b: Bench) -> Outcome {
    let hostile = service(&b, "hostile").await;
    let dearest = &SHAPES[0];
    let others = fill_other_objects(&b, hostile, dearest).await;
    let payload = payload();
    // What storing the change costs without a filter to evaluate.
    let mut rows = vec![("no filter on the object", 0, measure(&b, &payload).await)];
    for shape in SHAPES {
        let placed = cover_object(&b, hostile, shape, 0).await;
        let m = measure(&b, &payload).await;
        rows.push((shape.name, placed.len(), m));
        for id in placed {
            watches::remove(&b.pool, hostile, id, "bench")
                .await
                .unwrap();
        }
    }
    // The dearest shape by its median; p99 on a shared host is noisier.
    let worst = rows
        .iter()
        .max_by(|a, b| a.2.p50.total_cmp(&b.2.p50))
        .unwrap();
    // A second hostile service at its own cap doubles the bill: the cap is
    // per service.
    let second = service(&b, "hostile2").await;
    cover_object(&b, hostile, dearest, 0).await;
    cover_object(&b, second, dearest, 1_000_000).await;
    let two = measure(&b, &payload).await;
    report(others, &rows, worst, &two)
}

/// What one shape measured.
struct Measured {
    p50: f64,
    p99: f64,
    max: f64,
    vm_hwm_mib: f64,
    vm_hwm_at_start_mib: f64,
}

async fn service(b: &Bench, name: &str) -> i64 {
    watchpump::services::add_within(
        &b.pool,
        name,
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap()
    .service
    .id
}

/// Creates watches with `shape`'s filters on the emitted object and its
/// prefixes, round robin, until the per-object cap refuses one, then tops
/// up what is left of the cap with one-unit filters of the dearest kind per
/// unit; returns their ids.
async fn cover_object(b: &Bench, service_id: i64, shape: &Shape, first: usize) -> Vec<i64> {
    let mut ids = fill(b, service_id, shape, first).await;
    ids.extend(fill(b, service_id, &SHAPES[1], first + 1000).await);
    ids
}

async fn fill(b: &Bench, service_id: i64, shape: &Shape, first: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in first.. {
        let object = COVERING[i % COVERING.len()];
        match create(b, service_id, object, &(shape.filter)(i)).await {
            Ok(id) => ids.push(id),
            Err(e) if e.to_string().contains("may cost at most") => break,
            Err(e) => panic!("{}: {e}", shape.name),
        }
    }
    ids
}

/// The rest of the service's 10,000 watches, on other objects, as many per
/// object as the cap allows. Returns how many.
async fn fill_other_objects(b: &Bench, service_id: i64, shape: &Shape) -> usize {
    let cost = filter::parse(&(shape.filter)(0)).unwrap().cost;
    let per_object = (MAX_FILTER_COST_PER_OBJECT / cost) as usize;
    // One short of the most a service may hold with the object at its cap,
    // so that the cap, not the watch count, is what refuses the next one.
    let n = MAX_WATCHES_PER_SERVICE as usize - MAX_FILTER_COST_PER_OBJECT as usize - 1;
    for i in 0..n {
        let object = format!("other/repo{}/refs/heads/main", i / per_object);
        create(b, service_id, &object, &(shape.filter)(i))
            .await
            .unwrap();
    }
    n
}

async fn create(b: &Bench, service_id: i64, object: &str, filter: &str) -> watchpump::Result<i64> {
    let new = NewWatch {
        resource: "r".into(),
        object: object.into(),
        filters: Filters {
            kinds: None,
            match_path: Some(filter.into()),
        },
        resync: false,
    };
    watches::create(&b.pool, service_id, &new)
        .await
        .map(|(w, _)| w.id)
}

/// 2,000 paths of about 40 characters that no filter above matches.
pub(super) fn payload() -> serde_json::Value {
    let paths: Vec<String> = (0..PATHS)
        .map(|i| format!("src/module_{i}/some/deeper/file_{i}.rs"))
        .collect();
    json!({"after": "9f2c1e", "paths": paths})
}

/// `EMITS` emits on a fresh backend, each in a transaction of its own
/// (rolled back: the next emit sees the same tables).
async fn measure(b: &Bench, payload: &serde_json::Value) -> Measured {
    let mut conn = PgConnection::connect(&b.url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    // A producer's connection is long-lived: compile emit()'s PL/pgSQL and
    // plans first, on an object no watch covers. The shape's regexes are
    // still compiled in the first measured emit.
    let mut tx = conn.begin().await.unwrap();
    watchpump::emit(&mut tx, "warm/up", "push", payload)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let vm_hwm_at_start_mib = vm_hwm_mib(pid);
    let mut ms = Vec::with_capacity(EMITS);
    for _ in 0..EMITS {
        let mut tx = conn.begin().await.unwrap();
        let start = Instant::now();
        watchpump::emit(&mut tx, OBJECT, "push", payload)
            .await
            .unwrap();
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        tx.rollback().await.unwrap();
    }
    let vm_hwm_mib = vm_hwm_mib(pid);
    ms.sort_by(f64::total_cmp);
    Measured {
        p50: percentile(&ms, 0.50),
        p99: percentile(&ms, 0.99),
        max: ms[ms.len() - 1],
        vm_hwm_mib,
        vm_hwm_at_start_mib,
    }
}

/// A process's peak resident memory in MiB (shared buffers it touched
/// included).
fn vm_hwm_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn report(
    others: usize,
    rows: &[(&str, usize, Measured)],
    worst: &(&str, usize, Measured),
    two: &Measured,
) -> Outcome {
    let (name, n, m) = worst;
    let line = format!(
        "{PATHS} paths, one service with {} dear filters, {n} on the object ({name}): \
         emit p50 {:.1} ms, p99 {:.1} ms; backend VmHWM {:.0} MiB ({:.0} after warm-up); \
         two such services: p99 {:.1} ms",
        others + n,
        m.p50,
        m.p99,
        m.vm_hwm_mib,
        m.vm_hwm_at_start_mib,
        two.p99
    );
    let shapes: Vec<_> = rows
        .iter()
        .map(|(name, n, m)| {
            json!({"shape": name, "watches_on_object": n, "p50_ms": m.p50, "p99_ms": m.p99,
                   "max_ms": m.max, "vm_hwm_mib": m.vm_hwm_mib,
                   "vm_hwm_after_warm_up_mib": m.vm_hwm_at_start_mib})
        })
        .collect();
    for (name, n, m) in rows {
        println!(
            "  {name:<36} {n:>2} on the object: p50 {:>5.1} ms, p99 {:>5.1} ms, VmHWM {:.0} MiB",
            m.p50, m.p99, m.vm_hwm_mib
        );
    }
    Outcome {
        line,
        json: json!({"paths": PATHS, "emits_per_shape": EMITS, "other_watches": others,
                     "cap_units_per_object": MAX_FILTER_COST_PER_OBJECT, "shapes": shapes,
                     "two_services_p50_ms": two.p50, "two_services_p99_ms": two.p99,
                     "two_services_vm_hwm_mib": two.vm_hwm_mib,
                     "target": "emit p99 <= 20 ms, backend VmHWM <= 64 MiB"}),
    }
}
