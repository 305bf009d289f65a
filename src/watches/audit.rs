//! Stored filters checked against the language, for `watchpump migrate`.
//!
//! Watches created before [`super::filter`] existed may hold filters it
//! refuses (`$.**`, nested `exists($...)`, `strict`, arithmetic). They are
//! kept working, since removing a consumer's watch would silently lose its
//! deliveries, but the operator is told which ones to have replaced: each
//! can make `emit()` slow in the producer's transaction. Their classification
//! came from the old `{}` probe, which called predicates such as `$ == 1`
//! paths (so they matched every change); for filters inside the language the
//! parser's classification is stored instead, and reported.

use std::fmt;

use sqlx::PgPool;

use super::filter;
use crate::db::registry::{self as db, StoredFilter};
use crate::error::Result;

/// A live watch whose stored filter needed attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub watch_id: i64,
    pub service: String,
    pub filter: String,
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Outside the language, with the parser's message; left as it is.
    OutsideLanguage(String),
    /// Inside the language but stored with the wrong classification; now
    /// stored with the parser's (true: a predicate).
    Reclassified { is_predicate: bool },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (id, service, filter) = (self.watch_id, &self.service, &self.filter);
        match &self.problem {
            Problem::OutsideLanguage(why) => write!(
                f,
                "watch {id} of service {service} has a filter outside the allowed language; \
                 it keeps working, but can make emit() slow in the producer's transaction, so \
                 have the service replace it. Filter: {filter:?}. Why: {why}"
            ),
            Problem::Reclassified { is_predicate: true } => write!(
                f,
                "watch {id} of service {service}: its filter {filter:?} is a predicate but was \
                 stored as a path, so it matched every change; it is now evaluated as a predicate"
            ),
            Problem::Reclassified {
                is_predicate: false,
            } => write!(
                f,
                "watch {id} of service {service}: its filter {filter:?} is a path but was \
                 stored as a predicate, so it never matched; it is now evaluated as a path"
            ),
        }
    }
}

/// Checks every live watch's filter, stores the parser's classification
/// where the old one was wrong, and returns what it found, by watch id.
pub async fn stored_filters(pool: &PgPool) -> Result<Vec<Finding>> {
    let stored = db::stored_filters(pool).await?;
    let mut findings = Vec::new();
    for watch in stored {
        let Some(problem) = check(&watch) else {
            continue;
        };
        if let Problem::Reclassified { is_predicate } = problem {
            db::set_match_is_predicate(pool, watch.id, is_predicate).await?;
        }
        findings.push(Finding {
            watch_id: watch.id,
            service: watch.service,
            filter: watch.filter,
            problem,
        });
    }
    Ok(findings)
}

fn check(watch: &StoredFilter) -> Option<Problem> {
    match filter::parse(&watch.filter) {
        Err(e) => Some(Problem::OutsideLanguage(e.message().to_string())),
        Ok(m) if watch.is_predicate != Some(m.is_predicate) => Some(Problem::Reclassified {
            is_predicate: m.is_predicate,
        }),
        Ok(_) => None,
    }
}
