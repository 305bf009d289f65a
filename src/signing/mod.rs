//! Signing of deliveries per the Standard Webhooks specification
//! (<https://www.standardwebhooks.com>, the scheme Svix uses).
//!
//! We follow a published standard instead of inventing a header format so that
//! a consumer team can verify our deliveries with an off-the-shelf library
//! (`standardwebhooks` on PyPI/npm/crates.io, the Svix SDKs, ...) rather than
//! with code they have to write and get right themselves.
//!
//! Every attempt carries three headers:
//!
//! * `webhook-id`: the delivery id (for watchpump, the decimal form of the
//!   delivery's id). It stays the same across retries, so consumers use it as
//!   an idempotency key.
//! * `webhook-timestamp`: Unix seconds of *this attempt* (a retry gets a new
//!   one and so a new signature). Being signed, it lets consumers refuse
//!   replays of old captured requests.
//! * `webhook-signature`: `v1,<base64 HMAC-SHA256>` over the exact bytes
//!   `"{id}.{timestamp}.{body}"`, one entry per active secret, separated by
//!   single spaces, so a secret can be rotated without downtime: the consumer
//!   accepts the request if any entry matches any secret it knows.
//!
//! Asymmetric signatures (`v1a`, ed25519) are chosen per service: the
//! producer keeps the secret key (`whsk_<base64 of 64 bytes>`, the form
//! Svix's server uses: the 32-byte seed then the 32-byte public key) and
//! the consumer holds only the public key (`whpk_<base64 of 32 bytes>`),
//! nothing secret. `v1a,<base64 of the 64-byte signature>` signs the same
//! `"{id}.{timestamp}.{body}"`. A [`SigningSecret`] is any of the three
//! forms; signing skips a public key, verifying uses every form.
//!
//! [`verify`] is the consumer side. watchpump itself only signs, but it is
//! here for our tests, for consumer teams written in Rust, and as the
//! executable statement of what "valid" means.
//!
//! Over 400 lines: the scheme is one unit (the three key forms, their
//! parsing, the signed content and the header); the consumer's side is
//! already in `verify.rs` and the cases in `tests.rs`.

mod verify;

use std::fmt;
use std::str::FromStr;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::Sha256;
pub use verify::{verify, VerifyError};

/// Header carrying the delivery id (the same on every retry of a delivery).
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the Unix time, in whole seconds, of this attempt.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying the space-separated `v1,<base64>` signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// The tolerance the reference libraries apply to `webhook-timestamp`, in
/// both directions: 5 minutes. Pass it to [`verify`] unless there is a reason
/// not to; consumers using a reference library cannot change it.
pub const DEFAULT_TOLERANCE_SECS: i64 = 5 * 60;

/// Prefix of a serialized secret. The spec asks for it so that a secret pasted
/// into the wrong place is recognisable, and so that the symmetric scheme
/// (`whsec_`) cannot be confused with the asymmetric one (`whsk_`/`whpk_`).
pub const SECRET_PREFIX: &str = "whsec_";

/// Shortest key accepted: the spec requires at least 192 bits of randomness.
pub const MIN_SECRET_BYTES: usize = 24;
/// Longest key accepted: the spec's maximum of 512 bits.
pub const MAX_SECRET_BYTES: usize = 64;

/// How many entries of a `webhook-signature` header [`verify`] examines at
/// most. A legitimate header has one entry per active secret (one, or two
/// during a rotation, plus possibly entries of other versions); the cap keeps
/// a hostile header with thousands of entries from costing unbounded work.
pub const MAX_SIGNATURE_ENTRIES: usize = 16;

/// Size of keys made by [`SigningSecret::generate`]: 256 bits, well inside
/// the spec's range and the size of the HMAC-SHA256 output.
const GENERATED_SECRET_BYTES: usize = 32;

/// The signature version of the symmetric (HMAC-SHA256) scheme. Unknown
/// versions are skipped, as the spec requires, so that a producer can add
/// new schemes without breaking existing consumers.
const SIGNATURE_VERSION: &str = "v1";

/// The signature version of the asymmetric (ed25519) scheme.
const SIGNATURE_VERSION_ED25519: &str = "v1a";

/// Prefix of an ed25519 secret key (the producer's).
pub const SECRET_KEY_PREFIX: &str = "whsk_";

/// Prefix of an ed25519 public key (what the consumer holds).
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// Length of an ed25519 signature.
const ED25519_SIGNATURE_LEN: usize = 64;

/// Length of an HMAC-SHA256 output.
const MAC_LEN: usize = 32;

/// Longest base64 text that can hold a [`MAC_LEN`]-byte MAC (44 characters
/// with padding). Longer entries cannot match, so they are not even decoded.
const MAX_SIGNATURE_B64_LEN: usize = 44;

/// Standard base64 alphabet that accepts input with or without `=` padding.
/// The reference libraries pad what they emit but tolerate unpadded input
/// (Python appends `==` before decoding), so we read both, and write padded
/// output with [`STANDARD`] like they do.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

type HmacSha256 = Hmac<Sha256>;

/// A consumer service's signing secret (the HMAC key).
///
/// `Debug` never prints the key, so a secret that ends up in a log line or a
/// panic message through a containing struct does not leak. There is no
/// `Display` either: turning it back into text is the explicit
/// [`SigningSecret::to_whsec`].
#[derive(Clone)]
pub struct SigningSecret {
    key: Key,
}

/// What a [`SigningSecret`] holds.
#[derive(Clone)]
enum Key {
    /// `whsec_`: the HMAC key, shared by both sides.
    Hmac(Vec<u8>),
    /// `whsk_`: the producer's ed25519 key pair.
    Ed25519(Box<ed25519_dalek::SigningKey>),
    /// `whpk_`: the consumer's ed25519 public key; verifies, never signs.
    Ed25519Public(ed25519_dalek::VerifyingKey),
}

impl SigningSecret {
    /// A new random HMAC key (`GENERATED_SECRET_BYTES` of it).
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_SECRET_BYTES];
        OsRng.fill_bytes(&mut key);
        Self {
            key: Key::Hmac(key),
        }
    }

    /// A new random ed25519 key pair (`v1a`).
    pub fn generate_ed25519() -> Self {
        let mut seed = [0u8; ed25519_dalek::SECRET_KEY_LENGTH];
        OsRng.fill_bytes(&mut seed);
        Self {
            key: Key::Ed25519(Box::new(ed25519_dalek::SigningKey::from_bytes(&seed))),
        }
    }

    /// Reads `whsec_<base64>` (an HMAC key of [`MIN_SECRET_BYTES`] to
    /// [`MAX_SECRET_BYTES`]), `whsk_<base64>` (an ed25519 secret key: 64
    /// bytes, the seed then its public key, as Svix writes it; or the
    /// 32-byte seed alone) or `whpk_<base64>` (an ed25519 public key, 32
    /// bytes). Surrounding whitespace is ignored.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let s = s.trim();
        if let Some(encoded) = s.strip_prefix(SECRET_KEY_PREFIX) {
            return Self::parse_ed25519_secret(encoded);
        }
        if let Some(encoded) = s.strip_prefix(PUBLIC_KEY_PREFIX) {
            let bytes = LENIENT_BASE64
                .decode(encoded)
                .map_err(|_| SecretError::InvalidBase64)?;
            let bytes: [u8; 32] = bytes
                .try_into()
                .map_err(|b: Vec<u8>| SecretError::WrongKeyLength { len: b.len() })?;
            let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                .map_err(|_| SecretError::NotAKey)?;
            return Ok(Self {
                key: Key::Ed25519Public(key),
            });
        }
        let encoded = s
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = LENIENT_BASE64
            .decode(encoded)
            .map_err(|_| SecretError::InvalidBase64)?;
        if key.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { len: key.len() });
        }
        if key.len() > MAX_SECRET_BYTES {
            return Err(SecretError::TooLong { len: key.len() });
        }
        Ok(Self {
            key: Key::Hmac(key),
        })
    }

    fn parse_ed25519_secret(encoded: &str) -> Result<Self, SecretError> {
        let bytes = LENIENT_BASE64
            .decode(encoded)
            .map_err(|_| SecretError::InvalidBase64)?;
        let (seed, public) = match bytes.len() {
            64 => (&bytes[..32], Some(&bytes[32..])),
            32 => (&bytes[..], None),
            len => return Err(SecretError::WrongKeyLength { len }),
        };
        let seed: [u8; 32] = seed.try_into().expect("32 bytes");
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        if public.is_some_and(|p| p != key.verifying_key().as_bytes()) {
            return Err(SecretError::KeyMismatch);
        }
        Ok(Self {
            key: Key::Ed25519(Box::new(key)),
        })
    }

    /// The text form: `whsec_...` for an HMAC key, `whsk_...` (64 bytes)
    /// for an ed25519 secret key, `whpk_...` for a public key.
    pub fn to_whsec(&self) -> String {
        let (prefix, bytes) = match &self.key {
            Key::Hmac(key) => (SECRET_PREFIX, key.clone()),
            Key::Ed25519(key) => (SECRET_KEY_PREFIX, key.to_keypair_bytes().to_vec()),
            Key::Ed25519Public(key) => (PUBLIC_KEY_PREFIX, key.as_bytes().to_vec()),
        };
        let mut out = String::from(prefix);
        STANDARD.encode_string(bytes, &mut out);
        out
    }

    /// `whpk_...`: the public key a consumer verifies `v1a` signatures
    /// with; none for an HMAC key.
    pub fn public_key(&self) -> Option<String> {
        let key = match &self.key {
            Key::Hmac(_) => return None,
            Key::Ed25519(key) => key.verifying_key(),
            Key::Ed25519Public(key) => *key,
        };
        let mut out = String::from(PUBLIC_KEY_PREFIX);
        STANDARD.encode_string(key.as_bytes(), &mut out);
        Some(out)
    }

    /// Whether this signs with ed25519 (`v1a`) rather than HMAC (`v1`).
    pub fn is_ed25519(&self) -> bool {
        !matches!(self.key, Key::Hmac(_))
    }

    /// The `v1` MAC; none for an ed25519 key.
    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> Option<[u8; MAC_LEN]> {
        match &self.key {
            Key::Hmac(key) => Some(hmac_parts(key, msg_id, timestamp, &[body])),
            _ => None,
        }
    }

    /// The ed25519 public key, for verifying `v1a`; none for an HMAC key.
    fn verifying_key(&self) -> Option<ed25519_dalek::VerifyingKey> {
        match &self.key {
            Key::Hmac(_) => None,
            Key::Ed25519(key) => Some(key.verifying_key()),
            Key::Ed25519Public(key) => Some(*key),
        }
    }

    /// This key's `version,signature` entry; none for a public key.
    fn signature_entry(
        &self,
        msg_id: &str,
        timestamp: i64,
        body: &[&[u8]],
        out: &mut String,
    ) -> bool {
        use ed25519_dalek::Signer;
        match &self.key {
            Key::Hmac(key) => {
                out.push_str(SIGNATURE_VERSION);
                out.push(',');
                STANDARD.encode_string(hmac_parts(key, msg_id, timestamp, body), out);
            }
            Key::Ed25519(key) => {
                let signature = key.sign(&signed_content(msg_id, timestamp, body));
                out.push_str(SIGNATURE_VERSION_ED25519);
                out.push(',');
                STANDARD.encode_string(signature.to_bytes(), out);
            }
            Key::Ed25519Public(_) => return false,
        }
        true
    }
}

/// `"{id}.{timestamp}.{body}"`, the signed content, in one buffer: ed25519
/// signs a whole message (the body parts are copied once per signature).
fn signed_content(msg_id: &str, timestamp: i64, body: &[&[u8]]) -> Vec<u8> {
    let timestamp = timestamp.to_string();
    let len = msg_id.len() + timestamp.len() + 2 + body.iter().map(|p| p.len()).sum::<usize>();
    let mut content = Vec::with_capacity(len);
    content.extend_from_slice(msg_id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    for part in body {
        content.extend_from_slice(part);
    }
    content
}

fn hmac_parts(key: &[u8], msg_id: &str, timestamp: i64, body: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    for part in body {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(<redacted>)")
    }
}

impl FromStr for SigningSecret {
    type Err = SecretError;

    /// Same as [`SigningSecret::parse`], so secrets can be read with
    /// `str::parse` from configuration.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Why a text is not a usable signing secret. The messages never repeat the
/// input, since the input is (close to) a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretError {
    /// The text does not start with `whsec_`.
    MissingPrefix,
    /// What follows `whsec_` is not standard base64.
    InvalidBase64,
    /// The decoded key is shorter than [`MIN_SECRET_BYTES`].
    TooShort { len: usize },
    /// The decoded key is longer than [`MAX_SECRET_BYTES`].
    TooLong { len: usize },
    /// An ed25519 key (`whsk_`, `whpk_`) of the wrong length.
    WrongKeyLength { len: usize },
    /// A `whsk_` whose public half is not the seed's public key.
    KeyMismatch,
    /// A `whpk_` that is not a point of the curve.
    NotAKey,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::MissingPrefix => write!(
                f,
                "signing secret must have the form \"{SECRET_PREFIX}<base64>\" (Standard Webhooks), \
                 or \"{SECRET_KEY_PREFIX}\" / \"{PUBLIC_KEY_PREFIX}\" for ed25519; it starts with none of them"
            ),
            SecretError::InvalidBase64 => write!(
                f,
                "the part of the signing secret after \"{SECRET_PREFIX}\" is not valid standard base64"
            ),
            SecretError::TooShort { len } => write!(
                f,
                "signing secret key is {len} bytes; it must be at least {MIN_SECRET_BYTES} bytes"
            ),
            SecretError::TooLong { len } => write!(
                f,
                "signing secret key is {len} bytes; it must be at most {MAX_SECRET_BYTES} bytes"
            ),
            SecretError::WrongKeyLength { len } => write!(
                f,
                "the ed25519 key is {len} bytes; a {SECRET_KEY_PREFIX} secret key is 64 (or a 32-byte \
                 seed), a {PUBLIC_KEY_PREFIX} public key 32"
            ),
            SecretError::KeyMismatch => write!(
                f,
                "the {SECRET_KEY_PREFIX} secret key's second half is not the public key of its first"
            ),
            SecretError::NotAKey => write!(f, "the {PUBLIC_KEY_PREFIX} key is not an ed25519 public key"),
        }
    }
}

impl std::error::Error for SecretError {}

/// The value of the `webhook-signature` header for one attempt: `v1,<sig>`
/// per secret, in the order given, separated by single spaces (`v1,<a>
/// v1,<b>` while a rotation has two secrets active).
///
/// `msg_id` and `timestamp` must be exactly what goes into `webhook-id` and
/// `webhook-timestamp`, and `body` exactly the bytes sent: a consumer
/// recomputes the MAC over what it received, so re-serializing the JSON after
/// signing breaks verification. [`headers`] builds all three values at once
/// and is the safer entry point for watchpump.
///
/// The id must not contain `.`: the spec forbids it because the signed text
/// is `.`-delimited. watchpump ids are decimal numbers, so this is a
/// programming error and only checked (with a panic) in debug builds, as is
/// an empty `secrets`, which would yield an empty header that every consumer
/// rejects.
pub fn sign(secrets: &[&SigningSecret], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    sign_parts(secrets, msg_id, timestamp, &[body])
}

/// [`sign`] over a body sent in parts: the signature of their concatenation.
pub fn sign_parts(
    secrets: &[&SigningSecret],
    msg_id: &str,
    timestamp: i64,
    body: &[&[u8]],
) -> String {
    debug_assert!(
        !secrets.is_empty(),
        "signing a delivery needs at least one secret"
    );
    debug_assert!(!msg_id.contains('.'), "a webhook-id must not contain '.'");
    let mut out =
        String::with_capacity(secrets.len() * (SIGNATURE_VERSION_ED25519.len() + 1 + 88 + 1));
    for secret in secrets {
        let mark = out.len();
        if mark > 0 {
            out.push(' ');
        }
        if !secret.signature_entry(msg_id, timestamp, body, &mut out) {
            out.truncate(mark);
        }
    }
    out
}

/// The three headers, name and value, of one delivery attempt: the id in
/// decimal, the attempt's timestamp, and [`sign`]'s signature over them and
/// `body`.
///
/// Taking the id as a number makes the id format (and the no-`.` rule) hold
/// by construction, and keeps what is signed and what is sent from drifting
/// apart.
pub fn headers(
    secrets: &[&SigningSecret],
    delivery_id: u64,
    timestamp: i64,
    body: &[u8],
) -> [(&'static str, String); 3] {
    let id = delivery_id.to_string();
    let signature = sign(secrets, &id, timestamp, body);
    [
        (HEADER_ID, id),
        (HEADER_TIMESTAMP, timestamp.to_string()),
        (HEADER_SIGNATURE, signature),
    ]
}

#[cfg(test)]
mod tests;
