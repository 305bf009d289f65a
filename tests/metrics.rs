//! The metrics tell the truth, and the dashboards and alerts read metrics
//! that exist.
//!
//! One scenario in one process: the exporter on a loopback port, a pump and
//! the backlog collector, real consumers whose answers make deliveries
//! succeed, retry, fail, get superseded and dropped. The scrape is compared
//! with what `watchpump.deliveries` and `watchpump.attempts` say happened;
//! every metric name in `dashboards/` must be in the scrape; `promtool`
//! checks the rules; and a real Prometheus, scraping the test's exporter,
//! evaluates every panel query and alert expression.
//!
//! Needs `prometheus` and `promtool` (from Debian's `prometheus` package,
//! which `scripts/test-deps.sh` unpacks into target/tools without
//! installing it); without them the test fails and says so.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::prometheus::{self, parse_sample, Prometheus, Scrape};
use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use watchpump::metrics::backlog::{Collector, Role};

const WAIT: Duration = Duration::from_secs(30);
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/watchpump.json");
const ALERTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/alerts.yml");
const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");

/// The consumer services of the scenario; `idle` appears halfway through.
const SERVICES: &[&str] = &["ok", "flaky", "slow", "gone", "idle"];
const OUTCOMES: &[&str] = watchpump::metrics::OUTCOMES;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_database_and_the_dashboards_use_them() {
    prometheus::check_rules(ALERTS);
    let exporter = free_addr();
    watchpump::metrics::install(exporter).expect("install the exporter");
    let prometheus = Prometheus::start(exporter, Path::new(ALERTS)).await;

    let db = TestDb::new().await;
    let ok = Receiver::start().await;
    let flaky = Receiver::start().await;
    let slow = Receiver::start().await;
    let gone = Receiver::start().await;
    gone.reply_with(410);
    for (name, consumer) in [
        ("ok", &ok),
        ("flaky", &flaky),
        ("slow", &slow),
        ("gone", &gone),
    ] {
        let (service, _) = db.add_service(name, &consumer.base_url()).await;
        db.add_watch(service.id, name, &format!("acme/{name}/"), all())
            .await;
    }
    let (stop_collector, collector_stopped) = tokio::sync::oneshot::channel::<()>();
    let collector = tokio::spawn(watchpump::metrics::backlog::run(
        db.pool.clone(),
        Duration::from_millis(200),
        async move {
            let _ = collector_stopped.await;
        },
    ));
    let mut cfg = pump_config();
    cfg.request_timeout_ms = 5000;
    cfg.lease_ms = 10_000;
    let pump = RunningPump::start(&db.pool, cfg);

    wait_for_prometheus_to_see_zeros(&prometheus).await;
    run_scenario(&db, &ok, &flaky, &slow).await;
    assert_a_new_service_starts_at_zero(&db, exporter).await;
    until(WAIT, "every delivery settled", || async {
        let open = db.count_state("pending").await + db.count_state("in_flight").await;
        check(open == 0, format!("{open} deliveries still open"))
    })
    .await;
    pump.stop().await.unwrap();

    let scrape = Scrape::fetch(exporter).await;
    assert_counters_match_database(&db.pool, &scrape).await;
    print_excerpt(&scrape);

    make_backlog(&db.pool).await;
    assert_backlog_matches_database(&db.pool, exporter).await;
    compare_with_backlog_view(&db.pool).await;

    let scrape = Scrape::fetch(exporter).await;
    assert_dashboards_use_scraped_metrics(&scrape);
    assert_docs_list_scraped_metrics(&scrape);
    assert_every_metric_has_help(&scrape);
    assert_prometheus_evaluates_dashboards_and_alerts(&prometheus, &db.pool).await;

    let _ = stop_collector.send(());
    collector.await.unwrap();
}

#[tokio::test]
async fn one_pump_at_a_time_reads_the_backlog() {
    let db = TestDb::new().await;
    db.add_service("leader-test", "http://127.0.0.1:9").await;
    let mut first = Collector::new(&db.pool);
    let mut second = Collector::new(&db.pool);
    assert_eq!(first.step().await, Role::Leader);
    assert_eq!(second.step().await, Role::Follower);
    assert_eq!(first.step().await, Role::Leader);
    assert_eq!(second.step().await, Role::Follower);

    // The leader's connection dies: the lock goes with it.
    sqlx::query(
        "select pg_terminate_backend(pid) from pg_locks
         where locktype = 'advisory' and database = (select oid from pg_database where datname = current_database())
           and objid = hashtext('watchpump.backlog')::oid",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let started = Instant::now();
    while second.step().await != Role::Leader {
        assert!(started.elapsed() < WAIT, "nobody took the lead over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(first.step().await, Role::Disconnected);
    assert_eq!(first.step().await, Role::Follower);

    // A pump that shuts down hands the lead over.
    second.close().await;
    let started = Instant::now();
    while first.step().await != Role::Leader {
        assert!(started.elapsed() < WAIT, "the lead was not handed over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rows = watchpump::metrics::backlog::backlog(&mut db.pool.acquire().await.unwrap())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].pending, rows[0].oldest_due_age), (0, 0.0));
    first.close().await;
}

/// With several pumps, whichever sweeps first fails a service's overdue
/// deliveries, often one that never sent to that service. The failures must
/// still count for that service (not `unknown`), or
/// `WatchpumpDeliveriesFailed` would fire for a service that does not exist.
#[tokio::test]
async fn the_sweep_counts_failures_for_their_service() {
    // A recorder of this test's own, on this (the runtime's only) thread.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let db = TestDb::new().await;
    let (service, _) = db.add_service("never-sent-to", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "r", "acme/", all()).await;
    let change = emit_overdue(&db, "acme/x").await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.wait_state(delivery_of(&db, change).await, "failed", WAIT)
        .await;
    pump.stop().await.unwrap();
    let scrape = Scrape::parse(handle.render());
    let labels = [("service", "never-sent-to"), ("outcome", "failed")];
    let counted = scrape.expect("watchpump_deliveries_total", &labels, 1.0);
    assert!(counted.is_ok(), "{counted:?}\n{}", scrape.text);
}

#[test]
fn samples_parse_with_escapes() {
    let s = parse_sample(r#"x_total{a="b",c="say \"hi\"\\"} 3"#).unwrap();
    assert_eq!(s.name, "x_total");
    assert_eq!(s.labels["c"], r#"say "hi"\"#);
    assert_eq!(s.value, 3.0);
    let s = parse_sample("up 1").unwrap();
    assert!(s.labels.is_empty());
    assert!(parse_sample("g NaN").unwrap().value.is_nan());
    assert_eq!(
        metric_names(r#"sum(rate(watchpump_a_total{x="1"}[5m])) / watchpump_b"#),
        BTreeSet::from(["watchpump_a_total".to_string(), "watchpump_b".to_string()])
    );
}

// ---------------------------------------------------------------------------
// The scenario, step by step

/// Counters exist at zero before anything happens, and Prometheus has seen
/// those zeros: the first failure of a service must count as an increase.
async fn wait_for_prometheus_to_see_zeros(prometheus: &Prometheus) {
    until(
        WAIT,
        "Prometheus has scraped the failed counters at 0",
        || async {
            let got = prometheus
                .query(r#"watchpump_deliveries_total{outcome="failed"} == 0"#)
                .await?;
            let seen: BTreeSet<&str> = got
                .iter()
                .filter_map(|s| s["metric"]["service"].as_str())
                .collect();
            let all = ["ok", "flaky", "slow", "gone"]
                .iter()
                .all(|s| seen.contains(s));
            check(all, format!("seen {seen:?}"))
        },
    )
    .await;
}

/// A service registered while the pump runs gets every series at 0 at the
/// collector's next step, before anything is sent to it.
async fn assert_a_new_service_starts_at_zero(db: &TestDb, exporter: SocketAddr) {
    db.add_service("idle", "http://127.0.0.1:9").await;
    until(
        WAIT,
        "the new service's counters and gauges at 0",
        || async {
            let scrape = Scrape::fetch(exporter).await;
            let idle = ("service", "idle");
            for outcome in OUTCOMES {
                let labels = [idle, ("outcome", outcome)];
                scrape.expect("watchpump_deliveries_total", &labels, 0.0)?;
            }
            for outcome in watchpump::metrics::NOTIFY_OUTCOMES {
                let labels = [idle, ("outcome", outcome)];
                scrape.expect("watchpump_notify_warnings_total", &labels, 0.0)?;
            }
            for state in watchpump::metrics::BACKLOG_STATES {
                scrape.expect("watchpump_backlog", &[idle, ("state", state)], 0.0)?;
            }
            scrape.expect("watchpump_oldest_due_age_seconds", &[idle], 0.0)?;
            scrape.expect("watchpump_in_flight", &[idle], 0.0)
        },
    )
    .await;
}

/// Deliveries that succeed, are retried, fail (in the pump and in the
/// sweep), are superseded (at emit and after a failed attempt), and are
/// dropped (a 410 and the waiting delivery of the same watch).
async fn run_scenario(db: &TestDb, ok: &Receiver, flaky: &Receiver, slow: &Receiver) {
    // Delivered.
    let mut changes = Vec::new();
    for i in 0..5 {
        changes.push(
            db.emit(&format!("acme/ok/{i}"), "push", json!({"i": i}))
                .await,
        );
    }
    for change in changes {
        db.wait_state(delivery_of(db, change).await, "delivered", WAIT)
            .await;
    }
    assert_eq!(ok.count(), 5);

    // Retried (500), then delivered.
    flaky.reply_with(500);
    let retried = delivery_of(db, db.emit("acme/flaky/a", "push", json!({})).await).await;
    until(WAIT, "two failed attempts", || async {
        let attempts: i64 = sqlx::query_scalar(
            "select coalesce(sum(repeats), 0)::int8 from watchpump.attempts where delivery_id = $1",
        )
        .bind(retried)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        check(attempts >= 2, format!("{attempts} attempts"))
    })
    .await;
    flaky.reply_with(200);
    db.wait_state(retried, "delivered", WAIT).await;

    // Superseded at emit: three changes of one object in one transaction;
    // only the newest is sent.
    let mut tx = db.pool.begin().await.unwrap();
    let mut burst = Vec::new();
    for n in 0..3 {
        burst.push(
            watchpump::emit(&mut tx, "acme/flaky/b", "push", &json!({"n": n}))
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();
    db.wait_state(delivery_of(db, burst[2]).await, "delivered", WAIT)
        .await;
    for change in &burst[..2] {
        db.wait_state(delivery_of(db, *change).await, "superseded", WAIT)
            .await;
    }

    // Superseded in the pump: newer news arrives while an attempt that will
    // fail is in flight. The newer delivery fails in the pump: its deadline
    // passes while it is in flight.
    slow.reply_with(500);
    slow.delay_replies(Duration::from_millis(1500));
    let older = delivery_of(db, db.emit("acme/slow/x", "push", json!({"n": 1})).await).await;
    db.wait_state(older, "in_flight", WAIT).await;
    let newer = delivery_of(db, db.emit("acme/slow/x", "push", json!({"n": 2})).await).await;
    db.wait_state(newer, "in_flight", WAIT).await;
    sqlx::query("update watchpump.queue set deadline = now() where id = $1")
        .bind(newer)
        .execute(&db.pool)
        .await
        .unwrap();
    db.wait_state(older, "superseded", WAIT).await;
    db.wait_state(newer, "failed", WAIT).await;
    slow.delay_replies(Duration::ZERO);
    slow.reply_with(200);

    // Failed in the sweep: a pending delivery, not due, past its deadline.
    let change = emit_overdue(db, "acme/ok/overdue").await;
    db.wait_state(delivery_of(db, change).await, "failed", WAIT)
        .await;

    // Dropped: the consumer answers 410; the watch's other delivery, not due
    // yet, is dropped with it.
    let mut tx = db.pool.begin().await.unwrap();
    let first = watchpump::emit(&mut tx, "acme/gone/1", "push", &json!({}))
        .await
        .unwrap();
    let waiting = watchpump::emit(&mut tx, "acme/gone/2", "push", &json!({}))
        .await
        .unwrap();
    sqlx::query(
        "update watchpump.queue set next_attempt_at = now() + interval '1 hour'
         where change_id = $1",
    )
    .bind(waiting)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    db.wait_state(delivery_of(db, first).await, "dropped", WAIT)
        .await;
    db.wait_state(delivery_of(db, waiting).await, "dropped", WAIT)
        .await;
}

/// Every counter and histogram count against the rows. Call with the pump
/// stopped, so that both sides are final.
async fn assert_counters_match_database(pool: &PgPool, scrape: &Scrape) {
    // A delivery the pump settled carries the attempt that delivered it, or
    // has the same xmin as its last logged attempt: watchpump.complete()
    // wrote both in one transaction. Every attempt the
    // pump reported either settled its delivery or scheduled a retry.
    // Deliveries superseded by a claim (stale news) or dropped as the
    // siblings of a 410 were settled in another transaction.
    let rows: Vec<Settled> = sqlx::query_as(
        "with d as (
             select d.service_id, d.state,
                    d.last_pump is not null or exists (
                        select 1 from watchpump.attempt_log a
                        where a.delivery_id = d.id and a.attempt + a.repeats - 1 = d.attempts
                          and a.xmin = d.xmin
                    ) as settled_by_attempt
             from watchpump.settled d
         )
         select s.name as service,
                count(d.state) filter (where d.state = 'delivered') as delivered,
                (select coalesce(sum(a.repeats), 0) from watchpump.attempts a
                 join watchpump.deliveries x on x.id = a.delivery_id
                 where x.service_id = s.id)
                  - count(d.state) filter (where d.settled_by_attempt) as retries,
                count(d.state) filter (where d.state = 'failed') as failed,
                count(d.state) filter (where d.state = 'dropped') as dropped,
                count(d.state) filter (where d.state = 'superseded' and d.settled_by_attempt)
                  as superseded,
                count(d.state) filter (where d.state = 'superseded' and not d.settled_by_attempt)
                  as superseded_at_emit
         from watchpump.services s
         left join d on d.service_id = s.id
         group by s.id, s.name
         order by s.name",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut seen = BTreeMap::<&str, i64>::new();
    for row in &rows {
        let service = row.service.as_str();
        let expected = [
            ("delivered", row.delivered),
            ("retry_scheduled", row.retries),
            ("failed", row.failed),
            ("dropped", row.dropped),
            ("superseded", row.superseded),
        ];
        for (outcome, count) in expected {
            let labels = [("service", service), ("outcome", outcome)];
            scrape
                .expect("watchpump_deliveries_total", &labels, count as f64)
                .unwrap();
            *seen.entry(outcome).or_default() += count;
        }
        *seen.entry("superseded at emit").or_default() += row.superseded_at_emit;
        let latency = "watchpump_delivery_latency_seconds_count";
        let observed = scrape.sum(latency, &[("service", service)]);
        assert_eq!(observed, row.delivered as f64, "{latency} of {service}");
        scrape
            .expect("watchpump_in_flight", &[("service", service)], 0.0)
            .unwrap();
    }
    let names: Vec<&str> = rows.iter().map(|r| r.service.as_str()).collect();
    assert_eq!(names, sorted(SERVICES), "every service has counters");
    // The scenario made each outcome happen, or the comparison proves little.
    for outcome in OUTCOMES.iter().chain(&["superseded at emit"]) {
        assert!(
            seen.get(outcome).copied().unwrap_or(0) > 0,
            "no {outcome} in {seen:?}"
        );
    }

    // Attempts: one histogram sample per row, by result.
    let attempts: Vec<(String, String, i64)> = sqlx::query_as(
        "select s.name,
                case when a.status between 200 and 299 then '2xx'
                     when a.status = 410 then '410'
                     when a.status between 300 and 399 then '3xx'
                     when a.status between 400 and 499 then '4xx'
                     when a.status >= 500 then '5xx'
                     when a.error ilike '%timed out%' then 'timeout'
                     else 'connect_error'
                end,
                sum(a.repeats)::int8
         from watchpump.attempts a
         join watchpump.deliveries d on d.id = a.delivery_id
         join watchpump.services s on s.id = d.service_id
         group by 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut total = 0;
    for (service, result, count) in &attempts {
        scrape
            .expect(
                "watchpump_attempt_duration_seconds_count",
                &[("service", service), ("result", result)],
                *count as f64,
            )
            .unwrap();
        total += count;
    }
    let histogram = "watchpump_attempt_duration_seconds_count";
    assert_eq!(scrape.sum(histogram, &[]), total as f64, "attempts in all");
    // Every claimed delivery was attempted exactly once (none was released
    // or lost its lease).
    assert_eq!(
        scrape.sum("watchpump_claimed_batch_size_sum", &[]),
        total as f64
    );
    assert!(scrape.sum("watchpump_claimed_batch_size_count", &[]) >= 1.0);

    assert!(scrape.sum("watchpump_wakeups_total", &[("source", "sweep")]) > 0.0);
    assert!(scrape.sum("watchpump_wakeups_total", &[("source", "notify")]) > 0.0);
    scrape
        .expect("watchpump_wakeups_total", &[("source", "reconnect")], 0.0)
        .unwrap();
    scrape
        .expect("watchpump_listener_reconnects_total", &[], 0.0)
        .unwrap();
    scrape
        .expect(
            "watchpump_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1.0,
        )
        .unwrap();
}

/// With the pump stopped: deliveries waiting (due and not due), one held by
/// a pump that died mid-send, failures from the scenario.
async fn make_backlog(pool: &PgPool) {
    for i in 0..3 {
        let mut tx = pool.begin().await.unwrap();
        watchpump::emit(&mut tx, &format!("acme/ok/later-{i}"), "push", &json!({}))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::raw_sql(
        "select watchpump.emit('acme/flaky/tomorrow', 'push');
         update watchpump.queue set next_attempt_at = now() + interval '1 day'
         where object = 'acme/flaky/tomorrow';
         select watchpump.emit('acme/slow/ghost', 'push');
         update watchpump.queue
         set attempts = 1, leased_by = 'a-pump-that-died', lease_until = now() + interval '1 hour'
         where object = 'acme/slow/ghost';",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The gauges against plain counts. The backlog no longer changes, so the
/// gauges settle on these numbers once the collector has run; the age keeps
/// growing, so it must lie between its value when the backlog was made and
/// its value after the scrape.
async fn assert_backlog_matches_database(pool: &PgPool, exporter: SocketAddr) {
    let made_at: f64 = sqlx::query_scalar("select extract(epoch from now())::float8")
        .fetch_one(pool)
        .await
        .unwrap();
    until(WAIT, "backlog gauges equal the database", || async {
        let scrape = Scrape::fetch(exporter).await;
        scrape.expect("watchpump_backlog_leader", &[], 1.0)?;
        let rows: Vec<Waiting> = sqlx::query_as(
            "select s.name as service,
                    count(d.id) filter (where d.state = 'pending') as pending,
                    count(d.id) filter (where d.state = 'in_flight') as in_flight,
                    count(d.id) filter (where d.state = 'pending' and d.next_attempt_at <= now())
                      as due,
                    count(d.id) filter (where d.state = 'failed'
                                        and d.finished_at > now() - interval '24 hours') as failed,
                    extract(epoch from min(d.next_attempt_at)
                            filter (where d.state = 'pending' and d.next_attempt_at <= now()))::float8
                      as oldest_due_at,
                    extract(epoch from now())::float8 as now
             from watchpump.services s
             left join watchpump.deliveries d on d.service_id = s.id
             group by s.name",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        for row in rows {
            let service = row.service.as_str();
            let states = [
                ("pending", row.pending),
                ("in_flight", row.in_flight),
                ("due", row.due),
                ("failed", row.failed),
            ];
            for (state, count) in states {
                let labels = [("service", service), ("state", state)];
                scrape.expect("watchpump_backlog", &labels, count as f64)?;
            }
            let age = scrape.sum("watchpump_oldest_due_age_seconds", &[("service", service)]);
            let (low, high) = match row.oldest_due_at {
                Some(at) => (made_at - at, row.now - at),
                None => (0.0, 0.0),
            };
            check(
                low <= age && age <= high,
                format!("oldest due age of {service}: {age}, not within [{low}, {high}]"),
            )?;
        }
        Ok(())
    })
    .await;
    // The scenario's backlog has every state.
    let scrape = Scrape::fetch(exporter).await;
    for state in watchpump::metrics::BACKLOG_STATES {
        let labels = [("state", *state)];
        let found = scrape
            .matching("watchpump_backlog", &labels)
            .any(|s| s.value > 0.0);
        assert!(found, "no {state}");
    }
}

/// `watchpump.backlog_counts()` (the gauges) and the operator's view
/// `watchpump.backlog` count the same things, when the view exists.
async fn compare_with_backlog_view(pool: &PgPool) {
    let view: Option<String> = sqlx::query_scalar("select to_regclass('watchpump.backlog')::text")
        .fetch_one(pool)
        .await
        .unwrap();
    if view.is_none() {
        eprintln!("watchpump.backlog does not exist here; not compared");
        return;
    }
    let differences: Vec<String> = sqlx::query_scalar(
        "select format('%s: counts %s, view %s', c.service,
                       row(c.pending, c.in_flight, c.due_now, c.failed_24h, c.oldest_due_age),
                       row(v.pending, v.in_flight, v.due_now, v.failed_24h, v.oldest_due_age))
         from watchpump.backlog_counts() c
         full join watchpump.backlog v on v.service = c.service
         where v.service is null or c.service is null
            or (c.pending, c.in_flight, c.due_now, c.failed_24h)
               is distinct from (v.pending, v.in_flight, v.due_now, v.failed_24h)
            or c.oldest_due_age - coalesce(extract(epoch from v.oldest_due_age), 0) not between 0 and 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(differences.is_empty(), "{differences:#?}");
}

/// Every metric name the dashboard and the alerts mention is in the scrape:
/// a renamed metric breaks this test, not the dashboard.
fn assert_dashboards_use_scraped_metrics(scrape: &Scrape) {
    let known = scrape.names();
    for file in [DASHBOARD, ALERTS] {
        let text = std::fs::read_to_string(file).unwrap();
        let used = metric_names(&text);
        assert!(!used.is_empty(), "no metric names found in {file}");
        let unknown: Vec<&String> = used.iter().filter(|n| !known.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metrics the pump does not export: {unknown:?}"
        );
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "service"]);
    for panel in panels(&dashboard) {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
    }
}

/// docs/metrics.md lists exactly the metrics the pump exports.
fn assert_docs_list_scraped_metrics(scrape: &Scrape) {
    let docs = std::fs::read_to_string(DOCS).unwrap();
    let documented = metric_names(&docs);
    let known = scrape.names();
    let unknown: Vec<&String> = documented.iter().filter(|n| !known.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "docs/metrics.md names unknown metrics: {unknown:?}"
    );
    let undocumented: Vec<&String> = scrape
        .families
        .keys()
        .filter(|f| f.starts_with("watchpump_") && !documented.contains(*f))
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
}

/// Every `watchpump_` family comes with a `# HELP` line that says something
/// (Prometheus shows it next to the name in its UI and in autocompletion).
fn assert_every_metric_has_help(scrape: &Scrape) {
    let families: Vec<&String> = scrape
        .families
        .keys()
        .filter(|f| f.starts_with("watchpump_"))
        .collect();
    assert_eq!(families.len(), watchpump_metric_count(), "{families:?}");
    for family in families {
        let help = scrape.helps.get(family).map(String::as_str).unwrap_or("");
        assert!(
            help.split_whitespace().count() >= 5,
            "{family} has no # HELP text worth reading: {help:?}"
        );
    }
}

/// The metrics `src/metrics.rs` defines (each `pub const` name).
fn watchpump_metric_count() -> usize {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics.rs")).unwrap();
    source
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains("\"watchpump_"))
        .count()
}

/// A real Prometheus has scraped the scenario: every panel query returns
/// data, every alert expression evaluates, the rules are healthy, and the
/// alert for failed deliveries fires for the services whose deliveries
/// failed.
async fn assert_prometheus_evaluates_dashboards_and_alerts(prometheus: &Prometheus, pool: &PgPool) {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().unwrap() {
            let expr = grafana_to_promql(target["expr"].as_str().unwrap());
            queries.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    assert!(queries.len() >= 15, "{} panel queries", queries.len());
    until(WAIT, "every panel query returns data", || async {
        for (title, expr) in &queries {
            let result = prometheus
                .query(expr)
                .await
                .unwrap_or_else(|e| panic!("panel {title:?}: {expr}: {e}"));
            check(
                !result.is_empty(),
                format!("panel {title:?} has no data: {expr}"),
            )?;
        }
        Ok(())
    })
    .await;
    // The backlog panel shows the backlog the database holds.
    until(
        WAIT,
        "the backlog panel shows the waiting deliveries",
        || async {
            let got = prometheus
                .query(r#"max by (service, state) (watchpump_backlog{service="ok", state="due"})"#)
                .await?;
            let value = got
                .first()
                .map(|s| s["value"][1].as_str().unwrap().to_string());
            check(value.as_deref() == Some("3"), format!("{value:?}"))
        },
    )
    .await;
    let values: Vec<String> = prometheus
        .get("/api/v1/label/service/values?match[]=watchpump_backlog")
        .await["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    for service in SERVICES {
        assert!(
            values.iter().any(|v| v == service),
            "$service lacks {service}: {values:?}"
        );
    }

    let rules: Vec<Value> = prometheus.get("/api/v1/rules").await["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect();
    assert_eq!(rules.len(), 8, "rules loaded from alerts.yml");
    for rule in &rules {
        let expr = rule["query"].as_str().unwrap();
        if let Err(e) = prometheus.query(expr).await {
            panic!("alert {}: {expr}: {e}", rule["name"]);
        }
        for annotation in ["summary", "description", "runbook"] {
            assert!(
                rule["annotations"][annotation].is_string(),
                "{} lacks {annotation}",
                rule["name"]
            );
        }
    }
    until(WAIT, "every rule evaluated without error", || async {
        let rules = prometheus.get("/api/v1/rules").await;
        for group in rules["data"]["groups"].as_array().unwrap() {
            for rule in group["rules"].as_array().unwrap() {
                check(
                    rule["health"] == "ok",
                    format!("{}: {} {}", rule["name"], rule["health"], rule["lastError"]),
                )?;
            }
        }
        Ok(())
    })
    .await;

    let failed: BTreeSet<String> = sqlx::query_scalar(
        "select distinct s.name from watchpump.deliveries d
         join watchpump.services s on s.id = d.service_id where d.state = 'failed'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    until(
        WAIT,
        "WatchpumpDeliveriesFailed fires for the failing services",
        || async {
            let alerts = prometheus.get("/api/v1/alerts").await;
            let firing: BTreeSet<String> = alerts["data"]["alerts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| {
                    a["labels"]["alertname"] == "WatchpumpDeliveriesFailed"
                        && a["state"] == "firing"
                })
                .filter_map(|a| a["labels"]["service"].as_str().map(str::to_string))
                .collect();
            check(
                firing == failed,
                format!("firing for {firing:?}, failed: {failed:?}"),
            )
        },
    )
    .await;
}

// ---------------------------------------------------------------------------
// What the dashboards, the rules and the docs name

/// Every `watchpump_*` identifier in a text: what a dashboard, a rule file
/// or the docs call a metric.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("watchpump_"))
        .map(str::to_string)
        .collect()
}

/// Every panel of the dashboard, rows' panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            stack.extend(inner);
        }
        if panel["targets"].is_array() {
            out.push(panel);
        }
    }
    out
}

/// A panel's query as Grafana would send it, every service selected.
fn grafana_to_promql(expr: &str) -> String {
    let promql = expr
        .replace("${service}", ".*")
        .replace("$service", ".*")
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "1h");
    assert!(!promql.contains('$'), "unknown variable in {expr}");
    promql
}

// ---------------------------------------------------------------------------
// Helpers

/// Per service: deliveries by how they ended, and the attempts that
/// scheduled a retry.
#[derive(sqlx::FromRow)]
struct Settled {
    service: String,
    delivered: i64,
    retries: i64,
    failed: i64,
    dropped: i64,
    /// By the pump: an attempt failed while newer news waited.
    superseded: i64,
    /// By emit(), in the producer's transaction.
    superseded_at_emit: i64,
}

/// Per service: the backlog counted plainly, and the oldest due time.
#[derive(sqlx::FromRow)]
struct Waiting {
    service: String,
    pending: i64,
    in_flight: i64,
    due: i64,
    failed: i64,
    /// Seconds since the epoch.
    oldest_due_at: Option<f64>,
    now: f64,
}

/// Emits a change whose delivery is pending, not due for an hour, and past
/// its deadline: the sweep fails it.
async fn emit_overdue(db: &TestDb, object: &str) -> i64 {
    let mut tx = db.pool.begin().await.unwrap();
    let change = watchpump::emit(&mut tx, object, "push", &json!({}))
        .await
        .unwrap();
    sqlx::query(
        "update watchpump.queue
         set deadline = now() - interval '1 second', next_attempt_at = now() + interval '1 hour'
         where change_id = $1",
    )
    .bind(change)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    change
}

fn sorted(names: &[&'static str]) -> Vec<&'static str> {
    let mut names = names.to_vec();
    names.sort();
    names
}

fn print_excerpt(scrape: &Scrape) {
    let excerpt: Vec<&str> = scrape
        .text
        .lines()
        .filter(|l| {
            l.contains("service=\"flaky\"")
                || l.contains("service=\"slow\"")
                || !l.contains("service=")
        })
        .filter(|l| !l.contains("_bucket"))
        .collect();
    eprintln!("--- scrape excerpt ---\n{}", excerpt.join("\n"));
}
