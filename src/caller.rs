//! Who is calling, decided in one place for every route but the panel's
//! log-in (`operator::panel`, which takes the admin token itself): a consumer
//! service by its token (the consumer API, [`Consumer`]), the operator by
//! the admin token (the admin API, [`Admin`]), or the operator by a panel
//! session (the panel, [`Session`]). A handler names its door by the
//! extractor it takes; the three doors' rules sit side by side here, with
//! how each audience's actions appear in a delivery's history.
//!
//! Each door refuses as it always has: the APIs with JSON (401 for a
//! missing or wrong token, 429 once an address has used up its failures,
//! [`crate::throttle`], before the token is looked at; 503 for the admin
//! API with no admin token set), the panel with pages (a page load without
//! a session goes to the login form, any other request is refused with
//! nothing changed).

use axum::extract::{FromRequestParts, Path};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use crate::http::extract::path_parameter;
use crate::http::{bearer, html, App, AsHtml, HttpError};
use crate::operator::auth;
use crate::services::{self, Service};
use crate::throttle::{ClientAddr, Door};

/// What a caller without a valid service token is told.
const SERVICE_TOKEN_REQUIRED: &str =
    "a valid service token is required: Authorization: Bearer <token>";

/// What a caller without the admin token is told.
const ADMIN_TOKEN_REQUIRED: &str =
    "the admin token is required: Authorization: Bearer <WATCHPUMP_ADMIN_TOKEN>";

/// The consumer service making the request. Extracting it rejects a missing,
/// malformed or wrong token with 401, before the body is read, and an
/// address that has used up its failures ([`crate::throttle`]) with 429,
/// before the token is looked at.
pub struct Consumer(pub Service);

impl FromRequestParts<App> for Consumer {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        service(parts, state).await.map(Consumer)
    }
}

/// The caller holds the admin token.
pub struct Admin;

impl FromRequestParts<App> for Admin {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        admin(parts, state).map(|()| Admin)
    }
}

/// A logged-in operator. Without a valid session a page load is sent to
/// the login form, and any other request is refused with nothing changed.
pub struct Session;

impl FromRequestParts<App> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        panel(parts, state).await.map(|()| Session)
    }
}

/// The admin token's holder, acting on the service the path names
/// (`/api/v1/admin/services/{name}/...`), with the application: [`Admin`]
/// first, then the name (a path that is not text is a JSON 400). It
/// describes itself as the route's path parameter (`params(AdminOnService)`).
pub struct AdminOnService {
    pub app: App,
    pub name: String,
}

impl FromRequestParts<App> for AdminOnService {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        admin(parts, state)?;
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| HttpError::BadRequest(e.body_text()))?;
        Ok(AdminOnService {
            app: state.clone(),
            name,
        })
    }
}

impl utoipa::IntoParams for AdminOnService {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        let name = <String as utoipa::PartialSchema>::schema();
        vec![path_parameter("name", "the service's name", name)]
    }
}

/// How the admin API's actions appear in a delivery's history.
pub const ADMIN_API_ACTOR: &str = "admin-api";

/// How the panel's actions appear in a delivery's history.
pub const PANEL_ACTOR: &str = "panel";

/// The service whose token the request bears: the consumer API's door.
async fn service(parts: &Parts, state: &App) -> Result<Service, HttpError> {
    let ClientAddr(client) = ClientAddr::of(parts);
    let throttle = &state.throttle;
    throttle
        .check(Door::Service, client)
        .map_err(HttpError::Throttled)?;
    if !parts.headers.contains_key(AUTHORIZATION) {
        return Err(HttpError::Unauthorized(SERVICE_TOKEN_REQUIRED));
    }
    let service = match bearer(&parts.headers) {
        Some(token) => services::authenticate(&state.pool, token).await?,
        None => None,
    };
    service.ok_or_else(|| {
        throttle.fail(
            Door::Service,
            client,
            "wrong service token on the watches API",
        );
        HttpError::Unauthorized(SERVICE_TOKEN_REQUIRED)
    })
}

/// Whether the request bears the admin token: the admin API's door.
fn admin(parts: &Parts, state: &App) -> Result<(), HttpError> {
    let configured = state.settings.admin_token.as_deref().ok_or(HttpError::Off(
        "the admin API is off: WATCHPUMP_ADMIN_TOKEN is not set",
    ))?;
    let ClientAddr(client) = ClientAddr::of(parts);
    let throttle = &state.throttle;
    throttle
        .check(Door::Admin, client)
        .map_err(HttpError::Throttled)?;
    if !parts.headers.contains_key(AUTHORIZATION) {
        return Err(HttpError::Unauthorized(ADMIN_TOKEN_REQUIRED));
    }
    match bearer(&parts.headers) {
        Some(presented) if auth::token_matches(configured, presented) => Ok(()),
        _ => {
            throttle.fail(Door::Admin, client, "wrong admin token on the admin API");
            Err(HttpError::Unauthorized(ADMIN_TOKEN_REQUIRED))
        }
    }
}

/// Whether the request bears a live panel session: the panel's door.
async fn panel(parts: &Parts, state: &App) -> Result<(), Response> {
    let Some(token) = state.settings.admin_token.as_deref() else {
        return Err(panel_off());
    };
    let valid = match auth::session_cookie(&parts.headers) {
        Some(secret) => auth::session_valid(&state.pool, token, secret)
            .await
            .map_err(|e| AsHtml::from(e).into_response())?,
        None => false,
    };
    match (valid, &parts.method) {
        (true, _) => Ok(()),
        (false, &Method::GET | &Method::HEAD) => Err(Redirect::to("/panel/login").into_response()),
        (false, _) => Err(AsHtml(HttpError::Forbidden(
            "You are not logged in (or your session ended); nothing was changed.".into(),
        ))
        .into_response()),
    }
}

/// The panel's answer while no admin token is set.
pub fn panel_off() -> Response {
    html::page(
        StatusCode::SERVICE_UNAVAILABLE,
        "The panel is off",
        "<p>Set <code>WATCHPUMP_ADMIN_TOKEN</code> to turn it on.</p>",
        false,
    )
}
