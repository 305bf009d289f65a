//! A service's token: `wps_<service id>_<64 hex digits>`, of which only
//! the SHA-256 of the secret part is stored, and who a bearer token says is
//! calling the watches API (compared in constant time).

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

use super::Service;
use crate::db::registry as db;
use crate::error::Result;

pub(super) const TOKEN_PREFIX: &str = "wps_";

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

/// A random token secret and its stored hash.
pub(super) fn new_token_secret() -> (String, Vec<u8>) {
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let secret = hex::encode(secret);
    let hash = Sha256::digest(secret.as_bytes()).to_vec();
    (secret, hash)
}

/// The service id and secret of a token, `wps_<id>_<secret>`.
///
/// Only the form [`add`](super::add) hands out is a token: the id in
/// decimal digits without a sign or a leading zero, and 64 lowercase hex
/// digits. `str::parse` alone also took `wps_01_…` and `wps_+1_…`, so one
/// token had many spellings that all authenticated (and a leaked one could
/// be passed off as another in logs and in a search for it).
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
