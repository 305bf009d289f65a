//! `GET /api/v1/openapi.json` (issue 20): served without a token, naming
//! every route the API and the admin API mount (read from the routers'
//! source, and each described route answered by the real server), and
//! real answers fitting its schemas (checked by `watchpump.kind_violation()`,
//! the JSON Schema subset the kinds use, after `$ref`s are resolved).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Map, Value};

/// The routers whose routes the description must hold.
const ROUTERS: [&str; 7] = [
    "src/api/mod.rs",
    "src/operator/admin.rs",
    "src/resources/deliveries/mod.rs",
    "src/resources/watches/mod.rs",
    "src/resources/services/mod.rs",
    "src/resources/rate.rs",
    "src/resources/kinds.rs",
];

/// (method, path) of every `.route("PATH", METHOD(...)...)` in `source`.
fn mounted(source: &str) -> Vec<(String, String)> {
    let mut routes = Vec::new();
    for chunk in source.split(".route(").skip(1) {
        let end = [
            ".route(",
            ".layer(",
            ".fallback(",
            ".with_state(",
            ".merge(",
        ]
        .iter()
        .filter_map(|m| chunk.find(m))
        .min()
        .unwrap_or(chunk.len());
        let chunk = &chunk[..end];
        let path = chunk.split('"').nth(1).expect("a path literal").to_string();
        for method in ["get", "post", "put", "delete"] {
            let called = chunk.match_indices(&format!("{method}(")).any(|(i, _)| {
                i == 0
                    || !chunk.as_bytes()[i - 1].is_ascii_alphanumeric()
                        && chunk.as_bytes()[i - 1] != b'_'
            });
            if called {
                routes.push((method.to_string(), path.clone()));
            }
        }
    }
    routes
}

/// The description as generated from the handlers (`api::openapi::ApiDoc`),
/// the text the server serves.
fn spec() -> Value {
    serde_json::from_str(&watchpump::api::openapi::SPEC).expect("the description is JSON")
}

#[tokio::test]
async fn the_description_is_served_without_a_token_and_holds_every_mounted_route() {
    let db = TestDb::new().await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let resp = reqwest::get(server.url("/api/v1/openapi.json"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let served: Value = resp.json().await.unwrap();
    assert_eq!(served["openapi"], "3.1.0");
    let spec = spec();
    assert_eq!(served, spec);

    let mut described = BTreeSet::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            described.insert((method.clone(), path.clone()));
        }
    }
    let mut all_mounted = BTreeSet::new();
    for file in ROUTERS {
        let source =
            std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        // A resource's file mounts its panel routes too: pages, not API.
        let routes: Vec<_> = mounted(&source)
            .into_iter()
            .filter(|(_, path)| !path.starts_with("/panel"))
            .collect();
        assert!(!routes.is_empty(), "no routes read from {file}");
        all_mounted.extend(routes);
    }
    let missing: Vec<_> = all_mounted.difference(&described).collect();
    assert!(missing.is_empty(), "mounted but not described: {missing:?}");

    // Every described route is answered by the server, not by its
    // fallbacks (404 "no such endpoint", 405).
    let http = reqwest::Client::new();
    for (method, path) in &described {
        let url = server.url(&path.replace("{id}", "1").replace("{name}", "nobody"));
        let resp = http
            .request(method.to_uppercase().parse::<Method>().unwrap(), url)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(
            !text.contains("no such endpoint"),
            "{method} {path} is not mounted: {text}"
        );
    }
}

/// `schema` with every `$ref` replaced by its component and every `allOf`
/// merged into its parent: the subset `kind_violation()` reads.
fn resolve(schema: &Value, components: &Map<String, Value>) -> Value {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                let name = r.rsplit('/').next().unwrap();
                return resolve(&components[name], components);
            }
            let mut out = Map::new();
            for (k, v) in map {
                if k == "allOf" || k == "format" {
                    continue;
                }
                out.insert(k.clone(), resolve(v, components));
            }
            for part in map
                .get("allOf")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let part = resolve(part, components);
                for (k, v) in part.as_object().unwrap() {
                    match (k.as_str(), out.get_mut(k)) {
                        ("properties", Some(Value::Object(mine))) => {
                            for (p, s) in v.as_object().unwrap() {
                                mine.entry(p.clone()).or_insert(s.clone());
                            }
                        }
                        ("required", Some(Value::Array(mine))) => {
                            mine.extend(v.as_array().unwrap().iter().cloned())
                        }
                        (_, Some(_)) => {}
                        (_, None) => {
                            out.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| resolve(v, components)).collect()),
        other => other.clone(),
    }
}

struct Checker {
    spec: Value,
    pool: sqlx::PgPool,
    http: reqwest::Client,
    server: AppServer,
    checked: usize,
}

impl Checker {
    /// Calls the server and checks the answer against the description of
    /// `template` (the path as described), `method` and the status got.
    async fn check(
        &mut self,
        method: Method,
        template: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Value {
        let mut req = self
            .http
            .request(method.clone(), self.server.url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let op = &self.spec["paths"][template][method.as_str().to_lowercase()];
        let described = &op["responses"][status.as_str()];
        assert!(
            described.is_object(),
            "{method} {path}: {status} is not described ({text})"
        );
        let Some(schema) = described["content"]["application/json"]["schema"].as_object() else {
            assert!(
                text.is_empty(),
                "{method} {path}: a body where none is described"
            );
            return Value::Null;
        };
        let components = self.spec["components"]["schemas"].as_object().unwrap();
        let schema = resolve(&Value::Object(schema.clone()), components);
        let answer: Value = serde_json::from_str(&text).unwrap();
        let violation: Option<String> =
            sqlx::query_scalar("select watchpump.kind_violation($1, $2, '$')")
                .bind(&schema)
                .bind(&answer)
                .fetch_one(&self.pool)
                .await
                .unwrap();
        assert_eq!(violation, None, "{method} {path} {status}: {answer}");
        self.checked += 1;
        answer
    }
}

#[tokio::test]
async fn real_answers_fit_the_described_schemas() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, token) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_service("docs", "http://127.0.0.1:9").await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let _pump = RunningPump::start(&db.pool, pump_config());
    let mut c = Checker {
        spec: spec(),
        pool: db.pool.clone(),
        http: reqwest::Client::new(),
        server,
        checked: 0,
    };
    let t = token.as_str();
    let a = ADMIN_TOKEN;

    let watch = c
        .check(
            Method::POST,
            "/api/v1/watches",
            "/api/v1/watches",
            t,
            Some(json!({"resource": "app", "object": "acme/", "filters": {"kinds": ["push"]}})),
        )
        .await;
    let id = watch["id"].as_i64().unwrap();
    let change = db.emit("acme/web", "push", json!({"n": 1})).await;
    let delivery = delivery_of(&db, change).await;
    db.wait_state(delivery, "delivered", Duration::from_secs(20))
        .await;

    let w = format!("/api/v1/watches/{id}");
    let d = format!("/api/v1/deliveries/{delivery}");
    c.check(Method::GET, "/api/v1/watches", "/api/v1/watches", t, None)
        .await;
    c.check(Method::GET, "/api/v1/watches/{id}", &w, t, None)
        .await;
    c.check(
        Method::GET,
        "/api/v1/watches/{id}",
        "/api/v1/watches/999999",
        t,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/deliveries",
        "/api/v1/deliveries?limit=5",
        t,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/deliveries",
        "/api/v1/deliveries?limit=0",
        t,
        None,
    )
    .await;
    c.check(Method::GET, "/api/v1/deliveries/{id}", &d, t, None)
        .await;
    c.check(
        Method::POST,
        "/api/v1/deliveries/{id}/redeliver",
        &format!("{d}/redeliver"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/deliveries/{id}/redeliver",
        &format!("{d}/redeliver"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/watches/{id}/ping",
        &format!("{w}/ping"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/watches/{id}/ping",
        &format!("{w}/ping"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/watches/{id}/pause",
        &format!("{w}/pause"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/watches/{id}/resume",
        &format!("{w}/resume"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/watches/{id}/resync",
        &format!("{w}/resync"),
        t,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/watches/{id}/resync",
        "/api/v1/watches/999999/resync",
        t,
        None,
    )
    .await;
    let created = c
        .check(
            Method::POST,
            "/api/v1/watches",
            "/api/v1/watches",
            t,
            Some(json!({"resource": "app2", "object": "acme/", "resync": true})),
        )
        .await;
    assert_eq!(created["resync"]["watch_id"], created["id"]);
    c.check(
        Method::PUT,
        "/api/v1/rate",
        "/api/v1/rate",
        t,
        Some(json!({"rate": 20})),
    )
    .await;
    c.check(
        Method::PUT,
        "/api/v1/rate",
        "/api/v1/rate",
        t,
        Some(json!({"rate": 0})),
    )
    .await;
    c.check(Method::GET, "/api/v1/rate", "/api/v1/rate", t, None)
        .await;
    c.check(Method::DELETE, "/api/v1/rate", "/api/v1/rate", t, None)
        .await;
    c.check(
        Method::GET,
        "/api/v1/rate",
        "/api/v1/rate",
        "wps_1_00",
        None,
    )
    .await;
    c.check(Method::GET, "/api/v1/kinds", "/api/v1/kinds", t, None)
        .await;

    c.check(
        Method::GET,
        "/api/v1/admin/backlog",
        "/api/v1/admin/backlog",
        a,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/admin/deliveries",
        "/api/v1/admin/deliveries",
        a,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/admin/deliveries/{id}",
        &format!("/api/v1/admin/deliveries/{delivery}"),
        a,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/admin/deliveries/{id}/attempts",
        &format!("/api/v1/admin/deliveries/{delivery}/attempts"),
        a,
        None,
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/admin/deliveries/{id}/retry",
        &format!("/api/v1/admin/deliveries/{delivery}/retry"),
        a,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/admin/watches",
        "/api/v1/admin/watches",
        a,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/admin/warnings",
        "/api/v1/admin/warnings",
        a,
        None,
    )
    .await;
    c.check(
        Method::GET,
        "/api/v1/admin/services",
        "/api/v1/admin/services",
        a,
        None,
    )
    .await;
    c.check(
        Method::PUT,
        "/api/v1/admin/services/{name}/rate",
        "/api/v1/admin/services/deploy/rate",
        a,
        Some(json!({"rate": 50})),
    )
    .await;
    c.check(
        Method::PUT,
        "/api/v1/admin/services/{name}/rate",
        "/api/v1/admin/services/deploy/rate",
        a,
        Some(json!({"rate": -1})),
    )
    .await;
    c.check(
        Method::PUT,
        "/api/v1/admin/services/{name}/url",
        "/api/v1/admin/services/docs/url",
        a,
        Some(json!({"base_url": "http://127.0.0.1:10"})),
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/admin/services/{name}/rotate-token",
        "/api/v1/admin/services/docs/rotate-token",
        a,
        Some(json!({})),
    )
    .await;
    c.check(
        Method::POST,
        "/api/v1/admin/services/{name}/rotate-secret",
        "/api/v1/admin/services/docs/rotate-secret",
        a,
        Some(json!({})),
    )
    .await;
    c.check(Method::DELETE, "/api/v1/watches/{id}", &w, t, None)
        .await;
    let _ = deploy;
    println!("{} answers checked", c.checked);
}
