//! The kit's calls into its SQL (`sql/kit/functions/0100_inbox_functions.sql`), where
//! the inbox's rules are written for a DBA to read.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::db::inbox as db;
use crate::kit::delivery::Delivery;
use crate::kit::error::{Error, Result};

/// What the inbox made of a verified delivery (`watchpump_inbox.receive()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    New,
    Duplicate,
    Stale,
    UnknownWatch,
    RemovedWatch,
}

/// Records `d` in the transaction `tx` belongs to, and says what to do.
pub(crate) async fn receive(tx: &mut PgConnection, d: &Delivery) -> Result<Received> {
    let verdict = db::receive(tx, d).await?;
    match verdict.as_str() {
        "new" => Ok(Received::New),
        "duplicate" => Ok(Received::Duplicate),
        "stale" => Ok(Received::Stale),
        "unknown_watch" => Ok(Received::UnknownWatch),
        "removed_watch" => Ok(Received::RemovedWatch),
        other => Err(Error::Invalid(format!(
            "watchpump_inbox.receive() said {other:?}: is the kit's schema newer than this build?"
        ))),
    }
}

pub use crate::db::inbox::KnownWatch;

/// The watches this consumer registered at `producer`, live and removed,
/// oldest first.
pub async fn known_watches(pool: &PgPool, producer: &str) -> Result<Vec<KnownWatch>> {
    Ok(db::known_watches(pool, producer).await?)
}

/// Deletes the inbox's records of deliveries received before `before`, in
/// batches of 1,000 (so no long transaction holds back vacuum); returns how
/// many. Replays of pruned deliveries are still refused by the positions per
/// (watch, object). Run it from a daily job.
pub async fn prune(pool: &PgPool, before: DateTime<Utc>) -> Result<u64> {
    const BATCH: i32 = 1000;
    let mut total = 0u64;
    loop {
        let n = db::prune(pool, before, BATCH).await?;
        total += n as u64;
        if n < BATCH {
            return Ok(total);
        }
    }
}
