//! The one error type of the HTTP front ends, [`HttpError`]: a status, a
//! stable code and a message, rendered as JSON for the APIs
//! (`{"error": {"code": "...", "message": "..."}}`, [`HttpError`]'s own
//! `IntoResponse`) and as a page for the panel ([`AsHtml`]): same statuses,
//! same messages. Internals never reach the caller: a database error is a
//! bare 500, its detail logged. The JSON is described here too, for the
//! OpenAPI description: [`Error`], and the refusals every route repeats
//! ([`NoValidToken`] and the 404s).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::http::html::{self, esc};
use crate::throttle;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0}")]
    BadRequest(String),
    /// No valid credential; the message says which one is required.
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Not in a state that allows it.
    #[error("{0}")]
    Conflict(String),
    #[error("request body too large")]
    TooLarge,
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Well-formed, but not acceptable (422).
    #[error("{0}")]
    Invalid(String),
    /// Too many failed authentications from the caller's address; the
    /// time until it may try again.
    #[error("too many failed authentications from your address; try again in {} s", throttle::retry_after_secs(*.0))]
    Throttled(Duration),
    /// A bound on what a caller may ask for was reached (its service's
    /// self-service writes, a ping too soon, a resync while one runs): 429,
    /// the message says which, and `Retry-After` when it may try again.
    #[error("{0}")]
    TooMany(String, Duration),
    /// This door is turned off by configuration.
    #[error("{0}")]
    Off(&'static str),
    #[error("internal error")]
    Internal(#[source] crate::Error),
}

impl HttpError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            HttpError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            HttpError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            HttpError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            HttpError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            HttpError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            HttpError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            HttpError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            HttpError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            HttpError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            HttpError::Throttled(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_failures"),
            HttpError::TooMany(..) => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
            HttpError::Off(_) => (StatusCode::SERVICE_UNAVAILABLE, "disabled"),
            HttpError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The title of the panel's page for it.
    fn title(&self) -> &'static str {
        match self {
            HttpError::BadRequest(_) | HttpError::UnsupportedMediaType(_) | HttpError::TooLarge => {
                "Bad request"
            }
            HttpError::NotFound(_) | HttpError::MethodNotAllowed => "Not found",
            HttpError::Conflict(_) | HttpError::Invalid(_) => "Not done",
            HttpError::Unauthorized(_)
            | HttpError::Forbidden(_)
            | HttpError::Throttled(_)
            | HttpError::TooMany(..) => "Refused",
            HttpError::Off(_) => "Off",
            HttpError::Internal(_) => "Internal error",
        }
    }

    /// Maps an axum extractor's rejection by its status, keeping its text
    /// (which says what was wrong with the body) for client errors.
    pub fn from_rejection(status: StatusCode, text: String) -> Self {
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => HttpError::TooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => HttpError::UnsupportedMediaType(
                "expected a JSON body with Content-Type: application/json".into(),
            ),
            StatusCode::UNPROCESSABLE_ENTITY => HttpError::Invalid(text),
            s if s.is_client_error() => HttpError::BadRequest(text),
            _ => HttpError::Internal(crate::Error::Invalid(text)),
        }
    }

    /// `response` with this error's status and the headers it calls for
    /// (`WWW-Authenticate` on 401, `Retry-After` on 429), the internal
    /// error logged for `front` (the API or the panel).
    fn answer(self, body: impl IntoResponse, front: &str) -> Response {
        let (status, _) = self.status_and_code();
        if let HttpError::Internal(e) = &self {
            tracing::error!(error = %e, "internal error in the {front}");
        }
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let HttpError::Throttled(wait) | HttpError::TooMany(_, wait) = self {
            headers.insert(header::RETRY_AFTER, throttle::retry_after(wait));
        }
        response
    }
}

impl From<crate::Error> for HttpError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::Invalid(message) => HttpError::Invalid(message),
            crate::Error::NotFound(message) => HttpError::NotFound(message),
            crate::Error::Conflict(message) => HttpError::Conflict(message),
            other => HttpError::Internal(other),
        }
    }
}

impl From<sqlx::Error> for HttpError {
    fn from(e: sqlx::Error) -> Self {
        HttpError::Internal(crate::Error::Database(e))
    }
}

impl From<axum::extract::rejection::JsonRejection> for HttpError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        HttpError::from_rejection(r.status(), r.body_text())
    }
}

/// A form the panel could not read: 422, as any other bad input there.
impl From<axum::extract::rejection::FormRejection> for HttpError {
    fn from(r: axum::extract::rejection::FormRejection) -> Self {
        HttpError::Invalid(r.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for HttpError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        HttpError::BadRequest(r.body_text())
    }
}

/// The APIs' rendering: `{"error": {"code": "...", "message": "..."}}`.
impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let (_, code) = self.status_and_code();
        let body = Json(json!({ "error": { "code": code, "message": self.to_string() } }));
        self.answer(body, "API")
    }
}

/// The panel's rendering of an [`HttpError`]: a page in the panel's frame,
/// with the same status and message. Panel handlers return
/// `Result<_, AsHtml>`; `?` turns anything an [`HttpError`] comes from into
/// one.
#[derive(Debug)]
pub struct AsHtml(pub HttpError);

impl<E: Into<HttpError>> From<E> for AsHtml {
    fn from(e: E) -> Self {
        AsHtml(e.into())
    }
}

impl IntoResponse for AsHtml {
    fn into_response(self) -> Response {
        let AsHtml(e) = self;
        let (status, _) = e.status_and_code();
        let body = format!(
            r#"<p class="error">{}</p><p><a href="/panel">Back to the overview</a></p>"#,
            esc(&e.to_string())
        );
        let page = html::page(status, e.title(), &body, false);
        e.answer(page, "panel")
    }
}

/// The 401 of every route that takes a token.
#[derive(utoipa::IntoResponses)]
#[response(status = 401, description = "no valid token")]
#[allow(dead_code)] // a description only
pub struct NoValidToken(Error);

/// The consumer API's 404 for an id not among the caller's own.
#[derive(utoipa::IntoResponses)]
#[response(status = 404, description = "another service's, or none")]
#[allow(dead_code)] // a description only
pub struct NotTheCallers(Error);

/// The admin API's 404 for a service name.
#[derive(utoipa::IntoResponses)]
#[response(status = 404, description = "no such service")]
#[allow(dead_code)] // a description only
pub struct NoSuchService(Error);

/// The admin API's 404 for a delivery id.
#[derive(utoipa::IntoResponses)]
#[response(status = 404, description = "no such delivery")]
#[allow(dead_code)] // a description only
pub struct NoSuchDelivery(Error);

/// Every error of both APIs, as [`HttpError`] renders it, described for
/// the OpenAPI description (`crate::api::openapi`).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // rendered as JSON by `HttpError`'s `IntoResponse` above; described here
pub struct Error {
    #[schema(inline)]
    error: ErrorDetail,
}

#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ErrorDetail {
    /// Stable, e.g. not_found, invalid, conflict, too_many_requests.
    code: String,
    message: String,
}
