//! `/api/v1/admin/services`: the service lifecycle through the admin API,
//! doing what `watchpump services ...` does: register, list, rotate the
//! signing secret or the token (the old one keeps working for an overlap),
//! move to a new URL, remove. Credentials appear only in the answer that
//! creates them; the answers that show a stored service (its base URL) are
//! masked (`Settings::masked`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::caller::{Admin, AdminOnService, ADMIN_API_ACTOR as ACTOR};
use crate::http::error::{Error, NoSuchService, NoValidToken};
use crate::http::extract::Body;
use crate::http::App;
use crate::http::HttpError;
use crate::services;

/// The registered services.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ServiceList {
    services: Vec<services::Service>,
}

/// Registered services
#[utoipa::path(get,
    operation_id = "admin_services_list", path = "/api/v1/admin/services", tag = "admin", security(("admin_token" = [])),
    responses(
        (status = 200, description = "services", body = ServiceList),
        NoValidToken,
    ))]
pub(crate) async fn list(_: Admin, State(state): State<App>) -> Result<Json<Value>, HttpError> {
    let services = services::list(&state.pool).await?;
    state.settings.masked(&ServiceList { services })
}

/// A service to register.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewService {
    name: String,
    base_url: String,
}

/// A service registered, with its credentials.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Registered {
    service: services::Service,
    /// The service's token for the consumer API: shown this once.
    token: String,
    /// The secret its deliveries are signed with: shown this once.
    signing_secret: String,
}

/// Register a service: its token and signing secret, shown this once
///
/// 201 with the service, its token and its signing secret: the only time
/// either is shown.
#[utoipa::path(post,
    operation_id = "admin_services_add", path = "/api/v1/admin/services", tag = "admin", security(("admin_token" = [])),
    request_body = NewService,
    responses(
        (status = 201, description = "registered", body = Registered),
        (status = 422, description = "bad name or URL", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn add(
    _: Admin,
    State(state): State<App>,
    Body(new): Body<NewService>,
) -> Result<(StatusCode, Json<Registered>), HttpError> {
    let allowed = &state.settings.destinations;
    let registered = services::add_within(&state.pool, &new.name, &new.base_url, allowed).await?;
    tracing::info!(service = %registered.service.name, "service registered through the admin API");
    Ok((
        StatusCode::CREATED,
        Json(Registered {
            service: registered.service,
            token: registered.token,
            signing_secret: registered.signing_secret,
        }),
    ))
}

/// How to rotate; the body may be empty.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rotation {
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

/// A signing secret rotated.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SecretRotated {
    service: String,
    /// The new signing secret: shown this once.
    signing_secret: String,
    /// Until when the previous secret signs too.
    previous_secret_signs_until: DateTime<Utc>,
    /// When a forced rotation retired the secret before the previous one;
    /// null when nothing was retired early.
    retired_early: Option<DateTime<Utc>>,
}

/// A new signing secret; the old one signs for the overlap
///
/// 409 during the overlap of the last rotation, unless forced.
#[utoipa::path(post,
    operation_id = "admin_services_rotate_secret", path = "/api/v1/admin/services/{name}/rotate-secret", tag = "admin", security(("admin_token" = [])),
    params(AdminOnService),
    request_body(content = Rotation, description = "optional: no body means the default overlap"),
    responses(
        (status = 200, description = "rotated", body = SecretRotated),
        NoSuchService,
        (status = 409, description = "the last rotation's overlap still runs (its previous secret still works, until the time the message says); force it with \"force\": true", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn rotate_secret(
    AdminOnService { app: state, name }: AdminOnService,
    body: axum::body::Bytes,
) -> Result<Json<SecretRotated>, HttpError> {
    let (overlap, force) = rotation(&body)?;
    let rotated = services::rotate_secret(&state.pool, &name, overlap, force).await?;
    tracing::info!(service = %name, retired_early = ?rotated.retired_early, "signing secret rotated through the admin API");
    Ok(Json(SecretRotated {
        service: name,
        signing_secret: rotated.new,
        previous_secret_signs_until: rotated.previous_until,
        retired_early: rotated.retired_early,
    }))
}

/// A token rotated.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct TokenRotated {
    service: String,
    /// The new token: shown this once.
    token: String,
    /// Until when the previous token works too.
    previous_token_works_until: DateTime<Utc>,
    /// When a forced rotation retired the token before the previous one;
    /// null when nothing was retired early.
    retired_early: Option<DateTime<Utc>>,
}

/// A new token; the old one works for the grace period
///
/// 409 during the grace of the last rotation, unless forced.
#[utoipa::path(post,
    operation_id = "admin_services_rotate_token", path = "/api/v1/admin/services/{name}/rotate-token", tag = "admin", security(("admin_token" = [])),
    params(AdminOnService),
    request_body(content = Rotation, description = "optional: no body means the default overlap"),
    responses(
        (status = 200, description = "rotated", body = TokenRotated),
        NoSuchService,
        (status = 409, description = "the last rotation's overlap still runs (its previous token still works, until the time the message says); force it with \"force\": true", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn rotate_token(
    AdminOnService { app: state, name }: AdminOnService,
    body: axum::body::Bytes,
) -> Result<Json<TokenRotated>, HttpError> {
    let (grace, force) = rotation(&body)?;
    let rotated = services::rotate_token(&state.pool, &name, grace, force).await?;
    tracing::info!(service = %name, retired_early = ?rotated.retired_early, "token rotated through the admin API");
    Ok(Json(TokenRotated {
        service: name,
        token: rotated.new,
        previous_token_works_until: rotated.previous_until,
        retired_early: rotated.retired_early,
    }))
}

/// A service's new base URL.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewUrl {
    base_url: String,
}

/// A service moved.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Moved {
    service: services::Service,
}

/// Point a service at a new base URL
#[utoipa::path(put,
    operation_id = "admin_services_set_url", path = "/api/v1/admin/services/{name}/url", tag = "admin", security(("admin_token" = [])),
    params(AdminOnService),
    request_body = NewUrl,
    responses(
        (status = 200, description = "moved", body = Moved),
        NoSuchService,
        (status = 422, description = "bad URL", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn set_url(
    AdminOnService { app: state, name }: AdminOnService,
    Body(new): Body<NewUrl>,
) -> Result<Json<Value>, HttpError> {
    let allowed = &state.settings.destinations;
    let service = services::set_url_within(&state.pool, &name, &new.base_url, allowed).await?;
    tracing::info!(service = %name, base_url = %service.base_url, "service moved through the admin API");
    state.settings.masked(&Moved { service })
}

/// A service's most deliveries a second.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ServiceRate)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRate {
    /// Deliveries a second, or null for no limit.
    rate: Option<i64>,
}

/// The rate set.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateSet {
    service: String,
    /// Deliveries a second; null for no limit.
    max_rate: Option<i64>,
}

/// The most deliveries a second the service gets, all pumps together
///
/// The most deliveries a second the service gets, all pumps together
/// (issue 20; `watchpump services set-rate`): `{"rate": 50}`, or
/// `{"rate": null}` for none. 422 for a rate below 1 or not a number.
#[utoipa::path(put,
    operation_id = "admin_services_set_rate", path = "/api/v1/admin/services/{name}/rate", tag = "admin", security(("admin_token" = [])),
    params(AdminOnService),
    request_body = NewRate,
    responses(
        (status = 200, description = "set", body = RateSet),
        NoSuchService,
        (status = 422, description = "not a whole number of at least 1", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn set_rate(
    AdminOnService { app: state, name }: AdminOnService,
    Body(new): Body<NewRate>,
) -> Result<Json<RateSet>, HttpError> {
    let rate = new.rate.map(services::rate::check).transpose()?;
    services::rate::set_max(&state.pool, &name, rate).await?;
    tracing::info!(service = %name, rate = ?rate, "service rate set through the admin API");
    Ok(Json(RateSet {
        service: name,
        max_rate: rate.map(i64::from),
    }))
}

/// What removing a service took with it.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Removed {
    service: String,
    watches_removed: i32,
    deliveries_dropped: i32,
}

/// Remove a service, its watches and their undelivered deliveries
///
/// Removes the service, its watches and their undelivered deliveries.
#[utoipa::path(delete,
    operation_id = "admin_services_remove", path = "/api/v1/admin/services/{name}", tag = "admin", security(("admin_token" = [])),
    params(AdminOnService),
    responses(
        (status = 200, description = "removed", body = Removed),
        NoSuchService,
        NoValidToken,
    ))]
pub(crate) async fn remove(
    AdminOnService { app: state, name }: AdminOnService,
) -> Result<Json<Removed>, HttpError> {
    let removal = services::remove(&state.pool, &name, ACTOR).await?;
    tracing::info!(service = %name, watches = removal.watches, dropped = removal.deliveries, "service removed through the admin API");
    Ok(Json(Removed {
        service: name,
        watches_removed: removal.watches,
        deliveries_dropped: removal.deliveries,
    }))
}
