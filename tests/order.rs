//! Per-object order under races: a consumer never receives an object's older
//! news after newer news of it was sent, and never two deliveries of one
//! (watch, object) at the same time, whatever the timing of producers'
//! commits against the pump's attempts.
//!
//! Each test stages one race deterministically: the consumer holds a request
//! while a producer's transaction stays open, then the test commits and
//! releases in the order that used to break the promise.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);
const OBJECT: &str = "acme/web/refs/heads/main";

/// State, attempts and superseded_by of the delivery of `change_id`, as the
/// operator's view shows them.
async fn delivery(db: &TestDb, change_id: i64) -> (String, i32, Option<i64>) {
    sqlx::query_as(
        "select state, attempts, superseded_by from watchpump.delivery_log where change_id = $1",
    )
    .bind(change_id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// The delivery of `change_id` has had one attempt, and that attempt is over.
async fn first_attempt_settled(db: &TestDb, change_id: i64) {
    eventually(WAIT, "the first attempt is recorded", || async {
        let (state, attempts, _) = delivery(db, change_id).await;
        attempts == 1 && state != "in_flight"
    })
    .await;
}

/// (change_id, status) of every request the consumer answered, in order.
fn answered(consumer: &Receiver) -> Vec<(i64, i64)> {
    consumer
        .received()
        .iter()
        .map(|r| {
            (
                r.body["change_id"].as_i64().unwrap(),
                r.body["sequence"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The consumer holds the older delivery's first attempt; meanwhile a
/// producer emits newer news and keeps its transaction open. Returns the
/// older change, and the open transaction with the newer change in it.
async fn older_attempt_fails_while_newer_news_is_uncommitted(
    db: &TestDb,
    consumer: &Receiver,
) -> (i64, sqlx::Transaction<'static, sqlx::Postgres>, i64) {
    consumer.hold();
    let older = db.emit(OBJECT, "push", json!({"n": 1})).await;
    consumer.wait_for_arrivals(1, WAIT).await;
    let mut tx = db.pool.begin().await.unwrap();
    let newer = watchpump::emit(&mut tx, OBJECT, "push", &json!({"n": 2}))
        .await
        .unwrap();
    consumer.reply_with(500);
    consumer.release();
    consumer.wait_for(1, WAIT).await;
    first_attempt_settled(db, older).await;
    (older, tx, newer)
}

#[tokio::test]
async fn older_news_that_failed_while_newer_was_uncommitted_is_never_sent_after_the_newer() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    // The older one's retry a second away, not 100 ms: the newer news
    // commits before it falls due, however slow the machine.
    let mut slow_retry = pump_config();
    slow_retry.retry_initial_ms = 1000;
    slow_retry.retry_max_ms = 1000;
    let pump = RunningPump::start(&db.pool, slow_retry.clone());

    let (older, tx, newer) =
        older_attempt_fails_while_newer_news_is_uncommitted(&db, &consumer).await;
    consumer.reply_with(200);
    tx.commit().await.unwrap();

    eventually(WAIT, "the newer change delivered", || async {
        delivery(&db, newer).await.0 == "delivered"
    })
    .await;
    // Long enough for the older one's retry (at most retry_max_ms away) to
    // fall due and be claimed, had it been left pending.
    eventually(WAIT, "the older change superseded", || async {
        delivery(&db, older).await.0 == "superseded"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2 * slow_retry.retry_max_ms)).await;
    pump.stop().await.unwrap();

    let got = answered(&consumer);
    assert_eq!(
        got.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        vec![older, newer],
        "the older change's failed attempt, then the newer change, and nothing after it"
    );
    assert!(
        delivery(&db, older).await.2.is_some(),
        "superseded by the newer delivery"
    );
}

#[tokio::test]
async fn two_pending_deliveries_of_one_object_due_together_send_only_the_newest() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    // The older one's retry a second away, not 100 ms: this pump is
    // stopped before it falls due, however slow the machine.
    let mut slow_retry = pump_config();
    slow_retry.retry_initial_ms = 1000;
    slow_retry.retry_max_ms = 1000;
    let pump = RunningPump::start(&db.pool, slow_retry.clone());

    let (older, tx, newer) =
        older_attempt_fails_while_newer_news_is_uncommitted(&db, &consumer).await;
    // No pump runs while the newer news commits and the older one's retry
    // falls due: both wait, due, for the next pump's first claim.
    pump.stop().await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2 * slow_retry.retry_max_ms)).await;
    consumer.reply_with(200);
    let pump = RunningPump::start(&db.pool, pump_config());

    eventually(WAIT, "the newer change delivered", || async {
        delivery(&db, newer).await.0 == "delivered"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2 * pump_config().retry_max_ms)).await;
    pump.stop().await.unwrap();

    assert_eq!(
        answered(&consumer)
            .iter()
            .map(|(c, _)| *c)
            .collect::<Vec<_>>(),
        vec![older, newer],
        "one claim must not take both; the older one is superseded, not sent"
    );
    assert_eq!(delivery(&db, older).await.0, "superseded");
}

#[tokio::test]
async fn retry_refuses_older_news_once_newer_news_of_the_object_was_delivered() {
    let db = TestDb::new().await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let (consumer, older) = failed_delivery(&db, "deploy", OBJECT, json!({"n": 1})).await;
    consumer.reply_with(200);
    let newer = db.emit(OBJECT, "push", json!({"n": 2})).await;
    eventually(WAIT, "the newer change delivered", || async {
        delivery(&db, newer).await.0 == "delivered"
    })
    .await;
    pump.stop().await.unwrap();

    let err = sqlx::query("select watchpump.retry($1)")
        .bind(older)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("newer news"), "{err}");
    assert_eq!(db.delivery_state(older).await, "failed", "nothing changed");
}

/// A resync's replay is created after live news that may be newer than it
/// (a live change committed while the resync read the object): its retry
/// must see that newer news although its id is lower.
#[tokio::test]
async fn retry_of_a_replay_refuses_it_once_newer_live_news_with_a_lower_id_was_delivered() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    db.emit(OBJECT, "push", json!({"n": 1})).await;
    db.emit(OBJECT, "push", json!({"n": 2})).await;
    let live: Vec<i64> = sqlx::query_scalar("select id from watchpump.queue order by sequence")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    // The replay of the older change (sequence 1), created last: the
    // highest id.
    let replay: i64 = sqlx::query_scalar(
        "insert into watchpump.queue (id, change_id, watch_id, service_id, object, attempts,
                                     next_attempt_at, deadline, created_at, sequence, replay)
         select nextval('watchpump.delivery_ids'), change_id, watch_id, service_id, object, 0,
                next_attempt_at, deadline, created_at, sequence, true
         from watchpump.queue where id = $1
         returning id",
    )
    .bind(live[0])
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(replay > live[1]);
    set_state(&db, &[live[0], live[1]], "delivered", None).await;
    set_state(&db, &[replay], "failed", None).await;

    let err = sqlx::query("select watchpump.retry($1)")
        .bind(replay)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("newer news"), "{err}");
    assert_eq!(db.delivery_state(replay).await, "failed", "nothing changed");
    // The live delivery of the newest news has none newer: its retry is
    // allowed (the replay of older news does not count against it).
    set_state(&db, &[live[1]], "failed", None).await;
    sqlx::query("select watchpump.retry($1)")
        .bind(live[1])
        .execute(&db.pool)
        .await
        .unwrap();
}
