//! Services and their credentials (`watchpump.services`): registering,
//! reading and removing a service, its token hashes for the watches API,
//! and its sealed signing secrets as the pump reads, seals and rotates them.
//! The rules around them are [`crate::services`]'s.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

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
