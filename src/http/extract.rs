//! The request's parts as handlers take them, refused in the house style:
//! a body or a query that does not parse is the [`HttpError`] its
//! rejection maps to (400, 413, 415 or 422, with the reason), as JSON on
//! the APIs ([`Body`], [`Query`]) and as a page on the panel ([`Form`]),
//! before the handler runs. A handler that must do something before it
//! reads its body takes axum's extractor as a `Result` instead.

use axum::extract::{FromRequest, FromRequestParts, Request};
use std::marker::PhantomData;

use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::{Required, RefOr, Schema};
use utoipa::{IntoParams, PartialSchema};

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

/// What an id in the path names: its noun, in the refusal of an id that is
/// not an integer and in the parameter's description.
pub trait Noun {
    const NOUN: &'static str;
}

/// A watch (`/api/v1/watches/{id}`).
pub enum Watch {}

impl Noun for Watch {
    const NOUN: &'static str = "watch";
}

/// A delivery (`/api/v1/deliveries/{id}`, `/api/v1/admin/deliveries/{id}`).
pub enum Delivery {}

impl Noun for Delivery {
    const NOUN: &'static str = "delivery";
}

/// The `{id}` of a path, an integer naming an `R`. Anything else is a 404
/// ("no such watch: ids are integers"), as an id that names nothing is:
/// no other id could be meant. It describes itself as the route's path
/// parameter (`params(WatchPath)`).
pub struct PathId<R> {
    pub id: i64,
    noun: PhantomData<R>,
}

/// A watch's id in the path.
pub type WatchPath = PathId<Watch>;

/// A delivery's id in the path.
pub type DeliveryPath = PathId<Delivery>;

impl<R: Noun, S: Send + Sync> FromRequestParts<S> for PathId<R> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(id) = axum::extract::Path::<i64>::from_request_parts(parts, state)
            .await
            .map_err(|_| HttpError::NotFound(format!("no such {}: ids are integers", R::NOUN)))?;
        Ok(PathId {
            id,
            noun: PhantomData,
        })
    }
}

impl<R: Noun> IntoParams for PathId<R> {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let description = format!("the {}'s id", R::NOUN);
        vec![path_parameter("id", &description, i64::schema())]
    }
}

/// A required parameter in the path, as `params(("id" = i64, Path,
/// description = ...))` would describe it.
pub fn path_parameter(name: &str, description: &str, schema: RefOr<Schema>) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}
