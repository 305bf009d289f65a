//! The calling service, from `Authorization: Bearer <service token>`.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use crate::api::{error::ApiError, AppState};
use crate::services::{self, Service};

/// The consumer service making the request. Extracting it rejects a missing,
/// malformed or wrong token with 401, before the body is read.
pub struct Caller(pub Service);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // The scheme is case-insensitive (RFC 9110, 11.1).
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
            .map(|(_, token)| token.trim())
            .ok_or(ApiError::Unauthorized)?;
        services::authenticate(&state.pool, token)
            .await?
            .map(Caller)
            .ok_or(ApiError::Unauthorized)
    }
}
