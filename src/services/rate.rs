//! The rate a consumer service can take (issue 20): the operator's maximum
//! and the consumer's own, lower, one. Enforced by the pumps together
//! ([`crate::pump::rate`]); set here, for the API, the admin API and the
//! CLI alike, through `sql/functions/0250_rate.sql`.

use serde::Serialize;
use sqlx::PgPool;

use crate::error::{Error, Result};

/// A service's rates, in deliveries a second; null is no limit.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Rates {
    /// The one that holds: the lower of the two.
    pub rate: Option<i32>,
    /// The operator's (`watchpump services set-rate`).
    pub max_rate: Option<i32>,
    /// The consumer's own (`PUT /api/v1/rate`).
    pub consumer_rate: Option<i32>,
}

/// A rate as given (an API body, a CLI argument): a whole number of
/// deliveries a second, at least 1; anything else is [`Error::Invalid`].
pub fn check(rate: i64) -> Result<i32> {
    match i32::try_from(rate) {
        Ok(rate) if rate >= 1 => Ok(rate),
        _ => Err(Error::Invalid(format!(
            "a rate is a whole number of deliveries a second, 1 to {}, not {rate}",
            i32::MAX
        ))),
    }
}

pub async fn get(pool: &PgPool, service_id: i64) -> Result<Rates> {
    Ok(sqlx::query_as(
        "select watchpump.effective_rate(max_rate, consumer_rate) as rate, max_rate, consumer_rate
         from watchpump.services where id = $1",
    )
    .bind(service_id)
    .fetch_one(pool)
    .await?)
}

/// The consumer's own rate (None: only the operator's holds); above the
/// operator's maximum it is [`Error::Invalid`].
pub async fn set_consumer(pool: &PgPool, service_id: i64, rate: Option<i32>) -> Result<Rates> {
    sqlx::query_as("select * from watchpump.set_consumer_rate($1, $2)")
        .bind(service_id)
        .bind(rate)
        .fetch_one(pool)
        .await
        .map_err(Error::raised)
}

/// The operator's maximum for the service named (None: no limit); the
/// consumer's own rate is lowered to it. An unknown service is
/// [`Error::NotFound`].
pub async fn set_max(pool: &PgPool, service: &str, rate: Option<i32>) -> Result<()> {
    sqlx::query("select watchpump.set_max_rate($1, $2)")
        .bind(service)
        .bind(rate)
        .execute(pool)
        .await
        .map_err(Error::raised)?;
    Ok(())
}
