//! What a service's registration is checked against before it is stored:
//! its name, its base URL (normalised, without credentials, and within the
//! allowed destinations), and durations as people write them.

use std::time::Duration;

use crate::destinations::Destinations;
use crate::error::{Error, Result};
use crate::redact::mask_url_credentials;

pub(super) fn validate_name(name: &str) -> Result<()> {
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

/// An absolute http(s) URL without credentials, query or fragment, without
/// trailing '/'. Credentials are refused: the URL is shown in listings and
/// logs, and the producer's token is the only credential a delivery carries.
pub fn normalize_base_url(raw: &str) -> Result<String> {
    let url = reqwest::Url::parse(raw).map_err(|e| {
        Error::Invalid(format!(
            "base URL {:?} is not a URL: {e}",
            mask_url_credentials(raw)
        ))
    })?;
    let invalid =
        |why: &str| Error::Invalid(format!("base URL {:?} {why}", mask_url_credentials(raw)));
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(invalid("must use http or https"));
    }
    if url.host_str().is_none() {
        return Err(invalid("has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "must not carry credentials (user:password@): deliveries authenticate with the producer's token and a signature",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("must not have a query or fragment"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// [`normalize_base_url`], then refused unless `allowed` lets deliveries go
/// there. Nothing is sent to it.
pub(super) async fn allowed_base_url(raw: &str, allowed: &Destinations) -> Result<String> {
    let base_url = normalize_base_url(raw)?;
    allowed
        .check_url(&base_url)
        .await
        .map_err(|why| Error::Invalid(format!("base URL {base_url:?}: {why}")))?;
    Ok(base_url)
}

/// How long an old secret or token keeps working after a rotation, unless
/// the operator says otherwise (the CLI, the admin API and the panel alike).
pub const DEFAULT_OVERLAP: &str = "24h";

/// An overlap as given; none or blank means [`DEFAULT_OVERLAP`].
pub fn parse_overlap(given: Option<&str>) -> Result<Duration> {
    match given.map(str::trim) {
        Some(text) if !text.is_empty() => parse_duration(text),
        _ => parse_duration(DEFAULT_OVERLAP),
    }
}

/// Parses an overlap or grace period: `90s`, `30m`, `24h`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let invalid = || {
        Error::Invalid(format!(
            "{text:?} is not a duration: write a number and a unit, e.g. 90s, 30m, 24h or 7d"
        ))
    };
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let n: u64 = text[..unit_at].parse().map_err(|_| invalid())?;
    let seconds = match &text[unit_at..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(invalid()),
    };
    n.checked_mul(seconds)
        .filter(|s| *s <= 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| Error::Invalid(format!("{text:?} is longer than a year")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn base_urls_with_credentials_are_refused_without_repeating_them() {
        for raw in ["http://user:pw@host:9000", "https://token@host/x"] {
            let message = normalize_base_url(raw).unwrap_err().to_string();
            assert!(message.contains("credentials"), "{message}");
            assert!(
                !message.contains("pw") && !message.contains("token@"),
                "{message}"
            );
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("deploy").is_ok());
        assert!(validate_name("docs-2_x").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("Deploy").is_err());
        assert!(validate_name("-x").is_err());
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        for bad in ["", "h", "10", "1.5h", "-1h", "10 h", "400d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
