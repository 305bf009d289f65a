//! The panel: its refusals over plain HTTP, its pages, and a retry in a real
//! headless Chromium driven over WebDriver (chromedriver), which also takes
//! the screenshot in target/panel.png (docs/panel.png with
//! WATCHPUMP_UPDATE_SCREENSHOT=1).

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::routing::get;
use common::*;
use serde_json::{json, Value};
use watchpump::redact::MASK;

const WAIT: Duration = Duration::from_secs(30);

async fn actions(db: &TestDb, id: i64) -> i64 {
    sqlx::query_scalar("select count(*) from watchpump.actions where delivery_id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_panel_changes_nothing_without_a_session_or_from_another_origin() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let (consumer, id) = failed_delivery(&db, "deploy", "acme/web/main", json!({})).await;
    let http = panel_client();

    let res = http.get(server.url("/panel")).send().await.unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()["location"], "/panel/login");

    let login = |token: &'static str, origin: Option<String>| {
        let mut req = http
            .post(server.url("/panel/login"))
            .form(&[("token", token)]);
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        req.send()
    };
    let res = login("not-the-admin-token", Some(server.origin()))
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    assert!(res.headers().get("set-cookie").is_none());
    let res = login(ADMIN_TOKEN, None).await.unwrap();
    assert_eq!(res.status(), 403, "a login without Origin is refused");
    let res = login(ADMIN_TOKEN, Some("http://evil.example".into()))
        .await
        .unwrap();
    assert_eq!(res.status(), 403, "a login from another origin is refused");

    let res = login(ADMIN_TOKEN, Some(server.origin())).await.unwrap();
    assert_eq!(res.status(), 303);
    let set_cookie = res.headers()["set-cookie"].to_str().unwrap().to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/panel"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let secret = cookie.split_once('=').unwrap().1;
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("select key_hash from watchpump.panel_sessions")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_ne!(hex::encode(&stored[0]), secret, "only a hash is stored");

    let retry = server.url(&format!("/panel/deliveries/{id}/retry"));
    let refused = [
        ("no session cookie", None, Some(server.origin()), None),
        (
            "another origin",
            Some(cookie.clone()),
            Some("http://evil.example".to_string()),
            None,
        ),
        (
            "another port on the same host",
            Some(cookie.clone()),
            Some("http://127.0.0.1:1".to_string()),
            None,
        ),
        ("no Origin or Referer", Some(cookie.clone()), None, None),
        (
            "a cross-site fetch",
            Some(cookie.clone()),
            Some(server.origin()),
            Some("cross-site"),
        ),
        (
            "a forged session",
            Some(format!("watchpump_session={}", "ab".repeat(32))),
            Some(server.origin()),
            None,
        ),
    ];
    for (why, cookie, origin, fetch_site) in refused {
        let mut req = http.post(&retry);
        if let Some(cookie) = cookie {
            req = req.header("cookie", cookie);
        }
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        if let Some(site) = fetch_site {
            req = req.header("sec-fetch-site", site);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 403, "{why}");
        assert_eq!(
            db.delivery_state(id).await,
            "failed",
            "{why}: nothing changed"
        );
        assert_eq!(actions(&db, id).await, 0, "{why}: nothing recorded");
    }

    consumer.reply_with(200);
    let before = consumer.count();
    let res = http
        .post(&retry)
        .header("cookie", &cookie)
        .header("origin", server.origin())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        format!("/panel/deliveries/{id}?done=retried")
    );
    let got = consumer.wait_for(before + 1, WAIT).await;
    assert_eq!(got.last().unwrap().body["delivery_id"], id);
    db.wait_state(id, "delivered", WAIT).await;
    pump.stop().await.unwrap();
    let actor: String =
        sqlx::query_scalar("select actor from watchpump.actions where delivery_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(actor, "panel");

    let res = http
        .post(server.url("/panel/logout"))
        .header("cookie", &cookie)
        .header("origin", server.origin())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    let res = http
        .get(server.url("/panel"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303, "the session ended at log-out");
}

#[tokio::test]
async fn pages_escape_what_they_show_mask_tokens_and_page_by_keyset() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "<b>app</b>", "acme/", all()).await;
    let service_token = format!("wps_3_{}", "c".repeat(64));
    let change = db
        .emit(
            "acme/<script>alert(1)</script>",
            "push",
            json!({"note": "<img src=x onerror=alert(1)>", "leak": PRODUCER_TOKEN, "other": service_token}),
        )
        .await;
    let id = delivery_of(&db, change).await;
    for i in 0..60 {
        db.emit(&format!("acme/branch-{i}"), "push", json!({}))
            .await;
    }
    let cookie = server.log_in().await;
    let page = |path: String| {
        let req = panel_client()
            .get(server.url(&path))
            .header("cookie", cookie.clone());
        async move {
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            let csp = res
                .headers()
                .get("content-security-policy")
                .map(|v| v.to_str().unwrap().to_string());
            (status, csp, res.text().await.unwrap())
        }
    };

    let (status, csp, html) = page(format!("/panel/deliveries/{id}")).await;
    assert_eq!(status, 200);
    assert!(csp.unwrap().contains("frame-ancestors 'none'"));
    assert!(!html.contains("<script>"), "markup is escaped");
    assert!(!html.contains("<img"), "markup is escaped");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("&lt;b&gt;app&lt;/b&gt;"));
    assert!(
        !html.contains(PRODUCER_TOKEN),
        "the producer token is masked"
    );
    assert!(!html.contains(&service_token), "service tokens are masked");
    assert!(html.contains("Authorization: Bearer ••••••••"));
    assert!(html.contains(&format!("Watchpump-Delivery: {id}")));

    let (status, _, html) = page("/panel/deliveries?service=deploy".into()).await;
    assert_eq!(status, 200);
    let older = html
        .split("href=\"/panel/deliveries?")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("an Older link on a full page")
        .replace("&amp;", "&");
    assert!(older.contains("after="), "{older}");
    let (status, _, next) = page(format!("/panel/deliveries?{older}")).await;
    assert_eq!(status, 200);
    let rows = |html: &str| html.matches("<tr><td><a href=\"/panel/deliveries/").count();
    assert_eq!(rows(&html) + rows(&next), 61);
    assert!(!next.contains("Older →"));

    let (status, _, _) = page("/panel/deliveries?since=yesterday".into()).await;
    assert_eq!(status, 422);
    let (status, _, _) = page("/panel/deliveries/987654".into()).await;
    assert_eq!(status, 404);
    for (path, shows) in [
        ("/panel", "deploy"),
        ("/panel/watches?service=deploy", "&lt;b&gt;app&lt;/b&gt;"),
        ("/panel/warnings", "No warnings."),
        ("/panel/services/deploy", "Retry all failed for deploy"),
    ] {
        let (status, _, html) = page(path.into()).await;
        assert_eq!(status, 200, "{path}");
        assert!(html.contains(shows), "{path} shows {shows}");
    }
    let (status, _, _) = page("/panel/services/nope".into()).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn retry_all_failed_since_a_time_from_the_service_page() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "r", "acme/", all()).await;
    for i in 0..3 {
        db.emit(&format!("acme/o{i}"), "push", json!({})).await;
    }
    let all = ids_where(&db, "true").await;
    set_state(&db, &all, "failed", None).await;
    sqlx::query("update watchpump.settled set finished_at = now() - interval '1 hour'")
        .execute(&db.pool)
        .await
        .unwrap();
    let cookie = server.log_in().await;
    let since = (chrono::Utc::now() - chrono::Duration::hours(2)).format("%Y-%m-%dT%H:%M");
    let res = panel_client()
        .post(server.url("/panel/services/deploy/retry-failed"))
        .header("cookie", &cookie)
        .header("origin", server.origin())
        .form(&[("since", since.to_string())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        "/panel/services/deploy?done=requeued&n=3"
    );
    assert_eq!(db.count_state("pending").await, 3);
}

#[tokio::test]
async fn pause_resume_and_resync_from_the_panel_as_the_cli_does() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(svc.id, "r", "acme/", all()).await;
    for i in 0..3 {
        db.emit(&format!("acme/o{i}"), "push", json!({"i": i}))
            .await;
    }
    // Delivered: a resync skips an object whose news is still queued.
    let all = ids_where(&db, "true").await;
    set_state(&db, &all, "delivered", None).await;
    let cookie = server.log_in().await;
    let post = |path: String, origin: Option<String>| {
        let mut req = panel_client()
            .post(server.url(&path))
            .header("cookie", &cookie);
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        req.send()
    };
    let paused = |what: &'static str, id: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(&format!(
                "select paused_at is not null from watchpump.{what} where id = $1"
            ))
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    // From another origin: refused, nothing changes.
    let res = post(
        format!("/panel/watches/{}/pause", watch.id),
        Some("http://evil.example".into()),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 403);
    assert!(!paused("watches", watch.id).await);

    let res = post(
        format!("/panel/watches/{}/pause", watch.id),
        Some(server.origin()),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        format!("/panel/services/deploy?done=watch-paused&n={}", watch.id)
    );
    assert!(paused("watches", watch.id).await);
    let res = post(
        format!("/panel/watches/{}/resume", watch.id),
        Some(server.origin()),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 303);
    assert!(!paused("watches", watch.id).await);

    let res = post("/panel/services/deploy/pause".into(), Some(server.origin()))
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert!(paused("services", svc.id).await);
    let page = panel_client()
        .get(server.url("/panel/services/deploy?done=paused"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("deploy paused"), "{page}");
    assert!(page.contains("the whole service"), "{page}");
    let res = post(
        "/panel/services/deploy/resume".into(),
        Some(server.origin()),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 303);
    assert!(!paused("services", svc.id).await);

    // A resync: one replay per object, queued after the answer.
    let res = post(
        format!("/panel/watches/{}/resync", watch.id),
        Some(server.origin()),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        "/panel/services/deploy?done=resync&n=3"
    );
    eventually(WAIT, "three replays are queued", || async {
        sqlx::query_scalar::<_, i64>("select count(*) from watchpump.queue where replay")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 3
    })
    .await;

    // A removed watch: 404, and the watches page offers it no action.
    sqlx::query("update watchpump.watches set removed_at = now() where id = $1")
        .bind(watch.id)
        .execute(&db.pool)
        .await
        .unwrap();
    let res = post(
        format!("/panel/watches/{}/pause", watch.id),
        Some(server.origin()),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 404);
    let page = panel_client()
        .get(server.url("/panel/watches"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains(&format!("/panel/watches/{}/pause", watch.id)));
}

// ---- A real browser ----

/// chromedriver with one headless Chromium session, driven over the
/// WebDriver HTTP protocol.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
    http: reqwest::Client,
    profile: PathBuf,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn chromium_binary() -> Option<String> {
    std::env::var("WATCHPUMP_CHROMIUM").ok().or_else(|| {
        [
            "/usr/lib/chromium/chromium",
            "/usr/bin/chromium",
            "/usr/bin/chromium-browser",
        ]
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(|p| p.to_string())
    })
}

impl Browser {
    async fn start() -> Browser {
        let missing = "this test needs Debian's chromium and chromium-driver: \
                       `make test` installs them (scripts/test-deps.sh), or apt-get install chromium chromium-driver";
        let binary = chromium_binary().expect(missing);
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(missing);
        let profile =
            std::env::temp_dir().join(format!("wp-chromium-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&profile).unwrap();
        let http = reqwest::Client::new();
        let status = format!("http://127.0.0.1:{port}/status");
        eventually(WAIT, "chromedriver is ready", || async {
            match http.get(&status).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .is_ok_and(|v| v["value"]["ready"] == true),
                Err(_) => false,
            }
        })
        .await;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--window-size=1280,1100",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": binary, "args": args},
        }}});
        let res = json_of(
            http.post(format!("http://127.0.0.1:{port}/session"))
                .json(&caps),
        )
        .await;
        let session = res["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver did not start Chromium: {res}"))
            .to_string();
        Browser {
            driver,
            port,
            session,
            http,
            profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!(
            "http://127.0.0.1:{}/session/{}{path}",
            self.port, self.session
        );
        let mut req = self.http.request(method, url);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let res: Value = req.send().await.unwrap().json().await.unwrap();
        if res["value"].get("error").is_some() {
            panic!("WebDriver {path}: {}", res["value"]);
        }
        res["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn find(&self, css: &str) -> String {
        let v = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT].as_str().unwrap().to_string()
    }

    async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    async fn delete_cookies(&self) {
        self.call(reqwest::Method::DELETE, "/cookie", None).await;
    }

    async fn screenshot(&self, to: &std::path::Path) {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        std::fs::write(to, base64_decode(png.as_str().unwrap())).unwrap();
    }

    /// Waits until the page's source contains `text`.
    async fn wait_for_text(&self, text: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.source().await.contains(text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {text:?}: {}",
                self.source().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session (and its Chromium) even when the test panicked:
        // a plain blocking request, as Drop cannot await.
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                s,
                "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.session
            );
            let _ = s.read_to_end(&mut Vec::new());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, c)| n | (u32::from(value(*c)) << (18 - 6 * i)));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// A page on another origin (another port of the same host: the same
/// *site*, so the SameSite=Strict cookie goes along) with a form that posts
/// to the panel's Retry button.
async fn attacker_page(target: String) -> SocketAddr {
    let html = format!(
        r#"<!doctype html><html><body><form method="post" action="{target}"><button id="win" type="submit">Win a prize</button></form></body></html>"#
    );
    let app = axum::Router::new().route(
        "/",
        get(move || {
            let html = html.clone();
            async move { axum::response::Html(html) }
        }),
    );
    serve(app).await
}

#[tokio::test]
async fn a_failed_delivery_is_retried_from_the_panel_in_a_real_browser() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    let (consumer, id) = failed_delivery(
        &db,
        "deploy",
        "acme/web/refs/heads/main",
        json!({"after": "9f2c41d", "pusher": "ada", "paths": ["src/main.rs", "docs/index.md"]}),
    )
    .await;
    let (_docs, other) = failed_delivery(&db, "docs", "acme/docs/refs/heads/main", json!({})).await;
    let browser = Browser::start().await;

    // Not logged in: the panel sends the browser to the login form.
    browser
        .goto(&server.url(&format!("/panel/deliveries/{id}")))
        .await;
    assert!(browser.url().await.ends_with("/panel/login"));
    browser.type_into("input[name=token]", ADMIN_TOKEN).await;
    browser.click("button[type=submit]").await;
    browser.wait_for_text("Consumer services").await;
    assert!(browser.source().await.contains("looks down"));

    // Open the failed delivery and press Retry.
    browser
        .goto(&server.url(&format!("/panel/deliveries/{id}")))
        .await;
    browser.wait_for_text(r#"class="state failed""#).await;
    consumer.reply_with(200);
    let before = consumer.count();
    browser.click("#retry").await;
    browser.wait_for_text("Requeued").await;
    let got = consumer.wait_for(before + 1, WAIT).await;
    assert_eq!(
        got.last().unwrap().body["delivery_id"],
        id,
        "same delivery id"
    );
    db.wait_state(id, "delivered", WAIT).await;
    browser
        .goto(&server.url(&format!("/panel/deliveries/{id}")))
        .await;
    browser.wait_for_text(r#"class="state delivered""#).await;
    // Into target/, so that a test run leaves the tree clean;
    // WATCHPUMP_UPDATE_SCREENSHOT=1 refreshes docs/panel.png (docs/operator.md shows it).
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
        if std::env::var_os("WATCHPUMP_UPDATE_SCREENSHOT").is_some() {
            "docs/panel.png"
        } else {
            "target/panel.png"
        },
    );
    browser.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);

    // A form on another origin posting to the Retry button: the browser
    // sends the session cookie (same site) but its own Origin, and the
    // panel refuses.
    let retry_other = server.url(&format!("/panel/deliveries/{other}/retry"));
    let attacker = attacker_page(retry_other).await;
    browser.goto(&format!("http://{attacker}/")).await;
    browser.click("#win").await;
    browser.wait_for_text("did not come from the panel").await;
    assert_eq!(db.delivery_state(other).await, "failed");
    assert_eq!(actions(&db, other).await, 0);

    // The session ends while the page is open: Retry changes nothing.
    browser
        .goto(&server.url(&format!("/panel/deliveries/{other}")))
        .await;
    browser.wait_for_text(r#"class="state failed""#).await;
    browser.delete_cookies().await;
    browser.click("#retry").await;
    browser.wait_for_text("You are not logged in").await;
    assert_eq!(db.delivery_state(other).await, "failed");
    assert_eq!(actions(&db, other).await, 0);
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_large_body_is_shown_cut_at_64_kib_with_its_size() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    // Under the producer's default payload limit (1 MiB), far over 64 KiB.
    // jsonb orders keys by length: "a" (the start), "bb" (service tokens
    // over the cut), "ccc" (past the cut). The start is one byte longer each
    // time, so that the cut splits a token at every offset: what is shown of
    // it is masked all the same.
    let token = format!("wps_3_{}", "c".repeat(64));
    let tokens = vec![token.as_str(); 60].join(" ");
    let mut ids = Vec::new();
    for k in 0..=token.len() {
        let tail = if k == 0 { 900_000 } else { 2_000 };
        let payload = json!({"a": "x".repeat(62_000 + k), "bb": tokens, "ccc": "y".repeat(tail)});
        let change = db.emit(&format!("acme/big-{k}"), "push", payload).await;
        ids.push(delivery_of(&db, change).await);
    }

    let cookie = server.log_in().await;
    for id in ids {
        let html = panel_client()
            .get(server.url(&format!("/panel/deliveries/{id}")))
            .header("cookie", cookie.clone())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.len() < 80 * 1024, "the page is {} bytes", html.len());
        let note = html
            .split(r#"id="request-cut">"#)
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .expect("a note that the request was cut");
        assert!(note.starts_with("The first 64 KiB of "), "{note}");
        assert!(html.contains(&format!("Watchpump-Delivery: {id}")));
        assert!(
            html.contains("&quot;a&quot;: &quot;xxxx"),
            "the body's start is shown"
        );
        assert!(!html.contains("yyyy"), "past the cut");
        assert!(!html.contains("_cc"), "a token at the cut is masked");
    }

    // The producer's token, bare in a payload, cut at every offset the
    // same way: what is left of it at the cut is masked too, unless it is
    // too short (under 4 characters) to tell.
    let bare = vec![PRODUCER_TOKEN; 200].join(" ");
    for k in 0..=PRODUCER_TOKEN.len() {
        let payload = json!({"a": "x".repeat(62_000 + k), "bb": bare, "ccc": "y".repeat(2_000)});
        let change = db.emit(&format!("acme/bare-{k}"), "push", payload).await;
        let id = delivery_of(&db, change).await;
        let html = server.panel_get(&format!("/panel/deliveries/{id}")).await;
        let request = html
            .split(r#"<pre id="request">"#)
            .nth(1)
            .and_then(|rest| rest.split("</pre>").next())
            .expect("the request as sent");
        let last = request.rsplit(' ').next().unwrap();
        assert!(
            last == MASK || (last.chars().count() < 4 && PRODUCER_TOKEN.starts_with(last)),
            "the request ends with {last:?}"
        );
    }

    // A small body is shown whole, without the note.
    let small = db.emit("acme/small", "push", json!({"n": 1})).await;
    let small = delivery_of(&db, small).await;
    let html = server
        .panel_get(&format!("/panel/deliveries/{small}"))
        .await;
    assert!(!html.contains("request-cut") && html.contains("&quot;n&quot;: 1"));
}

/// The panel's lists link to an older page only when one follows, by
/// `after` (an old `before=` link still opens it), for deliveries (50 a
/// page) and watches (100 a page).
#[tokio::test]
async fn the_panels_lists_link_an_older_page_only_when_more_follow() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    let older = |html: &str, list: &str| {
        html.split(&format!("href=\"/panel/{list}?"))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(|q| q.replace("&amp;", "&"))
    };
    let rows = |html: &str, list: &str| html.matches(&format!("<a href=\"/panel/{list}/")).count();

    // Exactly a page of deliveries: no link to an empty page.
    for i in 0..50 {
        db.emit(&format!("acme/b{i}"), "push", json!({})).await;
    }
    let full = server.panel_get("/panel/deliveries?service=deploy").await;
    assert_eq!(
        older(&full, "deliveries"),
        None,
        "a full last page links nowhere"
    );
    db.emit("acme/b50", "push", json!({})).await;
    let first = server.panel_get("/panel/deliveries?service=deploy").await;
    let link = older(&first, "deliveries").expect("one more follows");
    assert!(link.contains("after="), "{link}");
    let next = server.panel_get(&format!("/panel/deliveries?{link}")).await;
    assert_eq!(rows(&next, "deliveries"), 1, "{next}");
    assert_eq!(older(&next, "deliveries"), None);
    let old_link = server
        .panel_get(&format!(
            "/panel/deliveries?{}",
            link.replace("after=", "before=")
        ))
        .await;
    assert_eq!(
        rows(&old_link, "deliveries"),
        1,
        "an old before= link opens the same page"
    );

    // Watches: 100 a page.
    for i in 1..100 {
        db.add_watch(svc.id, "app", &format!("acme/w{i}"), all())
            .await;
    }
    let full = server.panel_get("/panel/watches?service=deploy").await;
    assert_eq!(older(&full, "watches"), None, "100 watches are one page");
    db.add_watch(svc.id, "app", "acme/w100", all()).await;
    let first = server.panel_get("/panel/watches?service=deploy").await;
    let link = older(&first, "watches").expect("one more follows");
    assert!(link.contains("after="), "{link}");
    let next = server.panel_get(&format!("/panel/watches?{link}")).await;
    assert_eq!(older(&next, "watches"), None);
    assert!(
        next.contains("acme/"),
        "the oldest watch is on the last page: {next}"
    );
    assert!(!next.contains("acme/w100"), "the newest is not");
}

/// An id in a panel path that is not an integer is the panel's own 404
/// page, as a missing id is, for a delivery's page and for the actions on
/// a watch (which answered axum's plain-text 400 until the panel read ids
/// with the APIs' `PathId`); nothing changes.
#[tokio::test]
async fn a_panel_path_whose_id_is_not_an_integer_is_a_404_page() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(svc.id, "r", "acme/", all()).await;
    let cookie = server.log_in().await;
    let html_404 = |res: reqwest::Response| async move {
        assert_eq!(res.status(), 404);
        let kind = res.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/html"), "{kind}");
        let body = res.text().await.unwrap();
        assert!(body.contains("ids are integers"), "{body}");
    };

    let res = panel_client()
        .get(server.url("/panel/deliveries/abc"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    html_404(res).await;
    for action in ["pause", "resume", "resync"] {
        let res = panel_client()
            .post(server.url(&format!("/panel/watches/abc/{action}")))
            .header("cookie", &cookie)
            .header("origin", server.origin())
            .send()
            .await
            .unwrap();
        html_404(res).await;
    }
    let paused: bool =
        sqlx::query_scalar("select paused_at is not null from watchpump.watches where id = $1")
            .bind(watch.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(!paused);
}
