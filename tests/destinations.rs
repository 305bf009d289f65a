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

/// Issue 17: the production default refuses this host, private networks
/// and the IPv6 forms that embed a metadata address, at registration,
/// whatever the spelling; loopback is accepted only when listed.
#[tokio::test]
async fn internal_and_embedded_base_urls_are_refused_at_add_unless_listed() {
    let db = TestDb::new().await;
    for url in [
        "http://127.0.0.1:9",
        "http://127.1.2.3:9",
        "http://localhost:9",
        "http://LocalHost.:9",
        "http://0.0.0.0:9",
        "http://[::]:9",
        "http://[::1]:9",
        "http://[::ffff:127.0.0.1]:9",
        "http://10.0.0.1",
        "http://172.16.0.1",
        "http://192.168.0.1",
        "http://100.64.0.1",
        "http://[fc00::1]",
        "http://[fd00::1]",
        "http://[64:ff9b::a9fe:a9fe]",
        "http://[64:ff9b:1::a9fe:a9fe]",
        "http://[2002:a9fe:a9fe::1]",
        "http://[::a9fe:a9fe]",
        "http://[::ffff:a9fe:a9fe]",
    ] {
        let err = watchpump::services::add(&db.pool, "internal", url)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("destination not allowed"), "{url}: {err}");
    }
    assert_eq!(service_count(&db).await, 0);

    // The CLI without a list: exit 2, the reason, nothing written.
    let out = watchpump_cli(Some(&db.url))
        .env_remove("WATCHPUMP_ALLOWED_DESTINATIONS")
        .args([
            "services",
            "add",
            "local",
            "--base-url",
            "http://localhost:9",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("destination not allowed"), "{stderr}");
    assert_eq!(service_count(&db).await, 0);

    // Listed, loopback is accepted (and the metadata forms still are not).
    let loopback = Destinations::loopback();
    for (name, url) in [
        ("v4", "http://127.0.0.1:9"),
        ("v6", "http://[::1]:9"),
        ("named", "http://localhost:9"),
    ] {
        watchpump::services::add_within(&db.pool, name, url, &loopback)
            .await
            .unwrap();
    }
    assert!(
        watchpump::services::add_within(&db.pool, "meta", "http://[::a9fe:a9fe]", &loopback)
            .await
            .is_err()
    );
    assert_eq!(service_count(&db).await, 3);
}

/// At send time, on what a name resolves to now (a lookup injected so that
/// names resolve to the refused forms without any of them being connected
/// to) and on the address connected to: every refused form is a connect
/// error on the attempt, and only the consumer on loopback, once loopback
/// is listed, is sent anything.
#[tokio::test]
async fn every_refused_form_is_a_connect_error_at_send_time() {
    use std::net::IpAddr;
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let port = consumer.addr.port();
    let resolved: Vec<(&str, &str)> = vec![
        ("localhost", "127.0.0.1"),
        ("nat64.test", "64:ff9b::a9fe:a9fe"),
        ("nat64-local.test", "64:ff9b:1::a9fe:a9fe"),
        ("sixtofour.test", "2002:a9fe:a9fe::1"),
        ("compatible.test", "::a9fe:a9fe"),
        ("mapped.test", "::ffff:169.254.169.254"),
        ("metadata.test", "169.254.169.254"),
        ("private.test", "10.0.0.1"),
        ("private16.test", "192.168.1.1"),
        ("cgnat.test", "100.64.0.1"),
        ("ula.test", "fc00::1"),
        ("unspecified.test", "0.0.0.0"),
        ("unspecified6.test", "::"),
        ("loopback6.test", "::1"),
    ];
    // Registered while a list allowed them; the pump then runs with the
    // production default.
    let names: Vec<&str> = resolved.iter().map(|(n, _)| *n).collect();
    let permissive: Destinations = format!("127.0.0.0/8, 0.0.0.0, {}", names.join(", "))
        .parse()
        .unwrap();
    let mut urls: Vec<String> = names.iter().map(|n| format!("http://{n}:{port}")).collect();
    urls.push(consumer.base_url());
    urls.push(format!("http://0.0.0.0:{port}"));
    urls.push(format!("http://[::ffff:127.0.0.1]:{port}"));
    let mut ids = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let s = watchpump::services::add_within(&db.pool, &format!("s{i}"), url, &permissive)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        db.add_watch(s.service.id, "app", "acme/", all()).await;
        ids.push(s.service.id);
    }
    db.emit("acme/web", "push", json!({})).await;
    let table: std::collections::HashMap<String, IpAddr> = resolved
        .iter()
        .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
        .collect();
    let lookup = watchpump::destinations::Lookup::new(move |name: String| {
        let found = table.get(&name).copied();
        async move {
            found
                .map(|ip| vec![ip])
                .ok_or_else(|| std::io::Error::other(format!("no test address for {name}")))
        }
    });
    let mut cfg = pump_config();
    cfg.allowed_destinations = None;
    cfg.lookup_with = Some(lookup.clone());
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
    for (id, url) in ids.iter().zip(&urls) {
        eventually(WAIT, "an attempt is recorded", || async {
            !errors(*id).await.is_empty()
        })
        .await;
        let error = errors(*id).await.remove(0).unwrap_or_default();
        assert!(error.contains("destination not allowed"), "{url}: {error}");
    }
    pump.stop().await.unwrap();
    assert_eq!(consumer.count(), 0, "a refused destination was sent to");

    // Loopback listed: the consumer on 127.0.0.1 gets its delivery.
    let mut cfg = pump_config();
    cfg.lookup_with = Some(lookup);
    let pump = RunningPump::start(&db.pool, cfg);
    consumer.wait_for(1, WAIT).await;
    pump.stop().await.unwrap();
}

/// Issue 17 item 6: a proxy would resolve and connect past the destination
/// checks, so the pump uses none, whatever its environment says. A `serve`
/// child with every proxy variable pointing at a loopback listener
/// delivers straight to the consumer; the "proxy" is never connected to.
#[tokio::test]
async fn the_pump_ignores_proxy_variables() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let proxied = Arc::new(AtomicUsize::new(0));
    let counted = proxied.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = proxy.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    let mut cmd = watchpump_cli(Some(&db.url));
    cmd.arg("serve")
        .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", PRODUCER)
        .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env(var, &proxy_url);
    }
    let _child = KillOnDrop(cmd.spawn().unwrap());
    db.emit("acme/web", "push", json!({})).await;
    consumer.wait_for(1, WAIT).await;
    assert_eq!(proxied.load(Ordering::SeqCst), 0, "the proxy was used");
}

/// A list of host names alone: the resolver accepts what a listed name
/// resolves to (private or loopback included), and the check on the
/// address connected to lets those addresses through too (before, it
/// refused every address, since none was in a listed network). An address
/// found for a listed name is then accepted as a literal too: the
/// operator listed the host it belongs to.
#[tokio::test]
async fn a_listed_host_name_is_delivered_to_whatever_private_address_it_resolves_to() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let port = consumer.addr.port();
    let names: Destinations = "hooks.test".parse().unwrap();
    let by_name = watchpump::services::add_within(
        &db.pool,
        "named",
        &format!("http://hooks.test:{port}"),
        &names,
    )
    .await
    .unwrap();
    db.add_watch(by_name.service.id, "app", "acme/", all())
        .await;
    db.emit("acme/web", "push", json!({})).await;
    let lookup = watchpump::destinations::Lookup::new(|name: String| async move {
        match name.as_str() {
            "hooks.test" => Ok(vec!["127.0.0.1".parse().unwrap()]),
            _ => Err(std::io::Error::other("unknown")),
        }
    });
    let mut cfg = pump_config();
    cfg.allowed_destinations = Some(names);
    cfg.lookup_with = Some(lookup);
    let pump = RunningPump::start(&db.pool, cfg);
    consumer.wait_for(1, WAIT).await;
    pump.stop().await.unwrap();
    assert_eq!(consumer.count(), 1);
}
