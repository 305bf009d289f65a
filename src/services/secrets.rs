//! The signing secrets: the kind of signature a service is registered
//! with ([`Signature`]), what a pump reads to sign a delivery to it
//! ([`Destination`], its sealed secrets opened), and sealing every stored
//! secret under the current key ([`seal_signing_secrets`]).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::at_rest::SecretKeys;
use crate::db::registry as db;
use crate::error::{Error, Result};
use crate::signing::SigningSecret;

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
    pub(super) fn column(self) -> &'static str {
        match self {
            Signature::Hmac => "v1",
            Signature::Ed25519 => "v1a",
        }
    }

    pub(super) fn generate(self) -> SigningSecret {
        match self {
            Signature::Hmac => SigningSecret::generate(),
            Signature::Ed25519 => SigningSecret::generate_ed25519(),
        }
    }
}

/// What the consumer team is handed to verify with: the `whsec_` secret,
/// or for ed25519 the `whpk_` public key (the `whsk_` stays here).
pub(super) fn for_the_consumer(secret: &SigningSecret) -> String {
    secret.public_key().unwrap_or_else(|| secret.to_whsec())
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
