//! The watches API (`/api/v1/watches`), served for real on loopback and
//! called with reqwest, against a real PostgreSQL: what each call returns,
//! and what it leaves in the database.

mod common;

use common::*;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use watchpump::api::BODY_LIMIT;

/// The calls these tests make.
impl WatchesApi {
    /// A request with `Authorization: Bearer <token>`.
    fn call(&self, method: Method, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(token)
    }

    /// Sends a request without a body with `Authorization: Bearer <token>`.
    async fn send(&self, method: Method, path: &str, token: &str) -> reqwest::Response {
        self.call(method, path, token).send().await.unwrap()
    }

    /// `/api/v1/watches/{id}` as the `deploy` service.
    async fn deploy_watch(&self, method: Method, id: i64) -> reqwest::Response {
        let path = format!("/api/v1/watches/{id}");
        self.send(method, &path, &self.deploy_token).await
    }

    async fn create(&self, token: &str, body: Value) -> reqwest::Response {
        self.call(Method::POST, "/api/v1/watches", token)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn get_json(&self, token: &str, path: &str) -> Value {
        let resp = self.send(Method::GET, path, token).await;
        assert_eq!(resp.status(), StatusCode::OK, "GET {path}");
        resp.json().await.unwrap()
    }

    async fn count_watches(&self) -> i64 {
        sqlx::query_scalar("select count(*) from watchpump.watches")
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }
}

/// Asserts the status and the error body `{"error": {"code", "message"}}`;
/// returns the message.
async fn expect_error(resp: reqwest::Response, status: StatusCode, code: &str) -> String {
    let got = resp.status();
    let content_type = resp
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    assert_eq!(got, status, "status; body: {text}");
    assert_eq!(
        content_type.as_deref(),
        Some("application/json"),
        "error bodies are JSON; body: {text}"
    );
    let body: Value = serde_json::from_str(&text).expect("the error body is JSON");
    let error = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("no error object: {text}"));
    assert_eq!(body.as_object().unwrap().len(), 1, "only `error`: {text}");
    assert_eq!(error.len(), 2, "error has code and message: {text}");
    assert_eq!(error["code"], code, "error code; body: {text}");
    let message = error["message"].as_str().expect("message is a string");
    assert!(!message.trim().is_empty(), "the message says something");
    message.to_string()
}

fn ids(page: &Value) -> Vec<i64> {
    page["watches"]
        .as_array()
        .expect("watches is an array")
        .iter()
        .map(|w| w["id"].as_i64().unwrap())
        .collect()
}

async fn deliveries_of_watch(db: &TestDb, watch_id: i64) -> Vec<(i64, String)> {
    sqlx::query_as("select id, state from watchpump.deliveries where watch_id = $1 order by id")
        .bind(watch_id)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn create_returns_201_with_the_watch_and_the_identical_watch_again_returns_200_and_the_same_id(
) {
    let api = WatchesApi::start().await;
    let body = json!({
        "resource": "app-7",
        "object": "acme/web/refs/heads/main",
        "filters": {"kinds": ["push"], "match": "$.forced == false"},
    });

    let resp = api.create(&api.deploy_token, body.clone()).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
    let created: Value = resp.json().await.unwrap();
    let id = created["id"].as_i64().expect("an integer id");
    assert_eq!(created["resource"], "app-7");
    assert_eq!(created["object"], "acme/web/refs/heads/main");
    assert_eq!(
        created["filters"],
        json!({"kinds": ["push"], "match": "$.forced == false"})
    );
    assert!(created["created_at"]
        .as_str()
        .unwrap()
        .parse::<chrono::DateTime<chrono::Utc>>()
        .is_ok());
    assert_eq!(created["removed_at"], Value::Null);
    assert_eq!(created["removed_reason"], Value::Null);

    // The row belongs to the caller, with the filters in their parsed form.
    let (service_id, kinds, match_path): (i64, Option<Vec<String>>, Option<String>) =
        sqlx::query_as(
            "select service_id, kinds, match_path::text from watchpump.watches where id = $1",
        )
        .bind(id)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(service_id, api.deploy.id);
    assert_eq!(kinds, Some(vec!["push".to_string()]));
    assert_eq!(match_path.as_deref(), Some("($.\"forced\" == false)"));

    // The identical watch again: 200, the same watch, no new row.
    let resp = api.create(&api.deploy_token, body.clone()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let again: Value = resp.json().await.unwrap();
    assert_eq!(again, created);
    assert_eq!(api.count_watches().await, 1);

    // Differing in anything, or registered by another service, is another watch.
    let mut other_resource = body.clone();
    other_resource["resource"] = json!("app-8");
    let resp = api.create(&api.deploy_token, other_resource).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let other: Value = resp.json().await.unwrap();
    assert_ne!(other["id"], created["id"]);

    let resp = api.create(&api.docs_token, body.clone()).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let theirs: Value = resp.json().await.unwrap();
    assert_ne!(theirs["id"], created["id"]);
    assert_eq!(api.count_watches().await, 3);

    // Leaving filters out is the same as sending empty filters.
    let resp = api
        .create(
            &api.deploy_token,
            json!({"resource": "r", "object": "acme/"}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let bare: Value = resp.json().await.unwrap();
    assert_eq!(bare["filters"], json!({}));
    let resp = api
        .create(
            &api.deploy_token,
            json!({"resource": "r", "object": "acme/", "filters": {}}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let same: Value = resp.json().await.unwrap();
    assert_eq!(same["id"], bare["id"]);
}

#[tokio::test]
async fn list_shows_only_the_callers_own_watches_paginated_and_removed_ones_on_request() {
    let api = WatchesApi::start().await;
    // Interleaved ids, so that another service's watches sit between ours.
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..5 {
        let w = api
            .db
            .add_watch(api.deploy.id, &format!("app-{i}"), "acme/web/", all())
            .await;
        mine.push(w.id);
        let w = api
            .db
            .add_watch(api.docs.id, &format!("site-{i}"), "acme/web/", all())
            .await;
        theirs.push(w.id);
    }
    let removed = mine[1];
    assert!(
        watchpump::watches::remove(&api.db.pool, api.deploy.id, removed, "test")
            .await
            .unwrap()
    );
    let theirs_removed = theirs[2];
    watchpump::watches::remove(&api.db.pool, api.docs.id, theirs_removed, "test")
        .await
        .unwrap();
    let live: Vec<i64> = mine.iter().copied().filter(|&id| id != removed).collect();

    let page = api.get_json(&api.deploy_token, "/api/v1/watches").await;
    assert_eq!(ids(&page), live, "only the caller's live watches, by id");
    assert_eq!(page["next_after"], Value::Null);
    for w in page["watches"].as_array().unwrap() {
        assert!(w["resource"].as_str().unwrap().starts_with("app-"));
        assert_eq!(w["removed_at"], Value::Null);
    }

    // Pages of 3: a full page points to the next one; the last says null.
    let first = api
        .get_json(&api.deploy_token, "/api/v1/watches?limit=3")
        .await;
    assert_eq!(ids(&first), live[..3]);
    assert_eq!(first["next_after"], live[2]);
    let second = api
        .get_json(
            &api.deploy_token,
            &format!("/api/v1/watches?limit=3&after={}", first["next_after"]),
        )
        .await;
    assert_eq!(ids(&second), live[3..]);
    assert_eq!(second["next_after"], Value::Null);

    // Pages of 2 over 4 watches: the second page is full and the last one,
    // so it has no cursor (no empty third page to fetch).
    let mut seen = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let page = api
            .get_json(
                &api.deploy_token,
                &format!("/api/v1/watches?limit=2&after={after}"),
            )
            .await;
        pages += 1;
        assert!(ids(&page).len() <= 2);
        seen.extend(ids(&page));
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
        assert!(pages < 10, "pagination ends");
    }
    assert_eq!(seen, live);
    assert_eq!(pages, 2);
    let last = api
        .get_json(
            &api.deploy_token,
            &format!("/api/v1/watches?limit=1&after={}", live[2]),
        )
        .await;
    assert_eq!(ids(&last), live[3..]);
    assert_eq!(last["next_after"], Value::Null, "nothing follows the last");

    // include_removed shows the removed one too, marked as removed.
    let all = api
        .get_json(&api.deploy_token, "/api/v1/watches?include_removed=true")
        .await;
    assert_eq!(ids(&all), mine);
    for w in all["watches"].as_array().unwrap() {
        let is_removed = w["id"] == removed;
        assert_eq!(!w["removed_at"].is_null(), is_removed, "{w}");
        assert_eq!(!w["removed_reason"].is_null(), is_removed, "{w}");
    }
    let paged = api
        .get_json(
            &api.deploy_token,
            &format!(
                "/api/v1/watches?include_removed=true&limit=1&after={}",
                mine[0]
            ),
        )
        .await;
    assert_eq!(ids(&paged), vec![removed]);
    assert_eq!(paged["next_after"], removed);

    // The other service sees only its own, removed included on request.
    let page = api.get_json(&api.docs_token, "/api/v1/watches").await;
    let theirs_live: Vec<i64> = theirs
        .iter()
        .copied()
        .filter(|&id| id != theirs_removed)
        .collect();
    assert_eq!(ids(&page), theirs_live);
    let page = api
        .get_json(&api.docs_token, "/api/v1/watches?include_removed=true")
        .await;
    assert_eq!(ids(&page), theirs);

    // A service with no watches gets an empty list, not someone else's.
    let (_, lonely) = api.db.add_service("lonely", "http://127.0.0.1:9").await;
    let page = api
        .get_json(&lonely, "/api/v1/watches?include_removed=true")
        .await;
    assert_eq!(page, json!({"watches": [], "next_after": null}));

    // Limits out of range are refused.
    for bad in ["limit=0", "limit=1001", "limit=x", "after=x", "colour=red"] {
        let resp = api
            .send(
                Method::GET,
                &format!("/api/v1/watches?{bad}"),
                &api.deploy_token,
            )
            .await;
        expect_error(resp, StatusCode::BAD_REQUEST, "bad_request").await;
    }
}

#[tokio::test]
async fn get_own_watch_is_200_and_another_services_is_404_like_a_nonexistent_id() {
    let api = WatchesApi::start().await;
    let mine = api
        .db
        .add_watch(
            api.deploy.id,
            "app-7",
            "acme/web/refs/heads/main",
            kinds(&["push"]),
        )
        .await;
    let theirs = api
        .db
        .add_watch(api.docs.id, "site", "acme/web/", all())
        .await;
    let nonexistent = theirs.id + 1000;

    let got = api
        .get_json(&api.deploy_token, &format!("/api/v1/watches/{}", mine.id))
        .await;
    assert_eq!(got, serde_json::to_value(&mine).unwrap());
    assert_eq!(got["filters"], json!({"kinds": ["push"]}));

    let before = api.db.snapshot().await;
    let other = api.deploy_watch(Method::GET, theirs.id).await;
    let other_headers = other.headers().clone();
    let other_message = expect_error(other, StatusCode::NOT_FOUND, "not_found").await;
    let none = api.deploy_watch(Method::GET, nonexistent).await;
    let none_headers = none.headers().clone();
    let none_message = expect_error(none, StatusCode::NOT_FOUND, "not_found").await;
    // Nothing but the id itself differs between the two answers.
    assert_eq!(
        other_message.replace(&theirs.id.to_string(), "ID"),
        none_message.replace(&nonexistent.to_string(), "ID"),
    );
    assert!(!other_message.contains("docs") && !other_message.contains("site"));
    let names = |h: &reqwest::header::HeaderMap| {
        let mut n: Vec<String> = h
            .keys()
            .filter(|k| *k != "date" && *k != "content-length")
            .map(|k| k.to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&other_headers), names(&none_headers));
    assert_eq!(api.db.snapshot().await, before);

    // The owner still sees it.
    let got = api
        .get_json(&api.docs_token, &format!("/api/v1/watches/{}", theirs.id))
        .await;
    assert_eq!(got["id"], theirs.id);
}

#[tokio::test]
async fn delete_own_watch_is_204_drops_its_pending_deliveries_and_shows_it_removed() {
    let api = WatchesApi::start().await;
    let db = &api.db;
    let doomed = db
        .add_watch(api.deploy.id, "app-7", "acme/web/", all())
        .await;
    let kept = db
        .add_watch(api.deploy.id, "app-8", "acme/web/", all())
        .await;
    let theirs = db.add_watch(api.docs.id, "site", "acme/web/", all()).await;
    // Two objects, so that neither delivery supersedes the other.
    db.emit("acme/web/a", "push", json!({})).await;
    db.emit("acme/web/b", "push", json!({})).await;
    let doomed_deliveries = deliveries_of_watch(db, doomed.id).await;
    assert_eq!(doomed_deliveries.len(), 2);
    // One of them was delivered already: it stays delivered.
    let delivered = doomed_deliveries[0].0;
    let pending = doomed_deliveries[1].0;
    set_state(db, &[delivered], "delivered", None).await;

    let resp = api.deploy_watch(Method::DELETE, doomed.id).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(resp.bytes().await.unwrap().is_empty());

    assert_eq!(db.delivery_state(pending).await, "dropped");
    assert_eq!(db.delivery_state(delivered).await, "delivered");
    let (finished, last_error): (bool, Option<String>) = sqlx::query_as(
        "select finished_at is not null, last_error from watchpump.deliveries where id = $1",
    )
    .bind(pending)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(finished, "a dropped delivery is finished");
    assert!(last_error.unwrap().contains("removed"));
    // Other watches' deliveries are untouched.
    for watch in [kept.id, theirs.id] {
        let states: Vec<String> = deliveries_of_watch(db, watch)
            .await
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        assert_eq!(states, ["pending", "pending"], "watch {watch}");
    }

    // Gone from the default list; shown removed with include_removed.
    let page = api.get_json(&api.deploy_token, "/api/v1/watches").await;
    assert_eq!(ids(&page), vec![kept.id]);
    let page = api
        .get_json(&api.deploy_token, "/api/v1/watches?include_removed=true")
        .await;
    assert_eq!(ids(&page), vec![doomed.id, kept.id]);
    let shown = &page["watches"][0];
    let removed_at: chrono::DateTime<chrono::Utc> =
        shown["removed_at"].as_str().unwrap().parse().unwrap();
    assert!(removed_at >= doomed.created_at);
    assert!(!shown["removed_reason"].as_str().unwrap().is_empty());
    let got = api
        .get_json(&api.deploy_token, &format!("/api/v1/watches/{}", doomed.id))
        .await;
    assert_eq!(&got, shown);

    // A removed watch matches nothing any more.
    let change = db.emit("acme/web/c", "push", json!({})).await;
    assert_eq!(
        watches_of_change(db, change).await,
        vec![kept.id, theirs.id]
    );

    // Deleting it again is harmless and changes nothing.
    let before = api.db.snapshot().await;
    let resp = api.deploy_watch(Method::DELETE, doomed.id).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(api.db.snapshot().await, before);
}

#[tokio::test]
async fn delete_of_another_services_watch_is_404_and_changes_nothing() {
    let api = WatchesApi::start().await;
    let theirs = api
        .db
        .add_watch(api.docs.id, "site", "acme/web/", all())
        .await;
    api.db.emit("acme/web/a", "push", json!({})).await;
    assert_eq!(api.db.count_state("pending").await, 1);
    let nonexistent = theirs.id + 1000;

    let before = api.db.snapshot().await;
    let resp = api.deploy_watch(Method::DELETE, theirs.id).await;
    let other_message = expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let resp = api.deploy_watch(Method::DELETE, nonexistent).await;
    let none_message = expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    assert_eq!(
        other_message.replace(&theirs.id.to_string(), "ID"),
        none_message.replace(&nonexistent.to_string(), "ID"),
    );
    assert_eq!(api.db.snapshot().await, before, "nothing changed");
    let (removed,): (bool,) =
        sqlx::query_as("select removed_at is not null from watchpump.watches where id = $1")
            .bind(theirs.id)
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
    assert!(!removed);
    assert_eq!(api.db.count_state("pending").await, 1);
}

#[tokio::test]
async fn requests_without_a_valid_service_token_are_401_and_change_nothing() {
    let api = WatchesApi::start().await;
    let theirs = api
        .db
        .add_watch(api.docs.id, "site", "acme/web/", all())
        .await;
    let deploy_secret = api.deploy_token.rsplit_once('_').unwrap().1.to_string();
    let docs_secret = api.docs_token.rsplit_once('_').unwrap().1.to_string();
    let mut wrong_secret = deploy_secret.clone().into_bytes();
    wrong_secret[0] = if wrong_secret[0] == b'0' { b'1' } else { b'0' };
    let wrong_secret = String::from_utf8(wrong_secret).unwrap();

    let bad_authorizations: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("empty bearer", Some("Bearer ".into())),
        ("wrong token", Some("Bearer not-a-token".into())),
        (
            "malformed: no id",
            Some(format!("Bearer wps__{deploy_secret}")),
        ),
        (
            "malformed: short secret",
            Some(format!("Bearer wps_{}_abc", api.deploy.id)),
        ),
        (
            "malformed: other prefix",
            Some(format!("Bearer xyz_{}_{deploy_secret}", api.deploy.id)),
        ),
        ("not bearer", Some(format!("Basic {}", api.deploy_token))),
        ("bare token", Some(api.deploy_token.clone())),
        (
            "real id, wrong secret",
            Some(format!("Bearer wps_{}_{wrong_secret}", api.deploy.id)),
        ),
        (
            "real id, another service's secret",
            Some(format!("Bearer wps_{}_{docs_secret}", api.deploy.id)),
        ),
        (
            "nonexistent id",
            Some(format!("Bearer wps_{}_{deploy_secret}", api.docs.id + 100)),
        ), // The real token in other spellings: one token has one spelling.
        (
            "real token, id with a leading zero",
            Some(format!("Bearer wps_0{}_{deploy_secret}", api.deploy.id)),
        ),
        (
            "real token, id with a plus sign",
            Some(format!("Bearer wps_+{}_{deploy_secret}", api.deploy.id)),
        ),
        (
            "real token, secret in capitals",
            Some(format!(
                "Bearer wps_{}_{}",
                api.deploy.id,
                deploy_secret.to_uppercase()
            )),
        ),
    ];
    let body = json!({"resource": "app", "object": "acme/web/"});
    let requests: Vec<(Method, String)> = vec![
        (Method::POST, "/api/v1/watches".into()),
        (Method::GET, "/api/v1/watches".into()),
        (Method::GET, format!("/api/v1/watches/{}", theirs.id)),
        (Method::DELETE, format!("/api/v1/watches/{}", theirs.id)),
    ];

    let before = api.db.snapshot().await;
    let watches_before = api.count_watches().await;
    for (what, authorization) in &bad_authorizations {
        for (method, path) in &requests {
            let mut req = api.http.request(method.clone(), api.url(path));
            if let Some(value) = authorization {
                req = req.header(AUTHORIZATION, value);
            }
            if *method == Method::POST {
                req = req.json(&body);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(
                resp.headers().get(WWW_AUTHENTICATE).map(|v| v.as_bytes()),
                Some(&b"Bearer"[..]),
                "{what}: {method} {path}"
            );
            let message = expect_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;
            assert!(message.contains("Bearer"), "{what}: {message}");
        }
    }
    assert_eq!(api.count_watches().await, watches_before);
    assert_eq!(api.db.snapshot().await, before, "nothing changed");

    // The right token works, so the failures above were the tokens'.
    let resp = api.create(&api.deploy_token, body).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

/// What is wrong, Content-Type, body, expected status, error code, and a
/// word the message must contain.
type BodyCase = (
    &'static str,
    Option<&'static str>,
    String,
    StatusCode,
    &'static str,
    &'static str,
);

#[tokio::test]
async fn invalid_bodies_are_refused_with_the_right_status_and_change_nothing() {
    let api = WatchesApi::start().await;
    // A watch to collide with, so that "nothing changed" means something.
    api.db
        .add_watch(api.deploy.id, "app", "acme/web/", all())
        .await;
    let json_ct = "application/json";
    let big = format!(
        r#"{{"resource": "app", "object": "acme/web/", "filters": {{"match": "$.a == \"{}\""}}}}"#,
        "x".repeat(BODY_LIMIT)
    );
    assert!(big.len() > 64 * 1024);
    #[rustfmt::skip]
    let cases: Vec<BodyCase> = vec![
        ("malformed JSON", Some(json_ct), r#"{"resource": "app", "object": "#.into(),
            StatusCode::BAD_REQUEST, "bad_request", ""),
        ("empty body", Some(json_ct), "".into(),
            StatusCode::BAD_REQUEST, "bad_request", ""),
        ("unknown field", Some(json_ct), r#"{"resource": "app", "object": "acme/", "colour": "red"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "colour"),
        ("unknown filter", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"kind": ["push"]}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "kind"),
        ("missing object", Some(json_ct), r#"{"resource": "app"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "object"),
        ("missing resource", Some(json_ct), r#"{"object": "acme/"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "resource"),
        ("empty JSON object", Some(json_ct), "{}".into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", ""),
        ("JSON array", Some(json_ct), "[]".into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", ""),
        ("wrong type", Some(json_ct), r#"{"resource": 7, "object": "acme/"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", ""),
        ("empty resource", Some(json_ct), r#"{"resource": "", "object": "acme/"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "resource"),
        ("empty object", Some(json_ct), r#"{"resource": "app", "object": ""}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "object"),
        ("object with spaces", Some(json_ct), r#"{"resource": "app", "object": "acme/web main"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "spaces"),
        ("resource with spaces", Some(json_ct), r#"{"resource": "my app", "object": "acme/"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "spaces"),
        ("object with a tab", Some(json_ct), r#"{"resource": "app", "object": "acme/\tweb"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "object"),
        ("object starting with /", Some(json_ct), r#"{"resource": "app", "object": "/acme/"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "object"),
        ("invalid jsonpath", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"match": "$.a ? ("}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "filters.match"),
        ("unsupported jsonpath flag", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"match": "$.a like_regex \"a\" flag \"x\""}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "filters.match"),
        ("jsonpath @ at the root", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"match": "@ == 1"}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "filters.match"),
        ("empty jsonpath", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"match": " "}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "filters.match"),
        ("empty kinds", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"kinds": []}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "kinds"),
        ("empty kind", Some(json_ct), r#"{"resource": "app", "object": "acme/", "filters": {"kinds": ["push", ""]}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY, "invalid", "kinds"),
        ("body over 64 KiB", Some(json_ct), big,
            StatusCode::PAYLOAD_TOO_LARGE, "too_large", ""),
        ("text/plain", Some("text/plain"), r#"{"resource": "app", "object": "acme/"}"#.into(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "JSON"),
        ("form", Some("application/x-www-form-urlencoded"), "resource=app&object=acme/".into(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "JSON"),
        ("no content-type", None, r#"{"resource": "app", "object": "acme/"}"#.into(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "JSON"),
    ];

    let before = api.db.snapshot().await;
    let watches_before = api.count_watches().await;
    for (what, content_type, body, status, code, says) in cases {
        let mut req = api.call(Method::POST, "/api/v1/watches", &api.deploy_token);
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        let resp = req.body(body).send().await.unwrap();
        let got = resp.status();
        assert_eq!(got, status, "{what}");
        let message = expect_error(resp, status, code).await;
        assert!(
            message.contains(says),
            "{what}: the message {message:?} should mention {says:?}"
        );
        assert_eq!(api.count_watches().await, watches_before, "{what}");
    }
    assert_eq!(api.db.snapshot().await, before, "nothing changed");

    // The same request, valid, is accepted: the failures were the bodies'.
    let resp = api
        .create(
            &api.deploy_token,
            json!({"resource": "app", "object": "acme/", "filters": {"match": "$.a ? (@ > 1)", "kinds": ["push"]}}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn bad_paths_unknown_routes_and_wrong_methods_answer_json_errors_and_change_nothing() {
    let api = WatchesApi::start().await;
    let mine = api
        .db
        .add_watch(api.deploy.id, "app", "acme/web/", all())
        .await;
    let before = api.db.snapshot().await;
    let t = &api.deploy_token;
    let cases: Vec<(Method, String, StatusCode, &str)> = vec![
        (
            Method::GET,
            "/api/v1/watches/abc".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/api/v1/watches/1.5".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/api/v1/watches/99999999999999999999".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::DELETE,
            "/api/v1/watches/abc".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/api/v1/nope".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (Method::GET, "/".into(), StatusCode::NOT_FOUND, "not_found"),
        (
            Method::DELETE,
            format!("/api/v1/watches/{}/extra", mine.id),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::PUT,
            "/api/v1/watches".into(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::DELETE,
            "/api/v1/watches".into(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::PATCH,
            format!("/api/v1/watches/{}", mine.id),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::POST,
            format!("/api/v1/watches/{}", mine.id),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::POST,
            "/healthz".into(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
    ];
    for (method, path, status, code) in cases {
        let resp = api
            .call(method.clone(), &path, t)
            .header(CONTENT_TYPE, "application/json")
            .body(r#"{"resource": "app", "object": "acme/"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{method} {path}");
        expect_error(resp, status, code).await;
    }
    assert_eq!(api.db.snapshot().await, before, "nothing changed");
}

#[tokio::test]
async fn a_watch_created_through_the_api_gets_deliveries_for_exactly_the_matching_changes() {
    let api = WatchesApi::start().await;
    let db = &api.db;
    let resp = api
        .create(
            &api.deploy_token,
            json!({
                "resource": "app-7",
                "object": "acme/web/",
                "filters": {"kinds": ["push", "force-push"], "match": "$.branch == \"main\""},
            }),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let pushes: i64 = resp.json::<Value>().await.unwrap()["id"].as_i64().unwrap();
    let resp = api
        .create(
            &api.docs_token,
            json!({
                "resource": "site",
                "object": "acme/",
                "filters": {"match": "$.paths[*] ? (@ starts with \"docs/\")"},
            }),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let docs: i64 = resp.json::<Value>().await.unwrap()["id"].as_i64().unwrap();

    let main = json!({"branch": "main", "paths": ["src/a.rs"]});
    let cases: Vec<(&str, &str, Value, Vec<i64>)> = vec![
        (
            "acme/web/refs/heads/main",
            "push",
            main.clone(),
            vec![pushes],
        ),
        (
            "acme/web/refs/heads/main",
            "force-push",
            main.clone(),
            vec![pushes],
        ),
        ("acme/web/refs/heads/main", "tag", main.clone(), vec![]),
        (
            "acme/web/refs/heads/dev",
            "push",
            json!({"branch": "dev", "paths": ["src/a.rs"]}),
            vec![],
        ),
        (
            "acme/web/refs/heads/main",
            "push",
            json!({"paths": ["src/a.rs"]}),
            vec![],
        ),
        ("acme/webx/refs/heads/main", "push", main.clone(), vec![]),
        ("acme/api/refs/heads/main", "push", main.clone(), vec![]),
        ("other/web/refs/heads/main", "push", main.clone(), vec![]),
        (
            "acme/web/refs/heads/main",
            "push",
            json!({"branch": "main", "paths": ["docs/x.md"]}),
            vec![pushes, docs],
        ),
        (
            "acme/api/refs/heads/dev",
            "tag",
            json!({"paths": ["docs/y.md"]}),
            vec![docs],
        ),
    ];
    for (object, kind, payload, expected) in cases {
        let change = db.emit(object, kind, payload.clone()).await;
        assert_eq!(
            watches_of_change(db, change).await,
            expected,
            "{kind} of {object} with {payload}"
        );
    }
    let (rows, services_ok): (i64, bool) = sqlx::query_as(
        "select count(*), bool_and(d.service_id = w.service_id and d.state in ('pending', 'superseded'))
         from watchpump.deliveries d join watchpump.watches w on w.id = d.watch_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows, 5);
    assert!(services_ok, "each delivery goes to its watch's service");
}

#[tokio::test]
async fn match_filters_that_would_make_emit_fail_are_refused_and_emit_keeps_working() {
    // emit() evaluates every matching watch's filter in the producer's own
    // transaction: a filter that raises an error there would fail the
    // producer's writes. These parse, but raise for some payloads.
    let api = WatchesApi::start().await;
    let object = "acme/web/refs/heads/main";
    let payload = json!({"a": "2020-01-01 10:00:00+02", "b": "2020-01-01", "v": 1});
    let refused = [
        "$x == 1",
        r#"$.v ? (@ == $"limit")"#,
        "exists($.a ? (@ == $min))",
        r#"$.a.datetime() < "2020-01-02".datetime()"#,
        r#"$.b.DateTime("xyz") == 1"#,
        "$.a.datetime() < $.b.datetime()",
    ];
    let before = api.db.snapshot().await;
    for path in refused {
        let resp = api
            .create(
                &api.deploy_token,
                json!({"resource": "app", "object": "acme/web/", "filters": {"match": path}}),
            )
            .await;
        let message = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
        assert!(message.starts_with("filters.match: "), "{path}: {message}");
    }
    assert_eq!(api.db.snapshot().await, before, "nothing changed");
    // Look-alikes in keys and strings are fine.
    let mut accepted = Vec::new();
    for path in [
        r#"$.a == "x$""#,
        r#"$.a == "$x""#,
        r#"$."$x" == 1"#,
        "$.datetime == 1",
        r#"$.a ? (@ == "a.datetime()")"#,
    ] {
        let resp = api
            .create(
                &api.deploy_token,
                json!({"resource": "app", "object": "acme/web/", "filters": {"match": path}}),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::CREATED, "{path}");
        accepted.push(resp.json::<Value>().await.unwrap()["id"].as_i64().unwrap());
    }
    let change = api.db.emit(object, "push", payload).await;
    assert_eq!(watches_of_change(&api.db, change).await, Vec::<i64>::new());
    let change = api.db.emit(object, "push", json!({"a": "x$"})).await;
    assert_eq!(watches_of_change(&api.db, change).await, vec![accepted[0]]);
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let api = WatchesApi::start().await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let resp = api
            .http
            .get(api.url("/api/v1/watches"))
            .header(AUTHORIZATION, format!("{scheme} {}", api.deploy_token))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{scheme}");
    }
}
