//! `/api/v1/rate`: the rate a consumer service can take, in deliveries a
//! second, all pumps together ([`crate::services::rate`]). The consumer
//! may lower what the producer's operator allows, never raise it.

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use crate::api::{auth::Caller, AppState};
use crate::http::HttpError;
use crate::services::rate::{self, Rates};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateBody {
    rate: i64,
}

/// `{"rate", "max_rate", "consumer_rate"}`; null is no limit.
pub async fn show(
    State(state): State<AppState>,
    Caller(service): Caller,
) -> Result<Json<Rates>, HttpError> {
    Ok(Json(rate::get(&state.pool, service.id).await?))
}

/// `{"rate": 20}`: the consumer's own rate. 422 for 0, a negative rate,
/// a non-number, or more than the operator allows; nothing changes then.
pub async fn set(
    State(state): State<AppState>,
    Caller(service): Caller,
    body: Result<Json<RateBody>, JsonRejection>,
) -> Result<Json<Rates>, HttpError> {
    let Json(body) = body?;
    let wanted = rate::check(body.rate)?;
    Ok(Json(
        rate::set_consumer(&state.pool, service.id, Some(wanted)).await?,
    ))
}

/// Drops the consumer's own rate: only the operator's holds.
pub async fn clear(
    State(state): State<AppState>,
    Caller(service): Caller,
) -> Result<Json<Rates>, HttpError> {
    Ok(Json(
        rate::set_consumer(&state.pool, service.id, None).await?,
    ))
}
