//! Who may operate: the admin token (compared in constant time), panel
//! sessions, and the Origin check every state-changing panel request passes.
//!
//! A session cookie holds 32 random bytes. The database keeps only
//! SHA-256(secret ‖ admin token), so a copy of the table opens nothing, and
//! changing `WATCHPUMP_ADMIN_TOKEN` ends every session.

use axum::http::{header, HeaderMap};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

use crate::db::panel as db;
use crate::error::Result;

/// The panel's session cookie.
pub const COOKIE: &str = "watchpump_session";

/// Whether `presented` is the admin token. Both sides are hashed first, so
/// the comparison takes the same time whatever the lengths.
pub fn token_matches(configured: &str, presented: &str) -> bool {
    let a = Sha256::digest(configured.as_bytes());
    let b = Sha256::digest(presented.as_bytes());
    a.ct_eq(&b).into()
}

fn session_key(secret: &str, admin_token: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(secret.as_bytes());
    h.update([0]);
    h.update(admin_token.as_bytes());
    h.finalize().to_vec()
}

/// Starts a session and returns the cookie's value.
pub async fn create_session(
    pool: &PgPool,
    admin_token: &str,
    ttl: std::time::Duration,
) -> Result<String> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let secret = hex::encode(bytes);
    db::create_session(pool, &session_key(&secret, admin_token), ttl.as_secs_f64()).await?;
    Ok(secret)
}

/// Whether the cookie names a live session made with the current token.
pub async fn session_valid(pool: &PgPool, admin_token: &str, secret: &str) -> Result<bool> {
    if secret.len() != 64 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(false);
    }
    Ok(db::session_valid(pool, &session_key(secret, admin_token)).await?)
}

pub async fn end_session(pool: &PgPool, admin_token: &str, secret: &str) -> Result<()> {
    db::end_session(pool, &session_key(secret, admin_token)).await?;
    Ok(())
}

/// The session secret from the request's cookies.
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
}

/// `Set-Cookie` for a new session: HttpOnly, SameSite=Strict, only sent to
/// the panel, and Secure when the panel is served over https.
pub fn set_cookie(secret: &str, ttl: std::time::Duration, secure: bool) -> String {
    format!(
        "{COOKIE}={secret}; Path=/panel; HttpOnly; SameSite=Strict; Max-Age={}{}",
        ttl.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// `Set-Cookie` that removes the session cookie.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/panel; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether a state-changing request comes from the panel's own pages.
///
/// Browsers send `Origin` with every POST; it must be the panel's public
/// origin (`panel_origin`) or the origin of the `Host` the request was sent
/// to. Without `Origin` the `Referer` must point into the panel. A request
/// with neither is refused, as is one whose `Sec-Fetch-Site` says it came
/// from another site. SameSite=Strict alone is not enough: another port on
/// the same host is the same site.
pub fn same_origin(headers: &HeaderMap, panel_origin: &str) -> bool {
    let get = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get(header::HeaderName::from_static("sec-fetch-site")) {
        if site != "same-origin" && site != "none" {
            return false;
        }
    }
    let host = get(header::HOST);
    let allowed = |origin: &str| {
        origin == panel_origin
            || host.is_some_and(|host| {
                origin
                    .strip_prefix("http://")
                    .or_else(|| origin.strip_prefix("https://"))
                    == Some(host)
            })
    };
    if let Some(origin) = get(header::ORIGIN) {
        return allowed(origin);
    }
    match get(header::REFERER).and_then(|r| reqwest::Url::parse(r).ok()) {
        Some(referer) => allowed(&referer.origin().ascii_serialization()),
        None => false,
    }
}

/// `scheme://host[:port]` of a URL, as browsers write `Origin`.
pub fn origin_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn tokens_match_only_exactly() {
        assert!(token_matches("a-long-admin-token", "a-long-admin-token"));
        assert!(!token_matches("a-long-admin-token", "a-long-admin-toke"));
        assert!(!token_matches("a-long-admin-token", ""));
    }

    #[test]
    fn origins_are_checked_against_the_panel_and_the_host() {
        let panel = "https://git.example.org";
        let ok = |pairs: &[(&'static str, &str)]| same_origin(&headers(pairs), panel);
        assert!(ok(&[("origin", "https://git.example.org")]));
        assert!(ok(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080")
        ]));
        assert!(!ok(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:9999")
        ]));
        assert!(!ok(&[("origin", "null")]));
        assert!(
            !ok(&[("host", "127.0.0.1:8080")]),
            "neither Origin nor Referer"
        );
        assert!(ok(&[(
            "referer",
            "https://git.example.org/panel/deliveries/4"
        )]));
        assert!(!ok(&[("referer", "https://evil.example/panel")]));
        assert!(!ok(&[
            ("origin", "https://git.example.org"),
            ("sec-fetch-site", "cross-site")
        ]));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; watchpump_session=abc ; b=2")]);
        assert_eq!(session_cookie(&h), Some("abc"));
        assert_eq!(session_cookie(&HeaderMap::new()), None);
    }
}
