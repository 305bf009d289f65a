//! Pausing a watch, or a whole service (issue 20): while paused nothing is
//! sent and nothing fails; news keeps superseding, so what waits stays one
//! delivery per (watch, object); resume sends it, each delivery with a
//! fresh delivery window from its release. The rules are SQL's
//! (`sql/functions/0550_pause.sql`, "PAUSE"); this is their one caller,
//! for the API, the CLI and the operator's periodic task alike.
//!
//! What a pause or a resume writes is bounded (issue 34): each holds or
//! releases at most [`PAUSE_BATCH`] deliveries itself, and the operator's
//! task does the rest a batch a round ([`hold_paused`],
//! [`release_resumed`]); through the API a watch resumed less than
//! [`REPAUSE_AFTER_SECS`] ago is not paused again; and a consumer's pause
//! ends after `watchpump.settings.max_pause` ([`expire_pauses`]).

use sqlx::PgPool;

use crate::db::pause as db;
use crate::error::{Error, Result};

/// Most held deliveries one run of [`hold_paused`] supersedes, and most it
/// holds: one statement's worth, the rest at the next run (every operator
/// tick, `WATCHPUMP_OPERATOR_INTERVAL_MS`).
pub const HOLD_BATCH: i32 = 10_000;

/// Most deliveries a pause holds, or a resume releases, in its own call
/// (the SQL's literal in `set_watch_paused()`, `set_service_paused()` and
/// `start_release()`): a bounded write whatever the watch holds, and as
/// many as claim()'s walk steps over at most (its WALK_SLACK, 1,024), so
/// that a watch paused with fewer waiting holds them all at once.
pub const PAUSE_BATCH: i32 = 1_000;

/// Most deliveries one run of [`release_resumed`] releases per watch, and
/// in all.
pub const RELEASE_PER_WATCH: i32 = 1_000;
pub const RELEASE_BATCH: i32 = 10_000;

/// A watch resumed less than this ago is not paused again through the
/// API (429): each pause and resume rewrites what the watch holds, a
/// batch at a time, so a loop of them would rewrite it again and again.
pub const REPAUSE_AFTER_SECS: i64 = 60;

/// Most expired pauses one run of [`expire_pauses`] ends.
pub const EXPIRE_BATCH: i32 = 100;

/// Pauses (`paused`) or resumes one of the service's live watches, as the
/// operator (the CLI): no minimum between a resume and a pause. Returns
/// whether anything changed (a repeated pause or resume changes nothing).
/// Another service's watch, or a removed one, is [`Error::NotFound`].
pub async fn set_watch(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    paused: bool,
) -> Result<bool> {
    set_watch_after(pool, service_id, watch_id, paused, None).await
}

/// [`set_watch`] as the consumer asks it through the API: a pause of a
/// watch resumed less than [`REPAUSE_AFTER_SECS`] ago is a database error
/// with SQLSTATE 54000 (the API's 429, with the wait).
pub async fn set_watch_by_consumer(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    paused: bool,
) -> Result<bool> {
    set_watch_after(pool, service_id, watch_id, paused, Some(REPAUSE_AFTER_SECS)).await
}

async fn set_watch_after(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    paused: bool,
    repause_after_secs: Option<i64>,
) -> Result<bool> {
    let repause_after_secs = repause_after_secs.map(|s| s as f64);
    db::set_watch_paused(pool, service_id, watch_id, paused, repause_after_secs)
        .await
        .map_err(Error::raised)
}

/// Pauses or resumes every watch of a service; whether anything changed.
pub async fn set_service(pool: &PgPool, service_id: i64, paused: bool) -> Result<bool> {
    db::set_service_paused(pool, service_id, paused)
        .await
        .map_err(Error::raised)
}

/// One run of `watchpump.hold_paused()`: supersedes older news among held
/// deliveries and holds what was queued since the last run. Returns
/// (superseded, held).
pub async fn hold_paused(pool: &PgPool) -> Result<(i32, i32)> {
    let db::Held { superseded, held } = db::hold_paused(pool, HOLD_BATCH).await?;
    Ok((superseded, held))
}

/// One run of `watchpump.release_resumed()`: what resumed watches still
/// hold, released a batch at a time. Returns how many were released.
pub async fn release_resumed(pool: &PgPool) -> Result<i32> {
    Ok(db::release_resumed(pool, RELEASE_PER_WATCH, RELEASE_BATCH).await?)
}

/// One run of `watchpump.expire_pauses()`: the consumers' pauses older
/// than `watchpump.settings.max_pause` (7 days by default) end, and what
/// they held is released. Returns (service, watch id) of each, logged and
/// counted in `watchpump_pauses_expired_total`.
pub async fn expire_pauses(pool: &PgPool) -> Result<Vec<(String, i64)>> {
    let ended: Vec<(String, i64)> = db::expire_pauses(pool, EXPIRE_BATCH)
        .await?
        .into_iter()
        .map(|e| (e.service, e.watch_id))
        .collect();
    for (service, watch_id) in &ended {
        tracing::warn!(
            service = %service,
            watch_id,
            "a pause reached its maximum (watchpump.settings.max_pause): the watch is resumed"
        );
        metrics::counter!(crate::metrics::PAUSES_EXPIRED, "service" => service.clone())
            .increment(1);
    }
    Ok(ended)
}

/// A live service's id by name, for the CLI.
pub async fn service_id(pool: &PgPool, name: &str) -> Result<i64> {
    crate::db::registry::live_service_id(pool, name)
        .await?
        .ok_or_else(|| Error::NotFound(format!("there is no service {name}")))
}
