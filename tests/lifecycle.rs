//! Signed deliveries and the service lifecycle: every delivery carries
//! Standard Webhooks headers that verify with the service's own secret (and
//! with Python's reference library); secrets and tokens rotate with an
//! overlap; a service moves to a new URL; a removed service's token stops
//! working and its undelivered deliveries are dropped. Through the library,
//! the CLI and the admin API.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use watchpump::api::BODY_LIMIT;
use watchpump::signing::{self, SigningSecret};

const WAIT: Duration = Duration::from_secs(20);
const OBJECT: &str = "acme/web/refs/heads/main";

fn header(r: &Received, name: &str) -> String {
    r.headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_string()
}

/// Verifies a received request's signature with `secrets`, now.
fn verifies(r: &Received, secrets: &[&SigningSecret]) -> Result<(), signing::VerifyError> {
    signing::verify(
        secrets,
        &header(r, "webhook-id"),
        &header(r, "webhook-timestamp"),
        &header(r, "webhook-signature"),
        &r.raw,
        chrono::Utc::now().timestamp(),
        signing::DEFAULT_TOLERANCE_SECS,
    )
}

/// Python's standardwebhooks verifies a request exactly as received.
fn python_verifies(r: &Received, secret: &str) -> String {
    let python = std::env::var("STANDARDWEBHOOKS_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/py/bin/python").to_string()
    });
    let script = r#"
import json, sys
from standardwebhooks import Webhook
secret, headers = sys.argv[1], json.loads(sys.argv[2])
body = sys.stdin.buffer.read()
try:
    Webhook(secret).verify(body, headers)
    print("ok")
except Exception as e:
    print("rejected: %s" % e)
"#;
    let headers = json!({
        "webhook-id": header(r, "webhook-id"),
        "webhook-timestamp": header(r, "webhook-timestamp"),
        "webhook-signature": header(r, "webhook-signature"),
    });
    let mut child = Command::new(python)
        .args(["-c", script, secret, &headers.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("target/py/bin/python (make test installs standardwebhooks there)");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&r.raw).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn every_delivery_is_signed_with_the_services_own_secret() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let deploy = watchpump::services::add_within(
        &db.pool,
        "deploy",
        &consumer.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let other = watchpump::services::add_within(
        &db.pool,
        "other",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    db.add_watch(deploy.service.id, "app", OBJECT, all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.emit(OBJECT, "push", json!({"paths": ["src/ä.rs"], "n": 1}))
        .await;
    let got = consumer.wait_for(1, WAIT).await;
    pump.stop().await.unwrap();

    let r = &got[0];
    assert_eq!(header(r, "webhook-id"), r.body["delivery_id"].to_string());
    let mine = SigningSecret::parse(&deploy.signing_secret).unwrap();
    let theirs = SigningSecret::parse(&other.signing_secret).unwrap();
    assert_eq!(verifies(r, &[&mine]), Ok(()));
    assert_eq!(
        verifies(r, &[&theirs]),
        Err(signing::VerifyError::NoMatchingSignature),
        "another consumer's secret cannot verify it"
    );
    assert_eq!(python_verifies(r, &deploy.signing_secret), "ok");
    assert_ne!(python_verifies(r, &other.signing_secret), "ok");
    assert_eq!(
        header(r, "authorization"),
        format!("Bearer {PRODUCER_TOKEN}")
    );
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let deploy = watchpump::services::add_within(
        &db.pool,
        "deploy",
        &consumer.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    db.add_watch(deploy.service.id, "app", "acme/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let old = SigningSecret::parse(&deploy.signing_secret).unwrap();

    let new = watchpump::services::rotate_secret(&db.pool, "deploy", Duration::from_secs(2), false)
        .await
        .unwrap()
        .new;
    let new = SigningSecret::parse(&new).unwrap();
    db.emit("acme/a", "push", json!({})).await;
    let during = consumer.wait_for(1, WAIT).await.remove(0);
    assert_eq!(header(&during, "webhook-signature").split(' ').count(), 2);
    assert_eq!(
        verifies(&during, &[&old]),
        Ok(()),
        "the old secret still verifies"
    );
    assert_eq!(verifies(&during, &[&new]), Ok(()), "the new one does too");

    tokio::time::sleep(Duration::from_millis(2100)).await;
    db.emit("acme/b", "push", json!({})).await;
    let after = consumer.wait_for(2, WAIT).await.remove(1);
    pump.stop().await.unwrap();
    assert_eq!(header(&after, "webhook-signature").split(' ').count(), 1);
    assert_eq!(verifies(&after, &[&new]), Ok(()));
    assert!(verifies(&after, &[&old]).is_err(), "the overlap is over");
}

#[tokio::test]
async fn a_rotated_token_keeps_the_old_one_working_for_its_grace_only() {
    let db = TestDb::new().await;
    let deploy = watchpump::services::add_within(
        &db.pool,
        "deploy",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let new = watchpump::services::rotate_token(&db.pool, "deploy", Duration::from_secs(1), false)
        .await
        .unwrap()
        .new;
    let auth = |t: String| {
        let pool = db.pool.clone();
        async move {
            watchpump::services::authenticate(&pool, &t)
                .await
                .unwrap()
                .is_some()
        }
    };
    assert!(auth(new.clone()).await);
    assert!(
        auth(deploy.token.clone()).await,
        "the old token works during the grace"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(auth(new).await);
    assert!(!auth(deploy.token).await, "the old token works no more");
}

#[tokio::test]
async fn a_service_moved_to_a_new_url_gets_its_next_deliveries_there() {
    let db = TestDb::new().await;
    let (before, after) = (Receiver::start().await, Receiver::start().await);
    let (deploy, _) = db.add_service("deploy", &before.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.emit("acme/a", "push", json!({})).await;
    before.wait_for(1, WAIT).await;
    watchpump::services::set_url_within(
        &db.pool,
        "deploy",
        &after.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    db.emit("acme/b", "push", json!({})).await;
    after.wait_for(1, WAIT).await;
    pump.stop().await.unwrap();
    assert_eq!(before.count(), 1);
}

#[tokio::test]
async fn a_removed_service_loses_its_token_its_watches_and_its_waiting_deliveries() {
    let db = TestDb::new().await;
    let (deploy, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(deploy.id, "app", OBJECT, all()).await;
    let change = db.emit(OBJECT, "push", json!({})).await;
    let delivery = delivery_of(&db, change).await;

    let removal = watchpump::services::remove(&db.pool, "deploy", "test")
        .await
        .unwrap();
    assert_eq!((removal.watches, removal.deliveries), (1, 1));
    assert!(watchpump::services::authenticate(&db.pool, &token)
        .await
        .unwrap()
        .is_none());
    assert_eq!(db.delivery_state(delivery).await, "dropped");
    let (reason, error): (String, String) = sqlx::query_as(
        "select w.removed_reason, d.last_error from watchpump.watch_list w
         join watchpump.delivery_log d on d.watch_id = w.watch_id where w.watch_id = $1",
    )
    .bind(watch.id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(reason.contains("service deploy removed"), "{reason}");
    assert!(error.contains("service deploy removed"), "{error}");
    // The name is free again; the new service is another one.
    let again = watchpump::services::add_within(
        &db.pool,
        "deploy",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    assert_ne!(again.service.id, deploy.id);
}

fn cli(db: &TestDb, args: &[&str]) -> std::process::Output {
    watchpump_cli(Some(&db.url)).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[tokio::test]
async fn the_cli_runs_the_lifecycle_and_refuses_bad_input_changing_nothing() {
    let db = TestDb::new().await;
    let out = cli(
        &db,
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:9",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let added: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["name"], "deploy");
    assert!(added["token"].as_str().unwrap().starts_with("wps_"));
    assert!(added["signing_secret"]
        .as_str()
        .unwrap()
        .starts_with("whsec_"));

    let out = cli(
        &db,
        &["services", "rotate-secret", "deploy", "--overlap", "1h"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let secret = text(&out.stdout).lines().last().unwrap().to_string();
    assert!(secret.starts_with("whsec_") && secret != added["signing_secret"]);

    let out = cli(&db, &["services", "rotate-token", "deploy"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token = text(&out.stdout).lines().last().unwrap().to_string();
    assert!(watchpump::services::authenticate(&db.pool, &token)
        .await
        .unwrap()
        .is_some());

    let out = cli(
        &db,
        &["services", "set-url", "deploy", "http://127.0.0.1:10/x/"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("http://127.0.0.1:10/x"));

    // Bad input: a clear message, a non-zero exit, nothing changed.
    for (args, says) in [
        (
            vec!["services", "rotate-secret", "deploy", "--overlap", "soon"],
            "not a duration",
        ),
        (
            vec!["services", "rotate-token", "nobody"],
            "no service \"nobody\"",
        ),
        (
            vec!["services", "set-url", "deploy", "http://u:pw@127.0.0.1:9"],
            "credentials",
        ),
        (
            vec!["services", "add", "x", "--base-url", "http://u:pw@h"],
            "credentials",
        ),
        (vec!["services", "remove", "deploy"], "--yes"),
    ] {
        let out = cli(&db, &args);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            !text(&out.stderr).contains("pw"),
            "credentials never repeated"
        );
    }
    assert_eq!(
        watchpump::services::find(&db.pool, "deploy")
            .await
            .unwrap()
            .base_url,
        "http://127.0.0.1:10/x"
    );
    let listed = text(&cli(&db, &["services", "list"]).stdout);
    assert!(
        listed.starts_with("deploy\t") && !listed.contains("wps_") && !listed.contains("whsec_")
    );

    let out = cli(&db, &["services", "remove", "deploy", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("service deploy removed"));
    assert_eq!(text(&cli(&db, &["services", "list"]).stdout), "");
}

/// The secrets that sign for `name` now, as whsec_ text.
async fn signing_now(db: &TestDb, name: &str) -> Vec<String> {
    let id = watchpump::services::find(&db.pool, name).await.unwrap().id;
    let destination = watchpump::services::destination(&db.pool, id)
        .await
        .unwrap();
    destination
        .signing_at(chrono::Utc::now())
        .into_iter()
        .map(|s| s.to_whsec())
        .collect()
}

fn json_out(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn time_of(v: &Value) -> chrono::DateTime<chrono::Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// A second rotation within the overlap used to retire the original secret
/// (or token) at once, without a word: a consumer still on it got 401s. It
/// is refused, saying until when the overlap runs, unless forced; at most
/// two secrets sign at once either way. `--json` on every rotation.
#[tokio::test]
async fn a_rotation_during_the_overlap_is_refused_unless_forced() {
    let db = TestDb::new().await;
    let added = json_out(&cli(
        &db,
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:9",
            "--json",
        ],
    ));
    let first_secret = added["signing_secret"].as_str().unwrap().to_string();
    let first_token = added["token"].as_str().unwrap().to_string();

    let rotated = json_out(&cli(
        &db,
        &[
            "services",
            "rotate-secret",
            "deploy",
            "--overlap",
            "1h",
            "--json",
        ],
    ));
    assert_eq!(rotated["service"], "deploy");
    assert_eq!(rotated["retired_early"], Value::Null);
    let second_secret = rotated["signing_secret"].as_str().unwrap().to_string();
    let until = time_of(&rotated["previous_secret_signs_until"]);
    let left = until - chrono::Utc::now();
    assert!(left > chrono::TimeDelta::minutes(59) && left <= chrono::TimeDelta::hours(1));
    assert_eq!(
        signing_now(&db, "deploy").await,
        [second_secret.clone(), first_secret.clone()]
    );

    // Again within the hour: refused, saying why and until when; nothing
    // changes, and the first secret still signs.
    let again = cli(&db, &["services", "rotate-secret", "deploy", "--json"]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), "", "no JSON for a refusal");
    let said = text(&again.stderr);
    for says in [
        "service deploy is in the overlap of its last rotation: its previous signing secret still signs until",
        &until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "(in 59m",
        "a consumer still verifying with it would refuse every delivery (401)",
        "--force",
    ] {
        assert!(said.contains(says), "{says:?} in {said}");
    }
    assert_eq!(
        signing_now(&db, "deploy").await,
        [second_secret.clone(), first_secret.clone()]
    );

    // Forced: the first secret stops now, and says so; still two sign.
    let forced = cli(
        &db,
        &["services", "rotate-secret", "deploy", "--force", "--json"],
    );
    let warning = text(&forced.stderr);
    let forced = json_out(&forced);
    assert_eq!(time_of(&forced["retired_early"]), until);
    assert!(warning.contains("stopped now (--force)"), "{warning}");
    let third_secret = forced["signing_secret"].as_str().unwrap().to_string();
    assert_eq!(
        signing_now(&db, "deploy").await,
        [third_secret, second_secret]
    );

    // Tokens: the same rule for the grace.
    let token = json_out(&cli(
        &db,
        &[
            "services",
            "rotate-token",
            "deploy",
            "--grace",
            "1h",
            "--json",
        ],
    ));
    assert_eq!(token["retired_early"], Value::Null);
    let grace_until = time_of(&token["previous_token_works_until"]);
    let second_token = token["token"].as_str().unwrap().to_string();
    let again = cli(&db, &["services", "rotate-token", "deploy"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("its previous token still works until"),
        "{}",
        text(&again.stderr)
    );
    let works = |t: String| {
        let pool = db.pool.clone();
        async move {
            watchpump::services::authenticate(&pool, &t)
                .await
                .unwrap()
                .is_some()
        }
    };
    assert!(works(first_token.clone()).await, "still in its grace");
    let forced = json_out(&cli(
        &db,
        &[
            "services",
            "rotate-token",
            "deploy",
            "--force",
            "--grace",
            "0s",
            "--json",
        ],
    ));
    assert_eq!(time_of(&forced["retired_early"]), grace_until);
    assert!(!works(first_token).await, "retired by the forced rotation");
    assert!(!works(second_token).await, "no grace given");
    let third_token = forced["token"].as_str().unwrap().to_string();
    assert!(works(third_token).await);

    // Once the overlap is over, no force is needed (a grace of 0s is over
    // at once).
    let after = json_out(&cli(&db, &["services", "rotate-token", "deploy", "--json"]));
    assert_eq!(after["retired_early"], Value::Null);

    // The admin API: 409 with the same message, then forced.
    let app = AppServer::start(&db.pool, &operator_config()).await;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(app.url("/api/v1/admin/services/deploy/rotate-secret"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let r = post(json!({"overlap": "1h"})).await.unwrap();
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "conflict");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("still signs until"),
        "{body}"
    );
    let r = post(json!({"force": true})).await.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert!(body["retired_early"].is_string(), "{body}");
}

#[tokio::test]
async fn the_admin_api_runs_the_lifecycle_with_json_errors() {
    let db = TestDb::new().await;
    let app = AppServer::start(&db.pool, &operator_config()).await;
    let http = reqwest::Client::new();
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth(ADMIN_TOKEN);

    let r = admin(http.post(app.url("/api/v1/admin/services")))
        .json(&json!({"name": "deploy", "base_url": "http://127.0.0.1:9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let added: Value = r.json().await.unwrap();
    assert!(added["signing_secret"]
        .as_str()
        .unwrap()
        .starts_with("whsec_"));

    let r = admin(http.post(app.url("/api/v1/admin/services/deploy/rotate-secret")))
        .json(&json!({"overlap": "1h"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rotated: Value = r.json().await.unwrap();
    assert_ne!(rotated["signing_secret"], added["signing_secret"]);

    let r = admin(http.post(app.url("/api/v1/admin/services/deploy/rotate-token")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    for (request, status) in [
        (
            admin(http.put(app.url("/api/v1/admin/services/deploy/url")))
                .json(&json!({"base_url": "http://user:pw@127.0.0.1:9"})),
            422,
        ),
        (
            admin(http.post(app.url("/api/v1/admin/services/deploy/rotate-token")))
                .json(&json!({"overlap": "forever"})),
            422,
        ),
        (
            admin(http.delete(app.url("/api/v1/admin/services/nobody"))),
            404,
        ),
        (http.delete(app.url("/api/v1/admin/services/deploy")), 401),
        // The admin API's body limit holds on the service routes too.
        (
            admin(http.put(app.url("/api/v1/admin/services/deploy/url"))).json(
                &json!({"base_url": format!("http://127.0.0.1:9/{}", "x".repeat(BODY_LIMIT))}),
            ),
            413,
        ),
    ] {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), status);
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["message"].is_string(), "{body}");
    }
    assert_eq!(
        watchpump::services::find(&db.pool, "deploy")
            .await
            .unwrap()
            .base_url,
        "http://127.0.0.1:9",
        "nothing changed"
    );

    let r = admin(http.delete(app.url("/api/v1/admin/services/deploy")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let listed = json_of(admin(http.get(app.url("/api/v1/admin/services")))).await;
    assert_eq!(listed["services"], json!([]));
}

/// POSTs a panel form as the panel's own page would (session, Origin).
async fn panel_post(
    app: &AppServer,
    cookie: &str,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Response {
    panel_client()
        .post(app.url(path))
        .header("cookie", cookie)
        .header("origin", app.origin())
        .form(form)
        .send()
        .await
        .unwrap()
}

async fn base_url_of(db: &TestDb, name: &str) -> Option<String> {
    sqlx::query_scalar(
        "select base_url from watchpump.services where name = $1 and removed_at is null",
    )
    .bind(name)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_panel_rotates_a_token_and_shows_the_new_one_once() {
    let db = TestDb::new().await;
    let (_, old_token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let app = AppServer::start(&db.pool, &operator_config()).await;
    let cookie = app.log_in().await;
    let page = app.panel_get("/panel/services/deploy").await;
    assert!(
        page.contains("/panel/services/deploy/rotate-token"),
        "the service page offers it"
    );

    let res = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/rotate-token",
        &[("overlap", "1h")],
    )
    .await;

    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["cache-control"], "no-store");
    let page = res.text().await.unwrap();
    let start = page.find("wps_").expect("the new token is on the page");
    let new_token: String = page[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    assert_ne!(new_token, old_token);
    for token in [&new_token, &old_token] {
        let found = watchpump::services::authenticate(&db.pool, token)
            .await
            .unwrap();
        assert_eq!(
            found.map(|s| s.name).as_deref(),
            Some("deploy"),
            "both work during the grace"
        );
    }
}

#[tokio::test]
async fn the_panel_moves_and_removes_a_service_and_refuses_bad_input_changing_nothing() {
    let db = TestDb::new().await;
    let (service, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    let app = AppServer::start(&db.pool, &operator_config()).await;
    let cookie = app.log_in().await;

    let bad = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/url",
        &[("base_url", "ftp://x")],
    )
    .await;
    assert_eq!(bad.status(), 422);
    assert_eq!(
        base_url_of(&db, "deploy").await.as_deref(),
        Some("http://127.0.0.1:9")
    );
    let moved = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/url",
        &[("base_url", "http://127.0.0.1:7")],
    )
    .await;
    assert_eq!(moved.status(), 303);
    assert_eq!(
        moved.headers()["location"],
        "/panel/services/deploy?done=moved"
    );
    assert_eq!(
        base_url_of(&db, "deploy").await.as_deref(),
        Some("http://127.0.0.1:7")
    );

    let unconfirmed = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/remove",
        &[("confirm", "deplo")],
    )
    .await;
    assert_eq!(unconfirmed.status(), 422);
    assert!(base_url_of(&db, "deploy").await.is_some(), "not removed");
    let without_origin = panel_client()
        .post(app.url("/panel/services/deploy/remove"))
        .header("cookie", &cookie)
        .form(&[("confirm", "deploy")])
        .send()
        .await
        .unwrap();
    assert_eq!(without_origin.status(), 403);
    assert!(base_url_of(&db, "deploy").await.is_some(), "not removed");

    let removed = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/remove",
        &[("confirm", "deploy")],
    )
    .await;
    assert_eq!(removed.status(), 200);
    assert!(removed.text().await.unwrap().contains("1 watches removed"));
    assert!(base_url_of(&db, "deploy").await.is_none());
    assert!(watchpump::services::authenticate(&db.pool, &token)
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn the_panel_rotates_a_secret_with_the_default_overlap_and_refuses_a_bad_one() {
    let db = TestDb::new().await;
    db.add_service("deploy", "http://127.0.0.1:9").await;
    let app = AppServer::start(&db.pool, &operator_config()).await;
    let cookie = app.log_in().await;
    // As stored (sealed), opened with the tests' key.
    let secret = || async {
        let stored = sqlx::query_scalar::<_, String>(
            "select signing_secret from watchpump.services where name = 'deploy'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        watchpump::services::at_rest::SecretKeys::from_env()
            .unwrap()
            .open(&stored, "deploy's secret")
            .unwrap()
    };
    let before = secret().await;

    let bad = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/rotate-secret",
        &[("overlap", "soon")],
    )
    .await;
    assert_eq!(bad.status(), 422);
    assert_eq!(secret().await, before, "nothing rotated");

    let res = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/rotate-secret",
        &[("overlap", "")],
    )
    .await;
    assert_eq!(res.status(), 200);
    let after = secret().await;
    assert_ne!(after, before);
    assert!(
        res.text().await.unwrap().contains(&after),
        "the new secret is shown"
    );
    let hours: f64 = sqlx::query_scalar(
        "select (extract(epoch from previous_secret_until - now()) / 3600)::float8
         from watchpump.services where name = 'deploy'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        (23.0..=24.0).contains(&hours),
        "a blank overlap is the default 24 h: {hours}"
    );

    // Again during that overlap: a page that says until when, nothing
    // rotated; with the box ticked, rotated.
    let again = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/rotate-secret",
        &[("overlap", "")],
    )
    .await;
    assert_eq!(again.status(), 409);
    let page = again.text().await.unwrap();
    assert!(
        page.contains("previous signing secret still signs until"),
        "{page}"
    );
    assert_eq!(secret().await, after, "nothing rotated");
    let forced = panel_post(
        &app,
        &cookie,
        "/panel/services/deploy/rotate-secret",
        &[("overlap", ""), ("force", "yes")],
    )
    .await;
    assert_eq!(forced.status(), 200);
    assert_ne!(secret().await, after);
}
