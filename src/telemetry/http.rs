//! A SERVER span per request to `serve`'s listener: named by its route
//! (`GET /api/v1/watches/{id}`), never by the raw path, whose ids would
//! make as many span names as there are watches. A request that carries
//! `traceparent` continues its caller's trace. [`traced`] applies it once,
//! to the whole application (the consumer API, the admin API and the
//! panel), so that no audience's routes go untraced.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use tracing::field::Empty;
use tracing::Instrument;

use super::context::TraceParent;
use super::TARGET;

/// `app` with [`request_span`] on every route it has: call it on the
/// whole application, after every router is merged into it (a route
/// added later would not be traced).
pub fn traced(app: Router) -> Router {
    app.route_layer(axum::middleware::from_fn(request_span))
}

/// Middleware (`axum::middleware::from_fn`) for a router's routes.
pub async fn request_span(request: Request, next: Next) -> Response {
    if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let method = request.method().as_str().to_string();
    let name = match &route {
        Some(route) => format!("{method} {route}"),
        None => method.clone(),
    };
    let span = tracing::info_span!(target: TARGET, "http.request",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = Empty,
        "http.request.method" = %method,
        "http.route" = route.as_deref().unwrap_or_default(),
        "http.response.status_code" = Empty,
    );
    if !span.is_disabled() {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        if let Some(parent) =
            header("traceparent").and_then(|t| TraceParent::parse(t, header("tracestate")))
        {
            super::set_parent(&span, &parent);
        }
    }
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}
