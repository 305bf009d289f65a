//! The API's one error type: a status and a JSON body
//! `{"error": {"code": "...", "message": "..."}}`. Database details never
//! reach the caller; they are logged.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid service token is required: Authorization: Bearer <token>")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("request body too large")]
    TooLarge,
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Too many failed authentications from the caller's address; the
    /// time until it may try again.
    #[error("too many failed authentications from your address; try again in {} s", crate::throttle::retry_after_secs(*.0))]
    Throttled(std::time::Duration),
    #[error("internal error")]
    Internal(#[source] crate::Error),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Throttled(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_failures"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// Maps an axum extractor's rejection by its status, keeping its text
    /// (which says what was wrong with the body) for client errors.
    pub fn from_rejection(status: StatusCode, text: String) -> Self {
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(
                "expected a JSON body with Content-Type: application/json".into(),
            ),
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::Invalid(text),
            s if s.is_client_error() => ApiError::BadRequest(text),
            _ => ApiError::Internal(crate::Error::Invalid(text)),
        }
    }
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::Invalid(message) => ApiError::Invalid(message),
            crate::Error::NotFound(message) => ApiError::NotFound(message),
            other => ApiError::Internal(other),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::Internal(crate::Error::Database(e))
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        ApiError::from_rejection(r.status(), r.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        ApiError::BadRequest(r.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Internal(e) = &self {
            tracing::error!(error = %e, "internal error in the API");
        }
        let body = Json(json!({ "error": { "code": code, "message": self.to_string() } }));
        let mut response = (status, body).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        if let ApiError::Throttled(wait) = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, crate::throttle::retry_after(wait));
        }
        response
    }
}
