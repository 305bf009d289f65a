//! The rate a consumer can take (issue 20): set by the operator (CLI, admin
//! API), lowered by the consumer (`PUT /api/v1/rate`), and held by every
//! pump together, in PostgreSQL. Against the real pumps and a real consumer
//! on loopback.

mod common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn cli(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    let out = watchpump_cli(Some(&db.url)).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The most arrivals within any one second.
/// The most deliveries that arrived within any `window`.
fn busiest(received: &[Received], window: Duration) -> usize {
    let mut at: Vec<_> = received.iter().map(|r| r.at).collect();
    at.sort();
    let mut most = 0;
    let mut start = 0;
    for end in 0..at.len() {
        while at[end].duration_since(at[start]) >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

#[tokio::test]
async fn three_pumps_together_hold_a_rate_of_50_a_second_through_a_20_second_burst() {
    const CHANGES: usize = 1000;
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    let (code, out, err) = cli(&db, &["services", "set-rate", "deploy", "50"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("at most 50"), "{out}");

    // A backlog of 1,000 objects' news at once: 20 s at 50 a second.
    sqlx::query("select watchpump.emit('acme/o' || i, 'push', '{}') from generate_series(1, $1) i")
        .bind(CHANGES as i32)
        .execute(&db.pool)
        .await
        .unwrap();
    // At the default sweep of a second: a pump whose claim used its tokens
    // claims again when the bucket has the next ones, not at its sweep
    // (which gave a burst of 2 a sweep, about 4 a second).
    let default_sweep =
        watchpump::config::PumpConfig::new(PRODUCER, PRODUCER_TOKEN).sweep_interval_ms;
    let pumps: Vec<RunningPump> = (0..3)
        .map(|_| {
            let mut cfg = pump_config();
            cfg.sweep_interval_ms = default_sweep;
            RunningPump::start(&db.pool, cfg)
        })
        .collect();
    let received = consumer.wait_for(CHANGES, Duration::from_secs(90)).await;
    for pump in pumps {
        pump.stop().await.unwrap();
    }

    // The bucket grants at most 50 a second plus a burst of 2, in the
    // database's time. Arrivals are timed here, after the claim, the send
    // and the scheduling of a loaded machine, which can bunch a stall's
    // deliveries into the next second (57 in one second was seen under the
    // full suite): so the pace is held over the whole burst and over five
    // seconds, where a stall's bunching is small against the count, and a
    // second is only bounded loosely: arrivals in any window are at most
    // the grants of that window widened by the longest delay from grant to
    // arrival, here allowed half a second (25 more). Without the limit,
    // the 1,000 arrive in well under a second and every bound fails.
    let stall = 25;
    let second = busiest(&received, Duration::from_secs(1));
    let five = busiest(&received, Duration::from_secs(5));
    let first = received.iter().map(|r| r.at).min().unwrap();
    let last = received.iter().map(|r| r.at).max().unwrap();
    println!(
        "busiest second {second}, five seconds {five}, 1000 over {:?} (limit 50/s, 3 pumps)",
        last - first
    );
    assert!(
        last - first >= Duration::from_secs(18),
        "1000 deliveries at 50 a second take 19.96 s after the burst, not {:?}",
        last - first
    );
    assert!(
        last - first <= Duration::from_secs(30),
        "the rate is a limit, not a trickle: 1000 at 50 a second took {:?}",
        last - first
    );
    assert!(
        five <= 5 * 50 + 2 + stall,
        "{five} deliveries within five seconds"
    );
    assert!(
        second <= 50 + 2 + stall,
        "{second} deliveries within one second"
    );
    assert_eq!(
        db.count_state("delivered").await,
        CHANGES as i64,
        "held, never dropped"
    );
}

#[tokio::test]
async fn the_consumer_lowers_its_rate_and_bad_rates_are_422_changing_nothing() {
    let db = TestDb::new().await;
    let (_, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let http = reqwest::Client::new();
    let put = |body: Value| {
        http.put(server.url("/api/v1/rate"))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };

    // The operator allows 50 (admin API); the consumer may go lower only.
    let resp = http
        .put(server.url("/api/v1/admin/services/deploy/rate"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"rate": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = put(json!({"rate": 20})).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let rates: Value = resp.json().await.unwrap();
    assert_eq!(
        rates,
        json!({"rate": 20, "max_rate": 50, "consumer_rate": 20})
    );
    let rate: Option<i32> =
        sqlx::query_scalar("select rate from watchpump.backlog where service = 'deploy'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(rate, Some(20), "the backlog view shows the rate");

    for bad in [
        json!({"rate": 0}),
        json!({"rate": -5}),
        json!({"rate": "fast"}),
        json!({"rate": 2.5}),
        json!({"rate": null}),
        json!({}),
        json!({"rate": 51}),
        json!({"rate": 20, "burst": 3}),
    ] {
        let resp = put(bad.clone()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid", "{bad}");
    }
    let resp = http
        .get(server.url("/api/v1/rate"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let rates: Value = resp.json().await.unwrap();
    assert_eq!(rates["rate"], 20, "nothing changed");

    // The operator lowers the maximum below the consumer's own: both follow.
    let (code, _, err) = cli(&db, &["services", "set-rate", "deploy", "10"]);
    assert_eq!(code, 0, "{err}");
    let resp = http
        .delete(server.url("/api/v1/rate"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let rates: Value = resp.json().await.unwrap();
    assert_eq!(
        rates,
        json!({"rate": 10, "max_rate": 10, "consumer_rate": null})
    );

    for args in [
        &["services", "set-rate", "deploy", "0"][..],
        &["services", "set-rate", "deploy", "-3"],
        &["services", "set-rate", "deploy", "fast"],
        &["services", "set-rate", "nobody", "5"],
    ] {
        let (code, _, err) = cli(&db, args);
        assert_ne!(code, 0, "{args:?}");
        assert!(!err.trim().is_empty(), "{args:?}");
    }
    let resp = http
        .put(server.url("/api/v1/admin/services/deploy/rate"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"rate": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let max: Option<i32> =
        sqlx::query_scalar("select max_rate from watchpump.services where name = 'deploy'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(max, Some(10), "nothing changed");
    let (code, out, _) = cli(&db, &["services", "set-rate", "deploy", "none"]);
    assert_eq!(code, 0);
    assert!(out.contains("no rate limit"), "{out}");
}

#[tokio::test]
async fn the_panel_sets_a_services_rate_and_shows_it_with_its_pauses() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(deploy.id, "app", "acme/", all()).await;
    watchpump::watches::pause::set_watch(&db.pool, deploy.id, watch.id, true)
        .await
        .unwrap();
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let cookie = server.log_in().await;
    let post = |rate: &str| {
        panel_client()
            .post(server.url("/panel/services/deploy/rate"))
            .header("origin", server.origin())
            .header("cookie", cookie.clone())
            .form(&[("rate", rate.to_string())])
            .send()
    };

    let resp = post("25").await.unwrap();
    assert_eq!(resp.status(), 303);
    let page = server.panel_get("/panel/services/deploy").await;
    assert!(page.contains("25/s"), "the page shows the rate");
    assert!(page.contains("1 watches"), "and the paused watch");
    for bad in ["0", "fast", "-1"] {
        let resp = post(bad).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let max: Option<i32> =
        sqlx::query_scalar("select max_rate from watchpump.services where name = 'deploy'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(max, Some(25));
    let resp = post("").await.unwrap();
    assert_eq!(resp.status(), 303);
    let max: Option<i32> =
        sqlx::query_scalar("select max_rate from watchpump.services where name = 'deploy'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(max, None, "an empty rate lifts the limit");
}

/// One `watchpump.take_tokens()` as a pump calls it before a claim, listing
/// no service (each limited one then wants 10): (service, granted, whether
/// a refill time was given) by name.
async fn take(db: &TestDb) -> Vec<(String, i32, bool)> {
    sqlx::query_as(
        "select s.name, t.granted, t.refill_seconds <> 'infinity'
         from watchpump.take_tokens('{}', '{}', 10) t
         join watchpump.services s on s.id = t.service_id
         order by s.name",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The bucket's row version (`xmin`), or None without a bucket.
async fn bucket(db: &TestDb, service_id: i64) -> Option<String> {
    sqlx::query_scalar("select xmin::text from watchpump.rate_buckets where service_id = $1")
        .bind(service_id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

/// A consumer may limit its own service, and every claim of every pump
/// takes tokens for each limited service: one with nothing queued is
/// granted nothing and its bucket is not written (idle ones cost every
/// claim a row write and its WAL each), and one whose queue fills is held
/// to its bucket's burst from the next take.
#[tokio::test]
async fn a_limited_service_with_nothing_queued_is_granted_nothing_and_not_written() {
    let db = TestDb::new().await;
    let (idle, _) = db.add_service("idle", "http://127.0.0.1:9").await;
    let (busy, _) = db.add_service("busy", "http://127.0.0.1:9").await;
    for service in [&idle, &busy] {
        db.add_watch(service.id, "repo", &format!("{}/", service.name), all())
            .await;
        sqlx::query("select watchpump.set_max_rate($1, 50)")
            .bind(&service.name)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    for i in 0..5 {
        db.emit(&format!("busy/{i}"), "push", json!({})).await;
    }

    // busy: its burst (50 / 20 = 2.5, two whole tokens); idle: nothing,
    // no time to claim again at, and no bucket made.
    let first = take(&db).await;
    assert_eq!(first, [("busy".into(), 2, true), ("idle".into(), 0, false)]);
    assert_eq!(bucket(&db, idle.id).await, None);

    // A change for idle: the next take holds it to its bucket's burst.
    db.emit("idle/a", "push", json!({})).await;
    let second = take(&db).await;
    assert_eq!(second[1], ("idle".into(), 2, true));
    let written = bucket(&db, idle.id).await.expect("a bucket once queued");

    // Its queue emptied (as delivered), its bucket is left as it was.
    sqlx::query("delete from watchpump.queue where service_id = $1")
        .bind(idle.id)
        .execute(&db.pool)
        .await
        .unwrap();
    let third = take(&db).await;
    assert_eq!(third[1], ("idle".into(), 0, false));
    assert_eq!(bucket(&db, idle.id).await, Some(written));
}

/// What claim() cannot take does not cost a take a write either: a limited
/// service whose deliveries are all held by a paused watch, and a paused
/// limited service with deliveries queued, are granted nothing and no
/// bucket is made for them, as for one with nothing queued.
#[tokio::test]
async fn a_limited_service_whose_deliveries_claim_cannot_take_is_not_written() {
    let db = TestDb::new().await;
    let (held, _) = db.add_service("held", "http://127.0.0.1:9").await;
    let (stopped, _) = db.add_service("stopped", "http://127.0.0.1:9").await;
    let mut watches = Vec::new();
    for service in [&held, &stopped] {
        let watch = db
            .add_watch(service.id, "repo", &format!("{}/", service.name), all())
            .await;
        watches.push(watch);
        sqlx::query("select watchpump.set_max_rate($1, 50)")
            .bind(&service.name)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    watchpump::watches::pause::set_watch(&db.pool, held.id, watches[0].id, true)
        .await
        .unwrap();
    db.emit("held/a", "push", json!({})).await;
    db.emit("stopped/a", "push", json!({})).await;
    watchpump::watches::pause::hold_paused(&db.pool)
        .await
        .unwrap();
    watchpump::watches::pause::set_service(&db.pool, stopped.id, true)
        .await
        .unwrap();
    let queued: i64 = sqlx::query_scalar("select count(*) from watchpump.queue")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(queued, 2, "both deliveries wait in the queue");

    assert_eq!(
        take(&db).await,
        [("held".into(), 0, false), ("stopped".into(), 0, false)]
    );
    assert_eq!(bucket(&db, held.id).await, None);
    assert_eq!(bucket(&db, stopped.id).await, None);
}
