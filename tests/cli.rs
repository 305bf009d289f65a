//! The `watchpump` binary itself, run as a child process against a real
//! PostgreSQL: exit statuses, what it prints, and what it writes.

mod common;

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// Runs to completion and returns what it printed.
fn run(database_url: Option<&str>, args: &[&str]) -> Output {
    watchpump_cli(database_url)
        .args(args)
        .output()
        .expect("run the watchpump binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[track_caller]
fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "expected success, got {}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

/// Asserts a non-zero exit with a message on stderr that mentions `says`.
#[track_caller]
fn assert_fails_saying(out: &Output, says: &str) {
    assert!(
        !out.status.success() && out.status.code().is_some(),
        "expected a non-zero exit, got {}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        stderr(out)
    );
    let err = stderr(out);
    assert!(err.contains(says), "stderr should mention {says:?}: {err}");
}

async fn count(db: &TestDb, table: &str) -> i64 {
    sqlx::query_scalar(&format!("select count(*) from watchpump.{table}"))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Waits for a child to exit, killing it (and failing) after `limit`.
fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Collects a child's stderr in the background, so the pipe never fills.
fn collect(mut from: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let sink = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    out
}

#[tokio::test]
async fn migrate_creates_the_schema_and_a_second_run_changes_nothing() {
    let (url, pool) = blank_database().await;
    let exists = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, bool>(
            "select to_regclass('watchpump.deliveries') is not null
                and to_regprocedure('watchpump.emit(text, text, jsonb)') is not null",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert!(!exists(pool.clone()).await);

    let out = run(Some(&url), &["migrate"]);
    assert_success(&out);
    assert!(stdout(&out).contains("0001_core"), "{}", stdout(&out));
    assert!(exists(pool.clone()).await, "the schema is there");
    let applied = |pool: sqlx::PgPool| async move {
        sqlx::query_as::<_, (String, Vec<u8>, chrono::DateTime<chrono::Utc>)>(
            "select name, checksum, applied_at from watchpump.schema_migrations order by name",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let first = applied(pool.clone()).await;
    assert!(first.iter().any(|(name, _, _)| name == "0001_core"));

    let out = run(Some(&url), &["migrate"]);
    assert_success(&out);
    assert_eq!(stdout(&out).trim(), "schema is up to date");
    assert_eq!(applied(pool.clone()).await, first, "nothing re-applied");
    pool.close().await;
}

#[tokio::test]
async fn services_add_prints_the_token_alone_on_the_last_line_and_stores_only_its_hash() {
    let db = TestDb::new().await;
    let out = run(
        Some(&db.url),
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:1234",
        ],
    );
    assert_success(&out);
    let printed = stdout(&out);
    let token = printed.lines().last().expect("a last line").to_string();
    assert!(printed.ends_with(&format!("{token}\n")));

    // wps_<id>_<64 hex>
    let rest = token
        .strip_prefix("wps_")
        .unwrap_or_else(|| panic!("token shape: {token:?}"));
    let (id, secret) = rest.split_once('_').expect("wps_<id>_<secret>");
    let id: i64 = id.parse().expect("the id is an integer");
    assert_eq!(secret.len(), 64, "{token}");
    assert!(
        secret
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{token}"
    );

    let (row_id, name, base_url, hash_matches): (i64, String, String, bool) = sqlx::query_as(
        "select id, name, base_url, token_hash = sha256(convert_to($1, 'UTF8'))
         from watchpump.services",
    )
    .bind(secret)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row_id, id);
    assert_eq!(name, "deploy");
    assert_eq!(base_url, "http://127.0.0.1:1234");
    assert!(hash_matches, "token_hash is sha256 of the secret part");
    // Neither the token nor its secret is stored anywhere in the row.
    let leaks: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.services s
         where strpos(s::text, $1) > 0 or strpos(s::text, $2) > 0
            or strpos(encode(s.token_hash, 'escape'), $2) > 0",
    )
    .bind(&token)
    .bind(secret)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(leaks, 0, "the token is not stored");

    // The token authenticates; a changed one does not.
    let service = watchpump::services::authenticate(&db.pool, &token)
        .await
        .unwrap()
        .expect("the printed token authenticates");
    assert_eq!((service.id, service.name.as_str()), (id, "deploy"));
    let mut altered = token.clone().into_bytes();
    let last = altered.len() - 1;
    altered[last] = if altered[last] == b'0' { b'1' } else { b'0' };
    let altered = String::from_utf8(altered).unwrap();
    assert!(watchpump::services::authenticate(&db.pool, &altered)
        .await
        .unwrap()
        .is_none());

    // And the service is listed.
    let out = run(Some(&db.url), &["services", "list"]);
    assert_success(&out);
    let listed = stdout(&out);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("deploy\thttp://127.0.0.1:1234\t")),
        "{listed}"
    );
    assert!(!listed.contains(secret), "list never shows a token");
}

#[tokio::test]
async fn services_list_shows_every_registered_service_by_name() {
    let db = TestDb::new().await;
    let out = run(Some(&db.url), &["services", "list"]);
    assert_success(&out);
    assert_eq!(stdout(&out), "", "no services yet");
    for (name, url) in [
        ("docs", "https://docs.internal/"),
        ("deploy", "http://127.0.0.1:1234"),
    ] {
        // docs.internal does not resolve here: listed, it is not looked up.
        let out = watchpump_cli(Some(&db.url))
            .env(
                "WATCHPUMP_ALLOWED_DESTINATIONS",
                "127.0.0.0/8, docs.internal",
            )
            .args(["services", "add", name, "--base-url", url])
            .output()
            .unwrap();
        assert_success(&out);
    }
    let out = run(Some(&db.url), &["services", "list"]);
    assert_success(&out);
    let lines: Vec<Vec<String>> = stdout(&out)
        .lines()
        .map(|l| l.split('\t').map(String::from).collect())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0][..2], ["deploy", "http://127.0.0.1:1234"]);
    assert_eq!(lines[1][..2], ["docs", "https://docs.internal"]);
}

#[tokio::test]
async fn services_add_refuses_a_duplicate_name_a_bad_name_and_a_bad_url_adding_no_row() {
    let db = TestDb::new().await;
    assert_success(&run(
        Some(&db.url),
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:1234",
        ],
    ));
    let before: Vec<(i64, String, String, Vec<u8>)> =
        sqlx::query_as("select id, name, base_url, token_hash from watchpump.services order by id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(before.len(), 1);

    let cases: [(&str, &str, &str); 8] = [
        ("deploy", "http://127.0.0.1:4321", "already exists"),
        ("Deploy", "http://127.0.0.1:1234", "service name"),
        ("bad name", "http://127.0.0.1:1234", "service name"),
        ("_deploy", "http://127.0.0.1:1234", "service name"),
        ("other", "not a url", "base URL"),
        ("other", "ftp://127.0.0.1/", "http or https"),
        ("other", "http://127.0.0.1:1234/?a=1", "query"),
        ("other", "127.0.0.1:1234", "base URL"),
    ];
    for (name, url, says) in cases {
        let out = run(Some(&db.url), &["services", "add", name, "--base-url", url]);
        assert_fails_saying(&out, says);
        assert!(
            !stdout(&out).contains("wps_"),
            "{name} {url}: no token printed: {}",
            stdout(&out)
        );
        assert_eq!(
            count(&db, "services").await,
            1,
            "{name} {url}: no row added"
        );
    }
    let after: Vec<(i64, String, String, Vec<u8>)> =
        sqlx::query_as("select id, name, base_url, token_hash from watchpump.services order by id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(after, before, "the existing service is unchanged");
}

#[tokio::test]
async fn emit_records_the_change_and_its_deliveries() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let pushes = db
        .add_watch(service.id, "app", "acme/web/", kinds(&["push"]))
        .await;
    let everything = db
        .add_watch(service.id, "all", "acme/web/refs/heads/main", all())
        .await;

    let out = run(
        Some(&db.url),
        &["emit", "acme/web/refs/heads/main", "push", r#"{"a":1}"#],
    );
    assert_success(&out);
    let (change_id, object, kind, sequence, payload): (
        i64,
        String,
        String,
        i64,
        serde_json::Value,
    ) = sqlx::query_as("select id, object, kind, sequence, payload from watchpump.changes")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        stdout(&out).trim(),
        format!("change {change_id}: 2 deliveries")
    );
    assert_eq!(
        (object.as_str(), kind.as_str(), sequence),
        ("acme/web/refs/heads/main", "push", 1)
    );
    assert_eq!(payload, json!({"a": 1}));
    let deliveries: Vec<(i64, i64, String)> = sqlx::query_as(
        "select watch_id, service_id, state from watchpump.deliveries where change_id = $1 order by watch_id",
    )
    .bind(change_id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        deliveries,
        vec![
            (pushes.id, service.id, "pending".to_string()),
            (everything.id, service.id, "pending".to_string()),
        ]
    );

    // Another kind, default payload: only the unfiltered watch.
    let out = run(Some(&db.url), &["emit", "acme/web/refs/heads/main", "tag"]);
    assert_success(&out);
    let (change_id, payload, sequence): (i64, serde_json::Value, i64) = sqlx::query_as(
        "select id, payload, sequence from watchpump.changes order by id desc limit 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        stdout(&out).trim(),
        format!("change {change_id}: 1 delivery")
    );
    assert_eq!(payload, json!({}));
    assert_eq!(sequence, 2);
}

#[tokio::test]
async fn emit_refuses_invalid_json_and_non_object_payloads_writing_nothing() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let cases = [
        (r#"{"a":"#, "not JSON"),
        ("{a: 1}", "not JSON"),
        ("", "not JSON"),
        ("[1, 2]", "object"),
        (r#""text""#, "object"),
        ("1", "object"),
        ("null", "object"),
    ];
    for (payload, says) in cases {
        let out = run(Some(&db.url), &["emit", "acme/web/x", "push", payload]);
        assert_fails_saying(&out, says);
        assert!(stderr(&out).contains("payload"), "{}", stderr(&out));
        for table in ["changes", "deliveries", "objects"] {
            assert_eq!(
                count(&db, table).await,
                0,
                "{payload:?}: nothing in {table}"
            );
        }
    }
}

#[tokio::test]
async fn emit_refuses_an_object_no_watch_could_name_and_counts_one_delivery_in_the_singular() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    for object in ["/x", "acme//web", "two words"] {
        let out = run(Some(&db.url), &["emit", object, "push"]);
        assert_fails_saying(&out, "object must");
        assert_eq!(count(&db, "changes").await, 0, "{object:?}");
    }
    let out = run(Some(&db.url), &["emit", "acme/web", "push"]);
    assert_success(&out);
    assert!(stdout(&out).ends_with(": 1 delivery\n"), "{}", stdout(&out));
}

#[tokio::test]
async fn commands_on_an_unmigrated_database_say_to_run_migrate_and_create_nothing() {
    let (url, pool) = blank_database().await;
    for args in [
        &["services", "list"][..],
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:9",
        ],
        &["kinds", "list"],
        &["emit", "acme/x", "push"],
    ] {
        let out = run(Some(&url), args);
        assert_fails_saying(&out, "run `watchpump migrate`");
        assert_eq!(stdout(&out), "", "{args:?}");
    }
    let schemas: i64 =
        sqlx::query_scalar("select count(*) from pg_namespace where nspname = 'watchpump'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(schemas, 0, "no command but migrate creates the schema");
}

#[tokio::test]
async fn every_command_without_a_database_url_fails_with_a_message() {
    for args in [
        &["migrate"][..],
        &["services", "list"],
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:1234",
        ],
        &["emit", "acme/x", "push"],
    ] {
        let out = run(None, args);
        assert_fails_saying(&out, "DATABASE_URL");
        assert_eq!(stdout(&out), "", "{args:?}");
    }
    let out = watchpump_cli(None)
        .args(["serve"])
        .env("WATCHPUMP_PRODUCER", "git")
        .env("WATCHPUMP_PRODUCER_TOKEN", "x")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    assert_fails_saying(&out, "DATABASE_URL");
}

#[tokio::test]
async fn serve_refuses_a_lease_not_longer_than_the_request_timeout() {
    let db = TestDb::new().await;
    for (lease, timeout) in [("1000", "2000"), ("2000", "2000")] {
        let port = free_port();
        let mut child = watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{port}"))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", "git")
            .env("WATCHPUMP_PRODUCER_TOKEN", "x")
            .env("WATCHPUMP_LEASE_MS", lease)
            .env("WATCHPUMP_REQUEST_TIMEOUT_MS", timeout)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_exit(
            &mut child,
            Duration::from_secs(30),
            "serve with a short lease",
        );
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            !status.success() && status.code().is_some(),
            "{status}: {err}"
        );
        assert!(
            err.contains("lease") && err.contains("request timeout"),
            "the message names the lease and the request timeout: {err}"
        );
        assert!(err.contains(lease) && err.contains(timeout), "{err}");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "it never listened"
        );
    }
}

#[test]
fn serve_help_documents_the_producer_and_listen_settings() {
    let out = run(None, &["serve", "--help"]);
    assert_success(&out);
    let help = stdout(&out);
    for var in [
        "WATCHPUMP_PRODUCER",
        "WATCHPUMP_LISTEN",
        "WATCHPUMP_PRODUCER_TOKEN",
    ] {
        assert!(help.contains(var), "serve --help mentions {var}:\n{help}");
    }
}

#[tokio::test]
async fn serve_answers_healthz_and_exits_0_on_sigterm() {
    let db = TestDb::new().await;
    let port = free_port();
    let mut child = watchpump_cli(Some(&db.url))
        .arg("serve")
        .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{port}"))
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", "git")
        .env("WATCHPUMP_PRODUCER_TOKEN", "x")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs = collect(child.stderr.take().unwrap());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let healthz = format!("http://127.0.0.1:{port}/healthz");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve exited early with {status}: {}", logs.lock().unwrap());
        }
        if let Ok(resp) = http.get(&healthz).send().await {
            if resp.status() == reqwest::StatusCode::OK {
                assert_eq!(resp.text().await.unwrap(), "ok");
                break;
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("/healthz never answered: {}", logs.lock().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = wait_exit(&mut child, Duration::from_secs(60), "serve after SIGTERM");
    assert_eq!(
        status.code(),
        Some(0),
        "serve exits 0 on SIGTERM ({status}): {}",
        logs.lock().unwrap()
    );
    assert!(
        http.get(&healthz).send().await.is_err(),
        "nothing listens after the exit"
    );
    // The log says where the panel is, and why it is off.
    let logs = logs.lock().unwrap();
    assert!(
        logs.contains("panel and admin API off: set WATCHPUMP_ADMIN_TOKEN")
            && logs.contains(&format!("http://127.0.0.1:{port}/panel")),
        "{logs}"
    );
}

#[tokio::test]
async fn an_unreachable_database_or_a_wrong_url_says_why_at_once_without_the_password() {
    let port = free_port(); // nothing listens there
    let refused = format!("postgres://watchpump:secret-pw@127.0.0.1:{port}/x");
    let started = Instant::now();
    let out = run(Some(&refused), &["migrate"]);
    assert_fails_saying(&out, "Connection refused");
    assert_fails_saying(&out, "DATABASE_URL");
    assert!(!stderr(&out).contains("secret-pw"), "{}", stderr(&out));
    // Not the pool's "timed out" after 10 s: the cause, at once (generously).
    assert!(started.elapsed() < Duration::from_secs(8));
    for url in ["mysql://root@127.0.0.1/x", "127.0.0.1:5432/x"] {
        let out = run(Some(url), &["services", "list"]);
        assert_fails_saying(&out, "not a PostgreSQL URL");
        assert_eq!(out.status.code(), Some(2));
    }
}

#[tokio::test]
async fn serve_without_a_producer_name_or_token_names_the_variable_to_set() {
    let db = TestDb::new().await;
    for (unset, says) in [
        ("WATCHPUMP_PRODUCER", "set WATCHPUMP_PRODUCER"),
        ("WATCHPUMP_PRODUCER_TOKEN", "set WATCHPUMP_PRODUCER_TOKEN"),
    ] {
        let mut cmd = watchpump_cli(Some(&db.url));
        cmd.arg("serve")
            .env("WATCHPUMP_PRODUCER", "git")
            .env("WATCHPUMP_PRODUCER_TOKEN", "x")
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env_remove(unset);
        let out = cmd.output().unwrap();
        assert_fails_saying(&out, says);
        assert_eq!(out.status.code(), Some(2));
    }
}

#[tokio::test]
async fn emit_reads_a_large_payload_from_stdin_or_a_file_and_refuses_nul() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    // 880 KB: past what one argument may hold on Linux (128 KiB), within
    // emit()'s default payload limit (1 MiB).
    let paths: Vec<String> = (0..40_000).map(|i| format!("src/file-{i:06}.rs")).collect();
    let big = json!({"paths": paths}).to_string();
    assert!(big.len() > 800_000 && big.len() < 1_048_576);
    let mut child = watchpump_cli(Some(&db.url))
        .args(["emit", "acme/web/main", "push", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(big.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_success(&out);
    let file = std::env::temp_dir().join(format!("wp-payload-{:x}.json", rand::random::<u64>()));
    std::fs::write(&file, r#"{"after": "9f2c"}"#).unwrap();
    let out = run(
        Some(&db.url),
        &[
            "emit",
            "acme/web/main",
            "push",
            &format!("@{}", file.display()),
        ],
    );
    assert_success(&out);
    let _ = std::fs::remove_file(&file);
    let stored: Vec<i64> = sqlx::query_scalar(
        "select jsonb_array_length(coalesce(payload -> 'paths', '[]'))::int8 from watchpump.changes order by id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, vec![40_000, 0]);

    for payload in [r#"{"a": "x\u0000y"}"#, r#"{"a\u0000": 1}"#] {
        let out = run(Some(&db.url), &["emit", "acme/web/main", "push", payload]);
        assert_fails_saying(&out, "NUL");
        assert_eq!(out.status.code(), Some(2));
    }
    let out = run(
        Some(&db.url),
        &["emit", "acme/web/main", "push", "@/no/such/file"],
    );
    assert_fails_saying(&out, "cannot read the payload");
    assert_eq!(count(&db, "changes").await, 2, "nothing more was written");
}

#[tokio::test]
async fn logs_are_plain_text_on_a_pipe_and_one_json_object_a_line_on_request() {
    let db = TestDb::new().await;
    for format in ["text", "json"] {
        let port = free_port();
        let mut child = watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{port}"))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", "git")
            .env("WATCHPUMP_PRODUCER_TOKEN", "x")
            .env("WATCHPUMP_LOG_FORMAT", format)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let logs = collect(child.stderr.take().unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        while !logs.lock().unwrap().contains("listening") {
            assert!(
                Instant::now() < deadline,
                "no log: {}",
                logs.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        wait_exit(&mut child, Duration::from_secs(60), "serve after SIGTERM");
        let text = logs.lock().unwrap().clone();
        assert!(
            !text.contains('\u{1b}'),
            "no colour codes on a pipe: {text}"
        );
        if format == "json" {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
            }
        }
    }
}

#[tokio::test]
async fn serve_on_a_port_in_use_names_the_setting_that_moves_it() {
    let db = TestDb::new().await;
    // Held for the whole test: the port stays in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = taken.local_addr().unwrap().to_string();
    let serve = |listen: &str, metrics: &str| {
        watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", listen)
            .env("WATCHPUMP_METRICS_LISTEN", metrics)
            .env("WATCHPUMP_PRODUCER", "git")
            .env("WATCHPUMP_PRODUCER_TOKEN", "x")
            .output()
            .unwrap()
    };

    let api = serve(&in_use, "off");
    assert_fails_saying(&api, &format!("cannot listen on {in_use}"));
    assert_fails_saying(&api, "WATCHPUMP_LISTEN");

    let free = format!("127.0.0.1:{}", free_port());
    let metrics = serve(&free, &in_use);
    assert_fails_saying(&metrics, &format!("cannot listen on {in_use} for metrics"));
    assert_fails_saying(&metrics, "WATCHPUMP_METRICS_LISTEN");
}
