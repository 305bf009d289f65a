//! `/panel`: the operator's pages, server-rendered, usable without
//! JavaScript. Watches are shown, never edited (consumers own them, ADR
//! 0021); deliveries can be retried, and a service's lifecycle run. The
//! forms and pages of one resource are in its `panel.rs`
//! ([`crate::resources`]); here are the router, the log-in, the pages
//! that span resources (`pages.rs`) and what every panel handler takes
//! ([`Session`], and for a change [`crate::resources::forms::Change`] and
//! [`crate::resources::forms::back_to`]).
//!
//! Access: a login form takes `WATCHPUMP_ADMIN_TOKEN` and sets an HttpOnly,
//! SameSite=Strict session cookie ([`Session`]). Every state change is a
//! POST that must also come from the panel's own origin ([`SameOrigin`]).

mod pages;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

use crate::caller::Session;
use crate::http::html::{self, esc};
use crate::http::App;
use crate::http::{text, AsHtml, HttpError};
use crate::operator::auth;
use crate::resources;
use crate::resources::forms::SameOrigin;
use crate::throttle::{self, ClientAddr, Door};

/// Forms are a few fields; nothing bigger is read.
const FORM_LIMIT: usize = 16 * 1024;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/panel", get(pages::overview))
        .route("/panel/", get(|| async { Redirect::to("/panel") }))
        .route("/panel/login", get(login_form).post(login))
        .route("/panel/logout", post(logout))
        .route("/panel/services/{name}", get(pages::service))
        .route("/panel/watches", get(pages::watches))
        .route("/panel/warnings", get(pages::warnings))
        .merge(resources::deliveries::panel_routes())
        .merge(resources::watches::panel_routes())
        .merge(resources::services::panel_routes())
        .route("/panel/{*rest}", get(not_found))
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::from_fn(refuse_unreadable))
}

/// 400 as a page for a path or query PostgreSQL could not take
/// ([`crate::http::text`]).
async fn refuse_unreadable(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match text::unreadable(request.uri()) {
        Some(why) => AsHtml(HttpError::BadRequest(format!(
            "This address cannot be read: {why}. Filters must be text."
        )))
        .into_response(),
        None => next.run(request).await,
    }
}

async fn not_found(_: Session) -> AsHtml {
    AsHtml(HttpError::NotFound(
        "There is no such page in the panel.".into(),
    ))
}

fn login_page(status: StatusCode, message: Option<&str>) -> Response {
    let message = message
        .map(|m| format!(r#"<p class="error">{}</p>"#, esc(m)))
        .unwrap_or_default();
    let body = format!(
        r#"{message}<form method="post" action="/panel/login">
<label>Admin token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<p><button class="act" type="submit">Log in</button></p></form>"#
    );
    html::page(status, "Log in", &body, false)
}

async fn login_form(State(state): State<App>, headers: HeaderMap) -> Response {
    let Some(token) = state.settings.admin_token.as_deref() else {
        return crate::caller::panel_off();
    };
    if let Some(secret) = auth::session_cookie(&headers) {
        if auth::session_valid(&state.pool, token, secret)
            .await
            .unwrap_or(false)
        {
            return Redirect::to("/panel").into_response();
        }
    }
    login_page(StatusCode::OK, None)
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// Too many failed log-ins from this address: 429, the token unchecked.
fn locked_out(wait: std::time::Duration) -> Response {
    let message = format!(
        "Too many failed log-ins from your address. Try again in {} seconds.",
        throttle::retry_after_secs(wait)
    );
    let mut page = login_page(StatusCode::TOO_MANY_REQUESTS, Some(&message));
    page.headers_mut()
        .insert(header::RETRY_AFTER, throttle::retry_after(wait));
    page
}

async fn login(
    State(state): State<App>,
    _: SameOrigin,
    ClientAddr(client): ClientAddr,
    form: Result<Form<Login>, axum::extract::rejection::FormRejection>,
) -> Result<Response, AsHtml> {
    let Some(token) = state.settings.admin_token.as_deref() else {
        return Ok(crate::caller::panel_off());
    };
    let throttle = &state.throttle;
    if let Err(wait) = throttle.check(Door::Admin, client) {
        return Ok(locked_out(wait));
    }
    let Ok(Form(login)) = form else {
        return Ok(login_page(
            StatusCode::BAD_REQUEST,
            Some("Enter the admin token."),
        ));
    };
    if !auth::token_matches(token, &login.token) {
        throttle.fail(Door::Admin, client, "panel log-in with a wrong token");
        return Ok(login_page(
            StatusCode::UNAUTHORIZED,
            Some("That is not the admin token."),
        ));
    }
    let ttl = state.settings.session_ttl;
    let secret = auth::create_session(&state.pool, token, ttl).await?;
    let cookie = auth::set_cookie(&secret, ttl, state.settings.secure_cookie);
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/panel")).into_response())
}

async fn logout(
    State(state): State<App>,
    _: SameOrigin,
    headers: HeaderMap,
) -> Result<Response, AsHtml> {
    if let (Some(token), Some(secret)) = (
        state.settings.admin_token.as_deref(),
        auth::session_cookie(&headers),
    ) {
        auth::end_session(&state.pool, token, secret).await?;
    }
    let cookie = auth::clear_cookie(state.settings.secure_cookie);
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/panel/login")).into_response())
}
