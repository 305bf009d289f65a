//! What the fan-out budget counts: the live watches that can cover an
//! object, by the object they name and by service, and what each costs
//! ([`super::units`]); read in one statement for a create's check or the
//! operator's report.

use std::collections::HashMap;

use sqlx::PgConnection;

use super::{units, ROW_UNITS};
use crate::db::registry as db;
use crate::error::Result;

/// The object's prefixes that end in '/', and itself (as SQL's
/// `watchpump.object_prefixes`).
pub(super) fn prefixes(object: &str) -> impl Iterator<Item = &str> {
    object
        .match_indices('/')
        .map(|(at, _)| &object[..=at])
        .filter(move |p| p.len() < object.len())
        .chain(std::iter::once(object))
}

/// What some watches cost in the budget, and how many there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Cost {
    pub(super) units: u64,
    pub(super) watches: i64,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, other: Cost) {
        self.units += other.units;
        self.watches += other.watches;
    }
}

/// What each service's live watches covering one object cost.
#[derive(Debug, Default)]
pub(super) struct Covering {
    pub(super) services: HashMap<i64, Cost>,
}

impl Covering {
    pub(super) fn of(&self, service_id: i64) -> Cost {
        self.services.get(&service_id).copied().unwrap_or_default()
    }

    pub(super) fn total(&self) -> Cost {
        let mut total = Cost::default();
        for cost in self.services.values() {
            total += *cost;
        }
        total
    }
}

/// Live watches by the object they name, then by service: what each costs.
pub(super) struct Holdings {
    by_object: HashMap<String, HashMap<i64, Cost>>,
}

impl Holdings {
    /// The live watches that can cover `object` (on it, on its prefixes,
    /// and for a prefix under it), or every live watch when `object` is
    /// None (the operator's report).
    pub(super) async fn load(conn: &mut PgConnection, object: Option<&str>) -> Result<Holdings> {
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

    pub(super) fn keys(&self) -> impl Iterator<Item = &str> {
        self.by_object.keys().map(String::as_str)
    }

    /// What the watches covering `object` cost, per service.
    pub(super) fn covering(&self, object: &str) -> Covering {
        let mut covering = Covering::default();
        for p in prefixes(object) {
            for (service_id, cost) in self.by_object.get(p).into_iter().flatten() {
                *covering.services.entry(*service_id).or_default() += *cost;
            }
        }
        covering
    }
}

#[cfg(test)]
mod tests {
    use super::super::top_segment;
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
}
