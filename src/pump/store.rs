//! The pump's database calls: each is one round trip to a function in
//! `sql/functions/0500_delivery.sql` (the rate's in `0250_rate.sql`), which
//! holds the logic a DBA may read.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use sqlx::PgPool;

use crate::delivery::outcome::Finished;
use crate::delivery::{Claimed, Message, Payload, State};
use crate::error::Result;
use crate::pump::health::Slots;

/// Where a delivery stands after the pump reported an attempt.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Settled {
    pub delivery_id: i64,
    pub service_id: i64,
    #[sqlx(try_from = "String")]
    pub state: State,
    /// When a delivery that stays pending is due again: the back-off's
    /// time, or its deadline if that comes first (its last retry).
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Per-service overdue counts from a sweep.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Swept {
    pub service_id: i64,
    pub service: String,
    pub failed: i32,
}

/// What one claim may take besides each service's slots: deliveries in
/// all, and payload bytes (each change's counted once; the first change
/// goes whatever its size).
#[derive(Debug, Clone, Copy)]
pub struct ClaimLimits {
    pub rows: i32,
    pub bytes: i64,
}

/// A `watchpump.claimed_message` (`sql/migrations/0008_storage_v3.sql`), as
/// `watchpump.claim()` returns them: the payload is on the first row of each
/// change only. A field of the message is one attribute there, one here.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    delivery_id: i64,
    change_id: i64,
    watch_id: i64,
    service_id: i64,
    service_version: i32,
    attempt: i32,
    resource: String,
    object: String,
    kind: String,
    sequence: i64,
    occurred_at: chrono::DateTime<chrono::Utc>,
    payload: Option<String>,
    expired_lease_of: Option<String>,
    // The change's trace context (issue 21; the `traces` branch's one edit
    // to this row): a malformed value never reaches the table, so parse
    // only fails if another writer bypassed emit().
    traceparent: Option<String>,
    tracestate: Option<String>,
    // A resync's replay (issue 20, 0012_resync.sql).
    replay: Option<bool>,
}

/// Claims and leases due deliveries; each change's payload is read once
/// and shared by its deliveries, counted in `in_flight_bytes` while they
/// hold it.
pub async fn claim(
    pool: &PgPool,
    pump: &str,
    slots: &Slots,
    lease: std::time::Duration,
    limits: ClaimLimits,
    in_flight_bytes: &Arc<AtomicU64>,
) -> Result<Vec<Claimed>> {
    let slots_of: Vec<ClaimSlot> = slots
        .service_ids
        .iter()
        .zip(&slots.free)
        .zip(&slots.probe)
        .map(|((&service_id, &free), &probe)| ClaimSlot {
            service_id,
            free,
            probe,
        })
        .collect();
    let rows: Vec<ClaimRow> =
        sqlx::query_as("select * from watchpump.claim($1, $2, $3, $4, $5, $6)")
            .bind(pump)
            .bind(slots_of)
            .bind(slots.default_free)
            .bind(interval(lease))
            .bind(limits.rows)
            .bind(limits.bytes)
            .fetch_all(pool)
            .await?;
    let mut payloads: HashMap<i64, Payload> = HashMap::new();
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let payload =
                match r.payload {
                    Some(text) => {
                        let payload = Payload::metered(text, in_flight_bytes);
                        payloads.insert(r.change_id, payload.clone());
                        payload
                    }
                    // claim() orders each change's rows after its first.
                    None => match payloads.get(&r.change_id) {
                        Some(payload) => payload.clone(),
                        None => {
                            tracing::error!(delivery_id = r.delivery_id, change_id = r.change_id,
                            "claimed without its payload; it goes again when its lease runs out");
                            return None;
                        }
                    },
                };
            Some(Claimed {
                message: Message {
                    delivery_id: r.delivery_id,
                    change_id: r.change_id,
                    watch_id: r.watch_id,
                    attempt: r.attempt,
                    resource: r.resource,
                    object: r.object,
                    kind: r.kind,
                    sequence: r.sequence,
                    occurred_at: r.occurred_at,
                    payload,
                    replay: r.replay.unwrap_or(false),
                },
                service_id: r.service_id,
                service_version: r.service_version,
                expired_lease_of: r.expired_lease_of,
                trace: r.traceparent.as_deref().and_then(|t| {
                    crate::telemetry::context::TraceParent::parse(t, r.tracestate.as_deref())
                }),
            })
        })
        .collect())
}

/// A `watchpump.claim_slot` (`sql/migrations/0020_delivery_engine_v4.sql`):
/// what one claim may take of a service.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "watchpump.claim_slot")]
struct ClaimSlot {
    service_id: i64,
    free: i32,
    probe: bool,
}

/// A `watchpump.claim_ref`: a claimed delivery given back, by its attempt.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "watchpump.claim_ref")]
struct ClaimRef {
    delivery_id: i64,
    attempt: i32,
}

/// Gives claimed deliveries back unsent (`watchpump.release()`): pending
/// again at once, for any pump. Returns how many this pump still held.
pub async fn release(pool: &PgPool, pump: &str, claims: &[(i64, i32)]) -> Result<i32> {
    let refs: Vec<ClaimRef> = claims
        .iter()
        .map(|&(delivery_id, attempt)| ClaimRef {
            delivery_id,
            attempt,
        })
        .collect();
    Ok(sqlx::query_scalar("select watchpump.release($1, $2)")
        .bind(pump)
        .bind(refs)
        .fetch_one(pool)
        .await?)
}

/// A `watchpump.attempt_report` (`sql/migrations/0008_storage_v3.sql`):
/// what became of one attempt, as `watchpump.complete()` takes it. A field
/// is one attribute there, one here.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "watchpump.attempt_report")]
struct AttemptReport {
    delivery_id: i64,
    attempt: i32,
    outcome: String,
    status: Option<i32>,
    error: Option<String>,
    started_at: chrono::DateTime<chrono::Utc>,
    duration_ms: f64,
    response_head: Option<String>,
    next_attempt_at: chrono::DateTime<chrono::Utc>,
}

/// Records every finished attempt and returns where each delivery now stands,
/// including deliveries dropped because their watch answered 410.
pub async fn complete(pool: &PgPool, pump: &str, batch: &[&Finished]) -> Result<Vec<Settled>> {
    let reports: Vec<AttemptReport> = batch
        .iter()
        .map(|f| AttemptReport {
            delivery_id: f.claimed.message.delivery_id,
            attempt: f.claimed.message.attempt,
            outcome: f.result.as_outcome().to_string(),
            status: f.result.status().map(i32::from),
            error: f.error.clone(),
            started_at: f.started,
            duration_ms: f.duration.as_secs_f64() * 1000.0,
            response_head: f.response_head.clone(),
            next_attempt_at: f.result.retry_at().unwrap_or(f.started),
        })
        .collect();
    Ok(sqlx::query_as("select * from watchpump.complete($1, $2)")
        .bind(pump)
        .bind(reports)
        .fetch_all(pool)
        .await?)
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
