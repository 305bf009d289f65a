//! Fair shares of an object's fan-out budget (issue 34, item 2;
//! `src/watches/fanout.rs`): one service holds at most half of what the
//! watches covering an object may cost, so that the others still get
//! theirs; a refusal says how much the caller holds and how much the others
//! do; the operator sees the budget per top segment and raises it
//! (`watchpump fanout`). Through the real watches API and the real CLI.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use watchpump::watches::{Filters, NewWatch};

const OBJECT: &str = "acme/web/refs/heads/main";

impl WatchesApi {
    async fn post(&self, token: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(self.url("/api/v1/watches"))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

/// Filters of cost 12 and 11 (`$.x == "..."` costs 1 per comparison).
fn filter_of_cost(n: usize, tag: &str) -> String {
    (0..n)
        .map(|i| format!("$.{tag}{i} == {i}"))
        .collect::<Vec<_>>()
        .join(" || ")
}

/// What the finding's greedy service did, through the library's create
/// (the same checks as the API, without its rate limit, so that it can make
/// hundreds of watches quickly): two dear filters on the object, then
/// unfiltered watches on the object and on each of its prefixes until none
/// is accepted. Returns how many watches it got.
async fn take_all_it_can(db: &TestDb, service_id: i64) -> usize {
    let mut got = 0;
    let filtered = [
        (filter_of_cost(12, "a"), OBJECT),
        (filter_of_cost(11, "b"), OBJECT),
    ];
    for (i, (filter, object)) in filtered.iter().enumerate() {
        let new = NewWatch {
            resource: format!("f{i}"),
            object: object.to_string(),
            filters: Filters {
                kinds: None,
                match_path: Some(filter.clone()),
            },
            resync: false,
        };
        if watchpump::watches::create(&db.pool, service_id, &new)
            .await
            .is_ok()
        {
            got += 1;
        }
    }
    for object in ["acme/", "acme/web/", OBJECT] {
        for i in 0..300 {
            let new = NewWatch {
                resource: format!("r{i}"),
                object: object.to_string(),
                filters: Filters::default(),
                resync: false,
            };
            match watchpump::watches::create(&db.pool, service_id, &new).await {
                Ok(_) => got += 1,
                Err(watchpump::Error::Invalid(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    got
}

#[tokio::test]
async fn one_service_holds_at_most_half_of_an_objects_budget_and_the_others_still_get_theirs() {
    let api = WatchesApi::start().await;
    take_all_it_can(&api.db, api.deploy.id).await;

    // Every other service still gets watches on the object and on each of
    // its prefixes (before issue 34 each of these was a 422: the greedy
    // service held all 1,200 units).
    for object in ["acme/", "acme/web/", OBJECT] {
        let (status, body) = api
            .post(&api.docs_token, json!({"resource": "d", "object": object}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{object}: {body}");
    }

    // The greedy service is told it holds its share, in figures.
    let (status, body) = api
        .post(
            &api.deploy_token,
            json!({"resource": "more", "object": "acme/"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let text = body["error"]["message"].as_str().unwrap().to_string();
    assert!(
        text.contains("this service already holds 600 units")
            && text.contains("may hold at most 600")
            && text.contains("half of the budget of 1200"),
        "{text}"
    );
}

#[tokio::test]
async fn a_full_budget_tells_the_caller_what_it_holds_and_what_the_others_hold_and_the_operator_raises_it(
) {
    let api = WatchesApi::start().await;
    let (preview, _) = api.db.add_service("preview", "http://127.0.0.1:9").await;
    take_all_it_can(&api.db, api.deploy.id).await;
    let (status, _) = api
        .post(&api.docs_token, json!({"resource": "d", "object": OBJECT}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    take_all_it_can(&api.db, preview.id).await;

    // Full: deploy 600, preview the 599 left, docs 1.
    let (status, body) = api
        .post(&api.docs_token, json!({"resource": "d2", "object": OBJECT}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let text = body["error"]["message"].as_str().unwrap().to_string();
    assert!(
        text.contains("this service holds 1 of them and 2 other services hold 1199")
            && text.contains("at most 1200")
            && text.contains("raise the budget of acme/"),
        "{text}"
    );
    assert!(
        !text.contains("fewer"),
        "the victim is not told to use fewer filters: {text}"
    );

    // The operator sees the budget of the top segment, who holds what, and
    // raises it.
    let cli = |args: &[&str]| {
        let out = watchpump_cli(Some(&api.db.url))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = cli(&["fanout", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let acme = listed["top_segments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["top_segment"] == "acme/")
        .expect("acme/ is listed")
        .clone();
    assert_eq!(acme["budget"], 1200, "{acme}");
    assert_eq!(acme["share"], 600, "{acme}");
    assert_eq!(acme["units"], 1200, "{acme}");
    assert_eq!(acme["worst_object"], OBJECT, "{acme}");
    let held: Vec<(String, i64)> = acme["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["service"].as_str().unwrap().to_string(),
                s["units"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        held,
        vec![
            ("deploy".to_string(), 600),
            ("preview".to_string(), 599),
            ("docs".to_string(), 1)
        ]
    );
    let (code, out, _) = cli(&["fanout", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains("acme/") && out.contains("1200"), "{out}");

    let (code, out, err) = cli(&["fanout", "set-budget", "acme/", "2400"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2400"), "{out}");
    let (status, body) = api
        .post(&api.docs_token, json!({"resource": "d2", "object": OBJECT}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Another top segment keeps the default.
    let budget: i32 = sqlx::query_scalar("select watchpump.fanout_budget('other/')")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(budget, 1200);

    // Bad input changes nothing.
    for args in [
        &["fanout", "set-budget", "acme/", "0"][..],
        &["fanout", "set-budget", "acme/web/", "10"],
        &["fanout", "set-budget", "acme/", "lots"],
    ] {
        let (code, _, err) = cli(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(!err.trim().is_empty(), "{args:?}");
    }
    let (code, out, err) = cli(&["fanout", "set-budget", "acme/", "default"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1200"), "{out}");
}
