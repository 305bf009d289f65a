//! Judging a chaos run, from what the consumers recorded and what the
//! database says:
//!
//! - nothing committed is lost: every committed change has a delivery for
//!   every live watch it matches, and the newest change of every (watch,
//!   object) was answered 2xx, unless its watch was dropped (410);
//! - nothing rolled back is sent;
//! - no two requests of one (watch, object) overlap at the consumer, from
//!   arrival to the handler's real end: a request the pump gave up on is
//!   still being answered (hyper keeps the handler running), and the hold
//!   after no answer must cover that (docs/protocol.md, "One at a time");
//! - sequences never go backwards per (watch, object), neither among all
//!   requests in arrival order nor among 2xx answers; a sequence already
//!   sent comes again only as the same delivery (a duplicate) or as a
//!   resync's replay (docs/protocol.md, "Order with replays");
//! - nothing is left pending, in flight or failed once consumers are healthy;
//! - no delivery id (`webhook-id`) and no (watch, object, sequence) reaches
//!   a consumer for two different changes: a consumer de-duplicating by
//!   the one, or keeping the newest of the other, would drop news as seen
//!   (what an asynchronous failover threatens: the new primary may hand
//!   out again the ids the lost primary had used).
//!
//! The expected deliveries are computed here from the watches' own
//! definitions, not read back from the SQL that made them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::consumers::Request;
use crate::producers::Ledger;
use crate::ByStream;

/// A watch as the suite registered it.
#[derive(Debug, Clone)]
pub struct WatchDef {
    pub id: i64,
    /// Exact, or a prefix ending in '/'.
    pub object: String,
    pub kinds: Option<Vec<String>>,
    /// A watch of the service with a rate ([`RATE`]).
    pub rated: bool,
}

/// The most deliveries a second of the one rate-limited service (the
/// `mixed` consumer's): a little above its share of the changes on
/// average, so that bursts wait for its tokens.
pub const RATE: i32 = 200;

/// The busiest second of requests to the rate-limited service's watches,
/// and a violation when it is far past the rate. The bucket holds the rate
/// plus a burst of a twentieth in the database's time; arrivals are timed
/// at the consumer, after kills, restarts and a loaded machine's scheduling
/// (a stalled pump holds what it claimed, at most a burst), so the bound is
/// twice the rate: a limiter that stopped holding is many times past it.
pub fn rate_held(watches: &[WatchDef], requests: &[Request]) -> (usize, Option<String>) {
    let rated: HashSet<i64> = watches.iter().filter(|w| w.rated).map(|w| w.id).collect();
    let mut at: Vec<DateTime<Utc>> = requests
        .iter()
        .filter(|r| rated.contains(&r.watch_id))
        .map(|r| r.arrived)
        .collect();
    at.sort();
    let (mut busiest, mut start) = (0, 0);
    for end in 0..at.len() {
        while at[end] - at[start] >= chrono::Duration::seconds(1) {
            start += 1;
        }
        busiest = busiest.max(end - start + 1);
    }
    let bound = 2 * RATE as usize + (RATE as usize / 20);
    let violation = (busiest > bound).then(|| {
        format!("the rate-limited service got {busiest} requests within a second (rate {RATE}, bound {bound})")
    });
    (busiest, violation)
}

impl WatchDef {
    fn matches(&self, object: &str, kind: &str) -> bool {
        let object_matches = if self.object.ends_with('/') {
            object.starts_with(&self.object)
        } else {
            object == self.object
        };
        object_matches
            && self
                .kinds
                .as_ref()
                .is_none_or(|k| k.iter().any(|x| x == kind))
    }
}

/// Waits until no delivery is pending or in flight.
pub async fn settled(pool: &PgPool, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let (pending, in_flight): (i64, i64) = sqlx::query_as(
            "select coalesce(sum(pending), 0)::int8, coalesce(sum(in_flight), 0)::int8 from watchpump.backlog",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if pending == 0 && in_flight == 0 {
            return Ok(());
        }
        if std::env::var_os("WATCHPUMP_CHAOS_DEBUG").is_some() {
            let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
                "select service, pending, due_now, in_flight from watchpump.backlog where pending + in_flight > 0",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            eprintln!("settling: {rows:?}");
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not settled {limit:?} after consumers turned healthy: {pending} pending, {in_flight} in flight; {}",
                unsettled(pool).await
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What keeps the first few unsettled deliveries waiting, for the message
/// of a run that did not settle: when they are due, their lease (or hold),
/// pauses, removals and rates.
async fn unsettled(pool: &PgPool) -> String {
    let rows: Vec<String> = sqlx::query_scalar(
        "select format('delivery %s (%s, watch %s, %s): %s attempts, due in %s s, lease %s s by %s, '
                       'last error %L, paused watch %s service %s, removed watch %s service %s, '
                       'rates %s/%s, %s queued of its stream',
                       q.id, s.name, q.watch_id, q.object, q.attempts,
                       round(extract(epoch from q.next_attempt_at - now()), 1),
                       round(extract(epoch from q.lease_until - now()), 1), q.leased_by,
                       q.last_error, w.paused_at is not null, s.paused_at is not null,
                       w.removed_at is not null, s.removed_at is not null,
                       s.max_rate, s.consumer_rate,
                       (select count(*) from watchpump.queue o
                        where o.watch_id = q.watch_id and o.object = q.object))
         from watchpump.queue q
         join watchpump.watches w on w.id = q.watch_id
         join watchpump.services s on s.id = q.service_id
         order by q.id limit 5",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| vec![format!("(cannot read the queue: {e})")]);
    rows.join("; ")
}

pub struct Judged {
    pub deliveries: i64,
    pub duplicates: usize,
    pub violations: Vec<String>,
    /// Failover only: committed changes the surviving primary does not have
    /// (a violation with a synchronous standby, counted with an
    /// asynchronous one).
    pub lost: usize,
    /// Failover only: requests of changes the surviving primary does not
    /// have, sent before the failover (their commit was in doubt, or lost).
    pub sent_then_lost: usize,
    /// Asynchronous failover only: requests that overlapped one sent before
    /// the promotion whose lease the new primary never had.
    pub overlaps_across_async_failover: usize,
    /// Asynchronous failover: the lost changes' acknowledgements, in
    /// seconds after the standby froze (earliest, latest).
    pub lost_window: Option<(f64, f64)>,
    /// Requests of replayed deliveries (resyncs).
    pub replays: usize,
    /// Delivery ids, and (watch, object, sequence)s, that reached
    /// consumers for two different changes.
    pub reused: (usize, usize),
}

/// What the run did to PostgreSQL, for judging.
#[derive(Debug, Clone, Default)]
pub struct Failovers {
    /// None without failovers; whether the standby was synchronous.
    pub synchronous: Option<bool>,
    /// The switches that lost the primary with a standby behind (a crash
    /// after its WAL sender froze): when the sender froze, and when the
    /// front reached the promoted standby. With an asynchronous standby,
    /// what was acknowledged between the two may be lost.
    pub lossy: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

pub async fn judge(
    pool: &PgPool,
    ledger: &Ledger,
    watches: &[WatchDef],
    requests: &[Request],
    failovers: &Failovers,
) -> Judged {
    let mut violations = Vec::new();
    let rolled_back: HashSet<i64> = ledger.rolled_back.iter().map(|c| c.id).collect();
    let present = crate::producers::present(pool, &ledger.committed).await;
    let (kept, gone): (Vec<_>, Vec<_>) = ledger
        .committed
        .iter()
        .cloned()
        .partition(|c| present.contains(&c.key));
    let asynchronous = failovers.synchronous == Some(false);
    let mut lost_window: Option<(f64, f64)> = None;
    for c in &gone {
        if !asynchronous {
            violations.push(format!(
                "committed change {} ({} of {}) is gone from the database",
                c.id, c.kind, c.object
            ));
            continue;
        }
        // Bounded: only what the primary acknowledged while the standby
        // lagged (from the freeze, less what it had not streamed yet) may
        // be lost, never older commits.
        let window = failovers.lossy.iter().find(|(from, promoted)| {
            c.acked >= *from - chrono::Duration::milliseconds(LOST_SLACK_MS) && c.acked <= *promoted
        });
        match window {
            Some((from, _)) => {
                let after = (c.acked - *from).num_milliseconds() as f64 / 1000.0;
                lost_window = Some(match lost_window {
                    None => (after, after),
                    Some((lo, hi)) => (lo.min(after), hi.max(after)),
                });
            }
            None => violations.push(format!(
                "committed change {} ({} of {}), acknowledged at {}, is gone, though no failover's lag window covers it",
                c.id, c.kind, c.object, c.acked
            )),
        }
    }
    let gone_ids: HashSet<i64> = gone.iter().map(|c| c.id).collect();
    let committed: HashSet<i64> = kept.iter().map(|c| c.id).collect();
    let mut sent_then_lost = 0;

    for r in requests {
        let lost_in_failover = failovers.synchronous.is_some()
            && (gone_ids.contains(&r.change_id)
                || (rolled_back.contains(&r.change_id)
                    && ledger.in_doubt_ids.contains(&r.change_id)));
        if lost_in_failover {
            sent_then_lost += 1;
        } else if rolled_back.contains(&r.change_id) {
            violations.push(format!(
                "rolled-back change {} was sent (delivery {})",
                r.change_id, r.delivery_id
            ));
        } else if !committed.contains(&r.change_id) {
            violations.push(format!(
                "unknown change {} was sent (delivery {})",
                r.change_id, r.delivery_id
            ));
        }
    }

    // Sequences of changes the failover lost are handed out again by the
    // new primary: only the surviving changes' requests have an order.
    let mut streams: ByStream = HashMap::new();
    let mut forgiven = 0;
    for r in requests.iter().filter(|r| committed.contains(&r.change_id)) {
        streams
            .entry((r.watch_id, r.object.clone()))
            .or_default()
            .push(r);
    }
    for ((watch, object), list) in &mut streams {
        list.sort_by_key(|r| r.arrived);
        let across = |earlier: &Request, later: &Request| {
            asynchronous
                && failovers.lossy.iter().any(|(_, p)| {
                    earlier.arrived < *p && later.arrived >= *p - chrono::Duration::seconds(1)
                })
        };
        let (found, excused) = order_violations(*watch, object, list, across);
        violations.extend(found);
        forgiven += excused;
    }

    let (rows, dropped) = database_view(pool, &ledger.committed).await;
    let deliveries = rows.len() as i64;
    violations.extend(lost(&kept, watches, &dropped, &rows, &streams));
    for (change, watch, state) in &rows {
        if state != "delivered" && state != "superseded" && state != "dropped" {
            violations.push(format!(
                "delivery of change {change} to watch {watch} ended {state}, not delivered, superseded or dropped"
            ));
        }
    }

    let mut answered: HashMap<(i64, i64), usize> = HashMap::new();
    for r in requests.iter().filter(|r| (200..300).contains(&r.status)) {
        // A failover that lost commits hands their delivery ids out again.
        *answered.entry((r.delivery_id, r.change_id)).or_default() += 1;
    }
    let duplicates = answered.values().map(|n| n - 1).sum();
    let (reused, found) = ids_reused(requests);
    violations.extend(found);
    Judged {
        reused,
        deliveries,
        duplicates,
        violations,
        lost: gone.len(),
        sent_then_lost,
        overlaps_across_async_failover: forgiven,
        lost_window,
        replays: requests.iter().filter(|r| r.replay).count(),
    }
}

/// Delivery ids, and (watch, object, sequence)s, that reached consumers
/// for two different changes (told apart by the payload's `key`, unique in
/// the run, not by change id, which a failover can hand out twice): how
/// many of each, and a violation for each. The same change may come again
/// (a retry, a duplicate after a kill, a resync's replay under its own
/// sequence); another change never may.
fn ids_reused(requests: &[Request]) -> ((usize, usize), Vec<String>) {
    let mut found = Vec::new();
    let mut by_delivery: HashMap<i64, &Request> = HashMap::new();
    let mut by_sequence: HashMap<(i64, &str, i64), &Request> = HashMap::new();
    let (mut deliveries, mut sequences) = (HashSet::new(), HashSet::new());
    let mut in_order: Vec<&Request> = requests.iter().collect();
    in_order.sort_by_key(|r| r.arrived);
    for r in in_order {
        let first = by_delivery.entry(r.delivery_id).or_insert(r);
        if first.key != r.key && deliveries.insert(r.delivery_id) {
            found.push(format!(
                "delivery id {} reached consumers for two changes: {} (change {}, watch {}, {}, sequence {}) at {}, then {} (change {}, watch {}, {}, sequence {}) at {}",
                r.delivery_id,
                first.key, first.change_id, first.watch_id, first.object, first.sequence,
                first.arrived.format("%H:%M:%S%.3f"),
                r.key, r.change_id, r.watch_id, r.object, r.sequence,
                r.arrived.format("%H:%M:%S%.3f"),
            ));
        }
        let stream = (r.watch_id, r.object.as_str(), r.sequence);
        let first = by_sequence.entry(stream).or_insert(r);
        if first.key != r.key && sequences.insert(stream) {
            found.push(format!(
                "watch {}, {}: sequence {} reached the consumer for two changes: {} (change {}, delivery {}) at {}, then {} (change {}, delivery {}) at {}",
                r.watch_id, r.object, r.sequence,
                first.key, first.change_id, first.delivery_id,
                first.arrived.format("%H:%M:%S%.3f"),
                r.key, r.change_id, r.delivery_id,
                r.arrived.format("%H:%M:%S%.3f"),
            ));
        }
    }
    ((deliveries.len(), sequences.len()), found)
}

/// How long before a lagging standby's freeze a commit may still be lost:
/// what the standby had not received yet when it froze (on loopback, under
/// load, well below this).
const LOST_SLACK_MS: i64 = 2000;

/// Overlapping requests and sequences going backwards, for one stream of
/// requests in arrival order; and how many overlaps `excused` (an
/// asynchronous failover lost the lease the earlier request went under).
fn order_violations(
    watch: i64,
    object: &str,
    list: &[&Request],
    excused: impl Fn(&Request, &Request) -> bool,
) -> (Vec<String>, usize) {
    let mut found = Vec::new();
    let mut forgiven = 0;
    let mut busy_until: Option<&Request> = None;
    let mut newest_sent: Option<&Request> = None;
    let mut newest_answered: Option<&Request> = None;
    let mut sent: HashSet<i64> = HashSet::new();
    for r in list {
        if busy_until.is_some_and(|p| r.arrived < p.ended && excused(p, r)) {
            forgiven += 1;
        } else if let Some(prev) = busy_until.filter(|p| r.arrived < p.ended) {
            found.push(format!(
                "watch {watch}, {object}: delivery {} (sequence {}) arrived while delivery {} (sequence {}) was still being answered \
                 (that one: attempt {}, arrived {}, ended {}, {}; this one: attempt {}, arrived {})",
                r.delivery_id,
                r.sequence,
                prev.delivery_id,
                prev.sequence,
                prev.attempt,
                prev.arrived.format("%H:%M:%S%.3f"),
                prev.ended.format("%H:%M:%S%.3f"),
                if prev.hung { "no answer in time" } else { "answered" },
                r.attempt,
                r.arrived.format("%H:%M:%S%.3f"),
            ));
        }
        if busy_until.is_none_or(|p| r.ended > p.ended) {
            busy_until = Some(r);
        }
        if let Some(prev) = newest_sent.filter(|p| r.sequence < p.sequence) {
            found.push(format!(
                "watch {watch}, {object}: sequence {} (delivery {}) was sent after sequence {} (delivery {})",
                r.sequence, r.delivery_id, prev.sequence, prev.delivery_id
            ));
        }
        // The same sequence again: a duplicate of a delivery already sent,
        // or a replay; never a new live delivery.
        if !r.replay
            && newest_sent.is_some_and(|p| r.sequence == p.sequence)
            && !sent.contains(&r.delivery_id)
        {
            found.push(format!(
                "watch {watch}, {object}: sequence {} came again as delivery {}, neither a duplicate nor a replay",
                r.sequence, r.delivery_id
            ));
        }
        sent.insert(r.delivery_id);
        if newest_sent.is_none_or(|p| r.sequence > p.sequence) {
            newest_sent = Some(r);
        }
    }
    let mut ok: Vec<&&Request> = list
        .iter()
        .filter(|r| (200..300).contains(&r.status))
        .collect();
    ok.sort_by_key(|r| r.ended);
    for r in ok {
        if let Some(prev) = newest_answered.filter(|p| r.sequence < p.sequence) {
            found.push(format!(
                "watch {watch}, {object}: sequence {} (delivery {}) was answered 2xx after sequence {} (delivery {})",
                r.sequence, r.delivery_id, prev.sequence, prev.delivery_id
            ));
        }
        if newest_answered.is_none_or(|p| r.sequence > p.sequence) {
            newest_answered = Some(r);
        }
    }
    (found, forgiven)
}

/// The deliveries of committed changes as (change, watch, state), and the
/// watches that were dropped.
async fn database_view(
    pool: &PgPool,
    committed: &[crate::producers::Change],
) -> (Vec<(i64, i64, String)>, HashSet<i64>) {
    let ids: Vec<i64> = committed.iter().map(|c| c.id).collect();
    let rows: Vec<(i64, i64, String)> = sqlx::query_as(
        "select change_id, watch_id, state from watchpump.delivery_log where change_id = any($1)",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .unwrap();
    let dropped: Vec<i64> =
        sqlx::query_scalar("select watch_id from watchpump.watch_list where not live")
            .fetch_all(pool)
            .await
            .unwrap();
    (rows, dropped.into_iter().collect())
}

/// Committed changes without their deliveries, and newest news that never
/// got a 2xx.
fn lost(
    committed: &[crate::producers::Change],
    watches: &[WatchDef],
    dropped: &HashSet<i64>,
    rows: &[(i64, i64, String)],
    streams: &ByStream,
) -> Vec<String> {
    let mut found = Vec::new();
    let have: HashSet<(i64, i64)> = rows.iter().map(|(c, w, _)| (*c, *w)).collect();
    let mut newest: HashMap<(i64, &str), i64> = HashMap::new();
    for change in committed {
        for w in watches.iter().filter(|w| !dropped.contains(&w.id)) {
            if !w.matches(&change.object, &change.kind) {
                continue;
            }
            if !have.contains(&(change.id, w.id)) {
                found.push(format!(
                    "committed change {} ({} of {}) has no delivery for watch {}",
                    change.id, change.kind, change.object, w.id
                ));
            }
            let n = newest.entry((w.id, change.object.as_str())).or_default();
            *n = (*n).max(change.id);
        }
    }
    for ((watch, object), change) in newest {
        let answered = streams
            .get(&(watch, object.to_string()))
            .is_some_and(|list| {
                list.iter()
                    .any(|r| r.change_id == change && (200..300).contains(&r.status))
            });
        if !answered {
            found.push(format!(
                "the newest change {change} of watch {watch}, {object} was never answered 2xx"
            ));
        }
    }
    found
}
