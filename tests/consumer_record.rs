//! The record keeps every attempt (issue 34, item 6): a redelivery, an
//! operator's retry (`retry()`, `retry_failed()`) and a resync add to a
//! delivery's history and never take an attempt out of it, as the consumer
//! API, the admin API and `watchpump.delivery_history` show it. Against the
//! real pump and a real consumer on loopback.

mod common;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const OBJECT: &str = "acme/web/refs/heads/main";
const LONG: Duration = Duration::from_secs(30);

/// The API with the admin API on loopback, a service `deploy` with a
/// consumer and a watch on [`OBJECT`], and the pump.
struct Setup {
    db: TestDb,
    server: AppServer,
    http: reqwest::Client,
    consumer: Receiver,
    deploy_id: i64,
    token: String,
    _pump: RunningPump,
}

impl Setup {
    async fn start() -> Setup {
        let db = TestDb::new().await;
        let consumer = Receiver::start().await;
        let (deploy, token) = db.add_service("deploy", &consumer.base_url()).await;
        db.add_watch(deploy.id, "app", OBJECT, all()).await;
        let server = AppServer::start(&db.pool, &operator_config()).await;
        Setup {
            _pump: RunningPump::start(&db.pool, pump_config()),
            http: reqwest::Client::new(),
            server,
            consumer,
            deploy_id: deploy.id,
            token,
            db,
        }
    }

    async fn call(&self, method: Method, path: &str, token: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .request(method, self.server.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    async fn delivered(&self) -> i64 {
        let id = delivery_of(&self.db, self.db.emit(OBJECT, "push", json!({})).await).await;
        self.db.wait_state(id, "delivered", LONG).await;
        id
    }

    async fn redeliver(&self, id: i64) {
        let (status, body) = self
            .call(
                Method::POST,
                &format!("/api/v1/deliveries/{id}/redeliver"),
                &self.token,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }

    async fn set_window(&self, window: Option<&str>) {
        sqlx::query("update watchpump.settings set delivery_window = $1::interval")
            .bind(window)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }

    /// The attempts as the consumer API and the admin API list them: each
    /// (attempt, last_attempt, status).
    async fn attempts(
        &self,
        id: i64,
    ) -> (Vec<(i64, i64, Option<i64>)>, Vec<(i64, i64, Option<i64>)>) {
        let (status, mine) = self
            .call(
                Method::GET,
                &format!("/api/v1/deliveries/{id}"),
                &self.token,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{mine}");
        let (status, admin) = self
            .call(
                Method::GET,
                &format!("/api/v1/admin/deliveries/{id}/attempts"),
                ADMIN_TOKEN,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{admin}");
        let consumer_view: Vec<(i64, i64, Option<i64>)> = mine["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["attempt"].as_i64().unwrap(),
                    a["last_attempt"].as_i64().unwrap(),
                    a["status"].as_i64(),
                )
            })
            .collect();
        let admin_view: Vec<(i64, i64, Option<i64>)> = admin["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let first = a["attempt"].as_i64().unwrap();
                let repeats = a["repeats"].as_i64().unwrap_or(1);
                (first, first + repeats - 1, a["status"].as_i64())
            })
            .collect();
        (consumer_view, admin_view)
    }

    async fn history(&self, id: i64) -> Vec<(String, String)> {
        sqlx::query_as(
            "select event, coalesce(detail, '') from watchpump.delivery_history
             where delivery_id = $1 order by at, seq",
        )
        .bind(id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn attempt_count(&self, id: i64) -> i64 {
        sqlx::query_scalar::<_, i32>("select attempts from watchpump.deliveries where id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
            .into()
    }
}

/// Every attempt from 1 to `count` is listed, once, in order.
fn assert_every_attempt(listed: &[(i64, i64, Option<i64>)], count: i64) {
    let mut next = 1;
    for (first, last, _) in listed {
        assert_eq!(*first, next, "attempt {next} is missing: {listed:?}");
        next = last + 1;
    }
    assert_eq!(next, count + 1, "{count} attempts, listed: {listed:?}");
}

/// The "attempt N" and "attempt N-M" events of a history, as ranges.
fn attempt_events(history: &[(String, String)]) -> Vec<(i64, i64, Option<i64>)> {
    history
        .iter()
        .filter_map(|(event, _)| event.strip_prefix("attempt "))
        .map(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            (a.parse().unwrap(), b.parse().unwrap(), None)
        })
        .collect()
}

/// The finding: after a redelivery of a delivered delivery, its attempts
/// (consumer API and admin API) listed only attempt 2, and the history
/// read "created, delivered, retry, attempt 2, delivered", though it had 2
/// attempts.
#[tokio::test]
async fn a_redelivered_delivery_keeps_its_first_attempt_in_every_view() {
    let s = Setup::start().await;
    let id = s.delivered().await;
    s.redeliver(id).await;
    s.consumer.wait_for(2, LONG).await;
    s.db.wait_state(id, "delivered", LONG).await;

    let (mine, admin) = s.attempts(id).await;
    assert_eq!(mine, vec![(1, 1, Some(200)), (2, 2, Some(200))]);
    assert_eq!(admin, mine);
    let events: Vec<String> = s.history(id).await.into_iter().map(|e| e.0).collect();
    assert_eq!(
        events,
        [
            "created",
            "attempt 1",
            "delivered",
            "retry",
            "attempt 2",
            "delivered"
        ]
    );
}

/// Delivered, redelivered into a consumer that fails until the window
/// ends, then retried by the operator (admin API) and delivered: every
/// attempt, the first one's 200 included, stays listed.
#[tokio::test]
async fn an_operators_retry_after_a_redelivery_keeps_every_attempt() {
    let s = Setup::start().await;
    let id = s.delivered().await;
    s.consumer.reply_with(500);
    s.set_window(Some("1 second")).await;
    s.redeliver(id).await;
    s.db.wait_state(id, "failed", LONG).await;
    s.set_window(None).await;
    s.consumer.reply_with(200);
    let (status, body) = s
        .call(
            Method::POST,
            &format!("/api/v1/admin/deliveries/{id}/retry"),
            ADMIN_TOKEN,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    s.db.wait_state(id, "delivered", LONG).await;

    let count = s.attempt_count(id).await;
    assert!(count >= 3, "{count}");
    let (mine, admin) = s.attempts(id).await;
    assert_every_attempt(&mine, count);
    assert_every_attempt(&admin, count);
    assert_eq!(mine.first().unwrap().2, Some(200), "{mine:?}");
    assert_eq!(mine.last().unwrap().2, Some(200), "{mine:?}");
    let history = s.history(id).await;
    assert_every_attempt(&attempt_events(&history), count);
    let events: Vec<&str> = history.iter().map(|e| e.0.as_str()).collect();
    for ended in ["delivered", "failed"] {
        assert!(events.contains(&ended), "{events:?}");
    }
    assert_eq!(events.iter().filter(|e| **e == "retry").count(), 2);
}

/// The same through `watchpump.retry_failed()`, the operator's "recover".
#[tokio::test]
async fn retry_failed_after_a_redelivery_keeps_every_attempt() {
    let s = Setup::start().await;
    let id = s.delivered().await;
    s.consumer.reply_with(500);
    s.set_window(Some("1 second")).await;
    s.redeliver(id).await;
    s.db.wait_state(id, "failed", LONG).await;
    s.set_window(None).await;
    s.consumer.reply_with(200);
    let requeued: i32 =
        sqlx::query_scalar("select watchpump.retry_failed('deploy', now() - interval '1 hour')")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(requeued, 1);
    s.db.wait_state(id, "delivered", LONG).await;

    let count = s.attempt_count(id).await;
    let (mine, admin) = s.attempts(id).await;
    assert_every_attempt(&mine, count);
    assert_every_attempt(&admin, count);
    assert_every_attempt(&attempt_events(&s.history(id).await), count);
}

/// A resync adds a replay, whose history says what it is, and takes
/// nothing from the delivery it repeats.
#[tokio::test]
async fn a_resync_adds_a_replay_and_removes_no_attempt() {
    let s = Setup::start().await;
    let id = s.delivered().await;
    let before = (s.attempts(id).await, s.history(id).await);
    let watch: i64 = sqlx::query_scalar("select id from watchpump.watches where service_id = $1")
        .bind(s.deploy_id)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    let (status, body) = s
        .call(
            Method::POST,
            &format!("/api/v1/watches/{watch}/resync"),
            &s.token,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    s.consumer.wait_for(2, LONG).await;
    let replay: i64 = s.consumer.received()[1].body["delivery_id"]
        .as_i64()
        .unwrap();
    s.db.wait_state(replay, "delivered", LONG).await;

    assert_eq!((s.attempts(id).await, s.history(id).await), before);
    let history = s.history(replay).await;
    assert_eq!(history[0].0, "created");
    assert!(
        history[0].1.contains("a replay asked for by a resync"),
        "{history:?}"
    );
    let events: Vec<&str> = history.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(events, ["created", "attempt 1", "delivered"]);
}
