//! The calling service, from `Authorization: Bearer <service token>`.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use crate::http::{bearer, App, HttpError};
use crate::services::{self, Service};
use crate::throttle::{ClientAddr, Door};

/// What a caller without a valid service token is told.
const TOKEN_REQUIRED: &str = "a valid service token is required: Authorization: Bearer <token>";

/// The consumer service making the request. Extracting it rejects a missing,
/// malformed or wrong token with 401, before the body is read, and an
/// address that has used up its failures ([`crate::throttle`]) with 429,
/// before the token is looked at.
pub struct Caller(pub Service);

impl FromRequestParts<App> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        let ClientAddr(client) = ClientAddr::of(parts);
        let throttle = &state.throttle;
        throttle
            .check(Door::Service, client)
            .map_err(HttpError::Throttled)?;
        if !parts.headers.contains_key(AUTHORIZATION) {
            return Err(HttpError::Unauthorized(TOKEN_REQUIRED));
        }
        let service = match bearer(&parts.headers) {
            Some(token) => services::authenticate(&state.pool, token).await?,
            None => None,
        };
        service.map(Caller).ok_or_else(|| {
            throttle.fail(
                Door::Service,
                client,
                "wrong service token on the watches API",
            );
            HttpError::Unauthorized(TOKEN_REQUIRED)
        })
    }
}
