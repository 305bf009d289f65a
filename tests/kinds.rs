//! The kinds catalogue: declared from the file the producer ships
//! (`kinds/git.json`) with the CLI, read by consumers at `GET /api/v1/kinds`
//! and shown in docs/protocol.md; schemas outside the checked subset
//! refused; and strict mode, which makes `emit()` refuse an undeclared kind
//! or a payload that does not fit, only when it is on.

mod common;

use std::io::Write;
use std::process::{Output, Stdio};

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

const GIT_KINDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kinds/git.json");
const PROTOCOL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol.md");

fn run(url: &str, args: &[&str]) -> Output {
    watchpump_cli(Some(url)).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn count_kinds(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from watchpump.kinds")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

fn git_kinds() -> Vec<Value> {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(GIT_KINDS).unwrap()).unwrap();
    file["kinds"].as_array().unwrap().clone()
}

#[tokio::test]
async fn the_git_kinds_file_declares_what_consumers_read_at_api_v1_kinds() {
    let api = WatchesApi::start().await;
    let out = run(&api.db.url, &["kinds", "add", "--file", GIT_KINDS]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "kind push declared\nkind opened declared\nkind updated declared\nkind closed declared\n"
    );
    // Loading it again (as every `make run` does) updates, adding nothing.
    let again = run(&api.db.url, &["kinds", "add", "--file", GIT_KINDS]);
    assert!(text(&again.stdout).contains("kind push updated"));
    assert_eq!(count_kinds(&api.db).await, 4);

    let listed = run(&api.db.url, &["kinds", "list"]);
    let listed = text(&listed.stdout);
    let names: Vec<&str> = listed
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(names, ["closed", "opened", "push", "updated"]);

    // Consumers read every kind, with its schema and example, by name.
    let http = reqwest::Client::new();
    let page: Value = http
        .get(api.url("/api/v1/kinds"))
        .bearer_auth(&api.deploy_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["next_after"], Value::Null);
    let served = page["kinds"].as_array().unwrap();
    for declared in git_kinds() {
        let kind = served
            .iter()
            .find(|k| k["name"] == declared["name"])
            .unwrap_or_else(|| panic!("{} served", declared["name"]));
        for field in ["description", "schema", "example"] {
            assert_eq!(
                kind[field], declared[field],
                "{field} of {}",
                declared["name"]
            );
        }
    }
    // Pages of 3: the first has a cursor, the last none.
    let first: Value = http
        .get(api.url("/api/v1/kinds?limit=3"))
        .bearer_auth(&api.docs_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first["kinds"].as_array().unwrap().len(), 3);
    assert_eq!(first["next_after"], "push");
    let rest: Value = http
        .get(api.url("/api/v1/kinds?limit=3&after=push"))
        .bearer_auth(&api.docs_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rest["kinds"][0]["name"], "updated");
    assert_eq!(rest["next_after"], Value::Null);

    // Only with a service token; bad pages are refused.
    let anonymous = http.get(api.url("/api/v1/kinds")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    for bad in ["limit=0", "limit=1001", "colour=red"] {
        let resp = http
            .get(api.url(&format!("/api/v1/kinds?{bad}")))
            .bearer_auth(&api.deploy_token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
    }

    let removed = run(&api.db.url, &["kinds", "remove", "closed"]);
    assert_eq!(text(&removed.stdout), "kind closed removed\n");
    let again = run(&api.db.url, &["kinds", "remove", "closed"]);
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("no kind \"closed\""));
}

/// docs/protocol.md shows every kind of kinds/git.json with each of its
/// fields, so that a consumer team needs neither the source nor the API.
#[test]
fn the_protocol_shows_every_git_kind_and_field() {
    let protocol = std::fs::read_to_string(PROTOCOL).unwrap();
    for kind in git_kinds() {
        let name = kind["name"].as_str().unwrap();
        assert!(protocol.contains(&format!("`{name}`")), "kind {name}");
        for field in kind["schema"]["properties"].as_object().unwrap().keys() {
            assert!(protocol.contains(&format!("`{field}`")), "{name}.{field}");
        }
    }
}

#[tokio::test]
async fn kinds_add_refuses_what_strict_mode_could_not_check_and_changes_nothing() {
    let db = TestDb::new().await;
    let cases = [
        (
            json!({"type": "object", "properties": {"after": {"type": "string", "pattern": "^[0-9a-f]+$"}}}),
            json!({"after": "9f"}),
            "\"pattern\" is not supported",
        ),
        (
            json!({"type": "object", "anyOf": [{"required": ["a"]}]}),
            json!({"a": 1}),
            "\"anyOf\" is not supported",
        ),
        (
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
            json!({}),
            "true or false",
        ),
        (
            json!({"type": "object", "required": ["after"]}),
            json!({"before": "x"}),
            "does not fit its schema: $: required property \"after\" is missing",
        ),
        (
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            json!({"n": 1.5}),
            "$.n: expected integer, got number",
        ),
    ];
    for (schema, example, says) in cases {
        // The schema from stdin, as `--schema -` reads it.
        let mut child = watchpump_cli(Some(&db.url))
            .args(["kinds", "add", "push", "--schema", "-"])
            .args(["--example", &example.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(schema.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{schema}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
        assert_eq!(count_kinds(&db).await, 0);
    }
    // A file with one bad kind declares none of its kinds.
    let mut kinds = git_kinds();
    kinds[2]["schema"]["properties"]["head"]["format"] = json!("sha");
    let file = std::env::temp_dir().join(format!("kinds-{}.json", rand::random::<u64>()));
    std::fs::write(&file, json!({ "kinds": kinds }).to_string()).unwrap();
    let out = run(&db.url, &["kinds", "add", "--file", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    assert!(
        text(&out.stderr).contains("kind \"updated\": $.head: \"format\""),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(count_kinds(&db).await, 0);
}

/// emit() in a transaction with strict mode (`watchpump.settings.strict_kinds`)
/// on or off, and the emitter's own session setting the other way: only
/// watchpump's setting counts (a producer's session cannot weaken it).
async fn emit_with(db: &TestDb, strict: &str, kind: &str, payload: Value) -> sqlx::Result<i64> {
    sqlx::query("update watchpump.settings set strict_kinds = $1")
        .bind(strict == "on")
        .execute(&db.pool)
        .await?;
    let mut tx = db.pool.begin().await?;
    sqlx::query("select set_config('watchpump.strict_kinds', $1, true)")
        .bind(if strict == "on" { "off" } else { "on" })
        .execute(&mut *tx)
        .await?;
    let id = watchpump::emit(&mut tx, "acme/web/refs/heads/main", kind, &payload)
        .await
        .map_err(|e| match e {
            watchpump::Error::Database(e) => e,
            e => panic!("{e}"),
        })?;
    tx.commit().await?;
    Ok(id)
}

fn sqlstate(e: &sqlx::Error) -> (String, String) {
    let d = e.as_database_error().expect("a database error");
    (d.code().unwrap().to_string(), d.message().to_string())
}

#[tokio::test]
async fn strict_mode_refuses_undeclared_kinds_and_misfit_payloads_and_only_when_on() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    for kind in git_kinds() {
        let new: watchpump::kinds::NewKind = serde_json::from_value(kind).unwrap();
        watchpump::kinds::add(&db.pool, &new).await.unwrap();
    }
    let push = json!({"after": "9f2c1e", "paths": ["src/main.rs"]});

    // Off (unset, or anything but on): nothing is checked.
    for strict in ["", "off"] {
        emit_with(&db, strict, "force-push", json!({"x": 1}))
            .await
            .unwrap();
        emit_with(&db, strict, "push", json!({"after": 7}))
            .await
            .unwrap();
    }
    let before: i64 = sqlx::query_scalar("select count(*) from watchpump.changes")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(before, 4);

    // On: what fits goes through; the rest is refused, naming the kind.
    emit_with(&db, "on", "push", push.clone()).await.unwrap();
    emit_with(&db, "on", "closed", json!({})).await.unwrap();
    let undeclared = emit_with(&db, "on", "force-push", json!({}))
        .await
        .unwrap_err();
    let (code, message) = sqlstate(&undeclared);
    assert_eq!(code, "22023");
    assert!(
        message.contains("kind \"force-push\" is not declared"),
        "{message}"
    );
    for (payload, says) in [
        (
            json!({"paths": []}),
            "required property \"after\" is missing",
        ),
        (
            json!({"after": 7, "paths": []}),
            "$.after: expected string, got number",
        ),
        (
            json!({"after": "a", "paths": ["ok", {"no": 1}]}),
            "$.paths[1]: expected string, got object",
        ),
    ] {
        let e = emit_with(&db, "on", "push", payload).await.unwrap_err();
        let (code, message) = sqlstate(&e);
        assert_eq!(code, "23514");
        assert!(message.contains("kind \"push\""), "{message}");
        assert!(message.contains(says), "{message}");
    }
    let after: i64 = sqlx::query_scalar("select count(*) from watchpump.changes")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, before + 2, "a refused change leaves nothing behind");

    // watchpump's own setting, seen by the CLI's new connection too.
    sqlx::query("update watchpump.settings set strict_kinds = true")
        .execute(&db.pool)
        .await
        .unwrap();
    let out = run(
        &db.url,
        &[
            "emit",
            "acme/web/refs/heads/main",
            "push",
            r#"{"after": 1}"#,
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(
            "the payload does not fit the schema of kind \"push\": $: required property \"paths\" is missing"
        ),
        "{}",
        text(&out.stderr)
    );
    let ok = run(
        &db.url,
        &[
            "emit",
            "acme/web/refs/heads/main",
            "push",
            &push.to_string(),
        ],
    );
    assert!(ok.status.success(), "{}", text(&ok.stderr));
}
