//! Who is calling, decided in one place for every route: a consumer
//! service by its token (the consumer API), the operator by the admin
//! token (the admin API), or the operator by a panel session (the panel).
//! Which of the three credentials a route takes is its router's
//! [`Audience`], set once on each router as a request extension
//! ([`Audience::layer`]): a handler mounted at the wrong door fails loudly
//! (500, logged) rather than take another door's credential.
//!
//! Each door refuses as it always has: the APIs with JSON (401 for a
//! missing or wrong token, 429 once an address has used up its failures,
//! [`crate::throttle`], before the token is looked at; 503 for the admin
//! API with no admin token set), the panel with pages (a page load without
//! a session goes to the login form, any other request is refused with
//! nothing changed). Handlers take their audience's narrowing of the
//! [`Caller`] ([`Consumer`], [`Admin`], [`Session`]): the same extraction,
//! typed for what the handler needs.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use crate::http::{bearer, html, App, AsHtml, HttpError};
use crate::operator::auth;
use crate::services::{self, Service};
use crate::throttle::{ClientAddr, Door};

/// Which credential a router's routes take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// `/api/v1/...`: a consumer service's token.
    Consumer,
    /// `/api/v1/admin/...`: the admin token.
    Admin,
    /// `/panel/...`: a session the login form opened with the admin token.
    Panel,
}

impl Audience {
    /// The layer that marks every route of a router as this audience's.
    pub fn layer(self) -> axum::Extension<Audience> {
        axum::Extension(self)
    }
}

/// The caller of a request, once its credential was checked.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A consumer service.
    Service(Service),
    /// The operator, through the admin API.
    Admin,
    /// The operator, through the panel.
    Panel,
}

/// What a caller without a valid service token is told.
const SERVICE_TOKEN_REQUIRED: &str =
    "a valid service token is required: Authorization: Bearer <token>";

/// What a caller without the admin token is told.
const ADMIN_TOKEN_REQUIRED: &str =
    "the admin token is required: Authorization: Bearer <WATCHPUMP_ADMIN_TOKEN>";

impl Caller {
    /// The caller of a request at `audience`'s door, or the refusal that
    /// door answers.
    pub async fn at(parts: &Parts, state: &App, audience: Audience) -> Result<Caller, Response> {
        match audience {
            Audience::Consumer => service(parts, state)
                .await
                .map(Caller::Service)
                .map_err(IntoResponse::into_response),
            Audience::Admin => admin(parts, state)
                .map(|()| Caller::Admin)
                .map_err(IntoResponse::into_response),
            Audience::Panel => panel(parts, state).await.map(|()| Caller::Panel),
        }
    }
}

/// The router's [`Audience`] decides the door; a route mounted without one
/// is a mistake of the code, answered 500 and logged.
impl FromRequestParts<App> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        let Some(&audience) = parts.extensions.get::<Audience>() else {
            tracing::error!(path = %parts.uri.path(), "a route that asks for its caller is mounted without an audience");
            return Err(StatusCode::INTERNAL_SERVER_ERROR.into_response());
        };
        Caller::at(parts, state, audience).await
    }
}

// --- The narrowings: what each audience's handlers take --------------------

/// The consumer service making the request. Extracting it rejects a missing,
/// malformed or wrong token with 401, before the body is read, and an
/// address that has used up its failures ([`crate::throttle`]) with 429,
/// before the token is looked at.
pub struct Consumer(pub Service);

impl FromRequestParts<App> for Consumer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Service(service) => Ok(Consumer(service)),
            other => Err(misplaced(parts, &other)),
        }
    }
}

/// The caller holds the admin token: the admin API's narrowing of
/// [`Caller`].
pub struct Admin;

impl FromRequestParts<App> for Admin {
    type Rejection = axum::response::Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Admin => Ok(Admin),
            other => Err(misplaced(parts, &other)),
        }
    }
}

/// A logged-in operator: the panel's narrowing of [`Caller`]. Without a valid session a page load is sent
/// to the login form, and any other request is refused with nothing
/// changed.
pub struct Session;

impl FromRequestParts<App> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Panel => Ok(Session),
            other => Err(misplaced(parts, &other)),
        }
    }
}

/// How the admin API's actions appear in a delivery's history.
pub const ADMIN_API_ACTOR: &str = "admin-api";

/// How the panel's actions appear in a delivery's history.
pub const PANEL_ACTOR: &str = "panel";

/// A narrowing of [`Caller`] asked for on another audience's route: a
/// mistake of the code, answered 500 and logged.
fn misplaced(parts: &Parts, caller: &Caller) -> Response {
    tracing::error!(path = %parts.uri.path(), ?caller, "a handler asks for another audience's caller");
    StatusCode::INTERNAL_SERVER_ERROR.into_response()
}

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
