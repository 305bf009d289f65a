//! The rate a consumer service can take (issue 20): the operator's maximum
//! and the consumer's own, lower, one. Enforced by the pumps together
//! ([`crate::pump::rate`]); set here, for the API, the admin API and the
//! CLI alike, through `sql/functions/0250_rate.sql`.

use sqlx::PgPool;

use crate::db::rate as db;
pub use crate::db::rate::Rates;
use crate::error::{Error, Result};

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
    Ok(db::rates(pool, service_id).await?)
}

/// The consumer's own rate (None: only the operator's holds); above the
/// operator's maximum it is [`Error::Invalid`].
pub async fn set_consumer(pool: &PgPool, service_id: i64, rate: Option<i32>) -> Result<Rates> {
    db::set_consumer_rate(pool, service_id, rate)
        .await
        .map_err(Error::raised)
}

/// The operator's maximum for the service named (None: no limit); the
/// consumer's own rate is lowered to it. An unknown service is
/// [`Error::NotFound`].
pub async fn set_max(pool: &PgPool, service: &str, rate: Option<i32>) -> Result<()> {
    db::set_max_rate(pool, service, rate)
        .await
        .map_err(Error::raised)?;
    Ok(())
}
