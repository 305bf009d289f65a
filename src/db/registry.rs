//! The registry's statements (`sql/functions/0400_registry.sql` and the
//! tables it keeps: `services`, `watches`, `fanout_budgets`): services and
//! their credentials, watches, and what the fan-out budget and the filter
//! cap read. The rules around them live in [`crate::services`] and
//! [`crate::watches`].

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor, PgPool};

// --- Services -------------------------------------------------------------

/// A consumer service as the producer knows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Service {
    pub id: i64,
    pub name: String,
    pub base_url: String,
    pub created_at: DateTime<Utc>,
}

/// What removing a service took with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Removal {
    pub watches: i32,
    pub deliveries: i32,
}

/// A new service's row; `signature` is the word in `services.signature`
/// (`v1`, `v1a`). A name already taken is a unique violation.
pub async fn insert_service(
    pool: &PgPool,
    name: &str,
    base_url: &str,
    token_hash: &[u8],
    sealed_secret: &str,
    signature: &str,
) -> sqlx::Result<Service> {
    sqlx::query_as!(
        Service,
        "insert into watchpump.services (name, base_url, token_hash, signing_secret, signature)
         values ($1, $2, $3, $4, $5) returning id, name, base_url, created_at",
        name,
        base_url,
        token_hash,
        sealed_secret,
        signature
    )
    .fetch_one(pool)
    .await
}

/// Every live service, by name.
pub async fn live_services(pool: &PgPool) -> sqlx::Result<Vec<Service>> {
    sqlx::query_as!(
        Service,
        "select id, name, base_url, created_at from watchpump.services
         where removed_at is null order by name"
    )
    .fetch_all(pool)
    .await
}

/// The live service called `name`.
pub async fn live_service(pool: &PgPool, name: &str) -> sqlx::Result<Option<Service>> {
    sqlx::query_as!(
        Service,
        "select id, name, base_url, created_at from watchpump.services
         where name = $1 and removed_at is null",
        name
    )
    .fetch_optional(pool)
    .await
}

/// A live service's id by name.
pub async fn live_service_id(pool: &PgPool, name: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "select id from watchpump.services where name = $1 and removed_at is null",
        name
    )
    .fetch_optional(pool)
    .await
}

/// A live service's token hashes, and the service: the previous hash only
/// while its rotation's grace period lasts.
pub struct Credentials {
    pub token_hash: Vec<u8>,
    pub previous_token_hash: Option<Vec<u8>>,
    pub id: i64,
    pub name: String,
    pub base_url: String,
    pub created_at: DateTime<Utc>,
}

pub async fn credentials(pool: &PgPool, id: i64) -> sqlx::Result<Option<Credentials>> {
    sqlx::query_as!(
        Credentials,
        r#"select token_hash,
                  case when previous_token_until > now() then previous_token_hash end
                      as "previous_token_hash?",
                  id, name, base_url, created_at
           from watchpump.services where id = $1 and removed_at is null"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// A service's row as a pump reads it: where, and its sealed secrets.
pub struct DestinationRow {
    pub id: i64,
    pub version: i32,
    pub name: String,
    pub base_url: String,
    pub signing_secret: Option<String>,
    pub previous_signing_secret: Option<String>,
    pub previous_secret_until: Option<DateTime<Utc>>,
}

/// The rows of the services `ids`, whatever their state; unknown ids are
/// left out.
pub async fn destinations(pool: &PgPool, ids: &[i64]) -> sqlx::Result<Vec<DestinationRow>> {
    sqlx::query_as!(
        DestinationRow,
        "select id, version, name, base_url, signing_secret, previous_signing_secret,
                previous_secret_until
         from watchpump.services where id = any($1)",
        ids
    )
    .fetch_all(pool)
    .await
}

/// How many services have no signing secret, or one (current or
/// previous) not sealed: what sealing would have to do.
pub async fn count_unsealed(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from watchpump.services
           where signing_secret is null or signing_secret not like 'wpenc:%'
              or previous_signing_secret not like 'wpenc:%'"#
    )
    .fetch_one(pool)
    .await
}

/// A service's signing secrets as stored (sealed, or in clear before
/// 0006_encrypted_secrets.sql).
pub struct StoredSecrets {
    pub id: i64,
    pub name: String,
    pub signing_secret: Option<String>,
    pub previous_signing_secret: Option<String>,
}

pub async fn stored_secrets(pool: &PgPool) -> sqlx::Result<Vec<StoredSecrets>> {
    sqlx::query_as!(
        StoredSecrets,
        "select id, name, signing_secret, previous_signing_secret from watchpump.services"
    )
    .fetch_all(pool)
    .await
}

/// Stores resealed secrets (None: that one unchanged), only if the row
/// still holds what was read (`current`, `previous`): a rotation in
/// between is not undone.
pub async fn reseal(
    pool: &PgPool,
    id: i64,
    (current, previous): (Option<&str>, Option<&str>),
    (new_current, new_previous): (Option<&str>, Option<&str>),
) -> sqlx::Result<()> {
    sqlx::query!(
        "update watchpump.services
         set signing_secret = coalesce($4, signing_secret),
             previous_signing_secret = coalesce($5, previous_signing_secret),
             version = version + 1
         where id = $1 and signing_secret is not distinct from $2
           and previous_signing_secret is not distinct from $3",
        id,
        current,
        previous,
        new_current,
        new_previous
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// How many stored signing secrets (current and previous) match the
/// `like` pattern `sealed_like`.
pub async fn count_sealed_like(pool: &PgPool, sealed_like: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) filter (where signing_secret like $1)
                  + count(*) filter (where previous_signing_secret like $1) as "count!"
           from watchpump.services"#,
        sealed_like
    )
    .fetch_one(pool)
    .await
}

/// A live service's row, locked for a rotation until the transaction
/// ends: its kind of signature, when each previous credential stops, and
/// the time now.
pub struct RotationLock {
    pub signature: String,
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub previous_token_until: Option<DateTime<Utc>>,
    pub now: DateTime<Utc>,
}

pub async fn lock_for_rotation(
    tx: &mut PgConnection,
    name: &str,
) -> sqlx::Result<Option<RotationLock>> {
    sqlx::query_as!(
        RotationLock,
        r#"select signature, previous_secret_until, previous_token_until, now() as "now!"
           from watchpump.services where name = $1 and removed_at is null for update"#,
        name
    )
    .fetch_optional(tx)
    .await
}

/// The service's new sealed signing secret; the current one signs on for
/// `overlap_secs`, until the time returned.
pub async fn rotate_secret(
    tx: &mut PgConnection,
    name: &str,
    sealed_secret: &str,
    overlap_secs: f64,
) -> sqlx::Result<DateTime<Utc>> {
    sqlx::query_scalar!(
        r#"update watchpump.services
         set previous_signing_secret = signing_secret,
             previous_secret_until = now() + make_interval(secs => $3),
             signing_secret = $2, version = version + 1
         where name = $1 and removed_at is null
         returning previous_secret_until as "previous_secret_until!""#,
        name,
        sealed_secret,
        overlap_secs
    )
    .fetch_one(tx)
    .await
}

/// What [`rotate_token`] wrote: the service's id (part of the token) and
/// when the previous token stops working.
pub struct RotatedToken {
    pub id: i64,
    pub previous_token_until: DateTime<Utc>,
}

/// The service's new token hash; the current token works on for
/// `grace_secs`.
pub async fn rotate_token(
    tx: &mut PgConnection,
    name: &str,
    token_hash: &[u8],
    grace_secs: f64,
) -> sqlx::Result<RotatedToken> {
    sqlx::query_as!(
        RotatedToken,
        r#"update watchpump.services
         set previous_token_hash = token_hash,
             previous_token_until = now() + make_interval(secs => $3),
             token_hash = $2, version = version + 1
         where name = $1 and removed_at is null
         returning id, previous_token_until as "previous_token_until!""#,
        name,
        token_hash,
        grace_secs
    )
    .fetch_one(tx)
    .await
}

/// Points the live service `name` at `base_url`; None when there is none.
pub async fn set_base_url(
    pool: &PgPool,
    name: &str,
    base_url: &str,
) -> sqlx::Result<Option<Service>> {
    sqlx::query_as!(
        Service,
        "update watchpump.services set base_url = $2, version = version + 1
         where name = $1 and removed_at is null returning id, name, base_url, created_at",
        name,
        base_url
    )
    .fetch_optional(pool)
    .await
}

/// `watchpump.remove_service()`: P0002 when there is no such service.
pub async fn remove_service(pool: &PgPool, name: &str, actor: &str) -> sqlx::Result<Removal> {
    sqlx::query_as!(
        Removal,
        r#"select watches as "watches!", deliveries as "deliveries!"
           from watchpump.remove_service($1, $2)"#,
        name,
        actor
    )
    .fetch_one(pool)
    .await
}

// --- Watches --------------------------------------------------------------

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

// --- The filter cap and the fan-out budget --------------------------------

/// The filter texts, as the consumers sent them, of the service's live
/// watches on `object`, on its prefixes, and (for a prefix) under it.
pub async fn covering_filters(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
) -> sqlx::Result<Vec<String>> {
    // Two branches so that the first uses the index on object; the second
    // only runs for a prefix (a one-time filter on the parameter).
    sqlx::query_scalar!(
        r#"select coalesce(filters->>'match', match_path::text) as "filter!" from watchpump.watches
           where object = any (watchpump.object_prefixes($2))
             and service_id = $1 and removed_at is null and match_path is not null
           union all
           select coalesce(filters->>'match', match_path::text) from watchpump.watches
           where right($2, 1) = '/' and starts_with(object, $2) and object <> $2
             and service_id = $1 and removed_at is null and match_path is not null"#,
        service_id,
        object
    )
    .fetch_all(tx)
    .await
}

/// How many live watches the service holds on exactly `object`.
pub async fn count_live_watches_on(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from watchpump.watches
           where object = $2 and service_id = $1 and removed_at is null"#,
        service_id,
        object
    )
    .fetch_one(tx)
    .await
}

/// The advisory lock of a top segment's fan-out budget, until the
/// transaction ends: two creates under one top wait for each other.
pub async fn lock_fanout_top(tx: &mut PgConnection, top: &str) -> sqlx::Result<()> {
    sqlx::query!(
        r#"select pg_advisory_xact_lock(hashtextextended('watchpump.fanout:' || $1, 0)) as "locked""#,
        top
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// `watchpump.fanout_budget()` of the top segment `top`.
pub async fn fanout_budget(conn: impl PgExecutor<'_>, top: &str) -> sqlx::Result<i32> {
    sqlx::query_scalar!(r#"select watchpump.fanout_budget($1) as "budget!""#, top)
        .fetch_one(conn)
        .await
}

/// One service's live watches on one object: how many have no filter, and
/// the filter texts of the others.
pub struct Holding {
    pub object: String,
    pub service_id: i64,
    pub unfiltered: i64,
    pub filters: Vec<String>,
}

/// The live watches that can cover `object` (on it, on its prefixes, and
/// for a prefix under it), or every live watch when `object` is None.
pub async fn holdings(conn: &mut PgConnection, object: Option<&str>) -> sqlx::Result<Vec<Holding>> {
    sqlx::query_as!(
        Holding,
        r#"select object, service_id,
                  count(*) filter (where match_path is null) as "unfiltered!",
                  coalesce(array_agg(coalesce(filters->>'match', match_path::text))
                           filter (where match_path is not null), '{}') as "filters!"
           from watchpump.watches
           where removed_at is null
             and ($1::text is null
                  or object = any (watchpump.object_prefixes($1))
                  or (right($1, 1) = '/' and starts_with(object, $1)))
           group by object, service_id"#,
        object
    )
    .fetch_all(conn)
    .await
}

/// Every service's id and name, removed ones too.
pub struct ServiceName {
    pub id: i64,
    pub name: String,
}

pub async fn service_names(conn: &mut PgConnection) -> sqlx::Result<Vec<ServiceName>> {
    sqlx::query_as!(ServiceName, "select id, name from watchpump.services")
        .fetch_all(conn)
        .await
}

/// The top segments with a budget the operator set.
pub async fn budgeted_tops(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("select top_segment from watchpump.fanout_budgets")
        .fetch_all(conn)
        .await
}

pub async fn set_fanout_budget(
    pool: &PgPool,
    top: &str,
    units: i32,
    actor: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "insert into watchpump.fanout_budgets (top_segment, units, set_by)
         values ($1, $2, $3)
         on conflict (top_segment) do update
         set units = excluded.units, set_at = now(), set_by = excluded.set_by",
        top,
        units,
        actor
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn clear_fanout_budget(pool: &PgPool, top: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "delete from watchpump.fanout_budgets where top_segment = $1",
        top
    )
    .execute(pool)
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
