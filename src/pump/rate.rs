//! The rate a consumer can take, across every pump (issue 20): before a
//! claim the pump takes tokens from each rate-limited service's bucket in
//! PostgreSQL (`watchpump.take_tokens()`, `sql/functions/0250_rate.sql`,
//! "RATE") and claims at most the granted count per service; after it, it
//! gives back what it did not use. While no service has a rate, a pump
//! asks once every [`RECHECK`] rather than before every claim ([`Limited`]):
//! a rate set then holds from a pump's next claim within that time.
//!
//! A claim that used every token it was granted for a service (its
//! deliveries wait for tokens, not for slots) claims again when that
//! service's bucket holds the next claim's tokens ([`Limited::take_next_claim`]):
//! a pump that waited for its sweep instead sent a burst a sweep, about 4
//! a second for a service limited to 50 at the default sweep of a second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::db::rate as db;
use crate::error::Result;
use crate::pump::health::Slots;

/// What a claim took, for rate-limited services only.
#[derive(Debug, Default)]
pub struct Taken {
    /// When the tokens were asked for.
    asked: Option<Instant>,
    grants: Vec<Grant>,
}

#[derive(Debug)]
struct Grant {
    service_id: i64,
    /// The slots the pump had free for it: what it asked for.
    wanted: i32,
    granted: i32,
    /// How long until its bucket holds the next claim's tokens; `None` for
    /// a service with nothing queued (granted nothing, and nothing to
    /// claim again for).
    refill: Option<Duration>,
}

/// How long a pump that found no rate-limited service claims without asking
/// again: the round trip is saved on every claim of a pump whose services
/// have no rate, and a new rate waits at most this long.
pub const RECHECK: Duration = Duration::from_secs(1);

/// The soonest a pump claims again for a service waiting for its rate's
/// tokens: a bucket that already holds them (slots, not tokens, held the
/// claim) is not asked again at once in a loop.
const REFILL_FLOOR: Duration = Duration::from_millis(10);

/// One pump's memory of the rates: whether any service has one, and when
/// a service whose claim was held by its tokens has the next ones.
#[derive(Debug, Default)]
pub struct Limited {
    none_until: Mutex<Option<Instant>>,
    next_claim: Mutex<Option<Instant>>,
}

impl Limited {
    /// When the claim loop claims again for a service that is waiting for
    /// its rate's tokens; `None` when none is. Read once: the claim that
    /// follows any wake-up asks for tokens again and sets the next.
    pub fn take_next_claim(&self) -> Option<Instant> {
        self.next_claim.lock().unwrap().take()
    }
}

impl Taken {
    /// The rate-limited services that had nothing queued when the tokens
    /// were taken: granted nothing, and with nothing more due.
    pub fn nothing_queued(&self) -> impl Iterator<Item = i64> + '_ {
        self.grants
            .iter()
            .filter(|g| g.refill.is_none())
            .map(|g| g.service_id)
    }
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
    let granted = db::take_tokens(pool, &slots.service_ids, &slots.free, slots.default_free).await?;
    *limited.none_until.lock().unwrap() = granted.is_empty().then(|| now + RECHECK);
    // Every limited service has a row, idle or not: found by id, not by a
    // walk of the slots for each.
    let listed: HashMap<i64, usize> =
        slots.service_ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut grants = Vec::with_capacity(granted.len());
    for g in granted {
        let wanted = match listed.get(&g.service_id).copied() {
            Some(i) => {
                let wanted = slots.free[i];
                slots.free[i] = wanted.min(g.granted);
                wanted
            }
            None => {
                slots.service_ids.push(g.service_id);
                slots.free.push(g.granted);
                slots.probe.push(false);
                slots.default_free
            }
        };
        grants.push(Grant {
            service_id: g.service_id,
            wanted,
            granted: g.granted,
            refill: g.refill_seconds.is_finite().then(|| {
                Duration::from_secs_f64(g.refill_seconds.clamp(0.0, RECHECK.as_secs_f64()))
                    .max(REFILL_FLOOR)
            }),
        });
    }
    Ok(Taken {
        asked: Some(now),
        grants,
    })
}

/// Gives back the tokens of `taken` that the claim did not use (`found`:
/// how many it claimed per service), and
/// remembers when to claim again for the services whose tokens held their
/// claim: those that wanted some and used all they got (none, when another
/// pump had just taken them). A service that left tokens unused has no
/// more due; one with no free slot is woken by a finished send.
pub async fn give_back(
    pool: &PgPool,
    limited: &Limited,
    taken: &Taken,
    found: &HashMap<i64, u32>,
) -> Result<()> {
    let mut next_claim = None::<Instant>;
    let (mut ids, mut unused) = (Vec::new(), Vec::new());
    for g in &taken.grants {
        let used = found.get(&g.service_id).copied().unwrap_or(0) as i32;
        if used < g.granted {
            ids.push(g.service_id);
            unused.push(g.granted - used);
        } else if let (true, Some(refill)) = (g.wanted > 0, g.refill) {
            let at = taken.asked.map(|asked| asked + refill);
            next_claim = next_claim.into_iter().chain(at).min();
        }
    }
    if taken.asked.is_some() {
        *limited.next_claim.lock().unwrap() = next_claim;
    }
    if !ids.is_empty() {
        db::give_back_tokens(pool, &ids, &unused).await?;
    }
    Ok(())
}
