//! What the events endpoint answers. The producer acts on the status alone
//! (2xx delivered, 410 drop the watch, anything else retry); the JSON body is
//! for the people reading the producer's panel and the consumer's logs.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// A delivery the consumer has taken: answered 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// New; the handler's work committed with its record.
    Done,
    /// This delivery id was accepted before; nothing ran again.
    Duplicate,
    /// Not newer than the object's accepted news; recorded, not worked on.
    Skipped,
}

impl IntoResponse for Accepted {
    fn into_response(self) -> Response {
        let status = match self {
            Accepted::Done => "done",
            Accepted::Duplicate => "duplicate",
            Accepted::Skipped => "skipped",
        };
        (StatusCode::OK, Json(json!({ "status": status }))).into_response()
    }
}

/// A request the endpoint did not take; the layer's one error type. Every
/// refusal leaves the consumer's database as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not from the producer: token or signature missing, wrong or stale.
    #[error("{0}")]
    Unauthorized(String),
    /// From the producer, but for a watch that is not this consumer's.
    #[error("{0}")]
    Forbidden(String),
    /// No producer of that name is configured here.
    #[error("{0}")]
    NoSuchProducer(String),
    /// Signed, but not a delivery this kit can read.
    #[error("{0}")]
    BadRequest(String),
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    /// The watch's resource is gone (the handler said so, or the watch was
    /// removed here): the producer drops the watch.
    #[error("{0}")]
    Gone(String),
    /// The handler failed or the database did; logged where it happened.
    /// The producer retries.
    #[error("the consumer could not take the delivery now; it will be retried")]
    Internal,
}

impl Refusal {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Refusal::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Refusal::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Refusal::NoSuchProducer(_) => (StatusCode::NOT_FOUND, "not_found"),
            Refusal::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Refusal::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Refusal::Gone(_) => (StatusCode::GONE, "gone"),
            Refusal::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = Json(json!({ "error": { "code": code, "message": self.to_string() } }));
        let mut response = (status, body).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
