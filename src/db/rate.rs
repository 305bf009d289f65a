//! The rates' statements (`sql/functions/0250_rate.sql`): a consumer
//! service's delivery rate, the pumps' token buckets that enforce it
//! ([`crate::pump::rate`]), and the bucket of a service's self-service
//! writes ([`crate::api::limits`]).

use serde::Serialize;
use sqlx::PgPool;

/// A service's rates, in deliveries a second; null is no limit.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Rates {
    /// The one that holds: the lower of the two.
    pub rate: Option<i32>,
    /// The operator's (`watchpump services set-rate`).
    pub max_rate: Option<i32>,
    /// The consumer's own (`PUT /api/v1/rate`).
    pub consumer_rate: Option<i32>,
}

pub async fn rates(pool: &PgPool, service_id: i64) -> sqlx::Result<Rates> {
    sqlx::query_as!(
        Rates,
        "select watchpump.effective_rate(max_rate, consumer_rate) as rate, max_rate, consumer_rate
         from watchpump.services where id = $1",
        service_id
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.set_consumer_rate()`: 22023 above the operator's maximum.
pub async fn set_consumer_rate(
    pool: &PgPool,
    service_id: i64,
    rate: Option<i32>,
) -> sqlx::Result<Rates> {
    sqlx::query_as!(
        Rates,
        "select rate, max_rate, consumer_rate from watchpump.set_consumer_rate($1, $2)",
        service_id,
        rate
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.set_max_rate()`: P0002 for an unknown service.
pub async fn set_max_rate(pool: &PgPool, service: &str, rate: Option<i32>) -> sqlx::Result<()> {
    sqlx::query!(
        r#"select watchpump.set_max_rate($1, $2) as "set""#,
        service,
        rate
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Tokens a rate-limited service's bucket granted a claim.
pub struct Granted {
    pub service_id: i64,
    pub granted: i32,
    /// How long until the bucket holds what the next claim would take;
    /// infinity for a service with nothing queued (granted 0, its bucket
    /// not written).
    pub refill_seconds: f64,
}

/// `watchpump.take_tokens()`: `wanted[i]` tokens for `service_ids[i]`, and
/// `default_wanted` for each rate-limited service not listed; only
/// rate-limited services are in the answer.
pub async fn take_tokens(
    pool: &PgPool,
    service_ids: &[i64],
    wanted: &[i32],
    default_wanted: i32,
) -> sqlx::Result<Vec<Granted>> {
    sqlx::query_as!(
        Granted,
        r#"select service_id as "service_id!", granted as "granted!",
                  refill_seconds as "refill_seconds!"
           from watchpump.take_tokens($1, $2, $3)"#,
        service_ids,
        wanted,
        default_wanted
    )
    .fetch_all(pool)
    .await
}

/// `watchpump.give_back_tokens()`: `unused[i]` tokens back to
/// `service_ids[i]`'s bucket.
pub async fn give_back_tokens(
    pool: &PgPool,
    service_ids: &[i64],
    unused: &[i32],
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"select watchpump.give_back_tokens($1, $2) as "given""#,
        service_ids,
        unused
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What one self-service write's token cost: the wait before it may be
/// asked again (0 or less: it was taken), and the bucket's rate and burst.
pub struct WriteTokens {
    pub wait_secs: f64,
    pub rate: f64,
    pub burst: i32,
}

/// `watchpump.take_write_tokens()`: one token of the service's bucket.
pub async fn take_write_token(pool: &PgPool, service_id: i64) -> sqlx::Result<WriteTokens> {
    sqlx::query_as!(
        WriteTokens,
        r#"select wait_secs as "wait_secs!", rate as "rate!", burst as "burst!"
           from watchpump.take_write_tokens($1, 1)"#,
        service_id
    )
    .fetch_one(pool)
    .await
}
