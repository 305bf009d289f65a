//! The consumer side of the scheme: [`verify`] a received delivery's
//! headers and body against the secrets the consumer knows.

use std::fmt;

use subtle::{Choice, ConstantTimeEq};

use super::*;

/// Checks a received delivery: the consumer side.
///
/// Pass the raw header values (an absent header as `""`), the body bytes
/// exactly as received, the receiver's current Unix time and the tolerance
/// (normally [`DEFAULT_TOLERANCE_SECS`]). It succeeds when the timestamp is
/// within `tolerance_secs` of `now` in either direction (a negative tolerance
/// counts as 0) and some `v1` entry among the first [`MAX_SIGNATURE_ENTRIES`]
/// entries of `signature_header` equals the MAC under any HMAC key of
/// `secrets`, or some `v1a` entry is a valid ed25519 signature under any
/// ed25519 key of them (a `whpk_` public key, or a `whsk_`'s public half).
///
/// * Entries of other versions (`v1a,...`, `v2,...`) and malformed entries
///   are skipped, so a producer may add schemes without breaking consumers.
/// * MACs are compared in constant time, and every entry is compared with
///   every secret, so the time taken does not reveal how close a forged
///   signature came, nor which secret matched.
/// * The work is bounded by the number of secrets (one MAC over the body
///   each) and the entry cap, whatever the headers contain, and no input
///   makes it panic.
///
/// The timestamp is checked before any MAC is computed; it is an integer of
/// decimal digits (surrounding whitespace ignored). The id is used exactly as
/// given.
pub fn verify(
    secrets: &[&SigningSecret],
    msg_id: &str,
    timestamp_header: &str,
    signature_header: &str,
    body: &[u8],
    now: i64,
    tolerance_secs: i64,
) -> Result<(), VerifyError> {
    if msg_id.is_empty() {
        return Err(VerifyError::MissingHeader(HEADER_ID));
    }
    let timestamp_text = timestamp_header.trim();
    if timestamp_text.is_empty() {
        return Err(VerifyError::MissingHeader(HEADER_TIMESTAMP));
    }
    if signature_header.trim().is_empty() {
        return Err(VerifyError::MissingHeader(HEADER_SIGNATURE));
    }

    let timestamp = parse_timestamp(timestamp_text)?;
    let tolerance = tolerance_secs.max(0);
    // Saturating: a timestamp near i64::MIN or MAX must not overflow.
    if now.saturating_sub(timestamp) > tolerance {
        return Err(VerifyError::TimestampTooOld);
    }
    if timestamp.saturating_sub(now) > tolerance {
        return Err(VerifyError::TimestampTooNew);
    }

    // The MAC is canonical (it signs the parsed timestamp re-formatted), as
    // in the reference libraries, so " 0042" verifies like "42".
    let expected: Vec<[u8; MAC_LEN]> = secrets
        .iter()
        .filter_map(|secret| secret.mac(msg_id, timestamp, body))
        .collect();
    let public_keys: Vec<ed25519_dalek::VerifyingKey> =
        secrets.iter().filter_map(|s| s.verifying_key()).collect();
    // The signed content for v1a, built once, only if a v1a entry comes.
    let mut content: Option<Vec<u8>> = None;

    let mut matched = Choice::from(0);
    let mut saw_supported = false;
    for entry in signature_header
        .split_ascii_whitespace()
        .take(MAX_SIGNATURE_ENTRIES)
    {
        let Some((version, encoded)) = entry.split_once(',') else {
            continue;
        };
        if version == SIGNATURE_VERSION_ED25519 && !public_keys.is_empty() {
            saw_supported = true;
            let mut decoded = [0u8; 2 * ED25519_SIGNATURE_LEN];
            let Ok(ED25519_SIGNATURE_LEN) = LENIENT_BASE64.decode_slice(encoded, &mut decoded)
            else {
                continue;
            };
            let signature = ed25519_dalek::Signature::from_bytes(
                decoded[..ED25519_SIGNATURE_LEN]
                    .try_into()
                    .expect("64 bytes"),
            );
            let content = content.get_or_insert_with(|| signed_content(msg_id, timestamp, &[body]));
            for key in &public_keys {
                // A signature is public: no need to compare in constant time.
                if key.verify_strict(content, &signature).is_ok() {
                    matched = Choice::from(1);
                }
            }
            continue;
        }
        // v1 is what a consumer with no ed25519 key looks for.
        if version != SIGNATURE_VERSION || (expected.is_empty() && !public_keys.is_empty()) {
            continue;
        }
        saw_supported = true;
        if encoded.len() > MAX_SIGNATURE_B64_LEN {
            continue;
        }
        let mut decoded = [0u8; MAX_SIGNATURE_B64_LEN];
        let Ok(len) = LENIENT_BASE64.decode_slice(encoded, &mut decoded) else {
            continue;
        };
        let given = &decoded[..len];
        for mac in &expected {
            // Slices of different lengths compare unequal (lengths are not
            // secret); equal lengths are compared in constant time.
            matched |= mac[..].ct_eq(given);
        }
    }

    if bool::from(matched) {
        Ok(())
    } else if saw_supported {
        Err(VerifyError::NoMatchingSignature)
    } else {
        Err(VerifyError::NoSupportedSignature)
    }
}

/// Unix seconds as the spec has them: an integer, here decimal digits only
/// (no sign, no fraction, no exponent), that fits an `i64`.
fn parse_timestamp(text: &str) -> Result<i64, VerifyError> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::BadTimestamp);
    }
    text.parse().map_err(|_| VerifyError::BadTimestamp)
}

/// Why a delivery failed verification. The messages are written for the
/// consumer team reading their logs: each says what to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyError {
    /// The named header is absent or empty.
    MissingHeader(&'static str),
    /// `webhook-timestamp` is not an integer number of Unix seconds.
    BadTimestamp,
    /// `webhook-timestamp` is more than the tolerance before `now`.
    TimestampTooOld,
    /// `webhook-timestamp` is more than the tolerance after `now`.
    TimestampTooNew,
    /// There are `v1` signatures, but none matches any of the secrets.
    NoMatchingSignature,
    /// No `v1` signature among the entries examined (only other versions,
    /// malformed entries, or more than [`MAX_SIGNATURE_ENTRIES`] entries
    /// before the first `v1` one).
    NoSupportedSignature,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::MissingHeader(name) => write!(
                f,
                "the {name} header is missing or empty; every delivery carries \
                 {HEADER_ID}, {HEADER_TIMESTAMP} and {HEADER_SIGNATURE}"
            ),
            VerifyError::BadTimestamp => write!(
                f,
                "the {HEADER_TIMESTAMP} header is not an integer number of Unix seconds"
            ),
            VerifyError::TimestampTooOld => write!(
                f,
                "the {HEADER_TIMESTAMP} header is further in the past than the allowed tolerance: \
                 the request may be a replay of an old delivery, or this server's clock is fast"
            ),
            VerifyError::TimestampTooNew => write!(
                f,
                "the {HEADER_TIMESTAMP} header is further in the future than the allowed tolerance: \
                 this server's clock may be slow"
            ),
            VerifyError::NoMatchingSignature => write!(
                f,
                "no v1 or v1a signature in the {HEADER_SIGNATURE} header matches the signing secret or key: \
                 check that the configured secret is current (it may have been rotated), and that \
                 the signature is checked over the raw request body, not over re-serialized JSON"
            ),
            VerifyError::NoSupportedSignature => write!(
                f,
                "the {HEADER_SIGNATURE} header holds no signature of the kind the configured key \
                 verifies (v1, HMAC-SHA256, for a whsec_ secret; v1a, ed25519, for a whpk_ key) among \
                 its first {MAX_SIGNATURE_ENTRIES} entries"
            ),
        }
    }
}

impl std::error::Error for VerifyError {}
