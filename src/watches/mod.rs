//! Watches: what a consumer service follows. Consumers create and remove
//! them (ADR 0021); a service only ever sees its own.
//!
//! A watch's `match` filter runs inside the producer's transaction, so it
//! must be in the language of [`filter`] (each filter's cost bounded),
//! [`cap`] bounds what a service's filters covering one object cost
//! together, and [`fanout`] what every service's watches covering one
//! object cost `emit()` together. [`audit`] finds stored filters from
//! before either existed.

pub mod audit;
pub mod cap;
pub mod fanout;
pub mod filter;
pub mod pause;
pub mod resync;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::db::registry as db;
pub use crate::db::registry::Watch;
use crate::error::{Error, Result};
use filter::MatchFilter;

/// Most live watches one service may hold.
pub const MAX_WATCHES_PER_SERVICE: i64 = 10_000;
const MAX_TEXT: usize = 1024;
const MAX_KINDS: usize = 64;

/// What a consumer asks to follow.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[derive(utoipa::ToSchema)]
pub struct NewWatch {
    /// The consumer's own resource this watch acts for (an app, a site).
    pub resource: String,
    /// An exact object, or a prefix ending in '/'.
    pub object: String,
    #[serde(default)]
    pub filters: Filters,
    /// Ask for a resync as soon as the watch exists ([`resync`]): the
    /// newest matching change of every object it covers, replayed. Not
    /// part of what makes two watches the same.
    #[serde(default)]
    pub resync: bool,
}

/// Which changes of the object count.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[derive(utoipa::ToSchema)]
pub struct Filters {
    /// Change kinds to follow; absent means every kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<String>>,
    /// A PostgreSQL jsonpath over the change's payload, in the language of
    /// [`filter`]: a predicate that must hold, or a path that must select
    /// something.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_path: Option<String>,
}

impl NewWatch {
    /// Checks everything that does not need the database, and parses the
    /// `match` filter (None when there is none).
    pub fn validate(&self) -> Result<Option<MatchFilter>> {
        check_text("resource", &self.resource)?;
        check_object(&self.object)?;
        if let Some(kinds) = &self.filters.kinds {
            if kinds.is_empty() || kinds.len() > MAX_KINDS {
                return Err(Error::Invalid(format!(
                    "filters.kinds must list 1 to {MAX_KINDS} kinds (leave it out to follow every kind)"
                )));
            }
            for kind in kinds {
                check_text("each of filters.kinds", kind)?;
            }
        }
        let Some(text) = &self.filters.match_path else {
            return Ok(None);
        };
        filter::parse(text)
            .map(Some)
            .map_err(|e| Error::Invalid(e.message().to_string()))
    }
}

/// What an object name must be, for a watch and for `watchpump emit` alike
/// (an object `/x` could never be watched).
pub fn check_object(object: &str) -> Result<()> {
    check_text("object", object)?;
    if object.starts_with('/') || object.contains("//") {
        return Err(Error::Invalid(
            "object must not start with '/' or contain '//'".into(),
        ));
    }
    Ok(())
}

fn check_text(field: &str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_TEXT {
        return Err(Error::Invalid(format!(
            "{field} must be 1 to {MAX_TEXT} characters"
        )));
    }
    if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::Invalid(format!(
            "{field} must not contain spaces or control characters"
        )));
    }
    if let Some(c) = value.chars().find(|&c| is_invisible(c)) {
        return Err(Error::Invalid(format!(
            "{field} must not contain invisible or text-direction characters \
             (it contains U+{:04X}): they make one name look like another in a log, \
             the panel or a terminal",
            c as u32
        )));
    }
    Ok(())
}

/// Characters that change how a name is displayed without showing: the
/// bidirectional embeddings, overrides and isolates (U+202A-U+202E,
/// U+2066-U+2069), the direction marks (U+200E, U+200F, U+061C), and the
/// zero-width space, joiners, word joiner and byte-order mark (U+200B-U+200D,
/// U+2060, U+FEFF). Control characters are refused separately.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{061C}'
            | '\u{200B}'..='\u{200D}'
            | '\u{2060}'
            | '\u{FEFF}'
    )
}

/// PostgreSQL must parse what the parser accepted, as a second opinion: the
/// parser was checked against PostgreSQL 15 and should never disagree, but
/// if it ever does (a newer PostgreSQL, a regex its compiler refuses), the
/// watch is refused with PostgreSQL's reason instead of a 500 at insert.
async fn check_in_postgres(pool: &PgPool, text: &str) -> Result<()> {
    db::parse_jsonpath(pool, text).await.map_err(|e| match e {
        // 42601 syntax error, 2201B bad regex, 0A000 unsupported flag, ...
        sqlx::Error::Database(ref d)
            if d.code().is_some_and(|c| {
                c.starts_with("42") || c.starts_with("22") || c.starts_with("0A")
            }) =>
        {
            Error::Invalid(format!(
                "filters.match is not a valid jsonpath for PostgreSQL: {}",
                d.message()
            ))
        }
        other => Error::Database(other),
    })?;
    Ok(())
}

/// Creates a watch for `service_id`, or returns the identical live one it
/// already has (consumers may register again at every start). The bool says
/// whether it is new.
pub async fn create(pool: &PgPool, service_id: i64, new: &NewWatch) -> Result<(Watch, bool)> {
    let parsed = new.validate()?;
    if let Some(m) = &parsed {
        check_in_postgres(pool, &m.text).await?;
    }
    // `filters` keeps what the consumer sent (so registering it again finds
    // it); match_path gets the text the parser validated.
    let filters = serde_json::to_value(&new.filters).expect("filters serialise");
    let mut tx = pool.begin().await?;
    // One writer per service at a time: the count, the cap and the
    // duplicate check hold.
    db::lock_service(&mut tx, service_id).await?;
    if let Some(watch) = find_identical(&mut tx, service_id, new, &filters).await? {
        return Ok((watch, false));
    }
    check_watch_count(&mut tx, service_id).await?;
    if let Some(m) = &parsed {
        cap::check(&mut tx, service_id, &new.object, m).await?;
    }
    fanout::check(&mut tx, service_id, &new.object, parsed.as_ref()).await?;
    let watch = db::insert_watch(
        &mut tx,
        db::NewWatchRow {
            service_id,
            resource: &new.resource,
            object: &new.object,
            kinds: new.filters.kinds.as_deref(),
            match_path: parsed.as_ref().map(|m| m.text.as_str()),
            match_is_predicate: parsed.as_ref().map(|m| m.is_predicate),
            filters: &filters,
        },
    )
    .await?;
    tx.commit().await?;
    Ok((watch, true))
}

/// The identical live watch the service already has, if any: registering
/// it again writes nothing (the API takes no token of the service's bucket
/// for it, `crate::api::limits`). [`create`] checks again under the
/// service's lock.
pub async fn find_live(pool: &PgPool, service_id: i64, new: &NewWatch) -> Result<Option<Watch>> {
    let filters = serde_json::to_value(&new.filters).expect("filters serialise");
    let mut conn = pool.acquire().await?;
    find_identical(&mut conn, service_id, new, &filters).await
}

async fn find_identical(
    tx: &mut PgConnection,
    service_id: i64,
    new: &NewWatch,
    filters: &serde_json::Value,
) -> Result<Option<Watch>> {
    Ok(db::identical_watch(tx, service_id, &new.resource, &new.object, filters).await?)
}

async fn check_watch_count(tx: &mut PgConnection, service_id: i64) -> Result<()> {
    let live = db::count_live_watches(tx, service_id).await?;
    if live >= MAX_WATCHES_PER_SERVICE {
        return Err(Error::Invalid(format!(
            "a service may hold at most {MAX_WATCHES_PER_SERVICE} watches"
        )));
    }
    Ok(())
}

/// A service's watches, oldest first, `limit` at a time after id `after`.
pub async fn list(
    pool: &PgPool,
    service_id: i64,
    include_removed: bool,
    after: i64,
    limit: i64,
) -> Result<Vec<Watch>> {
    Ok(db::watches_after(pool, service_id, include_removed, after, limit).await?)
}

/// One of the service's own watches, removed or not.
pub async fn get(pool: &PgPool, service_id: i64, id: i64) -> Result<Option<Watch>> {
    Ok(db::watch(pool, service_id, id).await?)
}

/// Removes one of the service's own watches, dropping its deliveries that
/// were not sent yet (`watchpump.remove_watch()`). Returns false when the
/// service has no such watch.
pub async fn remove(pool: &PgPool, service_id: i64, id: i64, reason: &str) -> Result<bool> {
    if !db::has_watch(pool, service_id, id).await? {
        return Ok(false);
    }
    db::remove_watch(pool, id, reason).await?;
    Ok(true)
}
