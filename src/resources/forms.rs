//! What the panel's forms share, whichever resource they change: every
//! state-changing request comes from a logged-in operator on the panel's
//! own pages ([`Change`]: a [`Session`] and [`SameOrigin`]; [`ServiceChange`]
//! for one service's), and answers by going back to the service's page
//! with a notice ([`back_to`]).

use axum::extract::{FromRequestParts, Path};
use axum::http::header;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Redirect, Response};

use crate::caller::Session;
use crate::http::{html, App, AsHtml, HttpError};
use crate::operator::auth;

/// A state-changing request that came from the panel's own pages.
pub struct SameOrigin;

impl FromRequestParts<App> for SameOrigin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        if auth::same_origin(&parts.headers, &state.settings.panel_origin) {
            Ok(SameOrigin)
        } else {
            tracing::warn!(origin = ?parts.headers.get(header::ORIGIN), path = %parts.uri.path(),
                "panel refused a request from another origin");
            Err(AsHtml(HttpError::Forbidden(
                "This request did not come from the panel's own pages; nothing was changed.".into(),
            ))
            .into_response())
        }
    }
}

/// A state-changing request of a logged-in operator, from the panel's own
/// pages: [`Session`], then [`SameOrigin`], each refusing as it does alone.
pub struct Change;

impl FromRequestParts<App> for Change {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        Session::from_request_parts(parts, state).await?;
        SameOrigin::from_request_parts(parts, state).await?;
        Ok(Change)
    }
}

/// A [`Change`] to the service the path names (`/panel/services/{name}/...`),
/// with the application: what every form of a service's page takes.
pub struct ServiceChange {
    pub app: App,
    pub name: String,
}

impl FromRequestParts<App> for ServiceChange {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        Change::from_request_parts(parts, state).await?;
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| AsHtml(HttpError::BadRequest(e.body_text())).into_response())?;
        Ok(ServiceChange {
            app: state.clone(),
            name,
        })
    }
}

/// Back to the service's page after a change, saying what was `done` (and
/// to how many, `n`) in its query.
pub fn back_to(service: &str, done: &str, n: Option<i64>) -> Response {
    let mut query = vec![("done", done.to_string())];
    if let Some(n) = n {
        query.push(("n", n.to_string()));
    }
    Redirect::to(&format!("/panel/services/{service}{}", html::query(&query))).into_response()
}
