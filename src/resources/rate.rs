//! `/api/v1/rate`: the rate a consumer service can take, in deliveries a
//! second, all pumps together ([`crate::services::rate`]). The consumer
//! may lower what the producer's operator allows, never raise it.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use crate::caller::Consumer;
use crate::http::error::{Error, NoValidToken};
use crate::http::extract::Body;
use crate::http::App;
use crate::http::HttpError;
use crate::services::rate::{self, Rates};

/// The consumer API's routes.
pub fn consumer_routes() -> Router<App> {
    Router::new().route("/api/v1/rate", get(show).put(set).delete(clear))
}

/// The consumer's own rate.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = NewRate)]
#[serde(deny_unknown_fields)]
pub struct RateBody {
    /// Deliveries a second, at least 1.
    rate: i64,
}

/// The caller's rates
///
/// `{"rate", "max_rate", "consumer_rate"}`; null is no limit.
#[utoipa::path(get,
    operation_id = "rate_show", path = "/api/v1/rate", tag = "consumer",
    security(("service_token" = [])),
    responses(
        (status = 200, description = "rates", body = Rates),
        NoValidToken,
    ))]
pub async fn show(
    State(state): State<App>,
    Consumer(service): Consumer,
) -> Result<Json<Rates>, HttpError> {
    Ok(Json(rate::get(&state.pool, service.id).await?))
}

/// Lower the caller's own rate
///
/// `{"rate": 20}`: the consumer's own rate. 422 for 0, a negative rate,
/// a non-number, or more than the operator allows; nothing changes then.
#[utoipa::path(put,
    operation_id = "rate_set", path = "/api/v1/rate", tag = "consumer",
    security(("service_token" = [])),
    request_body = RateBody,
    responses(
        (status = 200, description = "rates", body = Rates),
        (status = 422, description = "not a whole number of at least 1, or above the operator's maximum", body = Error),
        NoValidToken,
    ))]
pub async fn set(
    State(state): State<App>,
    Consumer(service): Consumer,
    Body(body): Body<RateBody>,
) -> Result<Json<Rates>, HttpError> {
    let wanted = rate::check(body.rate)?;
    Ok(Json(
        rate::set_consumer(&state.pool, service.id, Some(wanted)).await?,
    ))
}

/// Drop the caller's own rate
///
/// Drops the consumer's own rate: only the operator's holds.
#[utoipa::path(delete,
    operation_id = "rate_clear", path = "/api/v1/rate", tag = "consumer",
    security(("service_token" = [])),
    responses(
        (status = 200, description = "rates", body = Rates),
        NoValidToken,
    ))]
pub async fn clear(
    State(state): State<App>,
    Consumer(service): Consumer,
) -> Result<Json<Rates>, HttpError> {
    Ok(Json(
        rate::set_consumer(&state.pool, service.id, None).await?,
    ))
}
