//! `history`: the pump and the reads with months of history behind them
//! (issue 18). For each size (WATCHPUMP_BENCH_HISTORY = "0,1000000,5000000"
//! by default: delivered deliveries already in the history), a database of
//! its own is filled by SQL with rows shaped like the pump's (spread over
//! the nine days before today, one in 20 failed, with an attempt), then:
//!
//! - bulk-1: 20,000 changes emitted in one transaction (timed: the
//!   producer's cost), then a pump process starts; the clock runs from its
//!   start to the last arrival. Pump CPU per delivery, and the database
//!   time per delivery from pg_stat_statements (claim + complete, which
//!   settles, over the deliveries);
//! - reads, each 20 times, p50: the panel's newest page of deliveries and
//!   the admin API's (GET /api/v1/admin/deliveries?limit=50), a service's
//!   failed deliveries (state=failed&service=svc0), /metrics, and the
//!   admin API's page of an hour's window in the middle of yesterday;
//! - retention: one `prune()` call that retires the oldest day (a ninth of
//!   the history), the rows a second it retired, and the longest emit() of
//!   a producer emitting one change a transaction meanwhile (how long
//!   retention's locks held the producer up); calls that gave way first
//!   (their locks not had within 100 ms) are counted and repeated.
//!
//! The fill takes minutes at 5 M; the databases are dropped at the end.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{percentile, Bench, Consumer, Outcome};

const ADMIN_TOKEN: &str = "bench-admin-token-0123456789";
const DAYS: i64 = 9;

/// One day of history by SQL, shared with the SQL-only benchmarks.
const FILL_DAY: &str = include_str!("../../scripts/sqlbench/fill_day.sql");

pub async fn history(b: Bench) -> Outcome {
    let admin = format!("{}/postgres", b.url.rsplit_once('/').unwrap().0);
    b.pool.close().await;
    let sizes: Vec<i64> = std::env::var("WATCHPUMP_BENCH_HISTORY")
        .unwrap_or_else(|_| "0,1000000,5000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut lines = Vec::new();
    let mut rows = Vec::new();
    for size in sizes {
        let b = Bench::new(&admin, &format!("history_{size}")).await;
        let row = one_size(&b, size).await;
        lines.push(format!(
            "{size}: bulk-1 {:.0}/s, emit {:.2} s, db {:.1} µs/delivery, pump CPU {:.0} µs/delivery; \
             p50 panel {:.1} ms, admin {:.1} ms, failed {:.1} ms, metrics {:.1} ms, an hour's window {:.1} ms; \
             retention {:.2} s for {} rows ({:.0}/s; {} calls gave way first), longest emit() meanwhile {:.0} ms; fill {:.0} s",
            row["bulk_per_s"].as_f64().unwrap_or(0.0),
            row["emit_s"].as_f64().unwrap_or(0.0),
            row["db_us_per_delivery"].as_f64().unwrap_or(0.0),
            row["pump_cpu_us"].as_f64().unwrap_or(0.0),
            row["panel_p50_ms"].as_f64().unwrap_or(f64::NAN),
            row["admin_p50_ms"].as_f64().unwrap_or(f64::NAN),
            row["failed_p50_ms"].as_f64().unwrap_or(f64::NAN),
            row["metrics_p50_ms"].as_f64().unwrap_or(f64::NAN),
            row["window_p50_ms"].as_f64().unwrap_or(f64::NAN),
            row["retention_s"].as_f64().unwrap_or(0.0),
            row["retired_rows"].as_i64().unwrap_or(0),
            row["retired_per_s"].as_f64().unwrap_or(0.0),
            row["retention_gave_way"].as_i64().unwrap_or(0),
            row["retention_longest_emit_ms"].as_f64().unwrap_or(0.0),
            row["fill_s"].as_f64().unwrap_or(0.0),
        ));
        rows.push(row);
        b.pool.close().await;
        let admin_pool = watchpump::server::connect(&admin, 1).await.unwrap();
        sqlx::query(&format!(
            "drop database if exists wpbench_history_{size} with (force)"
        ))
        .execute(&admin_pool)
        .await
        .unwrap();
        admin_pool.close().await;
    }
    Outcome {
        line: format!("\n  {}", lines.join("\n  ")),
        json: json!({ "sizes": rows }),
    }
}

async fn one_size(b: &Bench, size: i64) -> serde_json::Value {
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    let fill = Instant::now();
    fill_history(b, size).await;
    let fill_s = fill.elapsed().as_secs_f64();

    // bulk-1, with pg_stat_statements from a clean slate.
    let total = 20_000;
    // WATCHPUMP_BENCH_STATEMENTS=1: the statements inside the functions
    // are counted too, and the costliest printed, for the emits and for
    // the pump (the figures count the top-level calls only either way).
    let statements = std::env::var("WATCHPUMP_BENCH_STATEMENTS").is_ok_and(|v| v == "1");
    if statements {
        let db: String = sqlx::query_scalar("select current_database()")
            .fetch_one(&b.pool)
            .await
            .unwrap();
        // The pump's sessions, which start later.
        sqlx::query(&format!(
            "alter database {db} set pg_stat_statements.track = 'all'"
        ))
        .execute(&b.pool)
        .await
        .unwrap();
    }
    b.db_time_reset().await;
    let emit = Instant::now();
    let mut tx = b.pool.begin().await.unwrap();
    if statements {
        sqlx::query("set local pg_stat_statements.track = 'all'")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
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
    let emit_s = emit.elapsed().as_secs_f64();
    if statements {
        print_statements(b, "emit", total).await;
    }
    b.db_time_reset().await;
    let listen = free_addr();
    let metrics = free_addr();
    let start = Instant::now();
    let pump = b.pump(&[
        ("WATCHPUMP_LISTEN", &listen),
        ("WATCHPUMP_METRICS_LISTEN", &metrics),
        ("WATCHPUMP_ADMIN_TOKEN", ADMIN_TOKEN),
        // Its own operator task must not retire the day the retention
        // figure below is measured on.
        ("WATCHPUMP_RETENTION_DAYS", "3650"),
        ("WATCHPUMP_FAILED_RETENTION_DAYS", "3650"),
    ]);
    let all = consumer.wait_for(total, Duration::from_secs(300)).await;
    let elapsed = start.elapsed().as_secs_f64();
    // The last outcomes are written after the last arrival (today's
    // deliveries: the history is in the days before).
    while start.elapsed() < Duration::from_secs(310) {
        let delivered: i64 = sqlx::query_scalar(
            "select count(*) from watchpump.settled
             where created_at >= date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
               and state = 'delivered'",
        )
        .fetch_one(&b.pool)
        .await
        .unwrap();
        if delivered >= total as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = pump.cpu_seconds();
    let db_us = b.db_us_per_delivery(total).await;
    if statements {
        print_statements(b, "pump", total).await;
    }

    // Reads, through the pump's own HTTP server.
    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let cookie = panel_login(&base).await;
    let admin_p50 = p50_ms(|| async {
        http.get(format!("{base}/api/v1/admin/deliveries?limit=50"))
            .header("authorization", &bearer)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let failed_p50 = p50_ms(|| async {
        http.get(format!(
            "{base}/api/v1/admin/deliveries?limit=50&state=failed&service=svc0"
        ))
        .header("authorization", &bearer)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    })
    .await;
    // An hour in the middle of yesterday: a page in creation order, read
    // backwards from its end (src/operator/store.rs, PageOrder).
    let yesterday = chrono::Utc::now().date_naive() - chrono::Duration::days(1);
    let window = format!(
        "since={}T12:00:00Z&until={}T13:00:00Z",
        yesterday, yesterday
    );
    let window_p50 = p50_ms(|| async {
        http.get(format!("{base}/api/v1/admin/deliveries?limit=50&{window}"))
            .header("authorization", &bearer)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let panel_p50 = match &cookie {
        Some(cookie) => {
            p50_ms(|| async {
                http.get(format!("{base}/panel/deliveries"))
                    .header("cookie", cookie)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
            .await
        }
        None => f64::NAN,
    };
    let metrics_p50 = p50_ms(|| async {
        http.get(format!("http://{metrics}/metrics"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    pump.stop();

    // Retention: one call retires the oldest day, while a producer emits
    // one change a transaction beside it: the longest emit() says how long
    // retention held the producer up.
    let producing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = tokio::spawn({
        let pool = b.pool.clone();
        let producing = producing.clone();
        async move {
            let mut longest = Duration::ZERO;
            let mut emits = 0u64;
            while producing.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                let mut tx = pool.begin().await.unwrap();
                watchpump::emit(&mut tx, "elsewhere/during-retention", "push", &json!({}))
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                longest = longest.max(started.elapsed());
                emits += 1;
            }
            (longest, emits)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A call that cannot take a day's locks within its 100 ms gives way
    // and retires nothing (an autovacuum of the fill may hold one); the
    // operator task calls it again a minute later, this a second later,
    // and counts the calls that gave way. The time is the call's that
    // retired the day.
    let mut gave_way = 0;
    let (retention_s, (deliveries, failed, changes)) = loop {
        let retention = Instant::now();
        let retired: (i32, i32, i32) = sqlx::query_as(
            "select deliveries, failed, changes from watchpump.prune('7 days', '30 days', 500)",
        )
        .fetch_one(&b.pool)
        .await
        .unwrap();
        let took = retention.elapsed().as_secs_f64();
        if size == 0 || retired != (0, 0, 0) || gave_way == 10 {
            break (took, retired);
        }
        gave_way += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    producing.store(false, std::sync::atomic::Ordering::Relaxed);
    let (longest_emit, emits_during) = producer.await.unwrap();
    let retired = i64::from(deliveries) + i64::from(failed) + i64::from(changes);
    json!({
        "history": size, "fill_s": fill_s, "complete": all,
        "bulk_per_s": total as f64 / elapsed, "bulk_s": elapsed, "emit_s": emit_s,
        "pump_cpu_us": cpu * 1e6 / total as f64,
        "db_us_per_delivery": db_us,
        "panel_p50_ms": panel_p50, "admin_p50_ms": admin_p50, "failed_p50_ms": failed_p50,
        "metrics_p50_ms": metrics_p50, "window_p50_ms": window_p50,
        "retention_s": retention_s, "retired_rows": retired, "retention_gave_way": gave_way,
        "retention_longest_emit_ms": longest_emit.as_secs_f64() * 1e3,
        "retention_emits": emits_during,
        "retired_deliveries": deliveries, "retired_changes": changes,
        "retired_per_s": retired as f64 / retention_s,
    })
}

/// `size` delivered deliveries (one in 20 failed, with an attempt) and
/// their changes, spread evenly over the DAYS days before today, one
/// script per day into that day's partitions: the day of
/// `scripts/sqlbench/fill_day.sql` (which makes the partitions too), its
/// psql variables filled in here.
async fn fill_history(b: &Bench, size: i64) {
    if size == 0 {
        return;
    }
    let per_day = size / DAYS;
    // Oldest day first: ids grow with time, as the pump's do.
    for day in (1..=DAYS).rev() {
        let sql = FILL_DAY
            .replace(":per_day", &per_day.to_string())
            .replace(":fail_every", "20")
            .replace(":day", &day.to_string());
        sqlx::raw_sql(&sql).execute(&b.pool).await.unwrap();
    }
    // One statement each: VACUUM refuses a transaction block.
    for table in ["changes", "settled", "attempt_log"] {
        sqlx::raw_sql(&format!("vacuum analyze watchpump.{table}"))
            .execute(&b.pool)
            .await
            .unwrap();
    }
    // The fill wrote gigabytes in minutes, which a pump's history, written
    // over days, never leaves behind at once: the checkpoint that writes
    // them out is done here, not during bulk-1 (at 20 M, runs without this
    // measured 0.66-0.95x fresh: BENCHMARKS.md, issue 18, fourth session).
    sqlx::raw_sql("checkpoint").execute(&b.pool).await.unwrap();
}

/// A panel session's cookie, or none if the log-in was refused.
async fn panel_login(base: &str) -> Option<String> {
    // The cookie comes on the log-in's redirect: not followed, or the
    // answer read would be the page it leads to, without it (the panel's
    // column was empty in the first runs).
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .ok()?;
    let r = http
        .post(format!("{base}/panel/login"))
        .header("origin", base)
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .ok()?;
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| !v.is_empty())
        .and_then(|v| v.split(';').next())
        .map(str::to_string)
}

/// The median of 20 timed requests (after one to warm up); NaN if one failed.
async fn p50_ms<F, Fut>(mut request: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if !request().await {
        return f64::NAN;
    }
    let mut times = Vec::new();
    for _ in 0..20 {
        let at = Instant::now();
        if !request().await {
            return f64::NAN;
        }
        times.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    percentile(&times, 0.5)
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The costliest statements since the last reset, per delivery.
async fn print_statements(b: &Bench, phase: &str, deliveries: usize) {
    // Besides the time: pages read from outside shared buffers, pages
    // dirtied, and the WAL's full-page images and bytes, each a delivery;
    // what tells a cold index from a slow plan when a size runs slower.
    let top: Vec<(String, f64, i64, f64, f64, f64, f64)> = sqlx::query_as(
        "select left(regexp_replace(s.query, '\\s+', ' ', 'g'), 90), s.total_exec_time, s.calls,
                s.shared_blks_read::float8, s.shared_blks_dirtied::float8,
                s.wal_fpi::float8, s.wal_bytes::float8
         from pg_stat_statements s
         where s.dbid = (select oid from pg_database where datname = current_database())
         order by s.total_exec_time desc limit 12",
    )
    .fetch_all(&b.pool)
    .await
    .unwrap_or_default();
    let per = |x: f64| x / deliveries as f64;
    for (query, ms, calls, read, dirtied, fpi, wal) in &top {
        println!(
            "    {phase}: {:>7.1} µs/delivery {calls:>6} calls; a delivery: {:.2} pages read, \
             {:.2} dirtied, {:.2} full-page images, {:.0} WAL bytes  {query}",
            per(ms * 1000.0),
            per(*read),
            per(*dirtied),
            per(*fpi),
            per(*wal),
        );
    }
}
