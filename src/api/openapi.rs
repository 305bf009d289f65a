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
use utoipa::openapi::schema::{AdditionalProperties, Object, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::api;
use crate::http::error::Error;
use crate::operator::admin;
use crate::resources::{deliveries, kinds, rate, services, watches};

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
        watches::consumer::list,
        watches::consumer::create,
        watches::consumer::show,
        watches::consumer::remove,
        watches::consumer::ping,
        watches::consumer::pause,
        watches::consumer::resume,
        watches::consumer::resync,
        deliveries::consumer::list,
        deliveries::consumer::show,
        deliveries::consumer::redeliver,
        rate::show,
        rate::set,
        rate::clear,
        kinds::list,
        spec,
        api::healthz,
        admin::backlog,
        deliveries::admin::deliveries,
        deliveries::admin::delivery,
        deliveries::admin::attempts,
        deliveries::admin::retry,
        deliveries::admin::retry_failed,
        watches::admin::watches,
        admin::warnings,
        services::admin::list,
        services::admin::add,
        services::admin::remove,
        services::admin::rotate_secret,
        services::admin::rotate_token,
        services::admin::set_url,
        services::admin::set_rate,
    ),
    components(schemas(Error, deliveries::consumer::Body)),
    modifiers(&Tokens, &Answers),
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

/// What the derives do not say of the answers, and the types whose files
/// take derive lines only (`db/registry.rs`) cannot: an answer holds every
/// field of its schema, null or not (but `replica_lag_seconds`, there only
/// when read on a standby), where a derive takes an `Option` for a field
/// that may be left out; some answers hold nothing else; and the watch's
/// fields' prose.
struct Answers;

/// The request bodies: their optional fields may be left out.
const REQUESTS: [&str; 8] = [
    "NewWatch",
    "Filters",
    "NewRate",
    "RetryFailed",
    "NewService",
    "Rotation",
    "NewUrl",
    "ServiceRate",
];

/// Answers with no other property than those described (the others are
/// closed by `deny_unknown_fields` beside them).
const CLOSED: [&str; 2] = ["Rates", "Resync"];

impl Modify for Answers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        for (name, schema) in components.schemas.iter_mut() {
            let RefOr::T(Schema::Object(object)) = schema else {
                continue;
            };
            if !REQUESTS.contains(&name.as_str()) {
                for field in object.properties.keys() {
                    if field != "replica_lag_seconds" && !object.required.contains(field) {
                        object.required.push(field.clone());
                    }
                }
            }
            if CLOSED.contains(&name.as_str()) {
                object.additional_properties =
                    Some(Box::new(AdditionalProperties::FreeForm(false)));
            }
            if name == "Watch" {
                describe_watch(object);
            }
        }
    }
}

/// The watch's fields' prose (`db::registry::Watch`), and the resync's start
/// that the answer to a create with `"resync": true` carries.
fn describe_watch(watch: &mut Object) {
    if let Some(RefOr::T(Schema::Object(object))) = watch.properties.get_mut("object") {
        object.description = Some("An exact object, or a prefix ending in '/'.".into());
    }
    let mut filters = Object::with_type(Type::Object);
    filters.description = Some(r#"{"kinds": [...], "match": "<jsonpath>"}"#.into());
    watch
        .properties
        .insert("filters".into(), RefOr::T(Schema::Object(filters)));
    let mut resync = Ref::from_schema_name("Resync");
    resync.description =
        r#"Only in the answer to a create with "resync": true: the resync's start."#.into();
    watch.properties.insert("resync".into(), RefOr::Ref(resync));
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
