//! No secrets where they do not belong (issue 9): a consumer that echoes its
//! request back, `Authorization` header included, must not put the
//! producer's token into `watchpump.attempts`, the admin API or the panel.
//! Rows stored before masking existed are masked when shown.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use common::*;
use serde_json::{json, Value};
use watchpump::redact::MASK;

const WAIT: Duration = Duration::from_secs(30);

/// A consumer that answers 200 with what it was sent: the `Authorization`
/// header as a header line and as JSON, the token on its own, and some
/// other credentials a careless service might print.
async fn echo_consumer() -> SocketAddr {
    let app = axum::Router::new().route(
        "/{*path}",
        post(|headers: HeaderMap| async move {
            let authorization = headers["authorization"].to_str().unwrap().to_string();
            let token = authorization.trim_start_matches("Bearer ");
            format!(
                "authorization: {authorization}\r\n{}\r\nbare {token}; basic dXNlcjpwYXNzd29yZA== whsec_c2VjcmV0c2VjcmV0",
                json!({ "headers": { "Authorization": authorization } })
            )
        }),
    );
    serve(app).await
}

fn assert_masked(what: &str, text: &str) {
    for secret in [PRODUCER_TOKEN, "dXNlcjpwYXNzd29yZA==", "c2VjcmV0c2VjcmV0"] {
        assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
    }
    assert!(text.contains(MASK), "{what}: {text}");
}

/// One change delivered to `consumer` (service "echo", watching "acme/"):
/// its delivery id and the head of the answer as stored.
async fn deliver_one(db: &TestDb, consumer: SocketAddr) -> (i64, String) {
    let (service, _) = db.add_service("echo", &format!("http://{consumer}")).await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let change = db.emit("acme/web", "push", json!({})).await;
    let id = delivery_of(db, change).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.wait_state(id, "delivered", WAIT).await;
    pump.stop().await.unwrap();
    let head =
        sqlx::query_scalar("select response_head from watchpump.attempts where delivery_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    (id, head)
}

#[tokio::test]
async fn an_echoed_authorization_header_is_stored_and_shown_masked() {
    let db = TestDb::new().await;
    let (id, head) = deliver_one(&db, echo_consumer().await).await;
    assert_masked("the stored response_head", &head);
    assert!(
        head.contains(&format!("authorization: Bearer {MASK}")),
        "{head}"
    );
    assert!(head.contains(&format!("bare {MASK}")), "{head}");

    let server = AppServer::start(&db.pool, &operator_config()).await;
    let answer = server
        .admin_get(&format!("/api/v1/admin/deliveries/{id}"))
        .await;
    assert_masked("the admin API", &answer);
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["attempts"][0]["response_head"], json!(head));
}

#[tokio::test]
async fn rows_stored_before_masking_are_masked_in_the_admin_api_and_the_panel() {
    let db = TestDb::new().await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let (_, id) = failed_delivery(&db, "deploy", "acme/web", json!({})).await;
    pump.stop().await.unwrap();
    let leaked = format!(
        "HTTP 500: authorization: Bearer {PRODUCER_TOKEN}; basic dXNlcjpwYXNzd29yZA== whsec_c2VjcmV0c2VjcmV0"
    );
    // Where the failed delivery's attempts and last error are kept (the
    // `attempts` view reads both tables).
    for sql in [
        "update watchpump.attempt_log set response_head = $2, error = $2 where delivery_id = $1",
        "update watchpump.settled set last_error = $2, last_response_head = $2 where id = $1",
    ] {
        sqlx::query(sql)
            .bind(id)
            .bind(&leaked)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let server = AppServer::start(&db.pool, &operator_config()).await;
    for path in [
        format!("/api/v1/admin/deliveries/{id}"),
        format!("/api/v1/admin/deliveries/{id}/attempts"),
        "/api/v1/admin/deliveries?state=failed".to_string(),
    ] {
        assert_masked(&path, &server.admin_get(&path).await);
    }
    for path in [
        format!("/panel/deliveries/{id}"),
        "/panel/deliveries?state=failed".to_string(),
        "/panel".to_string(),
        "/panel/services/deploy".to_string(),
    ] {
        assert_masked(&path, &server.panel_get(&path).await);
    }
}

/// A consumer whose answer is longer than what is kept (512 bytes) and has
/// the producer's token, bare, where the cut falls: the kept head ends with
/// the token's first characters.
async fn long_echo_consumer() -> SocketAddr {
    let app = axum::Router::new().route(
        "/{*path}",
        post(|headers: HeaderMap| async move {
            let authorization = headers["authorization"].to_str().unwrap().to_string();
            let token = authorization.trim_start_matches("Bearer ").to_string();
            format!("{}{token} and more", "x".repeat(500))
        }),
    );
    serve(app).await
}

#[tokio::test]
async fn an_answer_cut_in_the_middle_of_a_token_is_stored_with_the_cut_end_masked() {
    let db = TestDb::new().await;
    let (_, head) = deliver_one(&db, long_echo_consumer().await).await;
    let kept = &PRODUCER_TOKEN[..12];
    assert!(!head.contains(kept), "the cut token shows {kept:?}: {head}");
    assert_eq!(head, format!("{}{MASK}", "x".repeat(500)));
}

/// Masking a token cut off at the end applies to answers that were cut,
/// not to what a producer or a consumer named: a payload or a name that
/// happens to end as a token begins is shown as it was sent.
#[tokio::test]
async fn a_payload_ending_as_a_token_begins_is_shown_as_sent() {
    let db = TestDb::new().await;
    let consumer = echo_consumer().await;
    let (service, service_token) = db.add_service("echo", &format!("http://{consumer}")).await;
    let resource = format!("web-{}", &PRODUCER_TOKEN[..8]);
    db.add_watch(service.id, &resource, "acme/", all()).await;
    let note = format!("signed by {}", &PRODUCER_TOKEN[..8]);
    let who = ADMIN_TOKEN[..9].to_string();
    let change = db
        .emit("acme/web", "push", json!({ "note": note, "who": who }))
        .await;
    let id = delivery_of(&db, change).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.wait_state(id, "delivered", WAIT).await;
    pump.stop().await.unwrap();

    let server = AppServer::start(&db.pool, &operator_config()).await;
    let admin: Value = serde_json::from_str(
        &server
            .admin_get(&format!("/api/v1/admin/deliveries/{id}"))
            .await,
    )
    .unwrap();
    assert_eq!(admin["delivery"]["resource"], json!(resource), "{admin}");
    let own = json_of(
        reqwest::Client::new()
            .get(server.url(&format!("/api/v1/deliveries/{id}")))
            .bearer_auth(&service_token),
    )
    .await;
    assert_eq!(own["body"]["payload"]["note"], json!(note), "{own}");
    assert_eq!(own["body"]["payload"]["who"], json!(who), "{own}");
    assert_eq!(own["body"]["resource"], json!(resource), "{own}");
    let page = server.panel_get(&format!("/panel/deliveries/{id}")).await;
    assert!(page.contains(&note), "the panel shows the note as sent");
}
