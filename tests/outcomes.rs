//! What becomes of a delivery: superseded by newer news, dropped on 410,
//! retried after 5xx, timeouts and refused connections, failed at its
//! deadline.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

async fn states_of_watch(db: &TestDb, watch_id: i64) -> Vec<(i64, String)> {
    sqlx::query_as(
        "select change_id, state from watchpump.deliveries where watch_id = $1 order by id",
    )
    .bind(watch_id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_hundred_changes_to_one_object_end_with_the_newest_delivered_and_the_rest_superseded() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    let main = "acme/web/refs/heads/main";
    let storm = db.add_watch(deploy.id, "app", main, kinds(&["push"])).await;
    let tags = db
        .add_watch(deploy.id, "releases", main, kinds(&["tag"]))
        .await;
    let dev = db
        .add_watch(deploy.id, "app-dev", "acme/web/refs/heads/dev", all())
        .await;
    consumer.reply_with(500);
    let pump = RunningPump::start(&db.pool, pump_config());

    let first = db.emit(main, "push", json!({"n": 0})).await;
    consumer.wait_for(1, WAIT).await; // the first one is in flight or failed once
    let tag = db.emit(main, "tag", json!({"tag": "v1"})).await;
    let other = db
        .emit("acme/web/refs/heads/dev", "push", json!({"n": "dev"}))
        .await;
    let mut newest = first;
    for n in 1..100 {
        newest = db.emit(main, "push", json!({"n": n})).await;
    }
    consumer.reply_with(200);

    eventually(WAIT, "the newest change delivered", || async {
        states_of_watch(&db, storm.id)
            .await
            .iter()
            .any(|(c, s)| *c == newest && s == "delivered")
    })
    .await;
    eventually(WAIT, "the other watches' deliveries delivered", || async {
        states_of_watch(&db, tags.id).await == vec![(tag, "delivered".to_string())]
            && states_of_watch(&db, dev.id).await == vec![(other, "delivered".to_string())]
    })
    .await;
    pump.stop().await.unwrap();

    let states = states_of_watch(&db, storm.id).await;
    assert_eq!(states.len(), 100);
    let delivered: Vec<i64> = states
        .iter()
        .filter(|(_, s)| s == "delivered")
        .map(|(c, _)| *c)
        .collect();
    let superseded = states.iter().filter(|(_, s)| s == "superseded").count();
    assert!(delivered.contains(&newest));
    assert!(
        delivered.len() <= 2,
        "at most the one in flight besides the newest: {delivered:?}"
    );
    assert!(superseded >= 98, "superseded: {superseded}");
    assert_eq!(
        superseded + delivered.len(),
        100,
        "nothing else: {states:?}"
    );
    // Every superseded delivery points to a newer delivery of the same watch.
    let bad: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.deliveries d join watchpump.deliveries n on n.id = d.superseded_by
         where d.state = 'superseded' and (n.watch_id <> d.watch_id or n.id <= d.id or n.object <> d.object)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(bad, 0);
    let ok_bodies: Vec<i64> = consumer
        .received()
        .iter()
        .filter(|r| r.body["watch_id"] == storm.id)
        .map(|r| r.body["sequence"].as_i64().unwrap())
        .collect();
    // 100 pushes and one tag on the object: the newest push is sequence 101.
    assert_eq!(
        ok_bodies.iter().max(),
        Some(&101),
        "the newest sequence arrived"
    );
}

#[tokio::test]
async fn gone_drops_the_watch_and_its_undelivered_deliveries() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    let gone = db
        .add_watch(deploy.id, "deleted-app", "acme/web/", all())
        .await;
    let kept = db
        .add_watch(deploy.id, "live-app", "acme/api/", all())
        .await;
    for branch in ["main", "dev", "feature"] {
        db.emit(&format!("acme/web/refs/heads/{branch}"), "push", json!({}))
            .await;
    }
    db.emit("acme/api/refs/heads/main", "push", json!({})).await;
    consumer.reply_for_resource("deleted-app", 410);
    let mut cfg = pump_config();
    cfg.service_concurrency = 1; // one at a time: the others are still pending at the 410
    let pump = RunningPump::start(&db.pool, cfg);

    eventually(WAIT, "the watch is dropped", || async {
        watchpump::watches::get(&db.pool, deploy.id, gone.id)
            .await
            .unwrap()
            .unwrap()
            .removed_at
            .is_some()
    })
    .await;
    eventually(WAIT, "its deliveries are dropped", || async {
        states_of_watch(&db, gone.id)
            .await
            .iter()
            .all(|(_, s)| s == "dropped")
    })
    .await;
    let watch = watchpump::watches::get(&db.pool, deploy.id, gone.id)
        .await
        .unwrap()
        .unwrap();
    assert!(watch.removed_reason.unwrap().contains("410"));
    let sent_for_gone = consumer
        .received()
        .iter()
        .filter(|r| r.body["watch_id"] == gone.id)
        .count();
    assert_eq!(
        sent_for_gone, 1,
        "after the first 410, the rest were dropped unsent"
    );

    // A removed watch gets no new deliveries.
    let later = db.emit("acme/web/refs/heads/main", "push", json!({})).await;
    let n: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.deliveries where change_id = $1 and watch_id = $2",
    )
    .bind(later)
    .bind(gone.id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(n, 0);
    pump.stop().await.unwrap();
    // The other watch of the same service was not touched by the 410 of this one.
    let kept = watchpump::watches::get(&db.pool, deploy.id, kept.id)
        .await
        .unwrap()
        .unwrap();
    assert!(kept.removed_at.is_none());
}

#[tokio::test]
async fn server_errors_are_retried_with_growing_delays_until_the_consumer_recovers() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/refs/heads/main", all())
        .await;
    consumer.reply_with(503);
    let mut cfg = pump_config();
    cfg.down_after_failures = 100; // test the per-delivery back-off, not probing
    cfg.retry_initial_ms = 100;
    cfg.retry_max_ms = 1600;
    let pump = RunningPump::start(&db.pool, cfg);
    db.emit("acme/web/refs/heads/main", "push", json!({})).await;

    let tries = consumer.wait_for(4, WAIT).await;
    consumer.reply_with(200);
    let delivered = consumer.wait_for(5, WAIT).await;
    assert!(delivered
        .iter()
        .all(|r| r.body["delivery_id"] == tries[0].body["delivery_id"]));
    let attempts: Vec<i64> = delivered
        .iter()
        .map(|r| r.body["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(&attempts[..4], &[1, 2, 3, 4]);
    // Each wait is at least the back-off's lower bound (100 ms doubling, jitter
    // ±25%): a noisy machine can only make them longer.
    for k in 1..4 {
        let gap = tries[k].at - tries[k - 1].at;
        let floor = Duration::from_millis(75 * (1 << (k - 1)));
        assert!(gap >= floor, "wait {k} was {gap:?}, below {floor:?}");
    }
    let id = tries[0].body["delivery_id"].as_i64().unwrap();
    db.wait_state(id, "delivered", WAIT).await;
    // Identical failures in a row fold into one attempt row with a count.
    let rows: Vec<(i32, Option<i32>, i32)> = sqlx::query_as(
        "select attempt, status, repeats from watchpump.attempts where delivery_id = $1 order by attempt",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows[0], (1, Some(503), 4), "{rows:?}");
    assert_eq!(rows.last(), Some(&(5, Some(200), 1)), "{rows:?}");
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn timeouts_are_retried_and_recorded() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/refs/heads/main", all())
        .await;
    consumer.delay_replies(Duration::from_millis(1500));
    let mut cfg = pump_config();
    cfg.request_timeout_ms = 300;
    cfg.lease_ms = 2000;
    let pump = RunningPump::start(&db.pool, cfg);
    db.emit("acme/web/refs/heads/main", "push", json!({})).await;

    eventually(WAIT, "a timed-out attempt is recorded", || async {
        let n: i64 = sqlx::query_scalar("select count(*) from watchpump.attempts where status is null and error ilike '%timed out%'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        n >= 1
    })
    .await;
    consumer.delay_replies(Duration::ZERO);
    eventually(WAIT, "delivered after the consumer sped up", || async {
        db.count_state("delivered").await == 1
    })
    .await;
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn refused_connections_are_retried_and_delivered_once_the_consumer_is_back() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let addr = consumer.addr;
    consumer.stop();
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/refs/heads/main", all())
        .await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.emit("acme/web/refs/heads/main", "push", json!({})).await;

    eventually(WAIT, "refused attempts are recorded", || async {
        let n: i64 = sqlx::query_scalar(
            "select coalesce(sum(repeats), 0)::int8 from watchpump.attempts where status is null",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        n >= 2
    })
    .await;
    let error: String =
        sqlx::query_scalar("select error from watchpump.attempts order by id limit 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(error.to_lowercase().contains("connect"), "{error}");
    let back = Receiver::start_on(addr).await;
    back.wait_for(1, WAIT).await;
    eventually(WAIT, "delivered", || async {
        db.count_state("delivered").await == 1
    })
    .await;
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_delivery_past_its_deadline_ends_failed() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/refs/heads/main", all())
        .await;
    consumer.reply_with(500);
    let mut cfg = pump_config();
    cfg.down_after_failures = 100;
    let pump = RunningPump::start(&db.pool, cfg);

    // Path 1: the next retry would fall after the deadline.
    let first = db
        .emit("acme/web/refs/heads/main", "push", json!({"n": 1}))
        .await;
    sqlx::query("update watchpump.queue set deadline = now() + interval '50 milliseconds' where change_id = $1")
        .bind(first)
        .execute(&db.pool)
        .await
        .unwrap();
    eventually(WAIT, "failed by its last attempt", || async {
        db.count_state("failed").await == 1
    })
    .await;

    // Path 2: a pending delivery whose deadline passes is failed by the sweep.
    let third = db
        .emit("acme/web/refs/heads/main", "push", json!({"n": 3}))
        .await;
    consumer.wait_for(2, WAIT).await;
    sqlx::query(
        "update watchpump.queue set deadline = now() - interval '1 second' where change_id = $1",
    )
    .bind(third)
    .execute(&db.pool)
    .await
    .unwrap();
    eventually(WAIT, "failed by the sweep or the next attempt", || async {
        db.count_state("failed").await == 2
    })
    .await;
    pump.stop().await.unwrap();
    let errors: Vec<String> = sqlx::query_scalar(
        "select last_error from watchpump.deliveries where state = 'failed' order by id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        errors
            .iter()
            .all(|e| e.contains("500") || e.contains("deadline")),
        "{errors:?}"
    );
}

#[tokio::test]
async fn an_answer_with_bytes_postgres_cannot_store_is_still_recorded() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/", all()).await;
    // NUL and invalid UTF-8: PostgreSQL's text refuses the first.
    consumer.reply_body(b"ok\0\xff\xfe");
    let pump = RunningPump::start(&db.pool, pump_config());
    for n in 0..5 {
        db.emit(&format!("acme/web/refs/heads/b{n}"), "push", json!({}))
            .await;
    }
    eventually(WAIT, "all five delivered and recorded", || async {
        db.count_state("delivered").await == 5
    })
    .await;
    pump.stop().await.unwrap();
    let heads: Vec<String> = sqlx::query_scalar("select response_head from watchpump.attempts")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(heads.len(), 5, "one attempt each, no re-sends");
    assert!(
        heads.iter().all(|h| h.starts_with("ok\u{FFFD}")),
        "{heads:?}"
    );
    assert_eq!(consumer.count(), 5);
}
