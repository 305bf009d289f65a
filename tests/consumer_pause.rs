//! Pause and resume (issue 20): a watch paused through the API, a service
//! paused from the CLI. Against the real pump, the operator's periodic task
//! and a real consumer on loopback: nothing is sent and nothing fails while
//! paused, however long; news keeps superseding; resume sends the newest
//! news of each object.

mod common;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(20);

/// The API on loopback, a service `deploy` with a consumer, the pump and
/// the operator's periodic task (every 100 ms) running.
struct Setup {
    db: TestDb,
    http: reqwest::Client,
    base: String,
    consumer: Receiver,
    deploy_id: i64,
    token: String,
    docs_token: String,
    _pump: RunningPump,
}

impl Setup {
    async fn start() -> Setup {
        let db = TestDb::new().await;
        let consumer = Receiver::start().await;
        let (deploy, token) = db.add_service("deploy", &consumer.base_url()).await;
        let (_, docs_token) = db.add_service("docs", "http://127.0.0.1:9").await;
        let app = watchpump::api::app(api_state(&db.pool, &pump_config()));
        let addr = serve(app).await;
        let mut operator = operator_config();
        operator.operator_interval_ms = 100;
        let worker = watchpump::operator::worker::Worker::new(
            db.pool.clone(),
            operator,
            &pump_config(),
            "http://127.0.0.1:9/panel",
        )
        .unwrap();
        tokio::spawn(worker.run(std::future::pending()));
        Setup {
            _pump: RunningPump::start(&db.pool, pump_config()),
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
            consumer,
            deploy_id: deploy.id,
            token,
            docs_token,
            db,
        }
    }

    async fn post(&self, path: &str, token: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .request(Method::POST, format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json().await.unwrap())
    }

    async fn states(&self) -> Vec<(String, i64)> {
        sqlx::query_as(
            "select state, count(*) from watchpump.deliveries group by state order by state",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

fn cli(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    let out = watchpump_cli(Some(&db.url)).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_pause_longer_than_the_delivery_window_sends_and_fails_nothing_and_resume_sends_the_newest_news(
) {
    let s = Setup::start().await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;
    let pause = format!("/api/v1/watches/{}/pause", watch.id);
    let resume = format!("/api/v1/watches/{}/resume", watch.id);

    let (status, body) = s.post(&pause, &s.token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"watch_id": watch.id, "paused": true, "changed": true})
    );
    let (status, body) = s.post(&pause, &s.token).await;
    assert_eq!(status, StatusCode::OK, "a repeated pause is 200");
    assert_eq!(body["changed"], false);

    // News of two objects, each retried for 2 s only: without the pause,
    // the sweep (deadlines every 2 s here) would fail what was not sent.
    for n in 1..=3 {
        emit_with_window(&s.db, "acme/web/main", "push", json!({"n": n}), "2 seconds").await;
    }
    for n in 1..=2 {
        emit_with_window(&s.db, "acme/web/dev", "push", json!({"n": n}), "2 seconds").await;
    }
    let paused: (bool, i64) = sqlx::query_as(
        "select paused, paused_watches from watchpump.backlog where service = 'deploy'",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        paused,
        (false, 1),
        "the backlog view shows the paused watch"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    assert_eq!(s.consumer.count(), 0, "nothing is sent while paused");
    assert_eq!(
        s.states().await,
        vec![("pending".into(), 2), ("superseded".into(), 3)],
        "nothing failed; one delivery waits per object"
    );

    let (status, body) = s.post(&resume, &s.token).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["changed"], true);
    let received = s.consumer.wait_for(2, LONG).await;
    let mut newest: Vec<(String, i64)> = received
        .iter()
        .map(|r| {
            (
                r.body["object"].as_str().unwrap().to_string(),
                r.body["payload"]["n"].as_i64().unwrap(),
            )
        })
        .collect();
    newest.sort();
    assert_eq!(
        newest,
        vec![("acme/web/dev".into(), 2), ("acme/web/main".into(), 3)],
        "the newest news of each object"
    );
    for _ in 0..100 {
        if s.db.count_state("delivered").await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        s.states().await,
        vec![("delivered".into(), 2), ("superseded".into(), 3)]
    );
    let (status, body) = s.post(&resume, &s.token).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["changed"], false);
}

#[tokio::test]
async fn pausing_another_services_watch_a_removed_one_or_no_id_is_404_and_changes_nothing() {
    let s = Setup::start().await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;
    let (status, _) = s
        .post(
            &format!("/api/v1/watches/{}/pause", watch.id),
            &s.docs_token,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = s.post("/api/v1/watches/x/pause", &s.token).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let paused: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("select paused_at from watchpump.watches where id = $1")
            .bind(watch.id)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(paused, None);
    let removed =
        s.db.add_watch(s.deploy_id, "other", "acme/docs/", all())
            .await;
    watchpump::watches::remove(&s.db.pool, s.deploy_id, removed.id, "test")
        .await
        .unwrap();
    let (status, _) = s
        .post(&format!("/api/v1/watches/{}/pause", removed.id), &s.token)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_cli_pauses_and_resumes_a_service_and_a_watch() {
    let s = Setup::start().await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;

    let (code, out, err) = cli(&s.db, &["services", "pause", "deploy"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused"), "{out}");
    let (code, out, _) = cli(&s.db, &["services", "pause", "deploy"]);
    assert_eq!(code, 0);
    assert!(out.contains("already"), "{out}");
    s.db.emit("acme/web/main", "push", json!({"n": 1})).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.consumer.count(), 0, "nothing is sent to a paused service");
    let paused: bool =
        sqlx::query_scalar("select paused from watchpump.backlog where service = 'deploy'")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert!(paused);

    // A watch paused on its own stays paused when its service resumes.
    let id = watch.id.to_string();
    let (code, _, err) = cli(&s.db, &["watches", "pause", &id, "--service", "deploy"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli(&s.db, &["services", "resume", "deploy"]);
    assert_eq!(code, 0);
    assert!(out.contains("resumed"), "{out}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.consumer.count(), 0, "the watch is still paused");
    let (code, _, err) = cli(&s.db, &["watches", "resume", &id, "--service", "deploy"]);
    assert_eq!(code, 0, "{err}");
    s.consumer.wait_for(1, LONG).await;

    // Bad input: a message and a non-zero exit.
    for args in [
        &["services", "pause", "nobody"][..],
        &["watches", "pause", &id, "--service", "docs"],
        &["watches", "pause", "x", "--service", "deploy"],
        &["watches", "pause", &id],
    ] {
        let (code, _, err) = cli(&s.db, args);
        assert_ne!(code, 0, "{args:?}");
        assert!(!err.trim().is_empty(), "{args:?}");
    }
    let paused: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("select paused_at from watchpump.watches where id = $1")
            .bind(watch.id)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(paused, None);
}

#[tokio::test]
async fn the_paused_watches_gauge_counts_a_paused_watch_and_every_watch_of_a_paused_service() {
    let exporter = free_addr();
    watchpump::metrics::install(exporter).expect("install the exporter");
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let (docs, _) = db.add_service("docs", "http://127.0.0.1:9").await;
    let first = db.add_watch(deploy.id, "a", "acme/a/", all()).await;
    db.add_watch(deploy.id, "b", "acme/b/", all()).await;
    for n in 0..3 {
        db.add_watch(docs.id, "d", &format!("acme/d{n}/"), all())
            .await;
    }
    let mut collector = watchpump::metrics::backlog::Collector::new(&db.pool);
    let gauge = |scrape: &common::prometheus::Scrape, service: &str| {
        scrape.sum("watchpump_paused_watches", &[("service", service)])
    };

    collector.step().await;
    let scrape = common::prometheus::Scrape::fetch(exporter).await;
    assert_eq!(
        (gauge(&scrape, "deploy"), gauge(&scrape, "docs")),
        (0.0, 0.0)
    );

    watchpump::watches::pause::set_watch(&db.pool, deploy.id, first.id, true)
        .await
        .unwrap();
    watchpump::watches::pause::set_service(&db.pool, docs.id, true)
        .await
        .unwrap();
    collector.step().await;
    let scrape = common::prometheus::Scrape::fetch(exporter).await;
    assert_eq!(
        (gauge(&scrape, "deploy"), gauge(&scrape, "docs")),
        (1.0, 3.0)
    );
    collector.close().await;
}

/// A resume that commits while the operator's task is holding paused
/// watches' deliveries leaves nothing held: the task waits for the resume
/// (watchpump.pause_key()), then sees the watch live. Before, it read the
/// watch as paused, held a delivery queued during the pause that the resume
/// had already passed over, and nothing ever released it.
#[tokio::test]
async fn a_resume_racing_the_operators_hold_leaves_nothing_held() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(deploy.id, "app", "acme/", all()).await;
    watchpump::watches::pause::set_watch(&db.pool, deploy.id, watch.id, true)
        .await
        .unwrap();
    // Queued during the pause, not yet held: the task's next round would.
    let change = db.emit("acme/a", "push", json!({})).await;
    let id = delivery_of(&db, change).await;
    let held = "select next_attempt_at = watchpump.held_until() from watchpump.queue where id = $1";
    let is_held = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, bool>(held)
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert!(!is_held(db.pool.clone()).await);

    // The resume, not committed yet, while the task runs a round.
    let mut resume = db.pool.begin().await.unwrap();
    sqlx::query("select watchpump.set_watch_paused($1, $2, false)")
        .bind(deploy.id)
        .bind(watch.id)
        .execute(&mut *resume)
        .await
        .unwrap();
    let mut task = db.pool.acquire().await.unwrap();
    let backend = backend_pid(&mut task).await;
    let round = tokio::spawn(async move {
        sqlx::query_as::<_, (i32, i32)>("select superseded, held from watchpump.hold_paused(10000)")
            .fetch_one(&mut *task)
            .await
            .unwrap()
    });
    // The round either waits for the resume (the lock) or is done.
    eventually(LONG, "the round waits for the resume, or is done", || {
        let done = round.is_finished();
        let waiting = waits_for_a_lock(&db.pool, backend);
        async move { done || waiting.await }
    })
    .await;
    resume.commit().await.unwrap();
    assert_eq!(round.await.unwrap(), (0, 0), "the round holds nothing");
    assert!(
        !is_held(db.pool.clone()).await,
        "the delivery is due, not held"
    );
}

/// Pauses lock per service: a pause of one service goes through while
/// another service's pause is under way (not committed), and the
/// operator's round does not wait for that one either: it holds the
/// paused service it can lock and leaves the busy one to its next round.
/// Before, one lock served every service, so a consumer pausing and
/// resuming in a loop delayed every other service's pauses and the
/// operator's rounds.
#[tokio::test]
async fn a_pause_under_way_delays_no_other_service_nor_the_operators_round() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let (preview, _) = db.add_service("preview", "http://127.0.0.1:9").await;
    let deploy_watch = db.add_watch(deploy.id, "app", "acme/", all()).await;
    let preview_watch = db.add_watch(preview.id, "app", "acme/", all()).await;
    let change = db.emit("acme/a", "push", json!({})).await;
    let preview_delivery: i64 =
        sqlx::query_scalar("select id from watchpump.queue where change_id = $1 and watch_id = $2")
            .bind(change)
            .bind(preview_watch.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();

    // deploy's pause, not committed yet.
    let mut busy = db.pool.begin().await.unwrap();
    sqlx::query("select watchpump.set_watch_paused($1, $2, true)")
        .bind(deploy.id)
        .bind(deploy_watch.id)
        .execute(&mut *busy)
        .await
        .unwrap();

    // preview's pause, meanwhile.
    let other = tokio::spawn({
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("select watchpump.set_service_paused($1, true)")
                .bind(preview.id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    });
    eventually(LONG, "another service's pause goes through", || {
        let done = other.is_finished();
        async move { done }
    })
    .await;
    assert!(other.await.unwrap());
    // A delivery queued to preview during its pause, not held yet; the
    // round holds it, and does not wait for deploy's pause.
    sqlx::query("update watchpump.queue set next_attempt_at = now() where id = $1")
        .bind(preview_delivery)
        .execute(&db.pool)
        .await
        .unwrap();
    let round = tokio::spawn({
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (i32, i32)>(
                "select superseded, held from watchpump.hold_paused(10000)",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    });
    eventually(LONG, "the operator's round is done", || {
        let done = round.is_finished();
        async move { done }
    })
    .await;
    assert_eq!(round.await.unwrap(), (0, 1), "preview's delivery held");
    busy.commit().await.unwrap();
}

/// However many services are paused, one operator's round takes the pause
/// locks of at most 32 of them (PostgreSQL's lock table is shared and
/// bounded), and the rounds after it hold the rest.
#[tokio::test]
async fn a_round_locks_at_most_32_paused_services_and_later_rounds_hold_the_rest() {
    let db = TestDb::new().await;
    for n in 0..40 {
        let (svc, _) = db
            .add_service(&format!("svc{n}"), "http://127.0.0.1:9")
            .await;
        db.add_watch(svc.id, "app", "acme/", all()).await;
        sqlx::query("select watchpump.set_service_paused($1, true)")
            .bind(svc.id)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    // Queued during the pauses, not yet held: one delivery per service.
    db.emit("acme/a", "push", json!({})).await;
    let unheld =
        "select count(*) from watchpump.queue where next_attempt_at <> watchpump.held_until()";
    assert_eq!(scalar(&db, unheld).await, 40);

    let mut round = db.pool.begin().await.unwrap();
    let (_, held): (i32, i32) =
        sqlx::query_as("select superseded, held from watchpump.hold_paused(10000)")
            .fetch_one(&mut *round)
            .await
            .unwrap();
    let locks: i64 = sqlx::query_scalar(
        "select count(*) from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()",
    )
    .fetch_one(&mut *round)
    .await
    .unwrap();
    round.commit().await.unwrap();
    assert_eq!(
        (held, locks),
        (32, 32),
        "32 services' locks, their deliveries held"
    );
    assert_eq!(scalar(&db, unheld).await, 8);
    for _ in 0..50 {
        sqlx::query("select * from watchpump.hold_paused(10000)")
            .execute(&db.pool)
            .await
            .unwrap();
        if scalar(&db, unheld).await == 0 {
            break;
        }
    }
    assert_eq!(scalar(&db, unheld).await, 0, "later rounds hold the rest");
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}
