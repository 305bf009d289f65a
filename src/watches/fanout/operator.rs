//! The operator's side of the fan-out budget: `watchpump fanout list`
//! ([`report`]: each top segment's budget, its most costly object and who
//! holds what) and `watchpump fanout set-budget` ([`set_budget`]).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sqlx::PgPool;

use super::holdings::Holdings;
use super::{budget_of, top_segment, MAX_BUDGET, SHARES};
use crate::db::registry as db;
use crate::error::{Error, Result};

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
    crate::watches::check_object(top)?;
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
