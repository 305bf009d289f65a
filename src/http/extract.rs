//! The request's parts as handlers take them, refused in the house style:
//! a body or a query that does not parse is the [`HttpError`] its
//! rejection maps to (400, 413, 415 or 422, with the reason), as JSON on
//! the APIs ([`Body`], [`Query`]) and as a page on the panel ([`Form`]),
//! before the handler runs. A handler that must do something before it
//! reads its body takes axum's extractor as a `Result` instead.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::http::{AsHtml, HttpError};

/// A JSON request body.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(body) = axum::Json::<T>::from_request(request, state).await?;
        Ok(Body(body))
    }
}

/// A query string.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(query) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(query))
    }
}

/// A panel form's fields, refused with a page.
pub struct Form<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Form<T> {
    type Rejection = AsHtml;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Form(form) = axum::Form::<T>::from_request(request, state)
            .await
            .map_err(HttpError::from)?;
        Ok(Form(form))
    }
}
