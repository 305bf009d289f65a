//! Watches (`watchpump.watches`): creating one under its service's row
//! lock, listing, reading and removing them, and the audit of their stored
//! filters by `watchpump migrate`. The rules around them are
//! [`crate::watches`]'s.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// A watch as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Watch {
    pub id: i64,
    pub resource: String,
    pub object: String,
    pub filters: Value,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub removed_reason: Option<String>,
    /// Since when the watch is paused (its deliveries wait, held); null
    /// while they flow ([`crate::watches::pause`]).
    pub paused_at: Option<DateTime<Utc>>,
}

/// A new watch's columns; `match_path` is the filter text the parser
/// validated, `filters` what the consumer sent.
pub struct NewWatchRow<'a> {
    pub service_id: i64,
    pub resource: &'a str,
    pub object: &'a str,
    pub kinds: Option<&'a [String]>,
    pub match_path: Option<&'a str>,
    pub match_is_predicate: Option<bool>,
    pub filters: &'a Value,
}

/// Parses `text` as a jsonpath: PostgreSQL's error (42601, 2201B, 0A000,
/// ...) when it cannot.
pub async fn parse_jsonpath(pool: &PgPool, text: &str) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"select $1::text::jsonpath is not null as "parsed!""#,
        text
    )
    .fetch_one(pool)
    .await?;
    Ok(())
}

/// Locks the service's row until the transaction ends: one writer of its
/// watches at a time.
pub async fn lock_service(tx: &mut PgConnection, service_id: i64) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"select 1 as "locked" from watchpump.services where id = $1 for update"#,
        service_id
    )
    .fetch_optional(tx)
    .await?;
    Ok(())
}

/// The service's live watch with exactly these resource, object and
/// filters, if any.
pub async fn identical_watch(
    conn: &mut PgConnection,
    service_id: i64,
    resource: &str,
    object: &str,
    filters: &Value,
) -> sqlx::Result<Option<Watch>> {
    sqlx::query_as!(
        Watch,
        "select id, resource, object, filters, created_at, removed_at, removed_reason, paused_at
         from watchpump.watches
         where service_id = $1 and resource = $2 and object = $3 and filters = $4
           and removed_at is null
         limit 1",
        service_id,
        resource,
        object,
        filters
    )
    .fetch_optional(conn)
    .await
}

/// How many live watches the service holds.
pub async fn count_live_watches(tx: &mut PgConnection, service_id: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from watchpump.watches
           where service_id = $1 and removed_at is null"#,
        service_id
    )
    .fetch_one(tx)
    .await
}

pub async fn insert_watch(tx: &mut PgConnection, new: NewWatchRow<'_>) -> sqlx::Result<Watch> {
    sqlx::query_as!(
        Watch,
        "insert into watchpump.watches
             (service_id, resource, object, kinds, match_path, match_is_predicate, filters)
         values ($1, $2, $3, $4, $5::text::jsonpath, $6, $7)
         returning id, resource, object, filters, created_at, removed_at, removed_reason, paused_at",
        new.service_id,
        new.resource,
        new.object,
        new.kinds,
        new.match_path,
        new.match_is_predicate,
        new.filters
    )
    .fetch_one(tx)
    .await
}

/// A service's watches (live ones only unless `include_removed`), oldest
/// first, `limit` at a time after id `after`.
pub async fn watches_after(
    pool: &PgPool,
    service_id: i64,
    include_removed: bool,
    after: i64,
    limit: i64,
) -> sqlx::Result<Vec<Watch>> {
    sqlx::query_as!(
        Watch,
        "select id, resource, object, filters, created_at, removed_at, removed_reason, paused_at
         from watchpump.watches
         where service_id = $1 and id > $2 and ($3 or removed_at is null)
         order by id limit $4",
        service_id,
        after,
        include_removed,
        limit
    )
    .fetch_all(pool)
    .await
}

/// One of the service's own watches, removed or not.
pub async fn watch(pool: &PgPool, service_id: i64, id: i64) -> sqlx::Result<Option<Watch>> {
    sqlx::query_as!(
        Watch,
        "select id, resource, object, filters, created_at, removed_at, removed_reason, paused_at
         from watchpump.watches where service_id = $1 and id = $2",
        service_id,
        id
    )
    .fetch_optional(pool)
    .await
}

/// Whether the service has a watch `id`, removed or not.
pub async fn has_watch(pool: &PgPool, service_id: i64, id: i64) -> sqlx::Result<bool> {
    let found = sqlx::query_scalar!(
        "select id from watchpump.watches where service_id = $1 and id = $2",
        service_id,
        id
    )
    .fetch_optional(pool)
    .await?;
    Ok(found.is_some())
}

/// `watchpump.remove_watch()`: the watch is removed with `reason` and its
/// deliveries not sent yet dropped.
pub async fn remove_watch(pool: &PgPool, id: i64, reason: &str) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"select count(*) as "dropped!" from watchpump.remove_watch($1, $2)"#,
        id,
        reason
    )
    .fetch_one(pool)
    .await?;
    Ok(())
}

// --- The audit of stored filters ------------------------------------------

/// A live watch's stored filter, for `watchpump migrate`'s audit.
pub struct StoredFilter {
    pub id: i64,
    pub service: String,
    pub filter: String,
    pub is_predicate: Option<bool>,
}

/// Every live watch with a filter, by id.
pub async fn stored_filters(pool: &PgPool) -> sqlx::Result<Vec<StoredFilter>> {
    sqlx::query_as!(
        StoredFilter,
        r#"select w.id, s.name as service,
                  coalesce(w.filters->>'match', w.match_path::text) as "filter!",
                  w.match_is_predicate as is_predicate
           from watchpump.watches w join watchpump.services s on s.id = w.service_id
           where w.removed_at is null and w.match_path is not null
           order by w.id"#
    )
    .fetch_all(pool)
    .await
}

pub async fn set_match_is_predicate(
    pool: &PgPool,
    watch_id: i64,
    is_predicate: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "update watchpump.watches set match_is_predicate = $2 where id = $1",
        watch_id,
        is_predicate
    )
    .execute(pool)
    .await?;
    Ok(())
}
