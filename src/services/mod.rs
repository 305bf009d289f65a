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

pub mod at_rest;
mod input;
pub mod rate;

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

use crate::db::registry as db;
pub use crate::db::registry::{Removal, Service};
use crate::destinations::Destinations;
use crate::error::{Error, Result};
use crate::signing::SigningSecret;
use at_rest::SecretKeys;
use input::{allowed_base_url, validate_name};
pub use input::{normalize_base_url, parse_duration, parse_overlap, DEFAULT_OVERLAP};

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

/// What a pump needs to send to one service, as of `version`: where, under
/// which name (logs, metrics), and the keys that sign.
#[derive(Debug, Clone)]
pub struct Destination {
    pub version: i32,
    pub name: String,
    pub base_url: String,
    pub current: SigningSecret,
    /// The secret before the last rotation, signing too until the time given.
    pub previous: Option<(SigningSecret, DateTime<Utc>)>,
}

impl Destination {
    /// The secrets that sign at `now`.
    pub fn signing_at(&self, now: DateTime<Utc>) -> Vec<&SigningSecret> {
        let mut secrets = vec![&self.current];
        if let Some((old, until)) = &self.previous {
            if now < *until {
                secrets.push(old);
            }
        }
        secrets
    }
}

const TOKEN_PREFIX: &str = "wps_";

/// Registers a consumer service and returns it with its new token and
/// signing secret, which are shown this once (only the token's hash is
/// stored). The base URL must not point at a link-local or metadata address
/// ([`add_within`] takes a configured list).
pub async fn add(pool: &PgPool, name: &str, base_url: &str) -> Result<Registered> {
    add_within(pool, name, base_url, &Destinations::default()).await
}

/// How deliveries to a service are signed (Standard Webhooks), chosen when
/// it is registered and kept through rotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Signature {
    /// `v1`: HMAC-SHA256 with a secret both sides hold (`whsec_`).
    #[default]
    Hmac,
    /// `v1a`: ed25519; the producer keeps the secret key (`whsk_`), the
    /// consumer holds only the public key (`whpk_`), nothing secret.
    Ed25519,
}

impl Signature {
    /// `hmac` (or `v1`) or `ed25519` (or `v1a`).
    pub fn parse(text: &str) -> Result<Signature> {
        match text {
            "hmac" | "v1" => Ok(Signature::Hmac),
            "ed25519" | "v1a" => Ok(Signature::Ed25519),
            other => Err(Error::Invalid(format!(
                "the signature is hmac or ed25519, not {other:?}"
            ))),
        }
    }

    /// The word in `services.signature`.
    fn column(self) -> &'static str {
        match self {
            Signature::Hmac => "v1",
            Signature::Ed25519 => "v1a",
        }
    }

    fn generate(self) -> SigningSecret {
        match self {
            Signature::Hmac => SigningSecret::generate(),
            Signature::Ed25519 => SigningSecret::generate_ed25519(),
        }
    }
}

/// What the consumer team is handed to verify with: the `whsec_` secret,
/// or for ed25519 the `whpk_` public key (the `whsk_` stays here).
fn for_the_consumer(secret: &SigningSecret) -> String {
    secret.public_key().unwrap_or_else(|| secret.to_whsec())
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

/// The service a bearer token belongs to, or `None` for any token that is
/// malformed, unknown, wrong, or of a removed service. During a token
/// rotation's grace period the previous token works too.
pub async fn authenticate(pool: &PgPool, token: &str) -> Result<Option<Service>> {
    let Some((id, secret)) = parse_token(token) else {
        return Ok(None);
    };
    let Some(db::Credentials {
        token_hash: current,
        previous_token_hash: previous,
        id,
        name,
        base_url,
        created_at,
    }) = db::credentials(pool, id).await?
    else {
        return Ok(None);
    };
    let service = Service {
        id,
        name,
        base_url,
        created_at,
    };
    let presented = Sha256::digest(secret.as_bytes());
    // Both comparisons always run, so the time taken says nothing about
    // which one matched.
    let matches_current = presented.as_slice().ct_eq(&current);
    let matches_previous = presented
        .as_slice()
        .ct_eq(previous.as_deref().unwrap_or(&[0u8; 32]))
        & subtle::Choice::from(u8::from(previous.is_some()));
    Ok(bool::from(matches_current | matches_previous).then_some(service))
}

/// Where and how deliveries to service `id` go, whatever its state.
pub async fn destination(pool: &PgPool, id: i64) -> Result<Destination> {
    destinations(pool, &[id])
        .await?
        .pop()
        .map(|(_, d)| d)
        .unwrap_or_else(|| Err(Error::NotFound(format!("there is no service with id {id}"))))
}

/// [`destination`] of each of `ids`, in one query: a pump that meets 300
/// services at once (their first deliveries in one claim) reads them in one
/// round trip, not 300 while the claim's other deliveries wait. Ids with no
/// service are left out; each service's secrets are opened on their own,
/// so that one that cannot be read fails only its own deliveries.
pub async fn destinations(pool: &PgPool, ids: &[i64]) -> Result<Vec<(i64, Result<Destination>)>> {
    let rows = db::destinations(pool, ids).await?;
    let keys = SecretKeys::from_env()?;
    Ok(rows
        .into_iter()
        .map(|row| (row.id, destination_of(row, &keys)))
        .collect())
}

fn destination_of(row: db::DestinationRow, keys: &SecretKeys) -> Result<Destination> {
    let id = row.id;
    let name = row.name.clone();
    let parse = |stored: &str| {
        let what = format!("the signing secret of service {name:?} (id {id})");
        SigningSecret::parse(&keys.open(stored, &what)?)
            .map_err(|e| Error::Config(format!("{what}: {e}")))
    };
    let current = parse(row.signing_secret.as_deref().ok_or_else(|| {
        Error::Config(format!(
            "service {id} has no signing secret: run `watchpump migrate`"
        ))
    })?)?;
    let previous = match (row.previous_signing_secret, row.previous_secret_until) {
        (Some(old), Some(until)) => Some((parse(&old)?, until)),
        _ => None,
    };
    Ok(Destination {
        version: row.version,
        name: row.name,
        base_url: row.base_url,
        current,
        previous,
    })
}

/// What [`seal_signing_secrets`] did: the services given a secret, and the
/// secrets sealed (clear ones, and those of a previous key).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sealed {
    pub given: Vec<String>,
    pub sealed: usize,
}

/// Gives every service without a signing secret one (services registered
/// before signing existed), and seals with the current key every secret
/// stored in clear (before 0006_encrypted_secrets.sql) or under the
/// previous key (a key rotation: `watchpump secrets rekey`). Without the key
/// it refuses only when there is something to do.
pub async fn seal_signing_secrets(pool: &PgPool) -> Result<Sealed> {
    let keys = match SecretKeys::from_env() {
        Ok(keys) => keys,
        Err(e) => {
            let waiting = db::count_unsealed(pool).await?;
            return if waiting == 0 {
                Ok(Sealed::default())
            } else {
                Err(e)
            };
        }
    };
    let mut done = Sealed::default();
    for row in db::stored_secrets(pool).await? {
        let db::StoredSecrets {
            id,
            name,
            signing_secret: current,
            previous_signing_secret: previous,
        } = row;
        let reseal = |stored: Option<&String>, which: &str| -> Result<Option<String>> {
            match stored {
                Some(s) if keys.is_current(s) => Ok(None),
                Some(s) if s.starts_with("whsec_") => Ok(Some(keys.seal(s))),
                Some(s) => {
                    let what = format!("the {which}signing secret of service {name:?}");
                    Ok(Some(keys.seal(&keys.open(s, &what)?)))
                }
                None => Ok(None),
            }
        };
        let new_current = match &current {
            None => {
                done.given.push(name.clone());
                Some(keys.seal(&SigningSecret::generate().to_whsec()))
            }
            Some(_) => reseal(current.as_ref(), "")?,
        };
        let new_previous = reseal(previous.as_ref(), "previous ")?;
        if new_current.is_none() && new_previous.is_none() {
            continue;
        }
        done.sealed += usize::from(new_current.is_some()) + usize::from(new_previous.is_some());
        // Compared with what was read: a rotation in between is not undone.
        db::reseal(
            pool,
            id,
            (current.as_deref(), previous.as_deref()),
            (new_current.as_deref(), new_previous.as_deref()),
        )
        .await?;
    }
    done.sealed -= done.given.len();
    Ok(done)
}

/// What a rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    /// The new credential: the token, or what the consumer verifies with
    /// (the `whsec_` secret, or the `whpk_` public key for ed25519).
    pub new: String,
    /// When the credential it replaces stops working (signing, for a
    /// secret): the overlap.
    pub previous_until: DateTime<Utc>,
    /// Forced during an overlap: when the credential before the replaced
    /// one was to stop. It stopped at the rotation instead.
    pub retired_early: Option<DateTime<Utc>>,
}

/// Which credential a rotation replaces, for its columns and its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    SigningSecret,
    Token,
}

impl Credential {
    /// When the credential before the current one stops working.
    fn previous_until(self, row: &db::RotationLock) -> Option<DateTime<Utc>> {
        match self {
            Credential::SigningSecret => row.previous_secret_until,
            Credential::Token => row.previous_token_until,
        }
    }

    /// Refuses a rotation while the previous credential still works (its
    /// overlap), unless `force`: the rotation would stop it at once.
    fn check_overlap(
        self,
        name: &str,
        until: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        force: bool,
    ) -> Result<Option<DateTime<Utc>>> {
        let Some(until) = until.filter(|u| *u > now) else {
            return Ok(None);
        };
        if force {
            return Ok(Some(until));
        }
        let (what, works, cut_off) = match self {
            Credential::SigningSecret => (
                "signing secret",
                "signs",
                "a consumer still verifying with it would refuse every delivery (401)",
            ),
            Credential::Token => (
                "token",
                "works",
                "a consumer still calling with it would get 401 from the watches API",
            ),
        };
        Err(Error::Conflict(format!(
            "service {name} is in the overlap of its last rotation: its previous {what} still {works} \
             until {} (in {}). Rotating again now would retire that {what} at once, and {cut_off}. \
             Rotate after the overlap ends, or force it (--force; \"force\": true in the admin API) \
             if that {what} must stop now",
            until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            remaining(until - now),
        )))
    }
}

/// `left` as people read it: `23h 59m`, `12m 5s`, `40s`.
fn remaining(left: chrono::TimeDelta) -> String {
    let secs = left.num_seconds().max(1);
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// The service's row for a rotation, locked until the transaction ends so
/// that two rotations at once cannot both pass the overlap check: its
/// signature kind, when its previous `credential` stops, and the time now.
async fn lock_for_rotation(
    tx: &mut sqlx::PgConnection,
    name: &str,
    credential: Credential,
) -> Result<(String, Option<DateTime<Utc>>, DateTime<Utc>)> {
    let row = db::lock_for_rotation(tx, name)
        .await?
        .ok_or_else(|| no_such_service(name))?;
    let until = credential.previous_until(&row);
    Ok((row.signature, until, row.now))
}

/// A new signing secret for `name` (of the service's kind, [`Signature`]);
/// the old one keeps signing (next to the new one) for `overlap`. Refused
/// while the secret before it still signs, unless `force`, which retires
/// that one now.
pub async fn rotate_secret(
    pool: &PgPool,
    name: &str,
    overlap: Duration,
    force: bool,
) -> Result<Rotated> {
    let keys = SecretKeys::from_env()?;
    let mut tx = pool.begin().await?;
    let (kind, until, now) = lock_for_rotation(&mut tx, name, Credential::SigningSecret).await?;
    let retired_early = Credential::SigningSecret.check_overlap(name, until, now, force)?;
    // A rotation keeps the service's kind of signature.
    let key = Signature::parse(&kind)?.generate();
    let sealed = keys.seal(&key.to_whsec());
    let previous_until = db::rotate_secret(&mut tx, name, &sealed, overlap.as_secs_f64()).await?;
    tx.commit().await?;
    Ok(Rotated {
        new: for_the_consumer(&key),
        previous_until,
        retired_early,
    })
}

/// A new token for `name`; the old one keeps working for `grace`. Refused
/// while the token before it still works, unless `force`, which retires
/// that one now.
pub async fn rotate_token(
    pool: &PgPool,
    name: &str,
    grace: Duration,
    force: bool,
) -> Result<Rotated> {
    let (secret, hash) = new_token_secret();
    let mut tx = pool.begin().await?;
    let (_, until, now) = lock_for_rotation(&mut tx, name, Credential::Token).await?;
    let retired_early = Credential::Token.check_overlap(name, until, now, force)?;
    let db::RotatedToken {
        id,
        previous_token_until: previous_until,
    } = db::rotate_token(&mut tx, name, &hash, grace.as_secs_f64()).await?;
    tx.commit().await?;
    Ok(Rotated {
        new: format!("{TOKEN_PREFIX}{id}_{secret}"),
        previous_until,
        retired_early,
    })
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

/// A random token secret and its stored hash.
fn new_token_secret() -> (String, Vec<u8>) {
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let secret = hex::encode(secret);
    let hash = Sha256::digest(secret.as_bytes()).to_vec();
    (secret, hash)
}

/// The service id and secret of a token, `wps_<id>_<secret>`.
///
/// Only the form [`add`] hands out is a token: the id in decimal digits
/// without a sign or a leading zero, and 64 lowercase hex digits. `str::parse`
/// alone also took `wps_01_…` and `wps_+1_…`, so one token had many
/// spellings that all authenticated (and a leaked one could be passed off
/// as another in logs and in a search for it).
fn parse_token(token: &str) -> Option<(i64, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let canonical_id =
        !id.is_empty() && !id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit());
    let canonical_secret = secret.len() == 64
        && secret
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !(canonical_id && canonical_secret) {
        return None;
    }
    Some((id.parse().ok()?, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_reads_as_people_write_it() {
        let secs = chrono::TimeDelta::seconds;
        assert_eq!(remaining(secs(0)), "1s");
        assert_eq!(remaining(secs(40)), "40s");
        assert_eq!(remaining(secs(12 * 60 + 5)), "12m 5s");
        assert_eq!(remaining(secs(23 * 3600 + 59 * 60 + 59)), "23h 59m");
        assert_eq!(remaining(secs(7 * 86_400 + 3600)), "7d 1h");
    }

    #[test]
    fn tokens_parse_only_in_their_own_shape() {
        let secret = "a".repeat(64);
        assert_eq!(
            parse_token(&format!("wps_12_{secret}")),
            Some((12, secret.as_str()))
        );
        assert_eq!(parse_token(&format!("wps_x_{secret}")), None);
        assert_eq!(parse_token("wps_12_short"), None);
        assert_eq!(parse_token(&format!("Bearer wps_12_{secret}")), None);
    }

    #[test]
    fn a_token_has_one_spelling() {
        let secret = "0123456789abcdef".repeat(4);
        assert_eq!(
            parse_token(&format!("wps_1_{secret}")),
            Some((1, secret.as_str()))
        );
        for id in [
            "01",
            "+1",
            "-1",
            "0",
            "",
            " 1",
            "1 ",
            "१",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_token(&format!("wps_{id}_{secret}")),
                None,
                "id {id:?}"
            );
        }
        let upper = secret.to_uppercase();
        let not_hex = "g".repeat(64);
        for other in [upper.as_str(), not_hex.as_str()] {
            assert_eq!(parse_token(&format!("wps_1_{other}")), None, "{other}");
        }
    }
}
