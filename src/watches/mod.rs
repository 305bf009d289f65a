//! Watches: what a consumer service follows. Consumers create and remove
//! them (ADR 0021); a service only ever sees its own.

pub mod filter;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::{Error, Result};

/// Most live watches one service may hold.
pub const MAX_WATCHES_PER_SERVICE: i64 = 10_000;
const MAX_TEXT: usize = 1024;
const MAX_KINDS: usize = 64;

/// A watch as the API shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Watch {
    pub id: i64,
    pub resource: String,
    pub object: String,
    pub filters: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub removed_reason: Option<String>,
}

/// What a consumer asks to follow.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewWatch {
    /// The consumer's own resource this watch acts for (an app, a site).
    pub resource: String,
    /// An exact object, or a prefix ending in '/'.
    pub object: String,
    #[serde(default)]
    pub filters: Filters,
}

/// Which changes of the object count.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filters {
    /// Change kinds to follow; absent means every kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<String>>,
    /// A PostgreSQL jsonpath over the change's payload: a predicate that must
    /// hold, or a path that must select something.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_path: Option<String>,
}

impl NewWatch {
    /// Checks everything that does not need the database.
    pub fn validate(&self) -> Result<()> {
        check_text("resource", &self.resource)?;
        check_text("object", &self.object)?;
        if self.object.starts_with('/') || self.object.contains("//") {
            return Err(Error::Invalid(
                "object must not start with '/' or contain '//'".into(),
            ));
        }
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
        if let Some(path) = &self.filters.match_path {
            if path.trim().is_empty() || path.len() > MAX_TEXT {
                return Err(Error::Invalid(format!(
                    "filters.match must be a jsonpath of 1 to {MAX_TEXT} characters"
                )));
            }
        }
        Ok(())
    }
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
    Ok(())
}

/// Parses a `match` filter as PostgreSQL does, and refuses one that parses
/// but can raise an error when emit() evaluates it, which would fail the
/// producer's transaction.
async fn check_match_path(pool: &PgPool, path: &str) -> Result<()> {
    let canonical: String = sqlx::query_scalar("select $1::text::jsonpath::text")
        .bind(path)
        .fetch_one(pool)
        .await
        .map_err(|e| match e {
            // 42601 syntax error, 2201B bad regex, 0A000 unsupported flag, ...
            sqlx::Error::Database(ref d)
                if d.code().is_some_and(|c| {
                    c.starts_with("42") || c.starts_with("22") || c.starts_with("0A")
                }) =>
            {
                Error::Invalid(format!(
                    "filters.match is not a valid jsonpath: {}",
                    d.message()
                ))
            }
            other => Error::Database(other),
        })?;
    if let Some(what) = raises_in_emit(&canonical) {
        return Err(Error::Invalid(format!(
            "filters.match must not use {what} in its jsonpath: it can raise an error \
             when a change is recorded, which would fail the producer's transaction"
        )));
    }
    Ok(())
}

/// jsonpath methods that convert to dates and times (PostgreSQL 17 adds all
/// but the first).
const DATETIME_METHODS: &[&str] = &[
    "datetime(",
    "date(",
    "time(",
    "time_tz(",
    "timestamp(",
    "timestamp_tz(",
];

/// What in a jsonpath, in PostgreSQL's canonical form (keys and strings
/// quoted, keywords in lower case, variables as `$"name"`), raises errors
/// that silent evaluation does not suppress: variables (emit() passes none)
/// and the datetime methods (time zone and format errors).
fn raises_in_emit(canonical: &str) -> Option<&'static str> {
    let bytes = canonical.as_bytes();
    let (mut in_string, mut escaped) = (false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'$' if bytes.get(i + 1) == Some(&b'"') => return Some("variables ($name)"),
            b'.' if DATETIME_METHODS
                .iter()
                .any(|m| canonical[i + 1..].starts_with(m)) =>
            {
                return Some("datetime methods such as .datetime()")
            }
            _ => {}
        }
    }
    None
}

const COLUMNS: &str = "id, resource, object, filters, created_at, removed_at, removed_reason";

/// Creates a watch for `service_id`, or returns the identical live one it
/// already has (consumers may register again at every start). The bool says
/// whether it is new.
pub async fn create(pool: &PgPool, service_id: i64, new: &NewWatch) -> Result<(Watch, bool)> {
    new.validate()?;
    if let Some(path) = &new.filters.match_path {
        check_match_path(pool, path).await?;
    }
    let filters = serde_json::to_value(&new.filters).expect("filters serialise");
    let mut tx = pool.begin().await?;
    // One writer per service at a time: the count and the duplicate check hold.
    sqlx::query("select 1 from watchpump.services where id = $1 for update")
        .bind(service_id)
        .execute(&mut *tx)
        .await?;
    let existing: Option<Watch> = sqlx::query_as(&format!(
        "select {COLUMNS} from watchpump.watches
         where service_id = $1 and resource = $2 and object = $3 and filters = $4 and removed_at is null
         limit 1"
    ))
    .bind(service_id)
    .bind(&new.resource)
    .bind(&new.object)
    .bind(&filters)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(watch) = existing {
        return Ok((watch, false));
    }
    let live: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.watches where service_id = $1 and removed_at is null",
    )
    .bind(service_id)
    .fetch_one(&mut *tx)
    .await?;
    if live >= MAX_WATCHES_PER_SERVICE {
        return Err(Error::Invalid(format!(
            "a service may hold at most {MAX_WATCHES_PER_SERVICE} watches"
        )));
    }
    let watch: Watch = sqlx::query_as(&format!(
        "insert into watchpump.watches (service_id, resource, object, kinds, match_path, match_is_predicate, filters)
         values ($1, $2, $3, $4, $5::jsonpath, watchpump.jsonpath_is_predicate($5::jsonpath), $6)
         returning {COLUMNS}"
    ))
    .bind(service_id)
    .bind(&new.resource)
    .bind(&new.object)
    .bind(&new.filters.kinds)
    .bind(&new.filters.match_path)
    .bind(&filters)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| match e {
        // 42601 syntax error, 22P02 and friends: the jsonpath did not parse.
        sqlx::Error::Database(ref d)
            if d.code()
                .is_some_and(|c| c.starts_with("42") || c.starts_with("22")) =>
        {
            Error::Invalid(format!(
                "filters.match is not a valid jsonpath: {}",
                d.message()
            ))
        }
        other => Error::Database(other),
    })?;
    tx.commit().await?;
    Ok((watch, true))
}

/// A service's watches, oldest first, `limit` at a time after id `after`.
pub async fn list(
    pool: &PgPool,
    service_id: i64,
    include_removed: bool,
    after: i64,
    limit: i64,
) -> Result<Vec<Watch>> {
    Ok(sqlx::query_as(&format!(
        "select {COLUMNS} from watchpump.watches
         where service_id = $1 and id > $2 and ($3 or removed_at is null)
         order by id limit $4"
    ))
    .bind(service_id)
    .bind(after)
    .bind(include_removed)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// One of the service's own watches, removed or not.
pub async fn get(pool: &PgPool, service_id: i64, id: i64) -> Result<Option<Watch>> {
    Ok(sqlx::query_as(&format!(
        "select {COLUMNS} from watchpump.watches where service_id = $1 and id = $2"
    ))
    .bind(service_id)
    .bind(id)
    .fetch_optional(pool)
    .await?)
}

/// Removes one of the service's own watches, dropping its deliveries that
/// were not sent yet (`watchpump.remove_watch()`). Returns false when the
/// service has no such watch.
pub async fn remove(pool: &PgPool, service_id: i64, id: i64, reason: &str) -> Result<bool> {
    let found: Option<i64> =
        sqlx::query_scalar("select id from watchpump.watches where service_id = $1 and id = $2")
            .bind(service_id)
            .bind(id)
            .fetch_optional(pool)
            .await?;
    if found.is_none() {
        return Ok(false);
    }
    sqlx::query("select count(*) from watchpump.remove_watch($1, $2)")
        .bind(id)
        .bind(reason)
        .execute(pool)
        .await?;
    Ok(true)
}
