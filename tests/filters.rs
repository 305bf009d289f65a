//! Issue 9, "a consumer cannot hurt the producer": what a consumer may put
//! in a watch, through the real API on loopback against a real PostgreSQL.
//! Filters outside the safe language and filters over the per-object cap
//! are refused and change nothing; accepted filters deliver as before;
//! names with invisible characters are refused; `watchpump migrate` reports
//! the filters stored before the language existed.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use watchpump::watches::cap::MAX_FILTER_COST_PER_OBJECT;
use watchpump::watches::filter::MAX_COST;

const MAIN: &str = "acme/web/refs/heads/main";

/// The calls these tests make.
impl WatchesApi {
    /// `POST /api/v1/watches`; the status and the body.
    async fn create(&self, token: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}/api/v1/watches", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json().await.unwrap())
    }

    /// A watch that must be created; its id.
    async fn created(&self, token: &str, resource: &str, object: &str, filter: &str) -> i64 {
        let body = json!({"resource": resource, "object": object, "filters": {"match": filter}});
        let (status, body) = self.create(token, body).await;
        assert_eq!(status, StatusCode::CREATED, "{filter}: {body}");
        body["id"].as_i64().unwrap()
    }

    /// A watch that must be refused with 422; the message.
    async fn refused(&self, token: &str, body: Value) -> String {
        let (status, answer) = self.create(token, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid", "{answer}");
        answer["error"]["message"].as_str().unwrap().to_string()
    }

    async fn is_predicate(&self, watch_id: i64) -> Option<bool> {
        sqlx::query_scalar("select match_is_predicate from watchpump.watches where id = $1")
            .bind(watch_id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// Emits and returns the watches the change was delivered to.
    async fn delivered_to(&self, object: &str, payload: Value) -> Vec<i64> {
        let change = self.db.emit(object, "push", payload).await;
        watches_of_change(&self.db, change).await
    }
}

fn watch(resource: &str, object: &str, filter: &str) -> Value {
    json!({"resource": resource, "object": object, "filters": {"match": filter}})
}

/// A payload of `n` paths, none of them under `docs/`.
fn paths(n: usize) -> Value {
    let paths: Vec<String> = (0..n)
        .map(|i| format!("src/module_{i}/file_{i}.rs"))
        .collect();
    json!({"forced": false, "paths": paths})
}

#[tokio::test]
async fn the_filter_that_took_seconds_and_gigabytes_is_refused_and_changes_nothing() {
    let api = WatchesApi::start().await;
    let before = api.db.snapshot().await;
    let evil = r#"$.paths[*] ? (exists($.paths[*] ? (exists($.paths[*] ? (@ == "zzz")))))"#;
    let message = api
        .refused(&api.deploy_token, watch("app", "acme/web/", evil))
        .await;
    assert!(
        message.starts_with("filters.match: `$` is not allowed inside a filter"),
        "{message}"
    );
    // The same with `@`, and the shapes that stay quadratic, are refused too.
    for (filter, says) in [
        (
            r#"$.paths[*] ? (exists(@.paths[*] ? (@ == "zzz")))"#,
            "nested filters",
        ),
        (r#"$.paths[*] ? (@ == $.ref)"#, "`$` is not allowed inside"),
        ("$.paths[*] == $.paths[*]", "comparing two paths"),
        (
            r#"$.a like_regex "(.*){64}Q""#,
            "repetition `{64}` is too large",
        ),
        (
            r#"$.a like_regex ".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*Q""#,
            "(18 atoms; at most 16)",
        ),
    ] {
        let message = api
            .refused(&api.deploy_token, watch("app", "acme/web/", filter))
            .await;
        assert!(message.contains(says), "{filter}: {message}");
    }
    assert_eq!(api.db.snapshot().await, before, "nothing changed");
}

#[tokio::test]
async fn predicates_the_old_probe_called_paths_are_refused_or_classified_right() {
    let api = WatchesApi::start().await;
    let before = api.db.snapshot().await;
    for (filter, says) in [
        ("$.** == 1", "`.**`"),
        ("$.a / 0 == 1", "arithmetic (`/`)"),
        ("strict $.a.b == 1", "`strict` mode is not allowed"),
    ] {
        let message = api
            .refused(&api.deploy_token, watch("app", "acme/web/", filter))
            .await;
        assert!(message.contains(says), "{filter}: {message}");
    }
    assert_eq!(api.db.snapshot().await, before, "nothing changed");

    // `$ == 1` is a predicate: the probe on '{}' found it unknown, stored it
    // as a path, and it then matched every change.
    let root = api.created(&api.deploy_token, "root", MAIN, "$ == 1").await;
    assert_eq!(api.is_predicate(root).await, Some(true));
    assert_eq!(
        api.delivered_to(MAIN, json!({"a": 1})).await,
        Vec::<i64>::new()
    );
    let path = api
        .created(&api.deploy_token, "path", MAIN, "$.pull_request")
        .await;
    assert_eq!(api.is_predicate(path).await, Some(false));
}

#[tokio::test]
async fn accepted_filters_still_deliver_as_before_on_small_and_large_payloads() {
    let api = WatchesApi::start().await;
    let docs = r#"$.paths[*] ? (@ starts with "docs/")"#;
    let forced = api
        .created(&api.deploy_token, "forced", MAIN, "$.forced == true")
        .await;
    let deploy_docs = api
        .created(&api.deploy_token, "docs", "acme/web/", docs)
        .await;
    // The same filter in another service: above 8 KiB of payload emit()
    // evaluates it once for both.
    let site_docs = api.created(&api.docs_token, "site", "acme/", docs).await;
    let rust = api
        .created(
            &api.docs_token,
            "rust",
            MAIN,
            r#"$.paths[*] ? (@ like_regex "\\.rs$")"#,
        )
        .await;
    for size in [3, 2_000] {
        let mut payload = paths(size);
        assert_eq!(
            api.delivered_to(MAIN, payload.clone()).await,
            vec![rust],
            "{size} paths"
        );
        payload["paths"][size - 1] = json!("docs/index.md");
        payload["forced"] = json!(true);
        assert_eq!(
            api.delivered_to(MAIN, payload.clone()).await,
            vec![forced, deploy_docs, site_docs, rust],
            "{size} paths"
        );
        payload["forced"] = json!("yes");
        assert_eq!(
            api.delivered_to("acme/api/refs/heads/main", payload).await,
            vec![site_docs],
            "{size} paths"
        );
    }
}

#[tokio::test]
async fn the_per_object_cap_refuses_the_filtered_watch_over_it_and_nothing_else() {
    let api = WatchesApi::start().await;
    let t = &api.deploy_token;
    let cap = MAX_FILTER_COST_PER_OBJECT as usize;
    // Two units each on the prefix, one unit each on the object: the cap.
    let mut on_main = Vec::new();
    for i in 0..4 {
        let filter = format!(r#"$.ref == "r{i}" && $.forced == true"#);
        api.created(t, &format!("p{i}"), "acme/web/", &filter).await;
    }
    for i in 0..cap - 8 {
        let filter = format!(r#"$.paths[*] ? (@ starts with "app{i}/")"#);
        on_main.push(api.created(t, &format!("m{i}"), MAIN, &filter).await);
    }
    let before = api.db.snapshot().await;
    let one_more = watch("m-last", MAIN, r#"$.paths[*] ? (@ == "x")"#);
    let message = api.refused(t, one_more.clone()).await;
    assert!(
        message.contains(&format!("may cost at most {cap} units"))
            && message.contains(&format!("already cost {cap}"))
            && message.contains("this filter costs 1"),
        "{message}"
    );
    // A prefix above counts everything under it.
    let message = api
        .refused(t, watch("all", "acme/", "$.forced == true"))
        .await;
    assert!(message.contains("or under it"), "{message}");
    assert_eq!(api.db.snapshot().await, before, "nothing changed");

    // Without a filter, on a sibling, or for another service: allowed.
    let (status, _) = api
        .create(t, json!({"resource": "plain", "object": MAIN}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    api.created(t, "dev", "acme/web/refs/heads/dev", "$.forced == true")
        .await;
    api.created(&api.docs_token, "site", MAIN, "$.forced == true")
        .await;
    // Removing one makes room again.
    let resp = api
        .http
        .delete(format!("{}/api/v1/watches/{}", api.base, on_main[0]))
        .bearer_auth(t)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let (status, body) = api.create(t, one_more).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn the_cap_counts_what_filters_cost_not_how_many_there_are() {
    let api = WatchesApi::start().await;
    let t = &api.deploy_token;
    let object = "acme/api/refs/heads/main";
    // The most one filter may cost: a like_regex of weight 12 and 4 more.
    let dear = r#"$.a like_regex "[a-c]{12}" || $.b == 1 || $.c == 2 || $.d == 3 || $.e == 4"#;
    api.created(t, "dear", object, dear).await;
    let room = (MAX_FILTER_COST_PER_OBJECT - MAX_COST) as usize;
    for i in 0..room {
        api.created(t, &format!("cheap{i}"), object, &format!("$.n == {i}"))
            .await;
    }
    let message = api.refused(t, watch("over", object, "$.n == -1")).await;
    assert!(message.contains("this filter costs 1"), "{message}");
    let over = format!(r#"{dear} || $.j == 9"#);
    let message = api.refused(t, watch("x", "acme/other/", &over)).await;
    assert!(
        message.contains(&format!(
            "the filter costs {} units; at most {MAX_COST}",
            MAX_COST + 1
        )),
        "{message}"
    );
}

#[tokio::test]
async fn names_with_invisible_or_direction_characters_are_refused() {
    let api = WatchesApi::start().await;
    let before = api.db.snapshot().await;
    let invisible = [
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}', '\u{200B}', '\u{200C}',
        '\u{200D}', '\u{2060}', '\u{FEFF}',
    ];
    for c in invisible {
        let code = format!("U+{:04X}", c as u32);
        let resource = format!("app{c}gpj.exe");
        let message = api
            .refused(
                &api.deploy_token,
                json!({"resource": resource, "object": "acme/web/"}),
            )
            .await;
        assert!(
            message.starts_with("resource must not contain invisible or text-direction")
                && message.contains(&code),
            "{code}: {message}"
        );
        let object = format!("acme/{c}web/");
        let message = api
            .refused(
                &api.deploy_token,
                json!({"resource": "app", "object": object}),
            )
            .await;
        assert!(message.starts_with("object must not"), "{code}: {message}");
    }
    assert_eq!(api.db.snapshot().await, before, "nothing changed");
    // Ordinary non-ASCII names are fine.
    let (status, body) = api
        .create(
            &api.deploy_token,
            json!({"resource": "café-prod", "object": "acme/web/"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn migrate_reports_stored_filters_outside_the_language_and_keeps_them_working() {
    let api = WatchesApi::start().await;
    let evil = r#"$.paths[*] ? (exists($.paths[*] ? (@ == "zzz")))"#;
    // As a watch created before the parser existed would be stored.
    let evil_id: i64 = sqlx::query_scalar(
        "insert into watchpump.watches (service_id, resource, object, match_path, match_is_predicate, filters)
         values ($1, 'old', 'acme/web/', $2::jsonpath, watchpump.jsonpath_is_predicate($2::jsonpath),
                 jsonb_build_object('match', $2::text))
         returning id",
    )
    .bind(api.deploy.id)
    .bind(evil)
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    let root_id: i64 = sqlx::query_scalar(
        "insert into watchpump.watches (service_id, resource, object, match_path, match_is_predicate, filters)
         values ($1, 'root', 'acme/web/', '$ == 1', watchpump.jsonpath_is_predicate('$ == 1'), '{}')
         returning id",
    )
    .bind(api.deploy.id)
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        api.is_predicate(root_id).await,
        Some(false),
        "the old probe"
    );

    let out = watchpump_cli(Some(&api.db.url))
        .arg("migrate")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.starts_with(&format!("warning: watch {evil_id} ")))
        .unwrap_or_else(|| panic!("no warning for watch {evil_id}: {stderr}"));
    assert!(
        warning.contains("of service deploy")
            && warning.contains("outside the allowed language")
            && warning.contains("keeps working")
            && warning.contains("`$` is not allowed inside a filter"),
        "{warning}"
    );
    let warning = stderr
        .lines()
        .find(|l| l.starts_with(&format!("warning: watch {root_id} ")))
        .unwrap_or_else(|| panic!("no warning for watch {root_id}: {stderr}"));
    assert!(
        warning.contains("is a predicate but was stored as a path"),
        "{warning}"
    );

    // Kept working, and the predicate now evaluated as one.
    assert_eq!(api.is_predicate(root_id).await, Some(true));
    assert_eq!(
        api.delivered_to(MAIN, json!({"paths": ["zzz"]})).await,
        vec![evil_id]
    );
    assert_eq!(
        api.delivered_to(MAIN, json!({"paths": ["a"]})).await,
        Vec::<i64>::new()
    );
}
