//! `/api/v1/admin/services`: the service lifecycle through the admin API,
//! doing what `watchpump services ...` does: register, list, rotate the
//! signing secret or the token (the old one keeps working for an overlap),
//! move to a new URL, remove. Credentials appear only in the answer that
//! creates them; every other answer is masked (`Settings::mask_json`).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::http::{text, HttpError};
use crate::operator::admin::{Admin, ACTOR};
use crate::operator::OperatorState;
use crate::services;

pub fn routes() -> Router<OperatorState> {
    Router::new()
        .route("/api/v1/admin/services", get(list).post(add))
        .route(
            "/api/v1/admin/services/{name}",
            axum::routing::delete(remove),
        )
        .route(
            "/api/v1/admin/services/{name}/rotate-secret",
            post(rotate_secret),
        )
        .route(
            "/api/v1/admin/services/{name}/rotate-token",
            post(rotate_token),
        )
        .route("/api/v1/admin/services/{name}/url", put(set_url))
        .route("/api/v1/admin/services/{name}/rate", put(set_rate))
        .layer(axum::middleware::from_fn(text::refuse_unreadable))
}

async fn list(_: Admin, State(state): State<OperatorState>) -> Result<Json<Value>, HttpError> {
    let services = services::list(&state.pool).await?;
    Ok(Json(
        state.settings.mask_json(json!({ "services": services })),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewService {
    name: String,
    base_url: String,
}

/// 201 with the service, its token and its signing secret: the only time
/// either is shown.
async fn add(
    _: Admin,
    State(state): State<OperatorState>,
    body: Result<Json<NewService>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), HttpError> {
    let Json(new) = body?;
    let allowed = &state.settings.destinations;
    let registered = services::add_within(&state.pool, &new.name, &new.base_url, allowed).await?;
    tracing::info!(service = %registered.service.name, "service registered through the admin API");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "service": registered.service,
            "token": registered.token,
            "signing_secret": registered.signing_secret,
        })),
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rotation {
    /// How long the old credential keeps working: 90s, 30m, 24h, 7d.
    overlap: Option<String>,
    /// Rotate even during the last rotation's overlap, retiring the
    /// credential before the current one at once.
    #[serde(default)]
    force: bool,
}

/// An optional JSON body `{"overlap": "24h", "force": false}`; no body, or
/// no overlap, means [`services::DEFAULT_OVERLAP`]. The overlap and whether
/// to force.
fn rotation(body: &[u8]) -> Result<(std::time::Duration, bool), HttpError> {
    let given = if body.iter().all(u8::is_ascii_whitespace) {
        Rotation::default()
    } else {
        serde_json::from_slice::<Rotation>(body).map_err(|e| {
            HttpError::BadRequest(format!(
                "the body must be empty or {{\"overlap\": \"24h\", \"force\": false}}: {e}"
            ))
        })?
    };
    let overlap = services::parse_overlap(given.overlap.as_deref())?;
    Ok((overlap, given.force))
}

/// 409 during the overlap of the last rotation, unless forced.
async fn rotate_secret(
    _: Admin,
    State(state): State<OperatorState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, HttpError> {
    let (overlap, force) = rotation(&body)?;
    let rotated = services::rotate_secret(&state.pool, &name, overlap, force).await?;
    tracing::info!(service = %name, retired_early = ?rotated.retired_early, "signing secret rotated through the admin API");
    Ok(Json(json!({
        "service": name,
        "signing_secret": rotated.new,
        "previous_secret_signs_until": rotated.previous_until,
        "retired_early": rotated.retired_early,
    })))
}

/// 409 during the grace of the last rotation, unless forced.
async fn rotate_token(
    _: Admin,
    State(state): State<OperatorState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, HttpError> {
    let (grace, force) = rotation(&body)?;
    let rotated = services::rotate_token(&state.pool, &name, grace, force).await?;
    tracing::info!(service = %name, retired_early = ?rotated.retired_early, "token rotated through the admin API");
    Ok(Json(json!({
        "service": name,
        "token": rotated.new,
        "previous_token_works_until": rotated.previous_until,
        "retired_early": rotated.retired_early,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUrl {
    base_url: String,
}

async fn set_url(
    _: Admin,
    State(state): State<OperatorState>,
    Path(name): Path<String>,
    body: Result<Json<NewUrl>, JsonRejection>,
) -> Result<Json<Value>, HttpError> {
    let Json(new) = body?;
    let allowed = &state.settings.destinations;
    let service = services::set_url_within(&state.pool, &name, &new.base_url, allowed).await?;
    tracing::info!(service = %name, base_url = %service.base_url, "service moved through the admin API");
    Ok(Json(
        state.settings.mask_json(json!({ "service": service })),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRate {
    /// Deliveries a second, or null for no limit.
    rate: Option<i64>,
}

/// The most deliveries a second the service gets, all pumps together
/// (issue 20; `watchpump services set-rate`): `{"rate": 50}`, or
/// `{"rate": null}` for none. 422 for a rate below 1 or not a number.
async fn set_rate(
    _: Admin,
    State(state): State<OperatorState>,
    Path(name): Path<String>,
    body: Result<Json<NewRate>, JsonRejection>,
) -> Result<Json<Value>, HttpError> {
    let Json(new) = body?;
    let rate = new.rate.map(services::rate::check).transpose()?;
    services::rate::set_max(&state.pool, &name, rate).await?;
    tracing::info!(service = %name, rate = ?rate, "service rate set through the admin API");
    Ok(Json(json!({ "service": name, "max_rate": rate })))
}

/// Removes the service, its watches and their undelivered deliveries.
async fn remove(
    _: Admin,
    State(state): State<OperatorState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, HttpError> {
    let removal = services::remove(&state.pool, &name, ACTOR).await?;
    tracing::info!(service = %name, watches = removal.watches, dropped = removal.deliveries, "service removed through the admin API");
    Ok(Json(json!({
        "service": name,
        "watches_removed": removal.watches,
        "deliveries_dropped": removal.deliveries,
    })))
}
