//! The registry of consumer services: where to deliver to, and who is
//! calling the watches API.
//!
//! A service token reads `wps_<service id>_<64 hex digits>`. Only the SHA-256
//! of its secret part is stored; a caller is looked up by the id and its
//! secret compared in constant time, so neither the database nor a timing
//! measurement gives the token away.

use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// A consumer service as the producer knows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Service {
    pub id: i64,
    pub name: String,
    pub base_url: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

const TOKEN_PREFIX: &str = "wps_";

/// Registers a consumer service and returns it with its new token, which is
/// shown this once and stored only as a hash.
pub async fn add(pool: &PgPool, name: &str, base_url: &str) -> Result<(Service, String)> {
    validate_name(name)?;
    let base_url = normalize_base_url(base_url)?;
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let secret = hex::encode(secret);
    let hash = Sha256::digest(secret.as_bytes()).to_vec();
    let service: Service = sqlx::query_as(
        "insert into watchpump.services (name, base_url, token_hash) values ($1, $2, $3)
         returning id, name, base_url, created_at",
    )
    .bind(name)
    .bind(&base_url)
    .bind(hash)
    .fetch_one(pool)
    .await
    .map_err(|e| match e {
        sqlx::Error::Database(ref d) if d.is_unique_violation() => {
            Error::Invalid(format!("a service named {name:?} already exists"))
        }
        other => Error::Database(other),
    })?;
    let token = format!("{TOKEN_PREFIX}{}_{secret}", service.id);
    Ok((service, token))
}

/// Every registered service, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<Service>> {
    Ok(sqlx::query_as(
        "select id, name, base_url, created_at from watchpump.services order by name",
    )
    .fetch_all(pool)
    .await?)
}

/// The service a bearer token belongs to, or `None` for any token that is
/// malformed, unknown or wrong.
pub async fn authenticate(pool: &PgPool, token: &str) -> Result<Option<Service>> {
    let Some((id, secret)) = parse_token(token) else {
        return Ok(None);
    };
    let row: Option<(Vec<u8>, Service)> = sqlx::query_as::<
        _,
        (Vec<u8>, i64, String, String, chrono::DateTime<chrono::Utc>),
    >(
        "select token_hash, id, name, base_url, created_at from watchpump.services where id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?
    .map(|(hash, id, name, base_url, created_at)| {
        (
            hash,
            Service {
                id,
                name,
                base_url,
                created_at,
            },
        )
    });
    let presented = Sha256::digest(secret.as_bytes());
    Ok(row.and_then(|(stored, service)| {
        bool::from(presented.as_slice().ct_eq(&stored)).then_some(service)
    }))
}

fn parse_token(token: &str) -> Option<(i64, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let id = id.parse().ok()?;
    (secret.len() == 64).then_some((id, secret))
}

fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "service name {name:?} must be 1-63 characters of a-z, 0-9, '-' and '_', starting with a letter or digit"
        )))
    }
}

/// An absolute http(s) URL without query or fragment, without trailing '/'.
pub fn normalize_base_url(raw: &str) -> Result<String> {
    let invalid = |why: &str| Error::Invalid(format!("base URL {raw:?} {why}"));
    let url = reqwest::Url::parse(raw).map_err(|e| invalid(&format!("is not a URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(invalid("must use http or https"));
    }
    if url.host_str().is_none() {
        return Err(invalid("has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("must not have a query or fragment"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
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
    fn base_urls_are_checked_and_normalised() {
        assert_eq!(
            normalize_base_url("http://127.0.0.1:8081/").unwrap(),
            "http://127.0.0.1:8081"
        );
        assert_eq!(
            normalize_base_url("https://deploy.internal/x/").unwrap(),
            "https://deploy.internal/x"
        );
        assert!(normalize_base_url("ftp://x").is_err());
        assert!(normalize_base_url("http://x/?a=1").is_err());
        assert!(normalize_base_url("not a url").is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("deploy").is_ok());
        assert!(validate_name("docs-2_x").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("Deploy").is_err());
        assert!(validate_name("-x").is_err());
    }
}
