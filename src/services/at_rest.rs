//! Signing secrets at rest: sealed with a key from the environment
//! (`WATCHPUMP_SECRET_KEY`), so that a copy of the database, a backup or a
//! role that can read `watchpump.services` does not give away the keys that
//! sign every delivery.
//!
//! The stored form is `wpenc:v1:<key id>:<base64 of nonce and ciphertext>`:
//! XChaCha20-Poly1305 with a random 24-byte nonce (random nonces of that size
//! never collide in practice, at any number of secrets and rotations; the tag
//! makes an altered value fail instead of signing with garbage). The key id
//! is 8 hex digits of the key's SHA-256: it names which key sealed a value,
//! so that during a key rotation the previous key
//! (`WATCHPUMP_SECRET_KEY_PREVIOUS`) still opens the values not yet sealed
//! again (`watchpump secrets rekey`, or `watchpump migrate`).
//!
//! Who needs the key: `serve` (the pump signs), `migrate` when it has
//! secrets to seal, and whatever creates or rotates a secret (the CLI, the
//! admin API, the panel). Without it they refuse with [`KEY_VAR`]'s name
//! and how to make a key.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The key that seals signing secrets: base64 of 32 random bytes.
pub const KEY_VAR: &str = "WATCHPUMP_SECRET_KEY";
/// During a key rotation, the key before it: opens what it sealed.
pub const PREVIOUS_KEY_VAR: &str = "WATCHPUMP_SECRET_KEY_PREVIOUS";
/// What every sealed value starts with.
pub const SEALED_PREFIX: &str = "wpenc:v1:";
/// Bound to every ciphertext: a value sealed for another purpose (or by a
/// later format) does not open as a signing secret.
const ASSOCIATED_DATA: &[u8] = b"watchpump signing secret v1";
const NONCE_BYTES: usize = 24;

/// How to make a key, for the messages that ask for one.
const HOW_TO_MAKE_ONE: &str = "make one with `openssl rand -base64 32` and keep it with the \
     producer's other secrets (every `watchpump serve` and `migrate` of this database needs the same key)";

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl Key {
    fn parse(var: &str, text: &str) -> Result<Key> {
        let bytes = STANDARD.decode(text.trim()).map_err(|_| {
            Error::Config(format!(
                "{var} is not base64 of 32 bytes; {HOW_TO_MAKE_ONE}"
            ))
        })?;
        if bytes.len() != 32 {
            return Err(Error::Config(format!(
                "{var} is {} bytes long, not 32; {HOW_TO_MAKE_ONE}",
                bytes.len()
            )));
        }
        let id = hex::encode(&Sha256::digest(&bytes)[..4]);
        let cipher = XChaCha20Poly1305::new_from_slice(&bytes).expect("a 32-byte key");
        Ok(Key { id, cipher })
    }
}

/// The key that seals, and the previous one that still opens.
pub struct SecretKeys {
    current: Key,
    previous: Option<Key>,
}

impl SecretKeys {
    /// The keys from [`KEY_VAR`] and [`PREVIOUS_KEY_VAR`]; a clear
    /// [`Error::Config`] when the key is unset or malformed.
    pub fn from_env() -> Result<SecretKeys> {
        let current = std::env::var(KEY_VAR)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| {
                Error::Config(format!(
                    "{KEY_VAR} is not set: signing secrets are stored encrypted with it; {HOW_TO_MAKE_ONE}"
                ))
            })?;
        let previous = std::env::var(PREVIOUS_KEY_VAR)
            .ok()
            .filter(|v| !v.trim().is_empty());
        SecretKeys::new(&current, previous.as_deref())
    }

    /// The keys from their base64 text (as in the environment).
    pub fn new(current: &str, previous: Option<&str>) -> Result<SecretKeys> {
        Ok(SecretKeys {
            current: Key::parse(KEY_VAR, current)?,
            previous: previous
                .map(|p| Key::parse(PREVIOUS_KEY_VAR, p))
                .transpose()?,
        })
    }

    /// The current key's id, as it appears in the values it sealed.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// `secret` sealed with the current key.
    pub fn seal(&self, secret: &str) -> String {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::thread_rng().fill_bytes(&mut nonce);
        let sealed = self
            .current
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: ASSOCIATED_DATA,
                },
            )
            .expect("encryption with a valid key and nonce cannot fail");
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&sealed);
        format!(
            "{SEALED_PREFIX}{}:{}",
            self.current.id,
            STANDARD.encode(blob)
        )
    }

    /// The secret in `stored`, opened with whichever key sealed it. `what`
    /// names the value in errors ("the signing secret of service 3").
    pub fn open(&self, stored: &str, what: &str) -> Result<String> {
        let Some(rest) = stored.strip_prefix(SEALED_PREFIX) else {
            return Err(Error::Config(format!(
                "{what} is stored in clear: run `watchpump migrate` with {KEY_VAR} set to encrypt it"
            )));
        };
        let (id, blob) = rest
            .split_once(':')
            .ok_or_else(|| Error::Config(format!("{what} is not a sealed value")))?;
        let key = [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| k.id == id)
            .ok_or_else(|| {
                Error::Config(format!(
                    "{what} was encrypted with key {id}, but {KEY_VAR} is key {}{}: \
                     set {KEY_VAR} (or {PREVIOUS_KEY_VAR}, during a key rotation) to the key it was encrypted with",
                    self.current.id,
                    self.previous
                        .as_ref()
                        .map(|p| format!(" and {PREVIOUS_KEY_VAR} key {}", p.id))
                        .unwrap_or_default()
                ))
            })?;
        let blob = STANDARD
            .decode(blob)
            .ok()
            .filter(|b| b.len() > NONCE_BYTES)
            .ok_or_else(|| Error::Config(format!("{what} is not a sealed value")))?;
        let (nonce, sealed) = blob.split_at(NONCE_BYTES);
        let clear = key
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: ASSOCIATED_DATA,
                },
            )
            .map_err(|_| {
                Error::Config(format!(
                    "{what} does not decrypt with key {id}: the stored value was altered"
                ))
            })?;
        String::from_utf8(clear).map_err(|_| Error::Config(format!("{what} is not text")))
    }

    /// Whether `stored` is sealed with the current key (nothing to redo).
    pub fn is_current(&self, stored: &str) -> bool {
        stored
            .strip_prefix(SEALED_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(id, _)| id == self.current.id)
    }
}

/// How many stored signing secrets (current and previous) `key_id` sealed:
/// what `secrets rekey` reports.
pub async fn count_sealed_with(pool: &sqlx::PgPool, key_id: &str) -> Result<i64> {
    let prefix = format!("{SEALED_PREFIX}{key_id}:%");
    Ok(crate::db::registry::count_sealed_like(pool, &prefix).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "Kc9p0Jm5G0wXqBqkQmcvXb2c8qz9+3aH8WzJ4nq0v2s=";
    const B: &str = "mZ1rQ9oWlQ3cP8T8b0bq5yqkVf2QnYd0l7hXo1q3wCk=";

    #[test]
    fn a_sealed_secret_opens_with_its_key_and_not_without_it() {
        let a = SecretKeys::new(A, None).unwrap();
        let sealed = a.seal("whsec_abc");
        assert!(sealed.starts_with(SEALED_PREFIX) && !sealed.contains("whsec_"));
        assert_ne!(sealed, a.seal("whsec_abc"), "a fresh nonce each time");
        assert_eq!(a.open(&sealed, "it").unwrap(), "whsec_abc");

        let b = SecretKeys::new(B, None).unwrap();
        let e = b.open(&sealed, "the secret").unwrap_err().to_string();
        assert!(e.contains(KEY_VAR) && e.contains(a.current_id()), "{e}");
        let rotating = SecretKeys::new(B, Some(A)).unwrap();
        assert_eq!(rotating.open(&sealed, "it").unwrap(), "whsec_abc");
        assert!(!rotating.is_current(&sealed) && a.is_current(&sealed));
    }

    #[test]
    fn altered_clear_and_malformed_values_are_clear_errors() {
        let a = SecretKeys::new(A, None).unwrap();
        let sealed = a.seal("whsec_abc");
        // A character of the ciphertext in the middle (the last ones carry
        // base64 padding bits, whose change is a decoding error instead).
        let mut altered = sealed.clone().into_bytes();
        let middle = SEALED_PREFIX.len() + 9 + 40;
        altered[middle] = if altered[middle] == b'A' { b'B' } else { b'A' };
        let e = a
            .open(std::str::from_utf8(&altered).unwrap(), "it")
            .unwrap_err();
        assert!(e.to_string().contains("altered"), "{e}");
        let e = a.open("whsec_abc", "it").unwrap_err();
        assert!(e.to_string().contains("in clear"), "{e}");
        assert!(a.open("wpenc:v1:nocolon", "it").is_err());
        assert!(a
            .open(&format!("wpenc:v1:{}:!!", a.current_id()), "it")
            .is_err());
        for bad in ["", "not base64", "c2hvcnQ="] {
            let e = SecretKeys::new(bad, None).err().unwrap().to_string();
            assert!(
                e.contains(KEY_VAR) && e.contains("openssl rand -base64 32"),
                "{e}"
            );
        }
    }
}
