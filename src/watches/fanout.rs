//! The fan-out budget: what one change can make `emit()` write and
//! evaluate, whichever services watch it (issue 17).
//!
//! `emit()` writes one queue row per matching watch and evaluates the
//! filter of every live watch on the changed object and on its prefixes,
//! inside the producer's transaction. [`super::cap`] bounds one service's
//! filters on one object and [`super::MAX_WATCHES_PER_SERVICE`] its
//! watches; neither bounds many services together: 50 services x 10,000
//! unfiltered watches on one prefix made one `emit()` take 2.45 s and write
//! 510,000 rows. So every live watch that can cover an object counts, for
//! every service:
//!
//! - one unit for its queue row ([`ROW_UNITS`]), filter or not;
//! - [`FILTER_UNIT_WEIGHT`] units per unit of its filter's cost
//!   ([`super::filter::cost`]), since evaluating a filter on a large payload
//!   costs as much as writing tens of rows;
//!
//! and the watches that can cover any one object may cost at most
//! [`MAX_UNITS_PER_OBJECT`] together. A watch on an object counts the
//! watches on it and on its prefixes; a watch on a prefix `acme/web/` also
//! counts, for the object under it with the most, the watches between
//! (`acme/web/a/`, `acme/web/a/b`): the worst change it can be part of.
//!
//! Besides, one service may hold at most [`MAX_WATCHES_PER_OBJECT`] live
//! watches on one object (or one prefix), and at most its **share** of
//! what the watches covering any one object may cost: half of the budget
//! ([`SHARES`]), whatever the others hold (issue 34: one service had taken
//! all 1,200 units of every object under `acme/` with 2 filtered watches
//! and 600 API calls, and every other service got a 422 there). So
//! whoever came first, another service always finds half of the budget
//! that one service cannot take, and a refusal says what the caller holds
//! and what the others hold. Half, not less: the dearest filter the
//! language allows costs 501 units, and a service at its own filter cap
//! ([`super::cap`], 23 units) up to 598; a quarter would refuse filters the
//! language accepts.
//!
//! The budget is [`MAX_UNITS_PER_OBJECT`] unless the operator set another
//! for the object's top segment (`watchpump fanout set-budget acme/ 2400`,
//! table `watchpump.fanout_budgets`) or for every top segment
//! (`watchpump.settings.fanout_units`); `watchpump fanout list` shows each
//! top segment's budget, its most costly object and who holds what
//! ([`report`]).
//!
//! Checked when a watch is created, in its transaction, under an advisory
//! lock per top-level segment of the object (`acme/` for
//! `acme/web/refs/heads/main`): every watch that can cover an object shares
//! the object's top segment, so two creates that could together pass the
//! budget wait for each other, and creates under other tops do not. A
//! refusal is a 422 with the figures, counted in
//! `watchpump_fanout_refused_total`. Tested in `tests/fanout.rs` and
//! `tests/consumer_shares.rs`; the worst `emit()` at the budget is measured
//! by `make bench SCENARIOS=fanout` (BENCHMARKS.md).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sqlx::{PgConnection, PgExecutor, PgPool};

use super::cap::MAX_FILTER_COST_PER_OBJECT;
use super::filter::{self, MatchFilter};
use crate::db::registry as db;
use crate::error::{Error, Result};

/// What a watch's queue row costs in the budget.
pub const ROW_UNITS: u64 = 1;

/// What one unit of filter cost counts for, in rows. `make bench
/// SCENARIOS=fanout-budget`, on the filters scenario's 2,000-path payload:
/// 6,000 unfiltered watches made emit() take 107 ms at the median and 222
/// ms at p99 (about 37 us a row at p99), and 117 distinct one-unit
/// filters 56 and 98 ms (about 0.84 ms a filter at p99): a unit of filter
/// is worth about 23 rows.
pub const FILTER_UNIT_WEIGHT: u64 = 25;

/// What the watches that can cover one object may cost together, across
/// all services, unless the operator set another budget: at most this many
/// rows per emit(), or about 46 one-unit filters; sized from the figures
/// above for emit() p99 under 50 ms, and measured at it (BENCHMARKS.md).
/// `watchpump.fanout_budget()` holds the same default.
pub const MAX_UNITS_PER_OBJECT: u64 = 1_200;

/// A service's share of an object's budget is 1 / SHARES of it: half.
pub const SHARES: u64 = 2;

/// Live watches one service may hold on one object or prefix (each for a
/// resource of its own): a quarter of [`MAX_UNITS_PER_OBJECT`].
pub const MAX_WATCHES_PER_OBJECT: i64 = 300;

/// The most an operator may set a budget to (the table's check): one
/// change may then make emit() write this many rows.
pub const MAX_BUDGET: i64 = 1_000_000;

/// What a watch costs in the budget, from its stored filter text (none:
/// unfiltered). A filter outside the language costs the whole per-service
/// filter cap, as in [`super::cap`].
pub fn units(filter_text: Option<&str>) -> u64 {
    ROW_UNITS
        + filter_text.map_or(0, |text| {
            let cost = filter::parse(text).map_or(MAX_FILTER_COST_PER_OBJECT, |m| m.cost);
            FILTER_UNIT_WEIGHT * u64::from(cost)
        })
}

/// Refuses a new watch of `service_id` on `object` (with `new`, its parsed
/// filter) when the service already holds [`MAX_WATCHES_PER_OBJECT`]
/// there, when it would then hold more than its share of some object's
/// budget, or when the watches that can cover some object would then cost
/// more than the budget. Runs in the create transaction, after the
/// service's row lock.
pub(super) async fn check(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
    new: Option<&MatchFilter>,
) -> Result<()> {
    let mine = db::count_live_watches_on(tx, service_id, object).await?;
    if mine >= MAX_WATCHES_PER_OBJECT {
        return Err(Error::Invalid(format!(
            "a service may hold at most {MAX_WATCHES_PER_OBJECT} live watches on one object or \
             prefix, and this service holds {mine} on {object}: remove some, or watch a prefix \
             for several resources"
        )));
    }
    let top = top_segment(object);
    db::lock_fanout_top(tx, top).await?;
    let budget = budget_of(&mut *tx, top).await?;
    let share = budget / SHARES;
    let adds = units(new.map(|m| m.text.as_str()));
    let holdings = Holdings::load(tx, Some(object)).await?;
    let candidates: Vec<&str> = std::iter::once(object)
        .chain(holdings.keys().filter(|o| o.len() > object.len()))
        .collect();
    let place = |worst: &str| {
        if worst == object {
            format!("on {object} and its prefixes")
        } else {
            format!("covering {worst} (under {object})")
        }
    };

    // The caller's own share first: a refusal it can do something about.
    let (worst, held) = candidates
        .iter()
        .map(|c| (*c, holdings.covering(c).of(service_id)))
        .max_by_key(|(_, h)| h.units)
        .expect("the object itself is a candidate");
    if held.units + adds > share {
        return Err(Error::Invalid(format!(
            "this service's watches {} already cost {} units of the fan-out budget ({} \
             watches) and this one adds {adds} ({ROW_UNITS} per watch, {FILTER_UNIT_WEIGHT} per \
             unit of filter cost); this service already holds {} units there, and one service \
             may hold at most {share}: half of the budget of {budget} units of an object under \
             {top}, so that other services get theirs. Remove some of this service's watches \
             there, or use fewer or cheaper filters",
            place(worst),
            held.units,
            held.watches,
            held.units
        )));
    }

    let (worst, all) = candidates
        .iter()
        .map(|c| (*c, holdings.covering(c)))
        .max_by_key(|(_, h)| h.total().units)
        .expect("the object itself is a candidate");
    let total = all.total();
    if total.units + adds <= budget {
        return Ok(());
    }
    let mine = all.of(service_id);
    let others = total.units - mine.units;
    let other_services = all.services.keys().filter(|s| **s != service_id).count();
    let (them, hold) = if other_services == 1 {
        ("other service", "holds")
    } else {
        ("other services", "hold")
    };
    Err(Error::Invalid(format!(
        "too many watches on this object across all services: the live watches {} already \
         cost {} units ({} watches): this service holds {} of them and {other_services} {them} \
         {hold} {others}; this one adds {adds} ({ROW_UNITS} per watch, {FILTER_UNIT_WEIGHT} per \
         unit of filter cost), and the watches covering one object under {top} may cost at most \
         {budget} (its fan-out budget: what one change may make emit() do in the producer's \
         transaction), one service at most half of it ({share}). Watch a narrower object, or \
         ask the producer's operators to raise the budget of {top}",
        place(worst),
        total.units,
        total.watches,
        mine.units
    )))
}

/// The kind of fan-out refusal `e` is, for `watchpump_fanout_refused_total`'s
/// `limit` label: `watches` (per object), `share` or `budget`; None for any
/// other error.
pub fn refusal_limit(e: &Error) -> Option<&'static str> {
    let Error::Invalid(message) = e else {
        return None;
    };
    if message.contains("live watches on one object or prefix") {
        Some("watches")
    } else if message.contains("so that other services get theirs") {
        Some("share")
    } else if message.contains("too many watches on this object across all services") {
        Some("budget")
    } else {
        None
    }
}

/// Counts a fan-out refusal of `service`'s create.
pub fn count(service: &str, limit: &'static str) {
    metrics::counter!(crate::metrics::FANOUT_REFUSED,
        "service" => service.to_string(), "limit" => limit)
    .increment(1);
}

/// The part of an object that every watch covering it shares: up to and
/// including its first '/', or all of it.
pub fn top_segment(object: &str) -> &str {
    object.find('/').map_or(object, |at| &object[..=at])
}

/// The fan-out budget of the objects under the top segment `top`
/// (`watchpump.fanout_budget()`).
async fn budget_of(conn: impl PgExecutor<'_>, top: &str) -> Result<u64> {
    let budget = db::fanout_budget(conn, top).await?;
    Ok(u64::try_from(budget).unwrap_or(0))
}

/// The object's prefixes that end in '/', and itself (as SQL's
/// `watchpump.object_prefixes`).
fn prefixes(object: &str) -> impl Iterator<Item = &str> {
    object
        .match_indices('/')
        .map(|(at, _)| &object[..=at])
        .filter(move |p| p.len() < object.len())
        .chain(std::iter::once(object))
}

/// What some watches cost in the budget, and how many there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cost {
    units: u64,
    watches: i64,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, other: Cost) {
        self.units += other.units;
        self.watches += other.watches;
    }
}

/// What each service's live watches covering one object cost.
#[derive(Debug, Default)]
struct Covering {
    services: HashMap<i64, Cost>,
}

impl Covering {
    fn of(&self, service_id: i64) -> Cost {
        self.services.get(&service_id).copied().unwrap_or_default()
    }

    fn total(&self) -> Cost {
        let mut total = Cost::default();
        for cost in self.services.values() {
            total += *cost;
        }
        total
    }
}

/// Live watches by the object they name, then by service: what each costs.
struct Holdings {
    by_object: HashMap<String, HashMap<i64, Cost>>,
}

impl Holdings {
    /// The live watches that can cover `object` (on it, on its prefixes,
    /// and for a prefix under it), or every live watch when `object` is
    /// None (the operator's report).
    async fn load(conn: &mut PgConnection, object: Option<&str>) -> Result<Holdings> {
        let rows = db::holdings(conn, object).await?;
        let mut costs: HashMap<String, u64> = HashMap::new();
        let mut by_object: HashMap<String, HashMap<i64, Cost>> = HashMap::new();
        for db::Holding {
            object: o,
            service_id,
            unfiltered,
            filters,
        } in rows
        {
            let filtered: u64 = filters
                .iter()
                .map(|t| *costs.entry(t.clone()).or_insert_with(|| units(Some(t))))
                .sum();
            let cost = Cost {
                units: unfiltered as u64 * ROW_UNITS + filtered,
                watches: unfiltered + filters.len() as i64,
            };
            by_object.entry(o).or_default().insert(service_id, cost);
        }
        Ok(Holdings { by_object })
    }

    fn keys(&self) -> impl Iterator<Item = &str> {
        self.by_object.keys().map(String::as_str)
    }

    /// What the watches covering `object` cost, per service.
    fn covering(&self, object: &str) -> Covering {
        let mut covering = Covering::default();
        for p in prefixes(object) {
            for (service_id, cost) in self.by_object.get(p).into_iter().flatten() {
                *covering.services.entry(*service_id).or_default() += *cost;
            }
        }
        covering
    }
}

/// One top segment's fan-out budget, as `watchpump fanout list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TopReport {
    pub top_segment: String,
    /// What the watches covering one object under it may cost.
    pub budget: u64,
    /// What one service may hold of it.
    pub share: u64,
    /// Whether the operator set the budget (else the default).
    pub set_by_operator: bool,
    /// What the watches covering its most costly object cost now, and that
    /// object (null when no live watch is under the top segment).
    pub units: u64,
    pub worst_object: Option<String>,
    /// Each service with watches under it, and the most its watches cost at
    /// one object, most first.
    pub services: Vec<ServiceShare>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServiceShare {
    pub service: String,
    pub units: u64,
}

/// Every top segment with live watches under it or a budget of its own:
/// its budget, the object under it whose watches cost the most, and what
/// each service holds. One read of every live watch: for the operator's
/// CLI, not for a request path.
pub async fn report(pool: &PgPool) -> Result<Vec<TopReport>> {
    let mut conn = pool.acquire().await?;
    let holdings = Holdings::load(&mut conn, None).await?;
    let names: HashMap<i64, String> = db::service_names(&mut conn)
        .await?
        .into_iter()
        .map(|s| (s.id, s.name))
        .collect();
    let set = db::budgeted_tops(&mut conn).await?;
    let mut tops: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for key in holdings.keys() {
        tops.entry(top_segment(key).to_string())
            .or_default()
            .push(key);
    }
    for top in &set {
        tops.entry(top.clone()).or_default();
    }
    let mut reports = Vec::new();
    for (top, keys) in tops {
        let budget = budget_of(&mut *conn, &top).await?;
        let mut worst: Option<(String, u64)> = None;
        let mut held: HashMap<i64, u64> = HashMap::new();
        for key in keys {
            let covering = holdings.covering(key);
            let units = covering.total().units;
            if worst
                .as_ref()
                .is_none_or(|(o, u)| units > *u || (units == *u && key < o.as_str()))
            {
                worst = Some((key.to_string(), units));
            }
            for (service_id, cost) in &covering.services {
                let most = held.entry(*service_id).or_default();
                *most = (*most).max(cost.units);
            }
        }
        let mut services: Vec<ServiceShare> = held
            .into_iter()
            .map(|(id, units)| ServiceShare {
                service: names.get(&id).cloned().unwrap_or_else(|| id.to_string()),
                units,
            })
            .collect();
        services.sort_by(|a, b| b.units.cmp(&a.units).then(a.service.cmp(&b.service)));
        reports.push(TopReport {
            set_by_operator: set.contains(&top),
            budget,
            share: budget / SHARES,
            units: worst.as_ref().map_or(0, |w| w.1),
            worst_object: worst.map(|w| w.0),
            services,
            top_segment: top,
        });
    }
    Ok(reports)
}

/// Sets the fan-out budget of the objects under the top segment `top`
/// (None: back to the default), for `watchpump fanout set-budget`. Returns
/// the budget that holds now. Watches already there stay; new ones are
/// checked against it.
pub async fn set_budget(pool: &PgPool, top: &str, units: Option<i64>, actor: &str) -> Result<u64> {
    super::check_object(top)?;
    if top_segment(top) != top {
        return Err(Error::Invalid(format!(
            "{top} is not a top segment: a budget is set for all the objects under one, such \
             as {}",
            top_segment(top)
        )));
    }
    match units {
        Some(units) if !(1..=MAX_BUDGET).contains(&units) => {
            return Err(Error::Invalid(format!(
                "a fan-out budget is 1 to {MAX_BUDGET} units, not {units}"
            )))
        }
        Some(units) => {
            db::set_fanout_budget(pool, top, units as i32, actor).await?;
        }
        None => {
            db::clear_fanout_budget(pool, top).await?;
        }
    }
    budget_of(pool, top).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_top_segments_match_emit() {
        let all: Vec<&str> = prefixes("acme/web/main").collect();
        assert_eq!(all, ["acme/", "acme/web/", "acme/web/main"]);
        let all: Vec<&str> = prefixes("acme/web/").collect();
        assert_eq!(all, ["acme/", "acme/web/"]);
        assert_eq!(prefixes("plain").collect::<Vec<_>>(), ["plain"]);
        assert_eq!(top_segment("acme/web/main"), "acme/");
        assert_eq!(top_segment("acme/"), "acme/");
        assert_eq!(top_segment("plain"), "plain");
    }

    #[test]
    fn a_watch_costs_a_row_and_its_filter() {
        assert_eq!(units(None), 1);
        assert_eq!(units(Some("$.forced == true")), 1 + FILTER_UNIT_WEIGHT);
        assert_eq!(
            units(Some("$.x ? (exists($.y ? (exists($.z))))")),
            1 + FILTER_UNIT_WEIGHT * u64::from(MAX_FILTER_COST_PER_OBJECT)
        );
    }
}
