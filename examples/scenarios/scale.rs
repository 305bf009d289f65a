//! `make bench SCENARIOS=scale`: what pumps cost the database, and how far
//! more pumps help (docs/scaling.md). For 1, 2 and 4 pump processes on one
//! database: 2,000 changes to distinct objects, each for 10 services (20,000
//! deliveries), emitted before the pumps start; then the clock runs until
//! every delivery is recorded delivered. Read from PostgreSQL meanwhile:
//! the WAL written (pg_current_wal_lsn), commits and rows written
//! (pg_stat_database), per delivery, for the producer's emits and for the
//! pumps' work; and the connections the pumps hold, by application name.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Bench, Consumer, Outcome};

const CHANGES: usize = 2000;
const SERVICES: usize = 10;

/// WAL bytes, commits and rows written in this database so far.
async fn counters(b: &Bench) -> (i64, i64, i64) {
    sqlx::query_as(
        "select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8,
                xact_commit::int8, (tup_inserted + tup_updated + tup_deleted)::int8
         from pg_stat_database where datname = current_database()",
    )
    .fetch_one(&b.pool)
    .await
    .unwrap()
}

pub async fn scale(b: Bench) -> Outcome {
    let consumer = Consumer::start(SERVICES).await;
    let services = b.services(&consumer).await;
    for s in &services {
        b.watch(*s, "acme/").await;
    }
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    let mut delivered = 0;
    for (round, pumps) in [1usize, 2, 4].into_iter().enumerate() {
        let deliveries = CHANGES * SERVICES;
        // pg_stat_database lags by up to a second (stats flushed by backends).
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let before_emit = counters(&b).await;
        for chunk in 0..(CHANGES / 100) {
            let mut tx = b.pool.begin().await.unwrap();
            for n in 0..100 {
                watchpump::emit(
                    &mut tx,
                    &format!("acme/r{round}/refs/heads/b{chunk}-{n}"),
                    "push",
                    &json!({"after": "9f2c1e", "paths": ["src/main.rs"]}),
                )
                .await
                .unwrap();
            }
            tx.commit().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let before_send = counters(&b).await;
        let start = Instant::now();
        let running: Vec<_> = (0..pumps).map(|_| b.pump(&[])).collect();
        delivered += deliveries as i64;
        let mut connections = Vec::new();
        while b.count("delivered").await < delivered && start.elapsed() < Duration::from_secs(300) {
            if connections.is_empty() && start.elapsed() > Duration::from_millis(500) {
                connections = sqlx::query_as::<_, (String, i64)>(
                    "select application_name, count(*) from pg_stat_activity
                     where datname = current_database() and pid <> pg_backend_pid()
                       and application_name like 'watchpump%'
                     group by 1 order by 1",
                )
                .fetch_all(&b.pool)
                .await
                .unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let elapsed = start.elapsed().as_secs_f64();
        for p in running {
            p.stop();
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let after = counters(&b).await;
        let per = |a: i64, b: i64| (a - b) as f64 / deliveries as f64;
        let emit = (
            per(before_send.0, before_emit.0),
            per(before_send.1, before_emit.1),
            per(before_send.2, before_emit.2),
        );
        let send = (
            per(after.0, before_send.0),
            per(after.1, before_send.1),
            per(after.2, before_send.2),
        );
        let rate = deliveries as f64 / elapsed;
        let conns: Vec<String> = connections
            .iter()
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        lines.push(format!(
            "{pumps} pump(s): {rate:.0}/s; per delivery emit {:.0} B WAL, {:.1} rows; pumps {:.0} B WAL, {:.2} commits, {:.1} rows; connections [{}]",
            emit.0, emit.2, send.0, send.1, send.2, conns.join(", ")
        ));
        rows.push(json!({"pumps": pumps, "deliveries": deliveries, "seconds": elapsed, "deliveries_per_s": rate,
            "emit_wal_bytes_per_delivery": emit.0, "emit_commits_per_delivery": emit.1, "emit_rows_per_delivery": emit.2,
            "pump_wal_bytes_per_delivery": send.0, "pump_commits_per_delivery": send.1, "pump_rows_per_delivery": send.2,
            "connections": connections.iter().map(|(n, c)| json!({"application_name": n, "count": c})).collect::<Vec<_>>()}));
    }
    Outcome {
        line: lines.join("\n               "),
        json: json!({"changes_per_round": CHANGES, "services": SERVICES, "rounds": rows}),
    }
}
