//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 description of the consumer
//! API and the admin API, readable without a token (it holds nothing
//! secret), for consumer teams to generate clients from. It is generated
//! ([`ApiDoc`], utoipa) from the handlers' `#[utoipa::path]` attributes and
//! the types they read and answer, their doc comments as its prose, so that
//! it cannot drift from the routers; `tests/openapi.rs` checks that it names
//! every route the server mounts and that real answers fit its schemas.

use std::sync::LazyLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::api;
use crate::operator::{admin, admin_services};

/// The description: both APIs, as `watchpump serve` mounts them.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "watchpump",
        version = "1",
        description = "The consumer API (a consumer service's token) and the admin API (the operator's token), as `watchpump serve` mounts them. docs/protocol.md is the consumer's guide, docs/operator.md the operator's.",
    ),
    tags(
        (name = "consumer", description = "Authorization: Bearer <the service's token>"),
        (name = "admin", description = "Authorization: Bearer <WATCHPUMP_ADMIN_TOKEN>"),
    ),
    paths(
        api::watches::list,
        api::watches::create,
        api::watches::show,
        api::watches::remove,
        api::watches::ping,
        api::watches::pause,
        api::watches::resume,
        api::watches::resync,
        api::deliveries::list,
        api::deliveries::show,
        api::deliveries::redeliver,
        api::rate::show,
        api::rate::set,
        api::rate::clear,
        api::kinds::list,
        spec,
        api::healthz,
        admin::backlog,
        admin::deliveries,
        admin::delivery,
        admin::attempts,
        admin::retry,
        admin::retry_failed,
        admin::watches,
        admin::warnings,
        admin_services::list,
        admin_services::add,
        admin_services::remove,
        admin_services::rotate_secret,
        admin_services::rotate_token,
        admin_services::set_url,
        admin_services::set_rate,
    ),
    components(schemas(Error, api::deliveries::Body)),
    modifiers(&Tokens),
)]
pub struct ApiDoc;

/// The two bearer tokens: a consumer service's (`watchpump services add`)
/// for the consumer API, the operator's (WATCHPUMP_ADMIN_TOKEN) for the
/// admin API.
struct Tokens;

impl Modify for Tokens {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, description) in [
            (
                "service_token",
                "Authorization: Bearer <the service's token>",
            ),
            (
                "admin_token",
                "Authorization: Bearer <WATCHPUMP_ADMIN_TOKEN>",
            ),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(description))
                        .build(),
                ),
            );
        }
    }
}

/// Every error of both APIs.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // rendered as JSON by `HttpError`'s `IntoResponse`; described here
pub struct Error {
    #[schema(inline)]
    error: ErrorDetail,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ErrorDetail {
    /// Stable, e.g. not_found, invalid, conflict, too_many_requests.
    code: String,
    message: String,
}

/// The description, as served: generated once, on the first request. The
/// doc comments are its prose, so their intra-doc links (``[`limits`]``)
/// are shown as the code they name (`` `limits` ``); a backtick is only
/// ever in a description's text.
pub static SPEC: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI description serialises")
        .replace("[`", "`")
        .replace("`]", "`")
});

/// This description
#[utoipa::path(get,
    operation_id = "spec", path = "/api/v1/openapi.json", tag = "consumer",
    security(()),
    responses(
        (status = 200, description = "OpenAPI 3.1", body = Object),
    ))]
pub async fn spec() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], SPEC.as_str())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    /// Client generators name a method by its operation's id: two alike
    /// would make one client method of two operations.
    #[test]
    fn operation_ids_are_unique() {
        let spec: Value = serde_json::from_str(&super::SPEC).unwrap();
        let mut seen = BTreeSet::new();
        for item in spec["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                let id = op["operationId"].as_str().unwrap().to_string();
                assert!(seen.insert(id.clone()), "operationId {id} twice");
            }
        }
        assert_eq!(seen.len(), 32);
    }
}
