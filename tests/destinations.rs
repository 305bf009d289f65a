//! Where deliveries may go (issue 9, `WATCHPUMP_ALLOWED_DESTINATIONS`):
//! link-local and cloud metadata base URLs are refused when a service is
//! registered or moved, through the library, the CLI and the admin API,
//! without contacting them; and at send time a destination outside the
//! list is a connect error on the attempt, whether the base URL holds an
//! address or a name. Only loopback is ever connected to.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use watchpump::destinations::Destinations;

const WAIT: Duration = Duration::from_secs(30);

async fn service_count(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from watchpump.services")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn link_local_and_metadata_base_urls_are_refused_at_add_and_set_url() {
    let db = TestDb::new().await;
    for url in [
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]:8080",
        "http://100.100.100.200",
        "http://[fd00:ec2::254]",
        "http://[::ffff:169.254.169.254]",
    ] {
        let err = watchpump::services::add(&db.pool, "meta", url)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("destination not allowed"), "{url}: {err}");
    }
    assert_eq!(service_count(&db).await, 0);

    // The CLI: exit 2, the reason on stderr, nothing written.
    let out = watchpump_cli(Some(&db.url))
        .args([
            "services",
            "add",
            "meta",
            "--base-url",
            "http://169.254.169.254",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("link-local or a cloud metadata"),
        "{stderr}"
    );
    assert_eq!(service_count(&db).await, 0);

    // The admin API: 422, and set-url leaves the old URL.
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(server.url("/api/v1/admin/services"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "meta", "base_url": "http://[fd00:ec2::254]/"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    db.add_service("deploy", "http://127.0.0.1:9").await;
    let resp = http
        .put(server.url("/api/v1/admin/services/deploy/url"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"base_url": "http://100.100.100.200"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let url: String = sqlx::query_scalar("select base_url from watchpump.services")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(url, "http://127.0.0.1:9");

    // Named explicitly, it is accepted (and never sent to: no watch).
    let allowed: Destinations = "169.254.169.254".parse().unwrap();
    watchpump::services::add_within(&db.pool, "meta", "http://169.254.169.254", &allowed)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_allow_list_refuses_other_destinations_at_add() {
    let db = TestDb::new().await;
    let out = watchpump_cli(Some(&db.url))
        .args([
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:9",
        ])
        .env(
            "WATCHPUMP_ALLOWED_DESTINATIONS",
            "127.0.0.2, hooks.internal",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not in WATCHPUMP_ALLOWED_DESTINATIONS"),
        "{stderr}"
    );
    let allowed: Destinations = "127.0.0.2, hooks.internal".parse().unwrap();
    for url in ["http://127.0.0.2:9", "http://hooks.internal:8080"] {
        let name = if url.contains("hooks") {
            "hooks"
        } else {
            "local"
        };
        watchpump::services::add_within(&db.pool, name, url, &allowed)
            .await
            .unwrap();
    }
    assert_eq!(service_count(&db).await, 2);
}

#[tokio::test]
async fn a_destination_outside_the_list_is_a_connect_error_at_send_time() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let port = consumer.addr.port();
    // Registered without a list; the pump then runs with one that excludes
    // them: by address (the connection is dropped before a byte is sent)
    // and by name (the resolver finds nothing allowed).
    let (by_address, _) = db.add_service("by-address", &consumer.base_url()).await;
    let (by_name, _) = db
        .add_service("by-name", &format!("http://localhost:{port}"))
        .await;
    for service in [&by_address, &by_name] {
        db.add_watch(service.id, "app", "acme/", all()).await;
    }
    db.emit("acme/web", "push", json!({})).await;
    let mut cfg = pump_config();
    cfg.allowed_destinations = Some("127.0.0.2".parse().unwrap());
    let pump = RunningPump::start(&db.pool, cfg);
    let errors = |service: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<String>>(
                "select a.error from watchpump.attempts a
                 join watchpump.deliveries d on d.id = a.delivery_id
                 join watchpump.watches w on w.id = d.watch_id
                 where w.service_id = $1",
            )
            .bind(service)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    for service in [&by_address, &by_name] {
        eventually(WAIT, "an attempt is recorded", || async {
            !errors(service.id).await.is_empty()
        })
        .await;
        let error = errors(service.id).await.remove(0).unwrap_or_default();
        println!("{}: {error}", service.name);
        assert!(error.contains("destination not allowed"), "{error}");
    }
    pump.stop().await.unwrap();
    assert_eq!(consumer.count(), 0, "a refused destination was sent to");
}
