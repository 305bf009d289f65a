//! Is this request from the producer? Its bearer token and its Standard
//! Webhooks signature, both checked in constant time, before anything is
//! parsed or stored.

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::http::bearer;
use crate::kit::answer::Refusal;
use crate::signing::{self, SigningSecret, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// What a consumer knows about one producer it follows: the producer's name
/// (the `{producer}` in `/api/v1/{producer}/events`), the token the producer
/// sends with every delivery, and the consumer's signing secrets for it.
///
/// Give every secret that may still sign: during a rotation
/// (`watchpump services rotate-secret`) the producer signs with the new and
/// the previous secret, so a consumer may hold either, or both.
#[derive(Clone)]
pub struct Producer {
    pub(crate) name: String,
    /// SHA-256 of the token: comparing digests takes the same time whatever
    /// the presented token's length, and the token itself is not kept.
    token_digest: [u8; 32],
    secrets: Vec<SigningSecret>,
    tolerance_secs: i64,
}

impl Producer {
    /// `secrets` must not be empty; every delivery would be refused.
    pub fn new(name: &str, token: &str, secrets: Vec<SigningSecret>) -> Self {
        assert!(
            !secrets.is_empty(),
            "a producer needs at least one signing secret"
        );
        Producer {
            name: name.to_string(),
            token_digest: Sha256::digest(token.as_bytes()).into(),
            secrets,
            tolerance_secs: signing::DEFAULT_TOLERANCE_SECS,
        }
    }

    /// How far `webhook-timestamp` may be from this server's clock, either
    /// way (default [`signing::DEFAULT_TOLERANCE_SECS`], five minutes).
    pub fn tolerance_secs(mut self, secs: i64) -> Self {
        self.tolerance_secs = secs;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bearer token, from the request's headers alone (so a request
    /// without it is refused before its body is read).
    pub(crate) fn check_token(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let presented = bearer(headers).ok_or(Refusal::Unauthorized(
            "the producer's token is required: Authorization: Bearer <token>".into(),
        ))?;
        let digest = Sha256::digest(presented.as_bytes());
        if bool::from(digest.as_slice().ct_eq(&self.token_digest)) {
            Ok(())
        } else {
            Err(Refusal::Unauthorized(
                "the bearer token is not this producer's".into(),
            ))
        }
    }

    /// The signature over the exact body, at `now` (Unix seconds). Returns
    /// the delivery id it signs.
    pub(crate) fn check_signature(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<i64, Refusal> {
        let header = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        let id = header(HEADER_ID);
        let secrets: Vec<&SigningSecret> = self.secrets.iter().collect();
        signing::verify(
            &secrets,
            id,
            header(HEADER_TIMESTAMP),
            header(HEADER_SIGNATURE),
            body,
            now,
            self.tolerance_secs,
        )
        .map_err(|e| Refusal::Unauthorized(e.to_string()))?;
        // Signed, so from the producer: an id that is not a number is its
        // bug, not a forgery.
        id.trim()
            .parse()
            .map_err(|_| Refusal::BadRequest(format!("{HEADER_ID} {id:?} is not a delivery id")))
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("name", &self.name)
            .field("secrets", &self.secrets.len())
            .field("tolerance_secs", &self.tolerance_secs)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn producer(secret: &SigningSecret) -> Producer {
        Producer::new("git", "t0ken", vec![secret.clone()])
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn only_the_producers_token_passes() {
        let p = producer(&SigningSecret::generate());
        let with = |v: &str| headers(&[("authorization", v.to_string())]);
        assert!(p.check_token(&with("Bearer t0ken")).is_ok());
        assert!(p.check_token(&with("bearer t0ken")).is_ok());
        assert!(p.check_token(&with("Bearer t0ke")).is_err());
        assert!(p.check_token(&with("Basic t0ken")).is_err());
        assert!(p.check_token(&HeaderMap::new()).is_err());
    }

    #[test]
    fn a_signature_verifies_with_any_known_secret_and_names_the_id() {
        let (old, new) = (SigningSecret::generate(), SigningSecret::generate());
        let p = Producer::new("git", "t", vec![new.clone(), old.clone()]);
        let body = br#"{"delivery_id":42}"#;
        let signed = headers(&signing::headers(&[&old], 42, 1_700_000_000, body));
        assert_eq!(p.check_signature(&signed, body, 1_700_000_010), Ok(42));
        assert!(p
            .check_signature(&signed, b"{\"delivery_id\":43}", 1_700_000_010)
            .is_err());
        assert!(producer(&SigningSecret::generate())
            .check_signature(&signed, body, 1_700_000_010)
            .is_err());
        // Replayed ten minutes later.
        assert!(p.check_signature(&signed, body, 1_700_000_600).is_err());
    }

    #[test]
    fn the_kit_verifies_v1a_with_the_public_key_alone_and_v1_next_to_it() {
        let key = SigningSecret::generate_ed25519();
        let public: SigningSecret = key.public_key().unwrap().parse().unwrap();
        let hmac = SigningSecret::generate();
        let p = Producer::new("git", "t", vec![public, hmac.clone()]);
        let body = br#"{"delivery_id":7}"#;
        for signer in [&key, &hmac] {
            let signed = headers(&signing::headers(&[signer], 7, 1_700_000_000, body));
            assert_eq!(p.check_signature(&signed, body, 1_700_000_010), Ok(7));
        }
        let forged = headers(&signing::headers(
            &[&SigningSecret::generate_ed25519()],
            7,
            1_700_000_000,
            body,
        ));
        assert!(p.check_signature(&forged, body, 1_700_000_010).is_err());
    }
}
