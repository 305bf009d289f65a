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
//!
//! This file holds the bounds and the check on a create; `fanout/` holds
//! what they count (`holdings.rs`: the live watches that can cover an
//! object, and what each service's watches cost) and the operator's side
//! (`operator.rs`: [`report`] and [`set_budget`]).

mod holdings;
mod operator;

use sqlx::{PgConnection, PgExecutor};

use super::cap::MAX_FILTER_COST_PER_OBJECT;
use super::filter::{self, MatchFilter};
use crate::db::registry as db;
use crate::error::{Error, Result};
use holdings::Holdings;
pub use operator::{report, set_budget, ServiceShare, TopReport};

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

#[cfg(test)]
mod tests {
    use super::*;

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
