//! The rate a consumer can take, across every pump (issue 20): before a
//! claim the pump takes tokens from each rate-limited service's bucket in
//! PostgreSQL (`watchpump.take_tokens()`, `sql/functions/0250_rate.sql`,
//! "RATE") and claims at most the granted count per service; after it, it
//! gives back what it did not use. While no service has a rate, a pump
//! asks once every [`RECHECK`] rather than before every claim ([`Limited`]):
//! a rate set then holds from a pump's next claim within that time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::db::rate as db;
use crate::delivery::Claimed;
use crate::error::Result;
use crate::pump::health::Slots;

/// What a claim took: (service id, tokens granted), for rate-limited
/// services only.
#[derive(Debug, Default)]
pub struct Taken(Vec<(i64, i32)>);

/// How long a pump that found no rate-limited service claims without asking
/// again: the round trip is saved on every claim of a pump whose services
/// have no rate, and a new rate waits at most this long.
pub const RECHECK: Duration = Duration::from_secs(1);

/// One pump's memory of whether any service has a rate.
#[derive(Debug, Default)]
pub struct Limited {
    none_until: Mutex<Option<Instant>>,
}

/// Takes tokens for the services in `slots` (and those it does not list,
/// at `default_free`) and lowers each rate-limited service's free slots to
/// what it was granted, adding the ones `slots` did not list.
pub async fn take(pool: &PgPool, limited: &Limited, slots: &mut Slots) -> Result<Taken> {
    let now = Instant::now();
    if limited
        .none_until
        .lock()
        .unwrap()
        .is_some_and(|until| now < until)
    {
        return Ok(Taken::default());
    }
    let granted: Vec<(i64, i32)> =
        db::take_tokens(pool, &slots.service_ids, &slots.free, slots.default_free)
            .await?
            .into_iter()
            .map(|g| (g.service_id, g.granted))
            .collect();
    *limited.none_until.lock().unwrap() = granted.is_empty().then(|| now + RECHECK);
    for &(service_id, n) in &granted {
        match slots.service_ids.iter().position(|id| *id == service_id) {
            Some(i) => slots.free[i] = slots.free[i].min(n),
            None => {
                slots.service_ids.push(service_id);
                slots.free.push(n);
                slots.probe.push(false);
            }
        }
    }
    Ok(Taken(granted))
}

/// Gives back the tokens of `taken` that `claimed` did not use.
pub async fn give_back(pool: &PgPool, taken: &Taken, claimed: &[Claimed]) -> Result<()> {
    let (ids, unused): (Vec<i64>, Vec<i32>) = taken
        .0
        .iter()
        .map(|&(service_id, n)| {
            let used = claimed
                .iter()
                .filter(|c| c.service_id == service_id)
                .count() as i32;
            (service_id, n - used)
        })
        .filter(|&(_, unused)| unused > 0)
        .unzip();
    if ids.is_empty() {
        return Ok(());
    }
    db::give_back_tokens(pool, &ids, &unused).await?;
    Ok(())
}
