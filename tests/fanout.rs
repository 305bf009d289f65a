//! The fan-out budget (issue 17, `src/watches/fanout.rs`), through the real
//! watches API: one service's watches on one object, and every service's
//! watches that can cover one object, are refused at their bound with a
//! 422 that gives the figures; two creates at the bound can not both pass.
//! The watches below the bound are staged in SQL (thousands of them); the
//! one at the bound is created through the API.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use watchpump::watches::fanout::{
    FILTER_UNIT_WEIGHT, MAX_UNITS_PER_OBJECT, MAX_WATCHES_PER_OBJECT,
};

const OBJECT: &str = "acme/web/refs/heads/main";
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl WatchesApi {
    async fn post(&self, token: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(self.url("/api/v1/watches"))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

/// `n` live unfiltered watches of `service` on `object`, straight into the
/// table.
async fn stage(db: &TestDb, service: i64, object: &str, n: i64) {
    sqlx::query(
        "insert into watchpump.watches (service_id, resource, object)
         select $1, 'staged-' || g, $2 from generate_series(1, $3) g",
    )
    .bind(service)
    .bind(object)
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn live_watches(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from watchpump.watches where removed_at is null")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

fn message(body: &Value) -> String {
    body.to_string()
}

#[tokio::test]
async fn one_service_holds_at_most_its_cap_of_watches_on_one_object() {
    let api = WatchesApi::start().await;
    stage(&api.db, api.deploy.id, OBJECT, MAX_WATCHES_PER_OBJECT - 1).await;
    let (status, _) = api
        .post(
            &api.deploy_token,
            json!({"resource": "last", "object": OBJECT}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = api
        .post(
            &api.deploy_token,
            json!({"resource": "one-more", "object": OBJECT}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let text = message(&body);
    assert!(
        text.contains(&format!("at most {MAX_WATCHES_PER_OBJECT} live watches"))
            && text.contains(&format!("holds {MAX_WATCHES_PER_OBJECT} on {OBJECT}")),
        "{text}"
    );
    // Registering an existing one again still answers with it; another
    // object and another service are not concerned.
    let (status, _) = api
        .post(
            &api.deploy_token,
            json!({"resource": "last", "object": OBJECT}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api
        .post(
            &api.deploy_token,
            json!({"resource": "x", "object": "acme/web/refs/heads/dev"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = api
        .post(&api.docs_token, json!({"resource": "x", "object": OBJECT}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(live_watches(&api.db).await, MAX_WATCHES_PER_OBJECT + 2);
}

/// Services enough to stage `units` unfiltered watches on `object`, within
/// the per-service cap.
async fn fill(api: &WatchesApi, object: &str, units: i64) {
    let mut left = units;
    let mut i = 0;
    let tag = object.replace('/', "-");
    while left > 0 {
        let n = left.min(MAX_WATCHES_PER_OBJECT);
        let (s, _) = api
            .db
            .add_service(&format!("filler{tag}{i}"), "http://127.0.0.1:9")
            .await;
        stage(&api.db, s.id, object, n).await;
        left -= n;
        i += 1;
    }
}

#[tokio::test]
async fn every_services_watches_covering_one_object_share_one_budget() {
    let api = WatchesApi::start().await;
    let budget = MAX_UNITS_PER_OBJECT as i64;
    // Spread over the object and its prefixes: all of them cover it.
    fill(&api, "acme/", budget / 2).await;
    fill(&api, OBJECT, budget / 2 - 1).await;

    // A filtered watch would pass the budget; an unfiltered one fits, the
    // last unit.
    let filtered = json!({"resource": "f", "object": OBJECT,
                          "filters": {"match": "$.forced == true"}});
    let (status, body) = api.post(&api.deploy_token, filtered).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let text = message(&body);
    let adds = 1 + FILTER_UNIT_WEIGHT;
    assert!(
        text.contains(&format!("already cost {} units", budget - 1))
            && text.contains(&format!("this one adds {adds}"))
            && text.contains(&format!("at most {MAX_UNITS_PER_OBJECT}")),
        "{text}"
    );
    let (status, _) = api
        .post(
            &api.deploy_token,
            json!({"resource": "u", "object": OBJECT}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);

    // Full: on the object, on a prefix of it, and on a prefix above an
    // object under it (the worst object is named); an object beside it and
    // another top segment are not concerned.
    for object in [OBJECT, "acme/web/", "acme/"] {
        let (status, body) = api
            .post(&api.docs_token, json!({"resource": "d", "object": object}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{object}: {body}");
        assert!(
            message(&body).contains(&format!("already cost {budget} units")),
            "{body}"
        );
    }
    let (status, body) = api
        .post(&api.docs_token, json!({"resource": "d", "object": "acme/"}))
        .await;
    assert!(
        message(&body).contains(&format!("covering {OBJECT} (under acme/)")),
        "{status} {body}"
    );
    for object in ["acme/web/refs/heads/dev", "other/web/refs/heads/main"] {
        // The dev branch is covered by the watches on acme/ alone.
        let (status, body) = api
            .post(&api.docs_token, json!({"resource": "d", "object": object}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{object}: {body}");
    }

    // What emit() does at the budget: one row per unit.
    let change = api.db.emit(OBJECT, "push", json!({})).await;
    let rows: i64 = sqlx::query_scalar("select count(*) from watchpump.queue where change_id = $1")
        .bind(change)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(rows, budget);
}

/// The race made deterministic: a create that reaches the check while
/// another create on the same top segment holds the lock waits for it, and
/// then sees the unit the other one took (without the lock it would not
/// wait, and both would pass).
#[tokio::test]
async fn a_create_waits_for_a_concurrent_one_and_sees_the_unit_it_took() {
    let api = WatchesApi::start().await;
    fill(&api, OBJECT, MAX_UNITS_PER_OBJECT as i64 - 1).await;
    // The other create, by hand: the lock of the top segment `acme/`, then
    // the last unit, not yet committed.
    let mut other = api.db.pool.begin().await.unwrap();
    sqlx::query(
        "select pg_advisory_xact_lock(hashtextextended('watchpump.fanout:' || 'acme/', 0))",
    )
    .execute(&mut *other)
    .await
    .unwrap();
    sqlx::query(
        "insert into watchpump.watches (service_id, resource, object) values ($1, 'other', $2)",
    )
    .bind(api.docs.id)
    .bind(OBJECT)
    .execute(&mut *other)
    .await
    .unwrap();
    let (http, url, token) = (
        api.http.clone(),
        api.url("/api/v1/watches"),
        api.deploy_token.clone(),
    );
    let create = tokio::spawn(async move {
        let resp = http
            .post(url)
            .bearer_auth(token)
            .json(&json!({"resource": "late", "object": "acme/web/"}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json::<Value>().await.unwrap_or(Value::Null))
    });
    eventually(WAIT, "the create waits for the lock", || async {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_locks where locktype = 'advisory' and not granted",
        )
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
        waiting == 1
    })
    .await;
    other.commit().await.unwrap();
    let (status, body) = create.await.unwrap();
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        message(&body).contains(&format!("already cost {MAX_UNITS_PER_OBJECT} units")),
        "{body}"
    );
}

#[tokio::test]
async fn two_creates_at_the_last_unit_can_not_both_pass() {
    let api = WatchesApi::start().await;
    fill(&api, OBJECT, MAX_UNITS_PER_OBJECT as i64 - 1).await;
    // Two services, so that the service's own row lock does not serialise
    // them; one on the object, one on a prefix of it.
    let (a, b) = tokio::join!(
        api.post(
            &api.deploy_token,
            json!({"resource": "a", "object": OBJECT})
        ),
        api.post(
            &api.docs_token,
            json!({"resource": "b", "object": "acme/web/"})
        ),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::CREATED, StatusCode::UNPROCESSABLE_ENTITY],
        "{} / {}",
        a.1,
        b.1
    );
    assert_eq!(live_watches(&api.db).await, MAX_UNITS_PER_OBJECT as i64);
}
