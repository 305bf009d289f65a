//! A consumer's own view (issue 20): `GET /api/v1/deliveries`, one
//! delivery with its body and attempts, redeliver and ping, against a real
//! PostgreSQL, the real pump and real consumers on loopback.

mod common;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use watchpump::signing::{self, SigningSecret};

const OBJECT: &str = "acme/web/refs/heads/main";
const LONG: Duration = Duration::from_secs(20);

/// Two services with consumers of their own (`deploy`, `docs`), the API on
/// loopback, and a pump running.
struct Setup {
    db: TestDb,
    http: reqwest::Client,
    base: String,
    deploy: Receiver,
    deploy_id: i64,
    deploy_token: String,
    deploy_secret: String,
    docs_id: i64,
    docs_token: String,
    _docs: Receiver,
    _pump: RunningPump,
}

impl Setup {
    async fn start() -> Setup {
        let db = TestDb::new().await;
        let deploy = Receiver::start().await;
        let docs = Receiver::start().await;
        let loopback = watchpump::destinations::Destinations::loopback();
        let d = watchpump::services::add_within(&db.pool, "deploy", &deploy.base_url(), &loopback)
            .await
            .unwrap();
        let (docs_service, docs_token) = db.add_service("docs", &docs.base_url()).await;
        let app = watchpump::api::app(api_state(&db.pool, &pump_config()));
        let addr = serve(app).await;
        let pump = RunningPump::start(&db.pool, pump_config());
        Setup {
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
            deploy,
            deploy_id: d.service.id,
            deploy_token: d.token,
            deploy_secret: d.signing_secret,
            docs_id: docs_service.id,
            docs_token,
            _docs: docs,
            _pump: pump,
            db,
        }
    }

    async fn call(&self, method: Method, path: &str, token: &str) -> reqwest::Response {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    async fn get_json(&self, path: &str) -> Value {
        let resp = self.call(Method::GET, path, &self.deploy_token).await;
        assert_eq!(resp.status(), StatusCode::OK, "GET {path}");
        resp.json().await.unwrap()
    }
}

/// The status and the error code of a JSON error.
async fn error_of(resp: reqwest::Response) -> (StatusCode, String) {
    let status = resp.status();
    let body: Value = resp.json().await.expect("errors are JSON");
    (status, body["error"]["code"].as_str().unwrap().to_string())
}

/// Waits until nothing is queued.
async fn wait_all_delivered(db: &TestDb) {
    for _ in 0..200 {
        let queued: i64 = sqlx::query_scalar("select count(*) from watchpump.queue")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if queued == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("deliveries still queued after 20 s");
}

fn ids(page: &Value) -> Vec<i64> {
    page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_consumer_lists_its_own_deliveries_with_filters_and_pages_and_sees_none_of_another_service(
) {
    let s = Setup::start().await;
    let main = s.db.add_watch(s.deploy_id, "app", OBJECT, all()).await;
    let other =
        s.db.add_watch(s.deploy_id, "app", "acme/docs/", all())
            .await;
    s.db.add_watch(s.docs_id, "site", OBJECT, all()).await;
    // One at a time, each delivered before the next (none superseded).
    for n in 0..3 {
        s.db.emit(OBJECT, "push", json!({"n": n})).await;
        wait_all_delivered(&s.db).await;
    }
    let before_docs = chrono::Utc::now();
    s.db.emit("acme/docs/readme", "edit", json!({})).await;
    wait_all_delivered(&s.db).await;
    assert_eq!(
        s.db.count_state("delivered").await,
        7,
        "3 + 1 to deploy, 3 to docs"
    );

    let page = s.get_json("/api/v1/deliveries").await;
    let all_ids = ids(&page);
    assert_eq!(all_ids.len(), 4, "only deploy's own: {page}");
    assert!(all_ids.windows(2).all(|w| w[0] > w[1]), "newest first");
    assert_eq!(page["next_after"], Value::Null);
    let first = &page["deliveries"][0];
    for field in [
        "id",
        "watch_id",
        "object",
        "kind",
        "sequence",
        "state",
        "attempts",
        "created_at",
        "finished_at",
        "last_status",
    ] {
        assert!(first.get(field).is_some(), "{field} in {first}");
    }
    assert_eq!(first["object"], "acme/docs/readme");
    assert_eq!(first["kind"], "edit");
    assert_eq!(first["state"], "delivered");
    assert_eq!(first["last_status"], 200);
    assert_eq!(first["attempts"], 1);

    // Filters.
    let by_watch = s
        .get_json(&format!("/api/v1/deliveries?watch_id={}", main.id))
        .await;
    assert_eq!(ids(&by_watch).len(), 3);
    let by_prefix = s.get_json("/api/v1/deliveries?object=acme/docs/").await;
    assert_eq!(by_prefix["deliveries"][0]["watch_id"], other.id);
    assert_eq!(ids(&by_prefix).len(), 1);
    let by_object = s
        .get_json(&format!("/api/v1/deliveries?object={OBJECT}"))
        .await;
    assert_eq!(ids(&by_object).len(), 3);
    let failed = s.get_json("/api/v1/deliveries?state=failed").await;
    assert_eq!(ids(&failed).len(), 0);
    let since = s
        .http
        .get(format!("{}/api/v1/deliveries", s.base))
        .query(&[("since", before_docs.to_rfc3339())])
        .bearer_auth(&s.deploy_token)
        .send()
        .await
        .unwrap();
    let since: Value = since.json().await.unwrap();
    assert_eq!(ids(&since).len(), 1, "created at or after: {since}");

    // Pages of 3, then the rest by the cursor.
    let page1 = s.get_json("/api/v1/deliveries?limit=3").await;
    assert_eq!(ids(&page1), all_ids[..3]);
    let after = page1["next_after"].as_i64().expect("a cursor");
    let page2 = s
        .get_json(&format!("/api/v1/deliveries?limit=3&after={after}"))
        .await;
    assert_eq!(ids(&page2), all_ids[3..]);
    assert_eq!(page2["next_after"], Value::Null);

    // The other service sees its own three, none of deploy's.
    let resp = s
        .call(Method::GET, "/api/v1/deliveries", &s.docs_token)
        .await;
    let docs_page: Value = resp.json().await.unwrap();
    assert_eq!(ids(&docs_page).len(), 3);
    assert!(ids(&docs_page).iter().all(|id| !all_ids.contains(id)));
    let resp = s
        .call(
            Method::GET,
            &format!("/api/v1/deliveries/{}", all_ids[0]),
            &s.docs_token,
        )
        .await;
    assert_eq!(
        error_of(resp).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
    let resp = s
        .call(
            Method::POST,
            &format!("/api/v1/deliveries/{}/redeliver", all_ids[0]),
            &s.docs_token,
        )
        .await;
    assert_eq!(
        error_of(resp).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
}

#[tokio::test]
async fn bad_list_queries_are_400_and_no_token_is_401() {
    let s = Setup::start().await;
    for query in [
        "limit=0",
        "limit=1001",
        "state=lost",
        "since=yesterday",
        "after=x",
        "colour=red",
        "object=/abs",
    ] {
        let resp = s
            .call(
                Method::GET,
                &format!("/api/v1/deliveries?{query}"),
                &s.deploy_token,
            )
            .await;
        let (status, _) = error_of(resp).await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
            "{query}: {status}"
        );
    }
    let resp = s.call(Method::GET, "/api/v1/deliveries", "wps_1_00").await;
    assert_eq!(error_of(resp).await.0, StatusCode::UNAUTHORIZED);
    let resp = s
        .call(Method::GET, "/api/v1/deliveries/abc", &s.deploy_token)
        .await;
    assert_eq!(error_of(resp).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn one_delivery_shows_the_body_as_sent_and_its_attempts_folded_with_tokens_masked() {
    let s = Setup::start().await;
    s.db.add_watch(s.deploy_id, "app", OBJECT, all()).await;
    // Fails four times, echoing a token, then takes it.
    s.deploy.reply_with(503);
    s.deploy
        .reply_body(b"echo: Authorization: Bearer producer-secret-token");
    let change = s.db.emit(OBJECT, "push", json!({"ref": "main"})).await;
    let id = delivery_of(&s.db, change).await;
    s.deploy.wait_for(4, LONG).await;
    s.deploy.reply_with(200);
    s.db.wait_state(id, "delivered", LONG).await;

    let shown = s.get_json(&format!("/api/v1/deliveries/{id}")).await;
    assert_eq!(shown["id"], id);
    assert_eq!(shown["state"], "delivered");
    let received = s.deploy.received();
    let last = received.last().unwrap();
    assert_eq!(
        shown["body"], last.body,
        "the body is the one the consumer received last"
    );
    let attempts = shown["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        2,
        "the failures folded into one row: {shown}"
    );
    let folded = &attempts[0];
    assert_eq!(folded["attempt"], 1);
    assert!(folded["repeats"].as_i64().unwrap() >= 4, "{folded}");
    assert_eq!(
        folded["last_attempt"].as_i64().unwrap(),
        folded["repeats"].as_i64().unwrap()
    );
    assert_eq!(folded["status"], 503);
    assert!(folded["statuses"]["503"].as_i64().unwrap() >= 4);
    assert_eq!(attempts[1]["status"], 200);
    let text = shown.to_string();
    assert!(!text.contains(PRODUCER_TOKEN), "token masked: {text}");
}

#[tokio::test]
async fn redeliver_sends_a_delivered_delivery_again_under_its_id_and_refuses_older_news() {
    let s = Setup::start().await;
    s.db.add_watch(s.deploy_id, "app", OBJECT, all()).await;
    let first = delivery_of(&s.db, s.db.emit(OBJECT, "push", json!({"n": 1})).await).await;
    s.db.wait_state(first, "delivered", LONG).await;
    let path = format!("/api/v1/deliveries/{first}/redeliver");

    let resp = s.call(Method::POST, &path, &s.deploy_token).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["delivery_id"], first);
    assert_eq!(body["previous_state"], "delivered");
    let again = s.deploy.wait_for(2, LONG).await;
    assert_eq!(again[1].headers["webhook-id"], first.to_string().as_str());
    assert_eq!(again[1].body["delivery_id"], first);
    s.db.wait_state(first, "delivered", LONG).await;
    let shown = s.get_json(&format!("/api/v1/deliveries/{first}")).await;
    let attempts: Vec<&Value> = shown["attempts"].as_array().unwrap().iter().collect();
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a["attempt"].as_i64(), a["status"].as_i64()))
            .collect::<Vec<_>>(),
        vec![(Some(1), Some(200)), (Some(2), Some(200))],
        "both attempts are kept (issue 34: the first one was lost)"
    );
    // The first delivery's event stays in the history, as after an
    // operator's retry: delivered, the redelivery, delivered again.
    let events: Vec<String> = sqlx::query_scalar(
        "select event from watchpump.delivery_history where delivery_id = $1 order by at, seq",
    )
    .bind(first)
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    let delivered = events.iter().filter(|e| *e == "delivered").count();
    assert_eq!(delivered, 2, "{events:?}");

    // Newer news of the object was sent: the older one is 409, and stays.
    let second = delivery_of(&s.db, s.db.emit(OBJECT, "push", json!({"n": 2})).await).await;
    s.db.wait_state(second, "delivered", LONG).await;
    let resp = s.call(Method::POST, &path, &s.deploy_token).await;
    assert_eq!(
        error_of(resp).await,
        (StatusCode::CONFLICT, "conflict".into())
    );
    assert_eq!(s.db.delivery_state(first).await, "delivered");
    assert_eq!(s.deploy.count(), 3, "nothing more was sent");

    // Unknown and non-integer ids are 404.
    for bad in ["999999", "x"] {
        let resp = s
            .call(
                Method::POST,
                &format!("/api/v1/deliveries/{bad}/redeliver"),
                &s.deploy_token,
            )
            .await;
        assert_eq!(error_of(resp).await.0, StatusCode::NOT_FOUND, "{bad}");
    }
}

#[tokio::test]
async fn a_ping_is_a_signed_delivery_of_its_own_kind_listed_with_its_answer() {
    let s = Setup::start().await;
    let watch = s.db.add_watch(s.deploy_id, "app", OBJECT, all()).await;
    // Real news waiting for the watch is not superseded by a ping.
    s.deploy.reply_with(503);
    let news = delivery_of(&s.db, s.db.emit(OBJECT, "push", json!({})).await).await;
    s.deploy.wait_for(1, LONG).await;
    s.deploy.reply_with(200);

    let path = format!("/api/v1/watches/{}/ping", watch.id);
    let resp = s.call(Method::POST, &path, &s.deploy_token).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body: Value = resp.json().await.unwrap();
    let ping = body["delivery_id"].as_i64().expect("delivery_id");
    s.db.wait_state(ping, "delivered", LONG).await;
    s.db.wait_state(news, "delivered", LONG).await;

    let received = s.deploy.received();
    let sent = received
        .iter()
        .find(|r| r.body["delivery_id"] == ping)
        .expect("the ping arrived");
    assert_eq!(sent.body["kind"], "watchpump.ping");
    assert_eq!(sent.body["watch_id"], watch.id);
    assert_eq!(sent.body["payload"]["watch_id"], watch.id);
    let secret = SigningSecret::parse(&s.deploy_secret).unwrap();
    let header = |name: &str| sent.headers[name].to_str().unwrap().to_string();
    signing::verify(
        &[&secret],
        &header("webhook-id"),
        &header("webhook-timestamp"),
        &header("webhook-signature"),
        &sent.raw,
        chrono::Utc::now().timestamp(),
        signing::DEFAULT_TOLERANCE_SECS,
    )
    .expect("the ping is signed like any delivery");

    let listed = s
        .get_json(&format!("/api/v1/deliveries?watch_id={}&limit=1", watch.id))
        .await;
    let entry = &listed["deliveries"][0];
    assert_eq!(entry["id"], ping);
    assert_eq!(entry["kind"], "watchpump.ping");
    assert_eq!(entry["last_status"], 200);

    // Another ping at once is 429; another service's watch and a removed
    // watch are 404; none of them makes a delivery.
    let count = s.db.count_state("delivered").await;
    let resp = s.call(Method::POST, &path, &s.deploy_token).await;
    assert_eq!(error_of(resp).await.0, StatusCode::TOO_MANY_REQUESTS);
    let resp = s.call(Method::POST, &path, &s.docs_token).await;
    assert_eq!(error_of(resp).await.0, StatusCode::NOT_FOUND);
    let resp = s
        .call(
            Method::DELETE,
            &format!("/api/v1/watches/{}", watch.id),
            &s.deploy_token,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = s.call(Method::POST, &path, &s.deploy_token).await;
    assert_eq!(error_of(resp).await.0, StatusCode::NOT_FOUND);
    let queued: i64 = sqlx::query_scalar("select count(*) from watchpump.queue")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(queued, 0);
    assert_eq!(s.db.count_state("delivered").await, count);
}

/// `watchpump ARGS...` on the test's database: (exit code, stdout, stderr).
fn cli(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    let out = watchpump_cli(Some(&db.url)).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_lists_shows_and_retries_deliveries_and_refuses_bad_input() {
    let db = TestDb::new().await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let (_consumer, failed) = failed_delivery(&db, "deploy", OBJECT, json!({"n": 1})).await;
    pump.stop().await.unwrap();

    let (code, out, err) = cli(
        &db,
        &["deliveries", "list", "--service", "deploy", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let page: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(page["deliveries"][0]["delivery_id"], failed);
    assert_eq!(page["deliveries"][0]["state"], "failed");
    // The next page starts after a delivery (--after, once --before).
    for cursor in ["--after", "--before"] {
        let listed = |after: i64| {
            let (code, out, err) = cli(
                &db,
                &["deliveries", "list", "--json", cursor, &after.to_string()],
            );
            assert_eq!(code, 0, "{err}");
            serde_json::from_str::<Value>(&out).unwrap()["deliveries"]
                .as_array()
                .unwrap()
                .len()
        };
        assert_eq!(listed(failed + 1), 1, "{cursor}");
        assert_eq!(listed(failed), 0, "{cursor}: nothing after the only one");
    }
    let (code, out, _) = cli(&db, &["deliveries", "list", "--state", "failed"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .nth(1)
            .unwrap()
            .starts_with(&format!("{failed}\tdeploy\t")),
        "{out}"
    );

    let (code, out, err) = cli(&db, &["deliveries", "show", &failed.to_string(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["delivery"]["delivery_id"], failed);
    assert!(!shown["attempts"].as_array().unwrap().is_empty());

    let (code, out, err) = cli(&db, &["deliveries", "retry", &failed.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("was failed"), "{out}");
    assert_eq!(db.delivery_state(failed).await, "pending");

    // Bad input: a message, a non-zero exit, nothing changed.
    for args in [
        &["deliveries", "show", "999999"][..],
        &["deliveries", "retry", "999999"],
        &["deliveries", "retry", &failed.to_string()],
        &["deliveries", "list", "--state", "lost"],
        &["deliveries", "show", "x"],
    ] {
        let (code, _, err) = cli(&db, args);
        assert_ne!(code, 0, "{args:?}");
        assert!(!err.trim().is_empty(), "{args:?} says why");
    }
    assert_eq!(db.delivery_state(failed).await, "pending");
}
