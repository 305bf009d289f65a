//! The per-object cap on filters: what one change can make `emit()` do.
//!
//! `emit()` evaluates the filter of every live watch on the changed object
//! and on each of its prefixes, inside the producer's transaction. One
//! filter is bounded by its language ([`super::filter`]); this bounds how
//! many a service can pile onto one object: the filters of a service's live
//! watches that can cover one object may cost at most
//! [`MAX_FILTER_COST_PER_OBJECT`] units together.
//!
//! Counting is conservative and needs no knowledge of which objects exist:
//! a new watch on `acme/web/refs/heads/main` counts the service's filtered
//! watches on that object and on `acme/`, `acme/web/`, ...; a new prefix
//! watch on `acme/web/` also counts every filtered watch under it, even
//! though those may be on different objects. Watches without a filter cost
//! nothing here; they count, with every service's, in the budget of
//! [`super::fanout`] (a row each). A filter outside the
//! language (a watch created before it existed, reported by `watchpump
//! migrate`) counts as the whole cap, since its cost has no bound.

use sqlx::PgConnection;

use super::filter::{self, MatchFilter};
use crate::error::{Error, Result};

/// What the filters of one service's watches covering any one object may
/// cost together, in [`filter::cost`] units: 23 plain filters such as
/// `$.paths[*] ? (@ starts with "docs/")`, or the dearest filter and 3
/// plain ones. Chosen with `make bench SCENARIOS=filters`: on a 2,000-path
/// payload one unit costs emit() 0.2-0.3 ms, and a service at 24 units with
/// the dearest filters the language allows made emit() take 7.5-8 ms at the
/// median and 12-17 ms at p99 (32 units gave 9-13 ms and 12-25 ms, over the
/// 20 ms target when the shared host was busy). 23 rather than 24 since
/// issue 34: a service at this cap (23 x 25 units of filter and a unit per
/// watch, at most 598) then fits its share of an object's fan-out budget
/// (600 of 1,200, [`super::fanout::SHARES`]), so that the cap a consumer
/// reads here is the one it meets.
pub const MAX_FILTER_COST_PER_OBJECT: u32 = 23;

/// Refuses `new` on `object` when the service's filters covering it would
/// then cost more than [`MAX_FILTER_COST_PER_OBJECT`]. Runs in the create
/// transaction, under the service's row lock, so two creates can not both
/// pass.
pub(super) async fn check(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
    new: &MatchFilter,
) -> Result<()> {
    let covering = covering_filters(tx, service_id, object).await?;
    let already: u32 = covering.iter().map(|text| cost_of(text)).sum();
    if already + new.cost <= MAX_FILTER_COST_PER_OBJECT {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "filters.match: a service's filtered watches that can cover one object may cost at most \
         {MAX_FILTER_COST_PER_OBJECT} units together, and this service's {} on {object} (or on \
         its prefixes{}) already cost {already}; this filter costs {}. Remove one of them, or \
         use a cheaper filter (a comparison, `starts with` or `exists` costs {}, a \
         `like_regex` {} plus the atoms of its pattern)",
        plural(covering.len(), "filtered watch", "filtered watches"),
        if object.ends_with('/') {
            ", or under it"
        } else {
            ""
        },
        new.cost,
        filter::cost::CONDITION,
        filter::cost::REGEX_BASE,
    )))
}

/// The filter texts, as the consumers sent them, of the service's live
/// watches on `object`, on its prefixes, and (for a prefix) under it.
async fn covering_filters(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
) -> Result<Vec<String>> {
    Ok(crate::db::registry::covering_filters(tx, service_id, object).await?)
}

/// What a stored filter costs; one outside the language costs the whole cap.
fn cost_of(text: &str) -> u32 {
    filter::parse(text).map_or(MAX_FILTER_COST_PER_OBJECT, |m| m.cost)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
