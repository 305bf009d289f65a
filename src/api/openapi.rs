//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 description of the consumer
//! API and the admin API, readable without a token (it holds nothing
//! secret), for consumer teams to generate clients from. The text is
//! `docs/openapi.json`; `tests/openapi.rs` checks that it names every route
//! the server mounts and that real answers fit its schemas.

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

/// The description, as served.
pub const SPEC: &str = include_str!("../../docs/openapi.json");

pub async fn spec() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], SPEC)
}
