//! Per-service bounds on a consumer's self-service writes (issue 34, item
//! 3): one token bucket per service over watch creation, ping, redeliver,
//! resync, pause and resume (429 with `Retry-After`); one redelivery of a
//! delivery a minute; one resync per service at a time and a daily replay
//! budget; pauses and resumes that write a bounded number of rows, a watch
//! not paused again soon after a resume, and a pause that ends at its
//! maximum. Through the real API on loopback, the real pump and a real
//! consumer.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

/// The API on loopback, a service `deploy` with a consumer, a service
/// `docs`, and (when asked) the pump.
struct Setup {
    db: TestDb,
    http: reqwest::Client,
    base: String,
    consumer: Receiver,
    deploy_id: i64,
    token: String,
    docs_token: String,
    _pump: Option<RunningPump>,
}

/// An answer: status, `Retry-After` in seconds if any, JSON body.
struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    body: Value,
}

impl Setup {
    async fn start(pump: bool) -> Setup {
        let db = TestDb::new().await;
        let consumer = Receiver::start().await;
        let (deploy, token) = db.add_service("deploy", &consumer.base_url()).await;
        let (_, docs_token) = db.add_service("docs", "http://127.0.0.1:9").await;
        let app = watchpump::api::app(api_state(&db.pool, &pump_config()));
        let addr = serve(app).await;
        Setup {
            _pump: pump.then(|| RunningPump::start(&db.pool, pump_config())),
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
            consumer,
            deploy_id: deploy.id,
            token,
            docs_token,
            db,
        }
    }

    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> Answer {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let text = resp.text().await.unwrap();
        Answer {
            status,
            retry_after,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    async fn post(&self, path: &str) -> Answer {
        self.call(Method::POST, path, &self.token, None).await
    }

    async fn exec(&self, sql: &str) {
        sqlx::query(sql).execute(&self.db.pool).await.unwrap();
    }
}

/// A 429 in the API's error shape, with a `Retry-After` of at most
/// `at_most` seconds.
fn assert_too_many(a: &Answer, at_most: u64, says: &str) {
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "too_many_requests", "{}", a.body);
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{message}");
    let wait = a.retry_after.expect("a Retry-After header");
    assert!((1..=at_most).contains(&wait), "Retry-After: {wait}");
}

/// The finding: create a watch, ping it, delete it, in a loop, so that the
/// ping's limit per watch never applies. The service's bucket (60 writes,
/// then one a second) refuses it with 429 and `Retry-After`; another
/// service is not concerned; the refusals are counted.
#[tokio::test]
async fn create_ping_delete_in_a_loop_is_refused_by_the_services_bucket_and_no_other_service_pays()
{
    let exporter = free_addr();
    watchpump::metrics::install(exporter).expect("install the exporter");
    let s = Setup::start(false).await;
    watchpump::metrics::register_service("deploy");
    let started = Instant::now();
    let mut accepted_pings = 0;
    let mut refused: Option<Answer> = None;
    for i in 0..100 {
        let created = s
            .call(
                Method::POST,
                "/api/v1/watches",
                &s.token,
                Some(json!({"resource": format!("r{i}"), "object": "acme/web/"})),
            )
            .await;
        if created.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(created);
            break;
        }
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
        let id = created.body["id"].as_i64().unwrap();
        let ping = s.post(&format!("/api/v1/watches/{id}/ping")).await;
        if ping.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(ping);
            break;
        }
        assert_eq!(ping.status, StatusCode::ACCEPTED, "{}", ping.body);
        accepted_pings += 1;
        let deleted = s
            .call(
                Method::DELETE,
                &format!("/api/v1/watches/{id}"),
                &s.token,
                None,
            )
            .await;
        assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    }
    let refused = refused.expect("the loop was refused before 100 rounds");
    assert_too_many(&refused, 2, "self-service writes");
    // 60 tokens, and one a second since: two a round.
    let bound = (60.0 + started.elapsed().as_secs_f64() + 1.0) / 2.0;
    assert!(
        f64::from(accepted_pings) <= bound,
        "{accepted_pings} pings accepted"
    );

    // Another service's writes still go.
    let theirs = s
        .call(
            Method::POST,
            "/api/v1/watches",
            &s.docs_token,
            Some(json!({"resource": "d", "object": "acme/docs/"})),
        )
        .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{}", theirs.body);
    // Registering an identical watch again writes nothing and costs nothing.
    let again = s
        .call(
            Method::POST,
            "/api/v1/watches",
            &s.docs_token,
            Some(json!({"resource": "d", "object": "acme/docs/"})),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);

    let scrape = common::prometheus::Scrape::fetch(exporter).await;
    let counted = scrape.sum(
        "watchpump_self_service_refused_total",
        &[("service", "deploy"), ("limit", "rate")],
    );
    assert!(counted >= 1.0, "refusals counted: {counted}");
}

/// A redelivery of a delivery that was delivered again at once is 429 for
/// the rest of the minute (before issue 34, 182 a second were accepted).
#[tokio::test]
async fn a_delivery_is_redelivered_at_most_once_a_minute() {
    let s = Setup::start(true).await;
    s.db.add_watch(s.deploy_id, "app", "acme/web/main", all())
        .await;
    let id = delivery_of(&s.db, s.db.emit("acme/web/main", "push", json!({})).await).await;
    s.db.wait_state(id, "delivered", LONG).await;
    let path = format!("/api/v1/deliveries/{id}/redeliver");
    let first = s.post(&path).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    s.consumer.wait_for(2, LONG).await;
    s.db.wait_state(id, "delivered", LONG).await;
    let second = s.post(&path).await;
    assert_too_many(&second, 60, "once a minute");
    assert_eq!(s.db.delivery_state(id).await, "delivered", "unchanged");
}

/// What replays were queued for the service, all resyncs together.
async fn replays(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from watchpump.deliveries where replay")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn wait_no_resync(db: &TestDb) {
    eventually(LONG, "no resync runs", || async {
        let n: i64 = sqlx::query_scalar("select count(*) from watchpump.resyncs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        n == 0
    })
    .await;
}

/// The finding: every watch of one service resynced at once, again and
/// again. One resync of a service runs at a time, and its replays come out
/// of a daily budget: past it, a 429 says when the budget has room again.
#[tokio::test]
async fn a_service_resyncs_one_watch_at_a_time_within_a_daily_replay_budget() {
    let s = Setup::start(false).await;
    let a = s.db.add_watch(s.deploy_id, "a", "acme/a/", all()).await;
    let b = s.db.add_watch(s.deploy_id, "b", "acme/b/", all()).await;
    for i in 0..10 {
        s.db.emit(&format!("acme/a/o{i}"), "push", json!({})).await;
        s.db.emit(&format!("acme/b/o{i}"), "push", json!({})).await;
    }
    // Nothing was sent (no pump): every object's news is queued already,
    // which a replay would only repeat. Settle it as delivered.
    s.exec(
        "select count(*) from watchpump.settle(array(
             select watchpump.settle_as(id, 'delivered', p_status => 200) from watchpump.queue))",
    )
    .await;

    // A's resync runs (its slot taken): B's is refused, for the service.
    sqlx::query("select objects from watchpump.resync_start($1, $2, 100)")
        .bind(s.deploy_id)
        .bind(a.id)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let refused = s.post(&format!("/api/v1/watches/{}/resync", b.id)).await;
    assert_too_many(&refused, 60, "one at a time");
    sqlx::query("select watchpump.resync_finish($1)")
        .bind(a.id)
        .execute(&s.db.pool)
        .await
        .unwrap();

    // A budget of 15 replays a day: A takes 10, B the 5 left (truncated),
    // then nothing until the budget refills.
    s.exec("update watchpump.settings set replays_per_day = 15")
        .await;
    let started = s.post(&format!("/api/v1/watches/{}/resync", a.id)).await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.body);
    assert_eq!(started.body["objects"], 10);
    assert_eq!(started.body["truncated"], false);
    assert_eq!(started.body["replays_left"], 5, "{}", started.body);
    wait_no_resync(&s.db).await;
    let started = s.post(&format!("/api/v1/watches/{}/resync", b.id)).await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.body);
    assert_eq!(started.body["objects"], 5, "{}", started.body);
    assert_eq!(started.body["truncated"], true);
    assert_eq!(started.body["replays_left"], 0);
    wait_no_resync(&s.db).await;
    let refused = s.post(&format!("/api/v1/watches/{}/resync", a.id)).await;
    assert_too_many(&refused, 86_400, "replays");
    assert_eq!(replays(&s.db).await, 15, "the budget, no more");
}

/// A replay not queued (the same news waits already) is given back to the
/// budget.
#[tokio::test]
async fn replays_a_resync_did_not_queue_go_back_to_the_budget() {
    let s = Setup::start(false).await;
    let a = s.db.add_watch(s.deploy_id, "a", "acme/a/", all()).await;
    for i in 0..4 {
        s.db.emit(&format!("acme/a/o{i}"), "push", json!({})).await;
    }
    s.exec("update watchpump.settings set replays_per_day = 10")
        .await;
    // Everything is still queued: nothing to replay.
    let started = s.post(&format!("/api/v1/watches/{}/resync", a.id)).await;
    assert_eq!(started.body["replays_left"], 6, "{}", started.body);
    wait_no_resync(&s.db).await;
    let left: f64 =
        sqlx::query_scalar("select tokens from watchpump.replay_buckets where service_id = $1")
            .bind(s.deploy_id)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert!(left >= 10.0 - 0.01, "the 4 unused went back: {left}");
    assert_eq!(replays(&s.db).await, 0);
}

/// The row versions of the queue, by id: a row rewritten since gets a new
/// xmin.
async fn versions(db: &TestDb) -> HashMap<i64, String> {
    sqlx::query_as::<_, (i64, String)>("select id, xmin::text from watchpump.queue")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

fn rewritten(before: &HashMap<i64, String>, after: &HashMap<i64, String>) -> usize {
    after
        .iter()
        .filter(|(id, xmin)| before.get(id) != Some(xmin))
        .count()
}

/// `n` deliveries queued for the watch, one per object, due now.
async fn stage_queue(db: &TestDb, service_id: i64, watch_id: i64, n: i64) {
    let change = db.emit("acme/staged", "push", json!({})).await;
    sqlx::query(
        "insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at)
         select c.id, $2, $3, 'acme/o' || g, 1, now() + interval '1 day', c.occurred_at
         from watchpump.changes c, generate_series(1, $4) g where c.id = $1",
    )
    .bind(change)
    .bind(watch_id)
    .bind(service_id)
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The finding: 17 pauses and resumes of a watch with 10,000 queued
/// deliveries rewrote every queued row 34 times (254 MB of WAL in 20 s).
/// A pause or a resume writes at most 1,000 rows itself (the operator's
/// task does the rest, a batch at a time), and a watch resumed less than a
/// minute ago is not paused again.
#[tokio::test]
async fn pausing_and_resuming_in_a_loop_rewrites_a_bounded_number_of_rows() {
    let s = Setup::start(false).await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/", all()).await;
    stage_queue(&s.db, s.deploy_id, watch.id, 10_000).await;
    let mut total = 0;
    let mut statuses = Vec::new();
    let mut last_refusal = None;
    for _ in 0..17 {
        for what in ["pause", "resume"] {
            let before = versions(&s.db).await;
            let a = s
                .post(&format!("/api/v1/watches/{}/{what}", watch.id))
                .await;
            total += rewritten(&before, &versions(&s.db).await);
            statuses.push(a.status);
            if a.status != StatusCode::OK {
                last_refusal = Some(a);
            }
        }
    }
    assert!(total <= 2_000, "{total} rows rewritten");
    assert_eq!(&statuses[..2], &[StatusCode::OK, StatusCode::OK]);
    let refusal = last_refusal.expect("a pause soon after a resume is refused");
    assert_too_many(&refusal, 60, "resumed less than 60 s ago");
}

/// A resume releases one batch at once and the operator's task the rest,
/// each with a fresh delivery window; a pause holds one batch at once and
/// the task the rest.
#[tokio::test]
async fn held_deliveries_are_held_and_released_in_batches() {
    let s = Setup::start(false).await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/", all()).await;
    stage_queue(&s.db, s.deploy_id, watch.id, 2_500).await;
    let held = || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from watchpump.queue where next_attempt_at = watchpump.held_until()",
        )
        .fetch_one(&s.db.pool)
        .await
        .unwrap()
    };
    let a = s.post(&format!("/api/v1/watches/{}/pause", watch.id)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(held().await, 1_000, "the pause holds one batch itself");
    watchpump::watches::pause::hold_paused(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(held().await, 2_501, "the task holds the rest");

    let a = s
        .post(&format!("/api/v1/watches/{}/resume", watch.id))
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(held().await, 1_501, "the resume releases one batch itself");
    let mut rounds = 0;
    while held().await > 0 {
        let released = watchpump::watches::pause::release_resumed(&s.db.pool)
            .await
            .unwrap();
        assert!(released <= 1_000, "{released}");
        rounds += 1;
        assert!(rounds <= 3, "the task releases the rest a batch a round");
    }
    let windows: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.queue
         where deadline > now() + interval '23 hours' and next_attempt_at <= now()",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(windows, 2_501, "each released with a fresh window");
    let releasing: i64 = sqlx::query_scalar("select count(*) from watchpump.releasing")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(releasing, 0, "nothing left to release");
}

/// A paused watch no longer holds its deliveries forever: past the
/// operator's maximum its pause ends, what it held is sent, and the
/// consumer sees the watch live again.
#[tokio::test]
async fn a_pause_ends_at_its_maximum_and_what_it_held_is_sent() {
    let s = Setup::start(true).await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/", all()).await;
    s.exec("update watchpump.settings set max_pause = '1 second'")
        .await;
    let a = s.post(&format!("/api/v1/watches/{}/pause", watch.id)).await;
    assert_eq!(a.status, StatusCode::OK);
    s.db.emit("acme/a", "push", json!({"n": 1})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.consumer.count(), 0, "held while paused");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let ended = watchpump::watches::pause::expire_pauses(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(ended, vec![("deploy".to_string(), watch.id)]);
    s.consumer.wait_for(1, LONG).await;
    let shown = s
        .call(
            Method::GET,
            &format!("/api/v1/watches/{}", watch.id),
            &s.token,
            None,
        )
        .await;
    assert_eq!(shown.body["paused_at"], Value::Null, "{}", shown.body);
}
