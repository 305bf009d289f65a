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
        (
            // 14 KB of text, three times that as jsonb.
            json!({"type": "object", "properties": {"n": {"enum": (0..3000).collect::<Vec<_>>()}}}),
            json!({"n": 1}),
            "takes more than 16384 bytes as PostgreSQL stores it",
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

/// Units of work (nodes visited, keys and required names looked up) that
/// strict mode's check spends on `payload` against `schema`.
async fn units(db: &TestDb, schema: &Value, payload: &Value) -> i32 {
    sqlx::query_scalar(
        "select watchpump.kind_max_visits()
                - watchpump.kind_walk(watchpump.kind_compile($1), '{}', $2, '$', watchpump.kind_max_visits(), 'k')",
    )
    .bind(schema)
    .bind(payload)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// An `enum` is a set looked up by key, with JSON's equality (1 and 1.0
/// are one value, the string "1" another), so a value costs the same
/// against 3 members as against 3,000: before, each value scanned the list.
#[tokio::test]
async fn an_enum_is_a_set_so_a_value_costs_the_same_whatever_its_size() {
    let db = TestDb::new().await;
    let with = |members: Vec<Value>| {
        json!({"type": "object", "properties": {
            "labels": {"type": "array", "items": {"enum": members}},
            "state": {"enum": ["open", 1, true, null]}}})
    };
    let small = with(vec![json!("bug"), json!("docs"), json!(7)]);
    let mut many: Vec<Value> = (0..3000).map(|i| json!(format!("label-{i}"))).collect();
    many.extend([json!("bug"), json!("docs"), json!(7)]);
    let large = with(many);
    assert!(
        large.to_string().len() > watchpump::kinds::MAX_SCHEMA_BYTES,
        "larger than the catalogue accepts"
    );

    // The compiled schema holds the set, keyed by value.
    let set: Value = sqlx::query_scalar(
        "select watchpump.kind_compile($1)->'properties'->'labels'->'items'->'$enum_set'",
    )
    .bind(&small)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(set, json!({"\"bug\"": true, "\"docs\"": true, "7": true}));

    let payload = json!({"labels": ["bug", 7.0, "docs", 7e0], "state": 1.0});
    for schema in [&small, &large] {
        let misfit: Option<String> =
            sqlx::query_scalar("select watchpump.kind_violation($1, $2, '$')")
                .bind(schema)
                .bind(&payload)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(misfit, None);
    }
    // The root, its 2 keys, the list, its 4 items, the state: 9 units either way.
    assert_eq!(units(&db, &small, &payload).await, 9);
    assert_eq!(units(&db, &large, &payload).await, 9);

    for (payload, says) in [
        (
            json!({"labels": ["bug", "7"]}),
            r#"$.labels[1]: "7" is not one of"#,
        ),
        (json!({"labels": [[7]]}), "$.labels[0]: [7] is not one of"),
        (json!({"state": "1"}), r#"$.state: "1" is not one of"#),
        (json!({"state": false}), "$.state: false is not one of"),
    ] {
        let misfit: Option<String> =
            sqlx::query_scalar("select watchpump.kind_violation($1, $2, '$')")
                .bind(&small)
                .bind(&payload)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        let misfit = misfit.unwrap_or_default();
        assert!(misfit.starts_with(says), "{payload}: {misfit}");
    }
}

/// The costliest schema `kinds add` accepts, for strict mode's check:
/// eight levels of `properties` and `items` (the deepest look-ups), the
/// last with `additionalProperties` (so that each of its items is a visit
/// of its own, not a row of one statement over the list) and as large an
/// enum as the catalogue holds (a set look-up for every item): short
/// strings, which take the least room as text (the CLI's limit) and as
/// jsonb (the table's).
async fn costliest_schema(db: &TestDb) -> Value {
    let schema = |members: usize| {
        let mut node = json!({"type": ["string", "object"], "additionalProperties": false,
            "enum": (0..members).map(|i| i.to_string()).collect::<Vec<_>>()});
        for _ in 0..7 {
            node = json!({"type": "array", "items": node});
        }
        json!({"type": "object", "required": ["a"], "properties": {"a": node}})
    };
    let mut fits = 1;
    let mut too_many = 16_384;
    while too_many - fits > 1 {
        let members = (fits + too_many) / 2;
        let candidate = schema(members);
        let stored: i32 = sqlx::query_scalar("select pg_column_size($1::jsonb)")
            .bind(&candidate)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if watchpump::kinds::check_schema(&candidate).is_ok() && stored <= 16_384 {
            fits = members;
        } else {
            too_many = members;
        }
    }
    schema(fits)
}

/// `{"a": [[[[[[["0", "0", ...]]]]]]]}` with `n` items.
fn nested_list(n: usize) -> Value {
    let mut node = json!(vec!["0"; n]);
    for _ in 0..6 {
        node = json!([node]);
    }
    json!({ "a": node })
}

/// Strict mode's cost is bounded by its work, not by the payload's bytes:
/// a 1 MiB payload (209,705 short strings, the most that fit) against the
/// costliest schema the catalogue accepts stops at the work cap with
/// SQLSTATE 54000, and refuses nothing else; below the cap, a check
/// costs exactly the nodes it visits. Measured on the shared 2-core test
/// machine (PostgreSQL 15, load average about 3): the refused emit() took
/// 0.95-0.98 s, payload sent included, three runs; before the cap and the
/// enum's set, one 16 KB enum on 100,000 paths took 46.5 s. The test
/// asserts the outcome and the work count, not the time.
#[tokio::test]
async fn a_1_mib_payload_against_the_costliest_schema_stops_at_the_work_cap() {
    let db = TestDb::new().await;
    let cap: i32 = sqlx::query_scalar("select watchpump.kind_max_visits()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(cap, watchpump::kinds::MAX_CHECK_UNITS, "SQL and Rust agree");

    let schema = costliest_schema(&db).await;
    let new = watchpump::kinds::NewKind {
        name: "costly".into(),
        description: String::new(),
        schema: schema.clone(),
        example: nested_list(1),
    };
    watchpump::kinds::add(&db.pool, &new)
        .await
        .expect("the catalogue accepts it");

    // Below the cap the work is what the check looks at: the root, its
    // required name, its key, 7 lists and the items.
    let within = nested_list(1000);
    assert_eq!(units(&db, &schema, &within).await, 1 + 1 + 1 + 7 + 1000);
    emit_with(&db, "on", "costly", within).await.unwrap();

    // 1 MiB of JSON text, as emit() counts it (`"0", ` an item).
    let n = (1 << 20) / 5 - 10;
    let payload = nested_list(n);
    let bytes: i32 = sqlx::query_scalar("select octet_length($1::jsonb::text)")
        .bind(&payload)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(bytes <= 1 << 20 && bytes > (1 << 20) - 64, "{bytes} bytes");
    let started = std::time::Instant::now();
    let refused = emit_with(&db, "on", "costly", payload).await.unwrap_err();
    println!("refused after {:?}", started.elapsed());
    let (code, message) = sqlstate(&refused);
    assert_eq!(code, "54000", "{message}");
    assert!(
        message.contains(r#"the payload of kind "costly""#),
        "{message}"
    );
    assert!(
        message.contains(&format!("more than {cap} units")),
        "{message}"
    );
    let changes: i64 = sqlx::query_scalar("select count(*) from watchpump.changes")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(changes, 1, "only the payload within the cap was recorded");
}

/// The finding of issue 34: a 1,900-value enum on the items of a list of
/// 100,000 paths took one emit() 46.5 s in strict mode. Such a payload is
/// within the cap, and checked in one statement over the list: its emit()
/// took 0.14-0.16 s here (three runs, same machine as above).
#[tokio::test]
async fn a_large_enum_on_100_000_paths_is_checked_within_the_cap() {
    let db = TestDb::new().await;
    let files: Vec<String> = (0..1900).map(|i| format!("f{i}")).collect();
    let schema = json!({"type": "object", "properties": {
        "paths": {"type": "array", "items": {"type": "string", "enum": files}}}});
    let paths: Vec<&String> = (0..100_000).map(|i| &files[i % files.len()]).collect();
    let payload = json!({ "paths": paths });
    assert_eq!(units(&db, &schema, &payload).await, 1 + 1 + 1 + 100_000);
    let new = watchpump::kinds::NewKind {
        name: "push".into(),
        description: String::new(),
        schema,
        example: json!({"paths": ["f1"]}),
    };
    watchpump::kinds::add(&db.pool, &new).await.unwrap();
    let started = std::time::Instant::now();
    emit_with(&db, "on", "push", payload).await.unwrap();
    println!("accepted after {:?}", started.elapsed());
    let e = emit_with(&db, "on", "push", json!({"paths": ["f1", "README.md"]}))
        .await
        .unwrap_err();
    let (code, message) = sqlstate(&e);
    assert_eq!(code, "23514");
    assert!(
        message.contains(r#"$.paths[1]: "README.md" is not one of"#),
        "{message}"
    );
}
