//! The registry of consumer services: where to deliver to, how deliveries
//! to each are signed, and who is calling the watches API.
//!
//! A service token reads `wps_<service id>_<64 hex digits>`. Only the SHA-256
//! of its secret part is stored; a caller is looked up by the id and its
//! secret compared in constant time, so neither the database nor a timing
//! measurement gives the token away. The signing secret (`whsec_...`, see
//! [`crate::signing`]) cannot be a hash, since signing needs the key itself:
//! it is stored encrypted with `WATCHPUMP_SECRET_KEY` ([`at_rest`]).
//!
//! Both can be rotated with an overlap: the old token keeps working, and the
//! old secret keeps signing next to the new one, until the overlap ends. So
//! at most two secrets sign a delivery (two signatures in
//! `webhook-signature`), and at most two tokens work, at once. A rotation
//! during an overlap would retire the credential before the last one at
//! once, cutting off a consumer still on it without warning: it is refused
//! ([`Error::Conflict`], saying when the overlap ends) unless forced.
//!
//! What a registration is checked against (name, base URL, durations) is
//! `input.rs`.
//!
//! One file per concept: `token.rs` (a token's shape, and who is
//! calling), `secrets.rs` (the kinds of signature, the secrets a pump signs
//! with, and their sealing), `rotation.rs` (rotating either with an
//! overlap); this file registers, finds, repoints and removes services.

pub mod at_rest;
mod input;
pub mod rate;
mod rotation;
mod secrets;
mod token;

use sqlx::PgPool;

use crate::db::registry as db;
pub use crate::db::registry::{Removal, Service};
use crate::destinations::Destinations;
use crate::error::{Error, Result};
use at_rest::SecretKeys;
use input::{allowed_base_url, validate_name};
pub use input::{normalize_base_url, parse_duration, parse_overlap, DEFAULT_OVERLAP};
pub use rotation::{rotate_secret, rotate_token, Credential, Rotated};
use secrets::for_the_consumer;
pub use secrets::{
    destination, destinations, seal_signing_secrets, Destination, Sealed, Signature,
};
pub use token::authenticate;
use token::{new_token_secret, TOKEN_PREFIX};

/// A service just registered, with the credentials shown only this once.
#[derive(Debug)]
pub struct Registered {
    pub service: Service,
    /// The service's token, for `Authorization: Bearer` on the watches API.
    pub token: String,
    /// What the consumer verifies deliveries with: the secret they are
    /// signed with (`whsec_...`), or for ed25519 the public key (`whpk_...`).
    pub signing_secret: String,
    /// For ed25519 (`v1a`) only: the public key (`whpk_...`).
    pub signing_public_key: Option<String>,
}

/// Registers a consumer service and returns it with its new token and
/// signing secret, which are shown this once (only the token's hash is
/// stored). The base URL must not point at a link-local or metadata address
/// ([`add_within`] takes a configured list).
pub async fn add(pool: &PgPool, name: &str, base_url: &str) -> Result<Registered> {
    add_within(pool, name, base_url, &Destinations::default()).await
}

/// [`add`], with the base URL checked against `allowed`
/// (`WATCHPUMP_ALLOWED_DESTINATIONS`).
pub async fn add_within(
    pool: &PgPool,
    name: &str,
    base_url: &str,
    allowed: &Destinations,
) -> Result<Registered> {
    add_signed(pool, name, base_url, allowed, Signature::Hmac).await
}

/// [`add_within`], signed as `signature` says.
pub async fn add_signed(
    pool: &PgPool,
    name: &str,
    base_url: &str,
    allowed: &Destinations,
    signature: Signature,
) -> Result<Registered> {
    validate_name(name)?;
    let keys = SecretKeys::from_env()?;
    let base_url = allowed_base_url(base_url, allowed).await?;
    let (secret, hash) = new_token_secret();
    let key = signature.generate();
    let signing_secret = for_the_consumer(&key);
    let sealed = keys.seal(&key.to_whsec());
    let service = db::insert_service(pool, name, &base_url, &hash, &sealed, signature.column())
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(ref d) if d.is_unique_violation() => {
                Error::Invalid(format!("a service named {name:?} already exists"))
            }
            other => Error::Database(other),
        })?;
    let token = format!("{TOKEN_PREFIX}{}_{secret}", service.id);
    Ok(Registered {
        service,
        token,
        signing_public_key: key.public_key(),
        signing_secret,
    })
}

/// Every live service, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<Service>> {
    Ok(db::live_services(pool).await?)
}

/// The live service called `name`.
pub async fn find(pool: &PgPool, name: &str) -> Result<Service> {
    db::live_service(pool, name)
        .await?
        .ok_or_else(|| no_such_service(name))
}

fn no_such_service(name: &str) -> Error {
    Error::NotFound(format!("there is no service {name:?}"))
}

/// Points `name` at a new base URL (checked as [`add`] checks it).
pub async fn set_url(pool: &PgPool, name: &str, base_url: &str) -> Result<Service> {
    set_url_within(pool, name, base_url, &Destinations::default()).await
}

/// [`set_url`], with the base URL checked against `allowed`.
pub async fn set_url_within(
    pool: &PgPool,
    name: &str,
    base_url: &str,
    allowed: &Destinations,
) -> Result<Service> {
    let base_url = allowed_base_url(base_url, allowed).await?;
    db::set_base_url(pool, name, &base_url)
        .await?
        .ok_or_else(|| no_such_service(name))
}

/// Removes `name`: its token stops working, its watches are removed and
/// their undelivered deliveries dropped (`watchpump.remove_service()`).
pub async fn remove(pool: &PgPool, name: &str, actor: &str) -> Result<Removal> {
    db::remove_service(pool, name, actor)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(ref d) if d.code().as_deref() == Some("P0002") => {
                no_such_service(name)
            }
            other => Error::Database(other),
        })
}
