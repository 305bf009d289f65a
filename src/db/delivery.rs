//! The pump's statements (`sql/functions/0500_delivery.sql`): claim,
//! write back, give back, sleep and sweep; and `message()`, one
//! delivery's message as the pump sends it, which the panel and the
//! consumer API read ([`message`]). Each is one round trip to a
//! function that holds the logic a DBA may read; the pump's side of them
//! (its slots and reports, the payloads its messages share) is
//! `crate::pump::store`.
//!
//! The rows that cross are declared here, one struct each; a composite
//! type's (`watchpump.claim_slot`, `claimed_message`, `claim_ref`,
//! `attempt_report`) field is one attribute there, one here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::PgPool;

use crate::delivery::{Message, State};

/// A `watchpump.claim_slot` (`sql/migrations/0020_delivery_engine_v4.sql`):
/// what one claim may take of a service.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "watchpump.claim_slot")]
pub struct ClaimSlot {
    pub service_id: i64,
    pub free: i32,
    pub probe: bool,
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
/// change only.
#[derive(Debug)]
pub struct ClaimedMessage {
    pub delivery_id: i64,
    pub change_id: i64,
    pub watch_id: i64,
    pub service_id: i64,
    pub service_version: i32,
    pub attempt: i32,
    pub resource: String,
    pub object: String,
    pub kind: String,
    pub sequence: i64,
    pub occurred_at: DateTime<Utc>,
    pub payload: Option<String>,
    pub expired_lease_of: Option<String>,
    /// The change's trace context (issue 21): a malformed value never
    /// reaches the table, so parsing it only fails if another writer
    /// bypassed emit().
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// A resync's replay (issue 20, `0012_resync.sql`); null before it.
    pub replay: Option<bool>,
}

/// `watchpump.claim()`: leases up to `limits` of the due deliveries that
/// `slots` allow (`default_free` for a service not among them), each for
/// `lease`. The attributes but the payload, the lease's former holder, the
/// trace context and the replay flag are never null.
pub async fn claim(
    pool: &PgPool,
    pump: &str,
    slots: &[ClaimSlot],
    default_free: i32,
    lease: Duration,
    limits: ClaimLimits,
) -> sqlx::Result<Vec<ClaimedMessage>> {
    sqlx::query_as!(
        ClaimedMessage,
        r#"select delivery_id as "delivery_id!", change_id as "change_id!",
                  watch_id as "watch_id!", service_id as "service_id!",
                  service_version as "service_version!", attempt as "attempt!",
                  resource as "resource!", object as "object!", kind as "kind!",
                  sequence as "sequence!", occurred_at as "occurred_at!",
                  payload, expired_lease_of, traceparent, tracestate, replay
           from watchpump.claim($1, $2, $3, $4, $5, $6)"#,
        pump,
        // A composite array the macro cannot name: its type is the derive's.
        slots as _,
        default_free,
        interval(lease),
        limits.rows,
        limits.bytes,
    )
    .fetch_all(pool)
    .await
}

/// A `watchpump.claim_ref`: a claimed delivery given back, by its attempt.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "watchpump.claim_ref")]
pub struct ClaimRef {
    pub delivery_id: i64,
    pub attempt: i32,
}

/// `watchpump.release()`: claimed deliveries given back unsent, pending
/// again at once for any pump. Returns how many this pump still held.
pub async fn release(pool: &PgPool, pump: &str, claims: &[ClaimRef]) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"select watchpump.release($1, $2) as "released!""#,
        pump,
        claims as _,
    )
    .fetch_one(pool)
    .await
}

/// A `watchpump.attempt_report` (`sql/migrations/0008_storage_v3.sql`):
/// what became of one attempt, as `watchpump.complete()` takes it.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "watchpump.attempt_report")]
pub struct AttemptReport {
    pub delivery_id: i64,
    pub attempt: i32,
    /// `delivered`, `gone` or `retry`.
    pub outcome: String,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub duration_ms: f64,
    pub response_head: Option<String>,
    pub next_attempt_at: DateTime<Utc>,
}

/// A `state` column read as the [`State`] it spells (`"state!: State"` in
/// a statement): a word [`State`] does not know fails the row, as a column
/// that does not decode.
impl sqlx::Type<sqlx::Postgres> for State {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for State {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<State, sqlx::error::BoxDynError> {
        Ok(<&str as sqlx::Decode<'r, sqlx::Postgres>>::decode(value)?.parse()?)
    }
}

/// Where a delivery stands after the pump reported an attempt: a row of
/// `watchpump.complete()`.
#[derive(Debug, Clone)]
pub struct Settled {
    pub delivery_id: i64,
    pub service_id: i64,
    pub state: State,
    /// When a delivery that stays pending is due again: the back-off's
    /// time, or its deadline if that comes first (its last retry).
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// `watchpump.complete()`: records every attempt reported and returns where
/// each delivery now stands, deliveries dropped with a watch that answered
/// 410 included. A state the SQL spells in a word [`State`] does not know
/// fails the call, as a column that does not decode.
pub async fn complete(
    pool: &PgPool,
    pump: &str,
    reports: &[AttemptReport],
) -> sqlx::Result<Vec<Settled>> {
    sqlx::query!(
        r#"select delivery_id as "delivery_id!", service_id as "service_id!",
                  state as "state!", next_attempt_at
           from watchpump.complete($1, $2)"#,
        pump,
        reports as _,
    )
    .try_map(|r| {
        Ok(Settled {
            delivery_id: r.delivery_id,
            service_id: r.service_id,
            state: r.state.parse().map_err(|e| sqlx::Error::ColumnDecode {
                index: "state".into(),
                source: Box::new(e),
            })?,
            next_attempt_at: r.next_attempt_at,
        })
    })
    .fetch_all(pool)
    .await
}

/// `watchpump.sleep()`: emitters' next delivery raises NOTIFY for this pump.
pub async fn sleep(pool: &PgPool, pump: &str) -> sqlx::Result<()> {
    // In `from`, so that the statement has no (void) column to decode.
    sqlx::query!("select from watchpump.sleep($1)", pump)
        .execute(pool)
        .await?;
    Ok(())
}

/// The pump is going away: no more notifications on its account.
pub async fn leave(pool: &PgPool, pump: &str) -> sqlx::Result<()> {
    sqlx::query!("delete from watchpump.sleepers where pump = $1", pump)
        .execute(pool)
        .await?;
    Ok(())
}

/// Per-service overdue counts from a sweep.
#[derive(Debug, Clone)]
pub struct Swept {
    pub service_id: i64,
    pub service: String,
    pub failed: i32,
}

/// `watchpump.sweep()`, the backstop; deadlines are checked at most every
/// `deadlines_every`.
pub async fn sweep(
    pool: &PgPool,
    pump: &str,
    deadlines_every: Duration,
) -> sqlx::Result<Vec<Swept>> {
    sqlx::query_as!(
        Swept,
        r#"select service_id as "service_id!", service as "service!", failed as "failed!"
           from watchpump.sweep($1, $2)"#,
        pump,
        interval(deadlines_every),
    )
    .fetch_all(pool)
    .await
}

/// `watchpump.release_backlog()`: a service answered again, and its waiting
/// deliveries are due now. Returns how many.
pub async fn release_backlog(pool: &PgPool, service_id: i64) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"select watchpump.release_backlog($1) as "released!""#,
        service_id
    )
    .fetch_one(pool)
    .await
}

fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: d.as_micros() as i64,
    }
}

/// A delivery's message as the pump sends it, in the shape the pump's
/// claims fill too ([`Message`]), and its service's base URL: what the
/// panel shows as the request sent, and the consumer API as the body.
#[derive(Debug, Clone)]
pub struct Sent {
    pub message: Message,
    pub base_url: String,
}

/// `watchpump.message()`: None if there is no such delivery, or its change
/// was pruned.
pub async fn message(pool: &PgPool, delivery_id: i64) -> sqlx::Result<Option<Sent>> {
    let row = sqlx::query!(
        r#"select delivery_id as "delivery_id!", change_id as "change_id!", watch_id as "watch_id!",
                  attempt as "attempt!", resource as "resource!", object as "object!",
                  kind as "kind!", sequence as "sequence!", occurred_at as "occurred_at!",
                  payload as "payload!", base_url as "base_url!", replay as "replay!"
           from watchpump.message($1)"#,
        delivery_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Sent {
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
            payload: r.payload.into(),
            replay: r.replay,
        },
        base_url: r.base_url,
    }))
}
