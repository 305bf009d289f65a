//! A NUL (`%00`) or bytes that are not UTF-8 (`%FF`) in a query parameter
//! or a path segment are the client's mistake: 400 with the API's JSON
//! error, or a page in the panel, never a 500 (PostgreSQL's `text` refuses
//! NUL) and never a silent U+FFFD.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::Value;

const BAD: [&str; 3] = ["%00", "x%00y", "%FF"];

/// `(method, path with {} where the bad text goes)` per front end.
const API: &[&str] = &[
    "/api/v1/watches?after={}",
    "/api/v1/watches?limit={}",
    "/api/v1/watches?include_removed={}",
    "/api/v1/watches/{}",
];
const ADMIN: &[&str] = &[
    "/api/v1/admin/deliveries?service={}",
    "/api/v1/admin/deliveries?object={}",
    "/api/v1/admin/deliveries?state={}",
    "/api/v1/admin/deliveries?since={}",
    "/api/v1/admin/watches?service={}",
    "/api/v1/admin/watches?resource={}",
    "/api/v1/admin/warnings?service={}",
    "/api/v1/admin/deliveries/{}",
];
const PANEL: &[&str] = &[
    "/panel/deliveries?service={}",
    "/panel/deliveries?object={}",
    "/panel/deliveries?state={}",
    "/panel/deliveries?since={}",
    "/panel/deliveries?before={}",
    "/panel/watches?service={}",
    "/panel/watches?show={}",
    "/panel/services/{}",
    "/panel/deliveries/1?done={}",
];

#[tokio::test]
async fn nul_and_non_utf8_in_queries_and_paths_are_400_everywhere() {
    let db = TestDb::new().await;
    let (_, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let server = AppServer::start(&db.pool, &operator_config()).await;
    let cookie = server.log_in().await;
    let http = reqwest::Client::new();

    for bad in BAD {
        for (paths, credential) in [(API, token.as_str()), (ADMIN, ADMIN_TOKEN)] {
            for path in paths {
                let path = path.replace("{}", bad);
                let resp = http
                    .get(server.url(&path))
                    .bearer_auth(credential)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "GET {path}");
                let body: Value = resp.json().await.unwrap();
                assert_eq!(body["error"]["code"], "bad_request", "GET {path}: {body}");
            }
        }
        for path in PANEL {
            let path = path.replace("{}", bad);
            let resp = http
                .get(server.url(&path))
                .header("cookie", &cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "GET {path}");
            let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
            assert!(
                content_type.starts_with("text/html"),
                "GET {path}: {content_type}"
            );
            let page = resp.text().await.unwrap();
            assert!(page.contains("Filters must be text"), "GET {path}: {page}");
        }
        // A path segment that reaches the database in a state-changing call.
        let path = format!("/api/v1/admin/services/a{bad}b/retry-failed");
        let resp = http
            .request(Method::POST, server.url(&path))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({"since": "2026-01-01T00:00:00Z"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "POST {path}");
    }

    // Text that is fine still works, escapes and all.
    let resp = http
        .get(server.url("/api/v1/admin/deliveries?object=acme%2Fw%C3%A9b%2F"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}
