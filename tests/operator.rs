//! The operator's side against the real PostgreSQL and real HTTP: the SQL
//! views and functions, the admin API, the warning to notify with its
//! folding, pruning, and the one-at-a-time operator task.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use watchpump::operator::notify::WarningState;
use watchpump::operator::Worker;

const WAIT: Duration = Duration::from_secs(30);

/// service, pending, in_flight, due_now, failed_24h, has an oldest due age,
/// has a last delivery, looks_down.
type BacklogRow = (String, i64, i64, i64, i64, bool, bool, bool);

async fn sql_error(db: &TestDb, sql: &str) -> (String, String) {
    match sqlx::query(sql).execute(&db.pool).await {
        Err(sqlx::Error::Database(e)) => (e.code().unwrap().to_string(), e.message().to_string()),
        other => panic!("{sql}: expected a database error, got {other:?}"),
    }
}

async fn scalar<T>(db: &TestDb, sql: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

#[tokio::test]
async fn a_first_attempt_on_the_wire_does_not_make_a_healthy_service_look_down() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    let delivered = delivery_of(&db, db.emit("acme/a", "push", json!({})).await).await;
    set_state(&db, &[delivered], "delivered", None).await;
    // Newer than the last delivery, claimed, its first attempt under way.
    let sending = delivery_of(&db, db.emit("acme/b", "push", json!({})).await).await;
    set_state(&db, &[sending], "in_flight", None).await;

    let (in_flight, looks_down): (i64, bool) = sqlx::query_as(
        "select in_flight, looks_down from watchpump.backlog where service = 'deploy'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((in_flight, looks_down), (1, false));
}

#[tokio::test]
async fn the_views_show_backlog_log_watches_and_history_of_real_rows() {
    let db = TestDb::new().await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let ok = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &ok.base_url()).await;
    let live = db.add_watch(deploy.id, "app-7", "acme/web/", all()).await;
    let gone = db.add_watch(deploy.id, "app-8", "acme/old/", all()).await;
    watchpump::watches::remove(&db.pool, deploy.id, gone.id, "removed by the consumer")
        .await
        .unwrap();
    let delivered = db
        .emit("acme/web/refs/heads/main", "push", json!({"after": "1"}))
        .await;
    ok.wait_for(1, WAIT).await;
    let delivered = delivery_of(&db, delivered).await;
    db.wait_state(delivered, "delivered", WAIT).await;
    let (_docs, failed) = failed_delivery(&db, "docs", "acme/docs", json!({"n": 1})).await;
    pump.stop().await.unwrap();
    // With the pump stopped, a new change waits, due now.
    db.emit("acme/web/refs/heads/dev", "push", json!({})).await;

    let rows: Vec<BacklogRow> = sqlx::query_as(
        "select service, pending, in_flight, due_now, failed_24h, oldest_due_age is not null,
                last_delivered_at is not null, looks_down
         from watchpump.backlog order by service",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            ("deploy".into(), 1, 0, 1, 0, true, true, false),
            ("docs".into(), 0, 0, 0, 1, false, false, true),
        ]
    );

    let (service, state, attempts, status, kind, object, resource): (
        String,
        String,
        i32,
        Option<i32>,
        String,
        String,
        String,
    ) = sqlx::query_as(
        "select service, state, attempts, last_status, kind, object, resource
         from watchpump.delivery_log where delivery_id = $1",
    )
    .bind(failed)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (
            service.as_str(),
            state.as_str(),
            kind.as_str(),
            object.as_str()
        ),
        ("docs", "failed", "push", "acme/docs")
    );
    assert_eq!((status, resource.as_str()), (Some(500), "app-1"));
    assert!(attempts >= 1);

    let watches: Vec<(i64, String, bool, Option<String>)> = sqlx::query_as(
        "select watch_id, service, live, removed_reason from watchpump.watch_list
         where service = 'deploy' order by watch_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        watches,
        vec![
            (live.id, "deploy".into(), true, None),
            (
                gone.id,
                "deploy".into(),
                false,
                Some("removed by the consumer".into())
            ),
        ]
    );

    let events: Vec<String> = sqlx::query_scalar(
        "select event from watchpump.delivery_history where delivery_id = $1 order by at, seq",
    )
    .bind(failed)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(events.first().map(String::as_str), Some("created"));
    assert!(
        events.get(1).is_some_and(|e| e.starts_with("attempt 1")),
        "{events:?}"
    );
    assert_eq!(events.last().map(String::as_str), Some("failed"));
}

#[tokio::test]
async fn retry_from_sql_brings_a_failed_delivery_to_the_consumer_with_the_same_id() {
    let db = TestDb::new().await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let (consumer, id) = failed_delivery(&db, "deploy", "acme/web/main", json!({})).await;
    let before = consumer.count();
    consumer.reply_with(200);

    let previous: String = sqlx::query_scalar("select watchpump.retry($1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(previous, "failed");

    let got = consumer.wait_for(before + 1, WAIT).await;
    let last = got.last().unwrap();
    assert_eq!(last.body["delivery_id"], id);
    assert_eq!(last.headers["watchpump-delivery"], id.to_string());
    db.wait_state(id, "delivered", WAIT).await;
    pump.stop().await.unwrap();

    let fresh_deadline: bool = sqlx::query_scalar(
        "select deadline > now() + interval '23 hours' from watchpump.deliveries where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(fresh_deadline, "the retry gave a fresh deadline");
    let (actor, from_state): (String, String) =
        sqlx::query_as("select actor, from_state from watchpump.actions where delivery_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(actor.starts_with("sql:"), "{actor}");
    assert_eq!(from_state, "failed");
    let events: Vec<String> = sqlx::query_scalar(
        "select event from watchpump.delivery_history where delivery_id = $1 order by at, seq",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let retry_at = events
        .iter()
        .position(|e| e == "retry")
        .expect("retry recorded");
    assert!(events[retry_at + 1].starts_with("attempt "), "{events:?}");
    assert_eq!(events.last().unwrap(), "delivered", "{events:?}");
}

#[tokio::test]
async fn sql_functions_explain_unknown_ids_and_services_and_wrong_states() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/main", all()).await;
    let first = delivery_of(&db, db.emit("acme/web/main", "push", json!({})).await).await;
    let second = delivery_of(&db, db.emit("acme/web/main", "push", json!({})).await).await;
    // A pump's claim takes the newest and supersedes the older one.
    sqlx::query("select * from watchpump.claim('test', '{}', 10, '1 minute')")
        .execute(&db.pool)
        .await
        .unwrap();

    let (code, message) = sql_error(&db, "select watchpump.retry(987654)").await;
    assert_eq!(code, "P0002");
    assert!(message.contains("there is no delivery 987654"), "{message}");

    let (code, message) = sql_error(&db, &format!("select watchpump.retry({first})")).await;
    assert_eq!(code, "55000");
    assert!(
        message.contains(&format!("superseded by delivery {second}")),
        "{message}"
    );

    let (code, message) = sql_error(&db, &format!("select watchpump.retry({second})")).await;
    assert_eq!(code, "55000");
    assert!(message.contains("is in_flight"), "{message}");

    let (code, message) = sql_error(&db, "select watchpump.retry_failed('nope', now())").await;
    assert_eq!(code, "P0002");
    assert!(message.contains("there is no service 'nope'"), "{message}");

    let (code, _) = sql_error(&db, "select watchpump.retry_failed('deploy', null)").await;
    assert_eq!(code, "22004");
    let unchanged: i64 = scalar(&db, "select count(*) from watchpump.actions").await;
    assert_eq!(unchanged, 0, "a refused retry records nothing");
}

#[tokio::test]
async fn retry_failed_requeues_only_that_services_failures_since_the_time() {
    let db = TestDb::new().await;
    let (a, _) = db.add_service("a", "http://127.0.0.1:9").await;
    let (b, _) = db.add_service("b", "http://127.0.0.1:9").await;
    db.add_watch(a.id, "r", "acme/", all()).await;
    db.add_watch(b.id, "r", "acme/", all()).await;
    for i in 0..3 {
        db.emit(&format!("acme/o{i}"), "push", json!({})).await;
    }
    // a: o0 failed 2 hours ago, o1 and o2 10 minutes ago; b: all three now.
    let all = ids_where(&db, "true").await;
    set_state(&db, &all, "failed", None).await;
    sqlx::query(
        "update watchpump.settled d
         set last_error = 'HTTP 503',
             finished_at = now() - case when d.object = 'acme/o0' and d.service_id = $1
                                        then interval '2 hours' else interval '10 minutes' end",
    )
    .bind(a.id)
    .execute(&db.pool)
    .await
    .unwrap();

    let n: i32 = sqlx::query_scalar(
        "select watchpump.retry_failed('a', now() - interval '1 hour', 'runbook')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(n, 2);
    let states: Vec<(i64, String, String, bool)> = sqlx::query_as(
        "select service_id, object, state, next_attempt_at <= now()
         from watchpump.deliveries order by service_id, object",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        vec![
            (a.id, "acme/o0".into(), "failed".into(), true),
            (a.id, "acme/o1".into(), "pending".into(), true),
            (a.id, "acme/o2".into(), "pending".into(), true),
            (b.id, "acme/o0".into(), "failed".into(), true),
            (b.id, "acme/o1".into(), "failed".into(), true),
            (b.id, "acme/o2".into(), "failed".into(), true),
        ]
    );
    let actors: Vec<String> = sqlx::query_scalar("select actor from watchpump.actions order by id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(actors, vec!["runbook", "runbook"]);
}

async fn admin(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client.request(method, url).bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_admin_api_needs_the_token_lists_with_filters_and_pages_by_keyset() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let client = reqwest::Client::new();
    let (a, _) = db.add_service("a", "http://127.0.0.1:9").await;
    let (b, _) = db.add_service("b", "http://127.0.0.1:9").await;
    db.add_watch(a.id, "r", "acme/", all()).await;
    db.add_watch(b.id, "r", "acme/web/", all()).await;
    for i in 0..5 {
        db.emit(&format!("acme/web/b{i}"), "push", json!({})).await;
    }
    db.emit("acme/api/main", "push", json!({})).await;

    let url = server.url("/api/v1/admin/deliveries");
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let res = client.get(&url).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(res.status(), 401);

    let get = |q: &str| admin(&client, reqwest::Method::GET, format!("{url}{q}"), None);
    let (status, page) = get("?service=a&limit=4").await;
    assert_eq!(status, 200);
    let ids: Vec<i64> = page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["delivery_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    assert!(page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["service"] == "a"));
    let next = page["next_after"].as_i64().unwrap();
    assert_eq!(next, ids[3], "the cursor is the page's last delivery");
    let (_, rest) = get(&format!("?service=a&limit=4&after={next}")).await;
    assert_eq!(rest["deliveries"].as_array().unwrap().len(), 2);
    assert!(rest["next_after"].is_null());

    // The cursor's old name, deprecated, still pages as it did: a cursor
    // whenever the page is full, even when nothing follows.
    assert_eq!(page["next_before"], page["next_after"]);
    let (status, old) = get(&format!("?service=a&limit=4&before={next}")).await;
    assert_eq!(status, 200);
    assert_eq!(old["deliveries"], rest["deliveries"]);
    let (_, full_last) = get(&format!("?service=a&limit=2&after={next}")).await;
    assert!(full_last["next_after"].is_null(), "nothing follows");
    assert_eq!(
        full_last["next_before"], full_last["deliveries"][1]["delivery_id"],
        "the old cursor comes with a full page"
    );
    let (status, both) = get(&format!("?service=a&after={next}&before={next}")).await;
    assert_eq!(status, 422, "{both}");
    assert!(both["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not both"));

    let (status, unknown) = get("?service=nope").await;
    assert_eq!(status, 200);
    assert_eq!(unknown["deliveries"].as_array().unwrap().len(), 0);
    let (_, exact) = get("?object=acme/api/main").await;
    assert_eq!(exact["deliveries"].as_array().unwrap().len(), 1);
    let (_, prefix) = get("?object=acme/web/&service=b").await;
    assert_eq!(prefix["deliveries"].as_array().unwrap().len(), 5);
    let (_, pending) = get("?state=pending&since=2000-01-01T00:00:00Z").await;
    assert_eq!(pending["deliveries"].as_array().unwrap().len(), 11);
    let (_, none) = get("?until=2000-01-01T00:00:00Z").await;
    assert_eq!(none["deliveries"].as_array().unwrap().len(), 0);

    let (status, bad) = get("?state=lost").await;
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (422, Some("invalid"))
    );
    let (status, _) = get("?limit=0").await;
    assert_eq!(status, 422);
    let (status, bad) = get("?colour=red").await;
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );

    let one = ids[0];
    let (status, detail) = get(&format!("/{one}")).await;
    assert_eq!(status, 200);
    assert_eq!(detail["delivery"]["delivery_id"], one);
    assert_eq!(detail["history"][0]["event"], "created");
    let (status, missing) = get("/987654").await;
    assert_eq!(
        (status, missing["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, _) = get("/abc").await;
    assert_eq!(status, 404);
    let (status, attempts) = get(&format!("/{one}/attempts")).await;
    assert_eq!(
        (status, attempts["attempts"].as_array().unwrap().len()),
        (200, 0)
    );

    let (status, backlog) = admin(
        &client,
        reqwest::Method::GET,
        server.url("/api/v1/admin/backlog"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(backlog["services"][0]["service"], "a");
    assert_eq!(backlog["services"][0]["pending"], 6);
    let (status, watches) = admin(
        &client,
        reqwest::Method::GET,
        server.url("/api/v1/admin/watches?service=b"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(watches["watches"][0]["object"], "acme/web/");

    // Watches page as deliveries do: `after`, and a cursor only when more
    // follow (the deprecated `next_before` with every full page).
    let watches = |q: &str| {
        admin(
            &client,
            reqwest::Method::GET,
            server.url(&format!("/api/v1/admin/watches{q}")),
            None,
        )
    };
    let (_, first) = watches("?limit=1").await;
    let newest = first["watches"][0]["watch_id"].as_i64().unwrap();
    assert_eq!(first["next_after"], newest);
    let (_, last) = watches(&format!("?limit=1&after={newest}")).await;
    assert_eq!(last["watches"][0]["object"], "acme/");
    assert!(last["next_after"].is_null());
    assert_eq!(last["next_before"], last["watches"][0]["watch_id"]);
    let (status, _) = watches(&format!("?after={newest}&before={newest}")).await;
    assert_eq!(status, 422);
}

#[tokio::test]
async fn the_admin_api_reads_the_bearer_scheme_in_any_case_as_the_watches_api_does() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let res = reqwest::Client::new()
            .get(server.url("/api/v1/admin/backlog"))
            .header("authorization", format!("{scheme} {ADMIN_TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{scheme}");
    }
}

#[tokio::test]
async fn the_admin_api_is_off_without_a_token() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &watchpump::operator::OperatorConfig::new()).await;
    let res = reqwest::Client::new()
        .get(server.url("/api/v1/admin/backlog"))
        .bearer_auth("anything-at-all-really")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "disabled");
}

#[tokio::test]
async fn retry_from_the_admin_api_brings_a_failed_delivery_to_the_consumer() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let client = reqwest::Client::new();
    let pump = RunningPump::start(&db.pool, pump_config());
    let (consumer, id) = failed_delivery(&db, "deploy", "acme/web/main", json!({})).await;
    let before = consumer.count();
    consumer.reply_with(200);
    let post = |path: String, body: Option<Value>| {
        admin(&client, reqwest::Method::POST, server.url(&path), body)
    };

    let (status, body) = post(format!("/api/v1/admin/deliveries/{id}/retry"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["previous_state"], "failed");
    let got = consumer.wait_for(before + 1, WAIT).await;
    assert_eq!(got.last().unwrap().body["delivery_id"], id);
    db.wait_state(id, "delivered", WAIT).await;

    let (status, body) = post(format!("/api/v1/admin/deliveries/{id}/retry"), None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("conflict"))
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("is delivered"));
    let (status, _) = post("/api/v1/admin/deliveries/987654/retry".into(), None).await;
    assert_eq!(status, 404);

    let (status, body) = post(
        "/api/v1/admin/services/nope/retry-failed".into(),
        Some(json!({"since": "2026-01-01T00:00:00Z"})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, _) = post(
        "/api/v1/admin/services/deploy/retry-failed".into(),
        Some(json!({"since": "yesterday"})),
    )
    .await;
    assert_eq!(status, 422);

    // A second failure, recovered with "retry all failed since".
    consumer.reply_with(500);
    let change = emit_with_window(&db, "acme/web/main", "push", json!({}), "1 second").await;
    let second = delivery_of(&db, change).await;
    db.wait_state(second, "failed", WAIT).await;
    consumer.reply_with(200);
    let before = consumer.count();
    let (status, body) = post(
        "/api/v1/admin/services/deploy/retry-failed".into(),
        Some(json!({"since": "2000-01-01T00:00:00Z"})),
    )
    .await;
    assert_eq!(
        (status, body["requeued"].as_i64()),
        (200, Some(1)),
        "{body}"
    );
    let got = consumer.wait_for(before + 1, WAIT).await;
    assert_eq!(got.last().unwrap().body["delivery_id"], second);
    pump.stop().await.unwrap();
    let actors: Vec<String> = sqlx::query_scalar("select distinct actor from watchpump.actions")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(actors, vec!["admin-api"]);
}

fn worker(db: &TestDb, notify: Option<&Receiver>) -> Worker {
    let mut cfg = operator_config();
    cfg.notify_url = notify.map(|n| format!("{}/api/v1/events", n.base_url()));
    Worker::new(
        db.pool.clone(),
        cfg,
        &pump_config(),
        "http://panel.test/panel",
    )
    .unwrap()
}

#[tokio::test]
async fn five_hundred_failures_fold_into_one_warning_with_the_count() {
    let db = TestDb::new().await;
    let notify = Receiver::start().await;
    let consumer = Receiver::start().await;
    consumer.reply_with(503);
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "r", "acme/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let mut tx = db.pool.begin().await.unwrap();
    let before = set_window(&mut tx, "1 second").await;
    for i in 0..500 {
        watchpump::emit(&mut tx, &format!("acme/repo-{i}"), "push", &json!({}))
            .await
            .unwrap();
    }
    put_window_back(&mut tx, before).await;
    tx.commit().await.unwrap();
    eventually(Duration::from_secs(60), "500 deliveries failed", || async {
        db.count_state("failed").await == 500
    })
    .await;
    pump.stop().await.unwrap();

    let worker = worker(&db, Some(&notify));
    let step = worker.step().await.unwrap();
    assert_eq!(step.handed.len(), 1);
    let got = notify.wait_for(1, WAIT).await;
    assert_eq!(got.len(), 1, "one warning");
    let w = &got[0];
    assert_eq!(w.path, "/api/v1/events");
    assert_eq!(w.body["service"], "deploy");
    assert_eq!(w.body["failed"], 500);
    assert_eq!(w.body["producer"], "git");
    assert_eq!(w.body["link"], "http://panel.test/panel/services/deploy");
    assert_eq!(
        w.headers["authorization"],
        format!("Bearer {PRODUCER_TOKEN}")
    );
    assert!(w.headers.contains_key("idempotency-key"));

    // More failures inside the fold window raise nothing now: they are
    // counted into the next warning, held until the window has passed.
    for round in 0..2 {
        let more = if round == 0 { 30 } else { 20 };
        sqlx::query(
            "with c as (select watchpump.emit('acme/late-' || $1 || '-' || i, 'push') from generate_series(1, $2) i)
             select count(*) from c",
        )
        .bind(round)
        .bind(more)
        .execute(&db.pool)
        .await
        .unwrap();
        let pending = ids_where(&db, "state = 'pending'").await;
        set_state(&db, &pending, "failed", None).await;
        worker.step().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(notify.count(), 1, "still one warning within the window");
    let warnings: Vec<(String, i32, i32)> =
        sqlx::query_as("select state, failed, folded from watchpump.warnings order by id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        warnings,
        vec![("sent".into(), 500, 0), ("pending".into(), 50, 20)]
    );

    // Once the window has passed (moved here, not waited for), the held
    // warning goes out with what was folded.
    sqlx::query("update watchpump.warnings set send_after = now(), next_attempt_at = now() where state = 'pending'")
        .execute(&db.pool)
        .await
        .unwrap();
    worker.step().await.unwrap();
    let got = notify.wait_for(2, WAIT).await;
    assert_eq!(got[1].body["failed"], 50);
    assert_eq!(got[1].body["folded"], 20);
}

#[tokio::test]
async fn a_warning_is_stored_and_retried_until_notify_takes_it() {
    let db = TestDb::new().await;
    let notify = Receiver::start().await;
    notify.reply_with(503);
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "r", "acme/", all()).await;
    db.emit("acme/x", "push", json!({})).await;
    let all = ids_where(&db, "true").await;
    set_state(&db, &all, "failed", None).await;

    let worker = worker(&db, Some(&notify));
    worker.step().await.unwrap();
    let (state, attempts, status): (String, i32, Option<i32>) =
        sqlx::query_as("select state, attempts, last_status from watchpump.warnings")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), attempts, status),
        ("pending", 1, Some(503))
    );

    notify.reply_with(202);
    eventually(WAIT, "the warning is sent", || async {
        worker.step().await.unwrap();
        let state: String = scalar(&db, "select state from watchpump.warnings").await;
        state == "sent"
    })
    .await;
    let got = notify.received();
    let keys: Vec<_> = got
        .iter()
        .map(|r| r.headers["idempotency-key"].clone())
        .collect();
    assert!(
        keys.len() >= 2 && keys.iter().all(|k| *k == keys[0]),
        "{keys:?}"
    );
}

#[tokio::test]
async fn without_a_notify_url_the_warning_is_logged() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "r", "acme/", all()).await;
    db.emit("acme/x", "push", json!({})).await;
    let all = ids_where(&db, "true").await;
    set_state(&db, &all, "failed", None).await;
    let step = worker(&db, None).step().await.unwrap();
    assert_eq!(step.handed.len(), 1);
    assert_eq!(step.handed[0].state, WarningState::Logged);
}

#[tokio::test]
async fn pruning_removes_watches_removed_long_ago_and_keeps_recent_and_live_ones() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let long_gone = db.add_watch(svc.id, "a", "acme/a", all()).await.id;
    let recently_gone = db.add_watch(svc.id, "b", "acme/b", all()).await.id;
    let gone_with_queue = db.add_watch(svc.id, "c", "acme/c", all()).await.id;
    let live = db.add_watch(svc.id, "d", "acme/d", all()).await.id;
    // A delivery still queued for a watch removed long ago keeps the watch.
    db.emit("acme/c", "push", json!({})).await;
    for (id, days) in [(long_gone, 40), (recently_gone, 3), (gone_with_queue, 40)] {
        sqlx::query(
            "update watchpump.watches set removed_at = now() - make_interval(days => $2),
                    removed_reason = 'test' where id = $1",
        )
        .bind(id)
        .bind(days)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    let worker = Worker::new(
        db.pool.clone(),
        operator_config(),
        &pump_config(),
        "http://p/panel",
    )
    .unwrap();
    worker.prune().await.unwrap();

    let left: Vec<i64> = sqlx::query_scalar("select id from watchpump.watches order by id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        left,
        vec![recently_gone, gone_with_queue, live],
        "only the watch removed past both retentions, with nothing queued, goes"
    );
}

/// Issue 17 (LOW, create/delete churn kept about 20M removed watch rows a
/// day for 30 days): a removed watch on an exact object that had no change
/// while the watch was live can have had no delivery, so it goes after the
/// shorter retention; one whose object changed meanwhile, or a prefix
/// watch, waits for both retentions as before.
#[tokio::test]
async fn removed_watches_that_never_had_a_delivery_go_after_the_shorter_retention() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let churned = db.add_watch(svc.id, "a", "acme/churned", all()).await.id;
    let changed = db.add_watch(svc.id, "b", "acme/changed", all()).await.id;
    let prefix = db.add_watch(svc.id, "c", "acme/prefix/", all()).await.id;
    let recent = db.add_watch(svc.id, "d", "acme/recent", all()).await.id;
    db.emit("acme/changed", "push", json!({})).await;
    // The delivery is settled (and kept: it is younger than its retention).
    let ids = ids_where(&db, "object = 'acme/changed'").await;
    set_state(&db, &ids, "delivered", Some(1)).await;
    for (id, days) in [(churned, 8), (changed, 8), (prefix, 8), (recent, 3)] {
        sqlx::query(
            "update watchpump.watches set removed_at = now() - make_interval(days => $2),
                    created_at = now() - make_interval(days => $2 + 1),
                    removed_reason = 'test' where id = $1",
        )
        .bind(id)
        .bind(days)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    sqlx::query("update watchpump.changes set occurred_at = now() - interval '8 days 12 hours'")
        .execute(&db.pool)
        .await
        .unwrap();
    let worker = Worker::new(
        db.pool.clone(),
        operator_config(),
        &pump_config(),
        "http://p/panel",
    )
    .unwrap();
    worker.prune().await.unwrap();
    let left: Vec<i64> = sqlx::query_scalar("select id from watchpump.watches order by id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, vec![changed, prefix, recent]);
    // The kept delivery still shows with its watch.
    let shown: i64 = scalar(
        &db,
        "select count(*) from watchpump.deliveries where object = 'acme/changed'",
    )
    .await;
    assert_eq!(shown, 1);
}

#[tokio::test]
async fn pruning_removes_only_rows_past_retention_and_keeps_failed_ones() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "r", "acme/", all()).await;
    // name -> (state, finished days ago)
    let cases = [
        ("old-delivered", "delivered", Some(8)),
        ("new-delivered", "delivered", Some(6)),
        ("old-superseded", "superseded", Some(8)),
        ("old-dropped", "dropped", Some(9)),
        ("failed-8-days", "failed", Some(8)),
        ("failed-31-days", "failed", Some(31)),
        ("failed-31-days-retried", "failed", Some(31)),
        ("pending", "pending", None),
    ];
    for (name, _, _) in cases {
        db.emit(&format!("acme/{name}"), "push", json!({})).await;
    }
    db.emit("elsewhere/unwatched", "push", json!({})).await;
    for (name, state, days) in cases {
        let ids = ids_where(&db, &format!("object = 'acme/{name}'")).await;
        set_state(&db, &ids, state, days).await;
    }
    sqlx::query(
        "select watchpump.retry(id) from watchpump.deliveries where object = 'acme/failed-31-days-retried'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump)
         select id, 1, now() - interval '40 days', 1, 200, 'test' from watchpump.deliveries",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("update watchpump.changes set occurred_at = now() - interval '40 days'")
        .execute(&db.pool)
        .await
        .unwrap();

    let mut cfg = operator_config();
    cfg.prune_batch = 2;
    let worker = Worker::new(db.pool.clone(), cfg, &pump_config(), "http://p/panel").unwrap();
    let pruned = worker.prune().await.unwrap();
    assert_eq!(
        (pruned.deliveries, pruned.failed, pruned.changes),
        (3, 1, 5)
    );

    let left: Vec<String> =
        sqlx::query_scalar("select d.object from watchpump.deliveries d order by d.object")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        left,
        vec![
            "acme/failed-31-days-retried",
            "acme/failed-8-days",
            "acme/new-delivered",
            "acme/pending"
        ]
    );
    let orphans: i64 = scalar(
        &db,
        "select count(*) from watchpump.attempts a
         where not exists (select 1 from watchpump.deliveries d where d.id = a.delivery_id)",
    )
    .await;
    assert_eq!(orphans, 0);
    let attempts: i64 = scalar(&db, "select count(*) from watchpump.attempts").await;
    assert_eq!(attempts, 4, "the kept deliveries keep their attempts");
    let changes: Vec<String> =
        sqlx::query_scalar("select object from watchpump.changes order by object")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(changes, left, "changes go once no delivery needs them");
    assert_eq!(worker.prune().await.unwrap().deliveries, 0);
}

async fn lock_holder(db: &TestDb) -> Option<i32> {
    sqlx::query_scalar(
        // The operator task's lock (one bigint key: objsubid 1), not the
        // two-key ones prune() and claims take for a transaction.
        "select pid from pg_locks where locktype = 'advisory' and granted and objsubid = 1
         and database = (select oid from pg_database where datname = current_database())",
    )
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn one_pump_at_a_time_runs_the_operator_task_and_another_takes_over() {
    let db = TestDb::new().await;
    let notify = Receiver::start().await;
    let start = |db: &TestDb| {
        let mut cfg = operator_config();
        cfg.operator_interval_ms = 100;
        cfg.notify_url = Some(format!("{}/events", notify.base_url()));
        let w = Worker::new(db.pool.clone(), cfg, &pump_config(), "http://p/panel").unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(w.run(async move {
            let _ = stopped.await;
        }));
        (stop, task)
    };
    let (stop_a, task_a) = start(&db);
    eventually(WAIT, "the first worker takes the lock", || async {
        lock_holder(&db).await.is_some()
    })
    .await;
    let first = lock_holder(&db).await;
    let (stop_b, task_b) = start(&db);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lock_holder(&db).await, first, "the lock stays with one");

    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "r", "acme/", all()).await;
    db.emit("acme/x", "push", json!({})).await;
    let all = ids_where(&db, "true").await;
    set_state(&db, &all, "failed", None).await;
    notify.wait_for(1, WAIT).await;

    stop_a.send(()).unwrap();
    task_a.await.unwrap();
    eventually(WAIT, "the second worker takes over", || async {
        matches!(lock_holder(&db).await, Some(pid) if Some(pid) != first)
    })
    .await;
    stop_b.send(()).unwrap();
    task_b.await.unwrap();
    assert_eq!(notify.count(), 1, "the warning was sent once");
}

#[tokio::test]
async fn serve_wires_the_panel_the_admin_api_and_the_operator_task() {
    use clap::Parser;
    let db = TestDb::new().await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let cli = watchpump::cli::Cli::parse_from([
        "watchpump",
        "serve",
        "--listen",
        &listen,
        "--metrics-listen",
        "off",
        "--producer",
        PRODUCER,
        "--producer-token",
        PRODUCER_TOKEN,
        "--admin-token",
        ADMIN_TOKEN,
        "--operator-interval-ms",
        "100",
    ]);
    let watchpump::cli::Command::Serve(cfg) = cli.command else {
        unreachable!()
    };
    // serve() runs in this task, next to the checks: it is not spawned.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let checks = async {
        let client = reqwest::Client::new();
        let base = format!("http://{listen}");
        eventually(WAIT, "the panel answers", || async {
            matches!(client.get(format!("{base}/panel/login")).send().await, Ok(r) if r.status() == 200)
        })
        .await;
        let res = client
            .get(format!("{base}/api/v1/admin/backlog"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        eventually(WAIT, "the operator task holds its lock", || async {
            lock_holder(&db).await.is_some()
        })
        .await;
        stop.send(()).unwrap();
    };
    let served = watchpump::server::serve(&db.url, *cfg, async move {
        let _ = stopped.await;
    });
    let (served, ()) = tokio::join!(served, checks);
    served.unwrap();
}

/// Identical failures in a row are one row of watchpump.attempts; the panel
/// says which attempts and how many it stands for, not just the first.
#[tokio::test]
async fn the_panel_shows_folded_attempts_as_a_range_and_a_count() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let delivery = delivery_of(&db, db.emit("acme/web", "push", json!({})).await).await;
    sqlx::query(
        "insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump, repeats)
         values ($1, 1, now(), 1, 503, 'test', 1), ($1, 2, now(), 1, 500, 'test', 5)",
    )
    .bind(delivery)
    .execute(&db.pool)
    .await
    .unwrap();
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let page = server
        .panel_get(&format!("/panel/deliveries/{delivery}"))
        .await;
    assert!(page.contains("<td>#1</td>"), "{page}");
    assert!(page.contains("<td>#2-6 (5×)</td>"), "{page}");
}
