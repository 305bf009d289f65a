//! Pausing a watch, or a whole service (issue 20): while paused nothing is
//! sent and nothing fails; news keeps superseding, so what waits stays one
//! delivery per (watch, object); resume sends it with a fresh delivery
//! window. The rules are SQL's (`sql/functions/0500_consumer.sql`, "PAUSE");
//! this is their one caller, for the API and the CLI alike.

use sqlx::PgPool;

use crate::error::{Error, Result};

/// Most held deliveries one run of [`hold_paused`] supersedes, and most it
/// holds: one statement's worth, the rest at the next run (every operator
/// tick, `WATCHPUMP_OPERATOR_INTERVAL_MS`).
pub const HOLD_BATCH: i32 = 10_000;

/// Pauses (`paused`) or resumes one of the service's live watches. Returns
/// whether anything changed (a repeated pause or resume changes nothing).
/// Another service's watch, or a removed one, is [`Error::NotFound`].
pub async fn set_watch(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    paused: bool,
) -> Result<bool> {
    sqlx::query_scalar("select watchpump.set_watch_paused($1, $2, $3)")
        .bind(service_id)
        .bind(watch_id)
        .bind(paused)
        .fetch_one(pool)
        .await
        .map_err(Error::raised)
}

/// Pauses or resumes every watch of a service; whether anything changed.
pub async fn set_service(pool: &PgPool, service_id: i64, paused: bool) -> Result<bool> {
    sqlx::query_scalar("select watchpump.set_service_paused($1, $2)")
        .bind(service_id)
        .bind(paused)
        .fetch_one(pool)
        .await
        .map_err(Error::raised)
}

/// One run of `watchpump.hold_paused()`: supersedes older news among held
/// deliveries and holds what was queued since the last run. Returns
/// (superseded, held).
pub async fn hold_paused(pool: &PgPool) -> Result<(i32, i32)> {
    Ok(
        sqlx::query_as("select superseded, held from watchpump.hold_paused($1)")
            .bind(HOLD_BATCH)
            .fetch_one(pool)
            .await?,
    )
}

/// A live service's id by name, for the CLI.
pub async fn service_id(pool: &PgPool, name: &str) -> Result<i64> {
    sqlx::query_scalar("select id from watchpump.services where name = $1 and removed_at is null")
        .bind(name)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| Error::NotFound(format!("there is no service {name}")))
}
