//! The pump's side of its database calls (`crate::db::delivery`, each one
//! round trip to a function in `sql/functions/0500_delivery.sql`): the
//! slots and reports it sends, and the claimed rows made messages that
//! share each change's payload.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use sqlx::PgPool;

use crate::db::delivery::{self as db, AttemptReport, ClaimRef, ClaimSlot};
pub use crate::db::delivery::{ClaimLimits, Settled, Swept};
use crate::delivery::outcome::Finished;
use crate::delivery::{Claimed, Message, Payload};
use crate::error::Result;
use crate::pump::health::Slots;

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
    let rows = db::claim(pool, pump, &slots_of, slots.default_free, lease, limits).await?;
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
    Ok(db::release(pool, pump, &refs).await?)
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
    Ok(db::complete(pool, pump, &reports).await?)
}

/// Tells emitters this pump sleeps: their next delivery raises NOTIFY.
pub async fn sleep(pool: &PgPool, pump: &str) -> Result<()> {
    Ok(db::sleep(pool, pump).await?)
}

/// The pump is going away: no more notifications on its account.
pub async fn leave(pool: &PgPool, pump: &str) -> Result<()> {
    Ok(db::leave(pool, pump).await?)
}

/// The backstop; deadlines are checked at most every `deadlines_every`.
pub async fn sweep(
    pool: &PgPool,
    pump: &str,
    deadlines_every: std::time::Duration,
) -> Result<Vec<Swept>> {
    Ok(db::sweep(pool, pump, deadlines_every).await?)
}

/// A service answered again: make its waiting deliveries due now.
pub async fn release_backlog(pool: &PgPool, service_id: i64) -> Result<i32> {
    Ok(db::release_backlog(pool, service_id).await?)
}
