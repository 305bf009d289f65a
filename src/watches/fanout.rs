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
//! watches on one object (or one prefix), so that no one service takes
//! most of an object's budget by registering resources.
//!
//! Checked when a watch is created, in its transaction, under an advisory
//! lock per top-level segment of the object (`acme/` for
//! `acme/web/refs/heads/main`): every watch that can cover an object shares
//! the object's top segment, so two creates that could together pass the
//! budget wait for each other, and creates under other tops do not. A
//! refusal is a 422 with the figures. Tested in `tests/fanout.rs`; the
//! worst `emit()` at the budget is measured by `make bench
//! SCENARIOS=fanout` (BENCHMARKS.md).

use std::collections::HashMap;

use sqlx::PgConnection;

use super::cap::MAX_FILTER_COST_PER_OBJECT;
use super::filter::{self, MatchFilter};
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
/// all services: at most this many rows per emit(), or about 46 one-unit
/// filters; sized from the figures above for emit() p99 under 50 ms, and
/// measured at it (BENCHMARKS.md). A service at its own filter cap
/// ([`super::cap`], 24 units) takes about half of it: the budget is first
/// come, first served.
pub const MAX_UNITS_PER_OBJECT: u64 = 1_200;

/// Live watches one service may hold on one object or prefix (each for a
/// resource of its own): a quarter of [`MAX_UNITS_PER_OBJECT`].
pub const MAX_WATCHES_PER_OBJECT: i64 = 300;

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
/// filter) when the service already holds [`MAX_WATCHES_PER_OBJECT`] there,
/// or when the watches that can cover some object would then cost more
/// than [`MAX_UNITS_PER_OBJECT`]. Runs in the create transaction, after the
/// service's row lock.
pub(super) async fn check(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
    new: Option<&MatchFilter>,
) -> Result<()> {
    let mine: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.watches
         where object = $2 and service_id = $1 and removed_at is null",
    )
    .bind(service_id)
    .bind(object)
    .fetch_one(&mut *tx)
    .await?;
    if mine >= MAX_WATCHES_PER_OBJECT {
        return Err(Error::Invalid(format!(
            "a service may hold at most {MAX_WATCHES_PER_OBJECT} live watches on one object or \
             prefix, and this service holds {mine} on {object}: remove some, or watch a prefix \
             for several resources"
        )));
    }
    sqlx::query("select pg_advisory_xact_lock(hashtextextended('watchpump.fanout:' || $1, 0))")
        .bind(top_segment(object))
        .execute(&mut *tx)
        .await?;
    let adds = units(new.map(|m| m.text.as_str()));
    let worst = worst_covered(tx, object).await?;
    if worst.units + adds <= MAX_UNITS_PER_OBJECT {
        return Ok(());
    }
    let place = if worst.object == object {
        format!("on {object} and its prefixes")
    } else {
        format!("covering {} (under {object})", worst.object)
    };
    Err(Error::Invalid(format!(
        "too many watches on this object across all services: the live watches {place} \
         already cost {} units ({} watches), this one adds {adds} ({ROW_UNITS} per watch, \
         {FILTER_UNIT_WEIGHT} per unit of filter cost), and one object's watches may cost at \
         most {MAX_UNITS_PER_OBJECT} (what one change may make emit() do in the producer's \
         transaction). Watch a narrower object, or use fewer or cheaper filters",
        worst.units, worst.watches
    )))
}

/// The part of an object that every watch covering it shares: up to and
/// including its first '/', or all of it.
fn top_segment(object: &str) -> &str {
    object.find('/').map_or(object, |at| &object[..=at])
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

/// The object most costly to emit that a new watch on `object` would cover,
/// and what the live watches covering it cost now.
struct Worst {
    object: String,
    units: u64,
    watches: i64,
}

async fn worst_covered(tx: &mut PgConnection, object: &str) -> Result<Worst> {
    // Per object: its unfiltered watches, and its filters' texts. For a
    // prefix, the objects under it too (their watches only add to the
    // prefix's own and its prefixes').
    let rows: Vec<(String, i64, Vec<String>)> = sqlx::query_as(
        "select object, count(*) filter (where match_path is null),
                coalesce(array_agg(coalesce(filters->>'match', match_path::text))
                         filter (where match_path is not null), '{}')
         from watchpump.watches
         where removed_at is null
           and (object = any (watchpump.object_prefixes($1))
                or (right($1, 1) = '/' and starts_with(object, $1)))
         group by object",
    )
    .bind(object)
    .fetch_all(tx)
    .await?;
    let mut costs: HashMap<String, u64> = HashMap::new();
    let per_object: HashMap<&str, (u64, i64)> = rows
        .iter()
        .map(|(o, unfiltered, filters)| {
            let filtered: u64 = filters
                .iter()
                .map(|t| *costs.entry(t.clone()).or_insert_with(|| units(Some(t))))
                .sum();
            let n = unfiltered + filters.len() as i64;
            (o.as_str(), (*unfiltered as u64 * ROW_UNITS + filtered, n))
        })
        .collect();
    let covering = |o: &str| -> (u64, i64) {
        prefixes(o)
            .filter_map(|p| per_object.get(p))
            .fold((0, 0), |(u, n), (du, dn)| (u + du, n + dn))
    };
    let mut worst = {
        let (units, watches) = covering(object);
        Worst {
            object: object.to_string(),
            units,
            watches,
        }
    };
    for under in per_object.keys().filter(|o| o.len() > object.len()) {
        let (units, watches) = covering(under);
        if units > worst.units {
            worst = Worst {
                object: under.to_string(),
                units,
                watches,
            };
        }
    }
    Ok(worst)
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
