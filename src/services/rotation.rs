//! Rotating a service's signing secret or token with an overlap: the
//! previous one keeps working until the overlap ends, and a rotation during
//! an overlap is refused unless forced (it would cut off a consumer still
//! on the credential before).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::at_rest::SecretKeys;
use super::no_such_service;
use super::secrets::{for_the_consumer, Signature};
use super::token::{new_token_secret, TOKEN_PREFIX};
use crate::db::registry as db;
use crate::error::{Error, Result};

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
}
