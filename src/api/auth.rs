//! The calling service, from `Authorization: Bearer <service token>`: the
//! consumer API's narrowing of [`Caller`].

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::Response;

use crate::caller::{misplaced, Caller};
use crate::http::App;
use crate::services::Service;

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
