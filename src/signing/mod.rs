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
//! [`verify`] is the consumer side. watchpump itself only signs, but it is
//! here for our tests, for consumer teams written in Rust, and as the
//! executable statement of what "valid" means.

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

/// The signature version of the symmetric (HMAC-SHA256) scheme. Other
/// versions (`v1a` is ed25519) are skipped, as the spec requires, so that a
/// producer can add new schemes without breaking existing consumers.
const SIGNATURE_VERSION: &str = "v1";

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
    key: Vec<u8>,
}

impl SigningSecret {
    /// A fresh secret of 32 bytes from the operating system's CSPRNG.
    ///
    /// `OsRng` rather than a user-space generator so that no seeding or
    /// forking mistake in this process can weaken a key.
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_SECRET_BYTES];
        OsRng.fill_bytes(&mut key);
        Self { key }
    }

    /// Reads a secret in the spec's `whsec_<base64>` form.
    ///
    /// Stricter than the reference libraries on purpose: they also take a
    /// bare base64 key and silently skip characters that are not base64,
    /// which turns a truncated or mistyped secret into a different key that
    /// only fails later, at the consumer. Here the `whsec_` prefix is
    /// required, the base64 must be valid (padding optional, surrounding
    /// whitespace ignored), and the key must be 24 to 64 bytes long.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let encoded = s
            .trim()
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
        Ok(Self { key })
    }

    /// The secret as `whsec_<base64>`, the form to store and to hand to the
    /// consumer team (and that [`SigningSecret::parse`] reads back).
    pub fn to_whsec(&self) -> String {
        let mut out = String::from(SECRET_PREFIX);
        STANDARD.encode_string(&self.key, &mut out);
        out
    }

    /// HMAC-SHA256 of `"{msg_id}.{timestamp}.{body}"`, fed in pieces so that
    /// the body is never copied.
    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; MAC_LEN] {
        self.mac_parts(msg_id, timestamp, &[body])
    }

    /// [`SigningSecret::mac`] of a body sent in parts (the pump's bodies
    /// share one copy of a change's payload between its deliveries).
    fn mac_parts(&self, msg_id: &str, timestamp: i64, body: &[&[u8]]) -> [u8; MAC_LEN] {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        for part in body {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
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
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::MissingPrefix => write!(
                f,
                "signing secret must have the form \"{SECRET_PREFIX}<base64>\" (Standard Webhooks); \
                 it does not start with \"{SECRET_PREFIX}\""
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
    let mut out = String::with_capacity(secrets.len() * (SIGNATURE_VERSION.len() + 1 + 44 + 1));
    for (i, secret) in secrets.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(SIGNATURE_VERSION);
        out.push(',');
        STANDARD.encode_string(secret.mac_parts(msg_id, timestamp, body), &mut out);
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
