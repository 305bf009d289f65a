//! What the kit takes, and how often the consumer's work runs: once per
//! delivery, whatever the producer repeats, and never for older news.

use std::sync::atomic::Ordering;
use std::time::Duration;

use watchpump::kit::WatchRequest;

use crate::common::{self, operator_config, pump_config, AppServer, RunningPump, TestDb};
use crate::support::{delivery, now, post, signed, Consumer, LossyProxy, Work, WORK_SCHEMA};

const MAIN: &str = "acme/web/refs/heads/main";
const LIMIT: Duration = Duration::from_secs(30);

/// A producer with its watches API and a running pump.
struct Producer {
    db: TestDb,
    api: AppServer,
    pump: RunningPump,
}

impl Producer {
    async fn start() -> Producer {
        let db = TestDb::new().await;
        let api = AppServer::start(&db.pool, &operator_config()).await;
        let pump = RunningPump::start(&db.pool, pump_config());
        Producer { db, api, pump }
    }

    /// The consumer service `deploy` of this producer, doing `work`.
    async fn consumer(&self, work: &Work) -> Consumer {
        Consumer::start(&self.db, &self.api, "deploy", WORK_SCHEMA, work.clone()).await
    }

    /// Emits and waits until the change's one delivery is delivered.
    async fn emit_delivered(&self, object: &str, payload: serde_json::Value) -> i64 {
        let change = self.db.emit(object, "push", payload).await;
        let id = common::delivery_of(&self.db, change).await;
        self.db.wait_state(id, "delivered", LIMIT).await;
        id
    }

    /// Attempts made and the last answer's status, from the operator's view.
    async fn attempts(&self, id: i64) -> (i32, Option<i32>) {
        sqlx::query_as(
            "select attempts, last_status from watchpump.delivery_log where delivery_id = $1",
        )
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn a_delivery_is_recorded_with_the_work_and_answered_done() {
    let p = Producer::start().await;
    let work = Work::default();
    let c = p.consumer(&work).await;
    let watch = c
        .watch(WatchRequest::new("app-1", MAIN).kinds(&["push"]))
        .await;

    let id = p
        .emit_delivered(MAIN, serde_json::json!({"after": "9f2c"}))
        .await;

    assert_eq!(work.calls.load(Ordering::SeqCst), 1);
    let (d, positions, watches, rows) = c.db.footprint().await;
    assert_eq!((d, positions, watches, rows), (1, 1, 1, 1));
    let (outcome, watch_id, payload): (String, i64, serde_json::Value) = sqlx::query_as(
        "select outcome, watch_id, payload from watchpump_inbox.deliveries where delivery_id = $1",
    )
    .bind(id)
    .fetch_one(&c.db.pool)
    .await
    .unwrap();
    assert_eq!((outcome.as_str(), watch_id), ("done", watch));
    assert_eq!(payload["after"], "9f2c");
    assert_eq!(p.attempts(id).await, (1, Some(200)));
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_delivery_sent_again_after_a_lost_answer_runs_the_work_once() {
    let p = Producer::start().await;
    let work = Work::default();
    let c = p.consumer(&work).await;
    c.watch(WatchRequest::new("app-1", MAIN)).await;
    // The pump talks to the consumer through a proxy that loses the first
    // answer: the work is done and committed, the pump sees a 502.
    let proxy = LossyProxy::start(c.server.base_url(), 1).await;
    watchpump::services::set_url_within(
        &p.db.pool,
        "deploy",
        &proxy.server.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();

    let id = p
        .emit_delivered(MAIN, serde_json::json!({"after": "1"}))
        .await;

    assert_eq!(
        proxy.lose.load(Ordering::SeqCst),
        0,
        "the first answer was lost"
    );
    assert_eq!(p.attempts(id).await, (2, Some(200)));
    assert_eq!(work.calls.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(
        c.db.work_and_inbox().await,
        (1, 1),
        "rows in work, in the inbox"
    );
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn two_copies_arriving_at_once_run_the_work_once() {
    let p = Producer::start().await;
    let work = Work::default();
    let c = p.consumer(&work).await;
    let watch = c.watch(WatchRequest::new("app-1", MAIN)).await;

    let body = serde_json::to_vec(&delivery(77, watch, MAIN, 1)).unwrap();
    let headers = signed(77, now(), &body, &c.secret);
    let url = c.events_url();
    let (a, b) = tokio::join!(
        post(&url, &headers, body.clone()),
        post(&url, &headers, body.clone())
    );

    let mut answers = [a.1["status"].clone(), b.1["status"].clone()];
    answers.sort_by_key(|s| s.to_string());
    assert_eq!((a.0, b.0), (200, 200));
    assert_eq!(
        answers,
        [serde_json::json!("done"), serde_json::json!("duplicate")]
    );
    assert_eq!(work.calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.db.count("select count(*) from work").await, 1);
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn older_news_after_newer_is_recorded_as_skipped_and_not_worked_on() {
    let p = Producer::start().await;
    let work = Work::default();
    let c = p.consumer(&work).await;
    let watch = c.watch(WatchRequest::new("app-1", MAIN)).await;
    p.emit_delivered(MAIN, serde_json::json!({"after": "1"}))
        .await;
    p.emit_delivered(MAIN, serde_json::json!({"after": "2"}))
        .await;
    let newest: i64 = sqlx::query_scalar("select max(sequence) from work")
        .fetch_one(&c.db.pool)
        .await
        .unwrap();

    // News of the same object with an older sequence, signed by the producer
    // (a delivery id the consumer has not seen, so only the sequence can
    // tell), and one with the same sequence as the newest.
    for (id, sequence) in [(9001, newest - 1), (9002, newest)] {
        let body = serde_json::to_vec(&delivery(id, watch, MAIN, sequence)).unwrap();
        let (status, answer) =
            post(&c.events_url(), &signed(id, now(), &body, &c.secret), body).await;
        assert_eq!((status, answer["status"].as_str()), (200, Some("skipped")));
    }

    assert_eq!(work.calls.load(Ordering::SeqCst), 2);
    let skipped =
        c.db.count("select count(*) from watchpump_inbox.deliveries where outcome = 'skipped'")
            .await;
    assert_eq!(skipped, 2);
    let position: i64 = sqlx::query_scalar("select sequence from watchpump_inbox.positions")
        .fetch_one(&c.db.pool)
        .await
        .unwrap();
    assert_eq!(position, newest);
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_failing_handler_rolls_back_and_the_pump_retries_until_done() {
    let p = Producer::start().await;
    let work = Work::default();
    work.fail_next.store(2, Ordering::SeqCst);
    let c = p.consumer(&work).await;
    c.watch(WatchRequest::new("app-1", MAIN)).await;

    let id = p
        .emit_delivered(MAIN, serde_json::json!({"after": "1"}))
        .await;

    assert_eq!(p.attempts(id).await, (3, Some(200)));
    assert_eq!(work.calls.load(Ordering::SeqCst), 3);
    // The two failed attempts wrote their row and rolled it back.
    assert_eq!(
        c.db.work_and_inbox().await,
        (1, 1),
        "rows in work, in the inbox"
    );
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn gone_answers_410_and_the_producer_removes_the_watch() {
    let p = Producer::start().await;
    let work = Work::default();
    *work.gone.lock().unwrap() = true;
    let c = p.consumer(&work).await;
    let watch = c.watch(WatchRequest::new("app-1", MAIN)).await;

    let change =
        p.db.emit(MAIN, "push", serde_json::json!({"after": "1"}))
            .await;
    let id = common::delivery_of(&p.db, change).await;
    p.db.wait_state(id, "dropped", LIMIT).await;

    let live: bool =
        sqlx::query_scalar("select live from watchpump.watch_list where watch_id = $1")
            .bind(watch)
            .fetch_one(&p.db.pool)
            .await
            .unwrap();
    assert!(!live, "the producer removed the watch");
    assert_eq!(p.attempts(id).await, (1, Some(410)));
    // Nothing committed, and the kit forgot the watch.
    assert_eq!(c.db.footprint().await, (0, 0, 0, 0));
    let known = watchpump::kit::known_watches(&c.db.pool, "git")
        .await
        .unwrap();
    assert_eq!(known.len(), 1);
    assert!(!known[0].live);
    // A late delivery for the forgotten watch is answered 410 again.
    let body = serde_json::to_vec(&delivery(5000, watch, MAIN, 9)).unwrap();
    let (status, _) = post(
        &c.events_url(),
        &signed(5000, now(), &body, &c.secret),
        body,
    )
    .await;
    assert_eq!(status, 410);
    assert_eq!(work.calls.load(Ordering::SeqCst), 1);
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_rotated_secret_verifies_with_the_old_or_the_new_secret_during_the_overlap() {
    let p = Producer::start().await;
    let work = Work::default();
    let c = p.consumer(&work).await;
    c.watch(WatchRequest::new("app-1", MAIN)).await;
    p.emit_delivered(MAIN, serde_json::json!({"after": "1"}))
        .await;

    let new =
        watchpump::services::rotate_secret(&p.db.pool, "deploy", Duration::from_secs(3600), false)
            .await
            .unwrap()
            .new;
    // The consumer still knows only the old secret: the producer signs with
    // both during the overlap.
    let id = p
        .emit_delivered(MAIN, serde_json::json!({"after": "2"}))
        .await;
    assert_eq!(p.attempts(id).await, (1, Some(200)));

    // The consumer switches to the new secret alone (a second endpoint on
    // the same inbox, where the service now points).
    let new = watchpump::signing::SigningSecret::parse(&new).unwrap();
    let switched = common::Served::on_loopback(crate::support::endpoint(
        &c.db.pool,
        vec![new],
        work.clone(),
    ))
    .await;
    watchpump::services::set_url_within(
        &p.db.pool,
        "deploy",
        &switched.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let id = p
        .emit_delivered(MAIN, serde_json::json!({"after": "3"}))
        .await;
    assert_eq!(p.attempts(id).await, (1, Some(200)));
    assert_eq!(c.db.count("select count(*) from work").await, 3);
    p.pump.stop().await.unwrap();
}

#[tokio::test]
async fn removing_a_watch_removes_it_at_the_producer_and_here() {
    let p = Producer::start().await;
    let c = p.consumer(&Work::default()).await;
    let watch = c.watch(WatchRequest::new("app-1", MAIN)).await;
    // Registering the identical watch again returns the same one.
    assert_eq!(c.watch(WatchRequest::new("app-1", MAIN)).await, watch);

    c.watches.remove(watch).await.unwrap();

    let live: bool =
        sqlx::query_scalar("select live from watchpump.watch_list where watch_id = $1")
            .bind(watch)
            .fetch_one(&p.db.pool)
            .await
            .unwrap();
    assert!(!live);
    let known = watchpump::kit::known_watches(&c.db.pool, "git")
        .await
        .unwrap();
    assert_eq!(known.iter().map(|w| w.live).collect::<Vec<_>>(), [false]);
    // Removing it again is not an error: it is gone either way.
    c.watches.remove(watch).await.unwrap();
    // A watch the producer refuses is an error that says why.
    let err = c
        .watches
        .register(&WatchRequest::new("app-1", "/bad"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("422"), "{err}");
    p.pump.stop().await.unwrap();
}

/// A consumer that registers more new watches than its service's burst of
/// self-service writes waits out each 429's `Retry-After` instead of
/// failing: with a burst of 2, the third registration is refused once and
/// then made. (Without the wait, `register` returned the 429.)
#[tokio::test]
async fn registering_past_the_services_write_limit_waits_and_registers_every_watch() {
    let p = Producer::start().await;
    let c = p.consumer(&Work::default()).await;
    sqlx::query("update watchpump.settings set self_service_rate = 10, self_service_burst = 2")
        .execute(&p.db.pool)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        let watch = WatchRequest::new("app-1", &format!("acme/limited-{n}/"));
        ids.push(c.watches.register(&watch).await.unwrap().id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 5);
    let live: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.watches where id = any ($1) and removed_at is null",
    )
    .bind(&ids)
    .fetch_one(&p.db.pool)
    .await
    .unwrap();
    assert_eq!(live, 5);
    let known = watchpump::kit::known_watches(&c.db.pool, "git")
        .await
        .unwrap();
    assert_eq!(known.iter().filter(|w| w.live).count(), 5);
    p.pump.stop().await.unwrap();
}
