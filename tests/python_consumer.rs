//! `examples/consumer.py`, the Python consumer (standard library only), run
//! against the real pump: it verifies signatures (a forged request is
//! refused), takes each delivery id once, ignores older sequences, and its
//! 410 makes the producer drop the watch. Runs with `python3`, or
//! `$CONSUMER_PYTHON`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use watchpump::signing::{headers, SigningSecret};

const CONSUMER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/consumer.py");
const WAIT: Duration = Duration::from_secs(30);

/// The consumer as a child process, its output lines collected.
struct PythonConsumer {
    _child: KillOnDrop,
    lines: Arc<Mutex<Vec<String>>>,
    base_url: String,
    db: PathBuf,
}

impl PythonConsumer {
    async fn start(secret: &str, gone: &str) -> PythonConsumer {
        let port = free_port();
        let db = std::env::temp_dir().join(format!("consumer-{:016x}.db", rand::random::<u64>()));
        let python = std::env::var("CONSUMER_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(python)
            .arg(CONSUMER)
            .args(["--port", &port.to_string(), "--db", db.to_str().unwrap()])
            .args(["--gone", gone])
            .env("WHSEC", secret)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run python3 examples/consumer.py");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let consumer = PythonConsumer {
            _child: KillOnDrop(child),
            lines,
            base_url: format!("http://127.0.0.1:{port}"),
            db,
        };
        consumer.wait_for_line("consumer listening").await;
        consumer
    }

    async fn wait_for_line(&self, part: &str) {
        until(WAIT, &format!("the consumer prints {part:?}"), || {
            let lines = self.lines.lock().unwrap().clone();
            let found = lines.iter().any(|l| l.contains(part));
            async move { check(found, format!("{lines:#?}")) }
        })
        .await;
    }

    /// What the consumer's SQLite holds, read with Python's sqlite3.
    fn query(&self, sql: &str) -> Vec<Value> {
        let out = Command::new("python3")
            .args(["-c", "import json, sqlite3, sys; print(json.dumps(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchall()))"])
            .args([self.db.to_str().unwrap(), sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
    }

    /// POSTs `body` to the events endpoint as delivery `id`, signed with
    /// `secret`.
    async fn post(&self, secret: &SigningSecret, id: u64, body: &Value) -> u16 {
        let body = body.to_string();
        let mut request = reqwest::Client::new()
            .post(format!("{}/api/v1/{PRODUCER}/events", self.base_url))
            .body(body.clone());
        for (name, value) in headers(
            &[secret],
            id,
            chrono::Utc::now().timestamp(),
            body.as_bytes(),
        ) {
            request = request.header(name, value);
        }
        request.send().await.unwrap().status().as_u16()
    }
}

impl Drop for PythonConsumer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.db);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_consumer_verifies_deduplicates_orders_and_answers_410() {
    let db = TestDb::new().await;
    // The port is only known once the consumer runs: register a
    // placeholder, then point the service at the consumer.
    let registered = watchpump::services::add_within(
        &db.pool,
        "pyconsumer",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let secret: SigningSecret = registered.signing_secret.parse().unwrap();
    let consumer = PythonConsumer::start(&registered.signing_secret, "web-old").await;
    watchpump::services::set_url_within(
        &db.pool,
        "pyconsumer",
        &consumer.base_url,
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let service = registered.service.id;
    let web = db.add_watch(service, "web", "acme/web/", all()).await;
    let old = db.add_watch(service, "web-old", "acme/old/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());

    // A real delivery, signed by the pump: verified and applied.
    let main = "acme/web/refs/heads/main";
    let first = db
        .emit(main, "push", json!({"after": "a1", "paths": ["src/x"]}))
        .await;
    db.wait_state(delivery_of(&db, first).await, "delivered", WAIT)
        .await;
    consumer
        .wait_for_line("applied push of acme/web/refs/heads/main for web, sequence 1")
        .await;
    let second = db
        .emit(main, "push", json!({"after": "b2", "paths": []}))
        .await;
    let second_delivery = delivery_of(&db, second).await;
    db.wait_state(second_delivery, "delivered", WAIT).await;
    assert_eq!(
        consumer
            .query("select payload, sequence from state where object = 'acme/web/refs/heads/main'"),
        vec![json!([r#"{"after": "b2", "paths": []}"#, 2])]
    );

    // The same delivery id again (as after a pump crash): answered 200, not
    // applied twice.
    let body = json!({"delivery_id": second_delivery, "change_id": second, "watch_id": web.id,
        "producer": PRODUCER, "resource": "web", "object": main, "kind": "push", "sequence": 2,
        "occurred_at": "2026-12-02T10:15:03.118Z", "attempt": 2,
        "payload": {"after": "b2", "paths": []}});
    assert_eq!(
        consumer.post(&secret, second_delivery as u64, &body).await,
        200
    );
    consumer.wait_for_line("duplicate").await;

    // An older sequence under a new delivery id: taken (200), ignored.
    let mut older = body.clone();
    older["delivery_id"] = json!(9_000_001);
    older["sequence"] = json!(1);
    older["payload"] = json!({"after": "zz", "paths": []});
    assert_eq!(consumer.post(&secret, 9_000_001, &older).await, 200);
    consumer.wait_for_line("stale push").await;
    assert_eq!(
        consumer.query("select json_extract(payload, '$.after') from state"),
        vec![json!(["b2"])],
        "the newer state stays"
    );

    // A forged request (signed with another secret): 401, nothing stored.
    let forger = SigningSecret::generate();
    let mut forged = body.clone();
    forged["delivery_id"] = json!(9_000_002);
    forged["sequence"] = json!(99);
    forged["payload"] = json!({"after": "evil", "paths": []});
    assert_eq!(consumer.post(&forger, 9_000_002, &forged).await, 401);
    consumer.wait_for_line("forged or stale: refused").await;
    assert_eq!(
        consumer.query("select count(*) from deliveries where delivery_id = 9000002"),
        vec![json!([0])]
    );

    // A gone resource: 410, and the producer drops the watch.
    let gone = db
        .emit(
            "acme/old/refs/heads/main",
            "push",
            json!({"after": "c3", "paths": []}),
        )
        .await;
    db.wait_state(delivery_of(&db, gone).await, "dropped", WAIT)
        .await;
    let removed: Option<String> =
        sqlx::query_scalar("select removed_reason from watchpump.watches where id = $1")
            .bind(old.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        removed.is_some_and(|r| r.contains("410")),
        "the watch is removed for its 410"
    );
    pump.stop().await.unwrap();
}
