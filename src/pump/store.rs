//! The pump's database calls: each is one round trip to a function in
//! `sql/functions/0200_pump.sql`, which holds the logic a DBA may read.

use sqlx::PgPool;

use crate::delivery::outcome::Finished;
use crate::delivery::{Claimed, State};
use crate::error::Result;
use crate::pump::health::Slots;

/// Where a delivery stands after the pump reported an attempt.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Settled {
    pub delivery_id: i64,
    pub service_id: i64,
    #[sqlx(try_from = "String")]
    pub state: State,
}

/// Per-service overdue counts from a sweep.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Swept {
    pub service_id: i64,
    pub service: String,
    pub expired_leases: i32,
    pub failed: i32,
}

pub async fn claim(
    pool: &PgPool,
    pump: &str,
    slots: &Slots,
    lease: std::time::Duration,
) -> Result<Vec<Claimed>> {
    Ok(
        sqlx::query_as("select * from watchpump.claim($1, $2, $3, $4, $5, $6)")
            .bind(pump)
            .bind(&slots.service_ids)
            .bind(&slots.free)
            .bind(&slots.probe)
            .bind(slots.default_free)
            .bind(interval(lease))
            .fetch_all(pool)
            .await?,
    )
}

/// Records every finished attempt and returns where each delivery now stands,
/// including deliveries dropped because their watch answered 410.
pub async fn complete(pool: &PgPool, pump: &str, batch: &[&Finished]) -> Result<Vec<Settled>> {
    let n = batch.len();
    let (mut ids, mut attempts, mut outcomes) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut statuses, mut errors, mut started) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut durations, mut heads, mut next) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for f in batch {
        ids.push(f.claimed.message.delivery_id);
        attempts.push(f.claimed.message.attempt);
        outcomes.push(f.result.as_outcome());
        statuses.push(f.result.status().map(i32::from));
        errors.push(f.error.as_deref());
        started.push(f.started);
        durations.push(f.duration.as_secs_f64() * 1000.0);
        heads.push(f.response_head.as_deref());
        next.push(f.result.retry_at().unwrap_or(f.started));
    }
    Ok(
        sqlx::query_as("select * from watchpump.complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
            .bind(pump)
            .bind(ids)
            .bind(attempts)
            .bind(outcomes)
            .bind(statuses)
            .bind(errors)
            .bind(started)
            .bind(durations)
            .bind(heads)
            .bind(next)
            .fetch_all(pool)
            .await?,
    )
}

/// Tells emitters this pump sleeps: their next delivery raises NOTIFY.
pub async fn sleep(pool: &PgPool, pump: &str) -> Result<()> {
    sqlx::query("select watchpump.sleep($1)")
        .bind(pump)
        .execute(pool)
        .await?;
    Ok(())
}

/// The pump is going away: no more notifications on its account.
pub async fn leave(pool: &PgPool, pump: &str) -> Result<()> {
    sqlx::query("delete from watchpump.sleepers where pump = $1")
        .bind(pump)
        .execute(pool)
        .await?;
    Ok(())
}

/// The backstop; deadlines are checked at most every `deadlines_every`.
pub async fn sweep(
    pool: &PgPool,
    pump: &str,
    deadlines_every: std::time::Duration,
) -> Result<Vec<Swept>> {
    Ok(sqlx::query_as("select * from watchpump.sweep($1, $2)")
        .bind(pump)
        .bind(interval(deadlines_every))
        .fetch_all(pool)
        .await?)
}

/// A service answered again: make its waiting deliveries due now.
pub async fn release_backlog(pool: &PgPool, service_id: i64) -> Result<i32> {
    Ok(sqlx::query_scalar("select watchpump.release_backlog($1)")
        .bind(service_id)
        .fetch_one(pool)
        .await?)
}

fn interval(d: std::time::Duration) -> sqlx::postgres::types::PgInterval {
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 0,
        microseconds: d.as_micros() as i64,
    }
}
