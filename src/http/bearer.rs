//! `Authorization: Bearer <token>`, read one way for every door: the
//! watches API (service tokens), the admin API (the admin token) and the
//! kit's events endpoint (the producer's token).

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;

/// The token of `Authorization: Bearer <token>`, if the request has one.
/// The scheme is case-insensitive (RFC 9110, 11.1); the token is taken
/// without surrounding whitespace.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)?
        .to_str()
        .ok()?
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
        .map(|(_, token)| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn token(value: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        bearer(&headers).map(str::to_string)
    }

    #[test]
    fn the_scheme_is_read_in_any_case_and_the_token_trimmed() {
        assert_eq!(token("Bearer t0ken").as_deref(), Some("t0ken"));
        assert_eq!(token("bearer t0ken").as_deref(), Some("t0ken"));
        assert_eq!(token("BEARER  t0ken ").as_deref(), Some("t0ken"));
        assert_eq!(token("Basic dTpw"), None);
        assert_eq!(token("Bearer"), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
