//! Request text PostgreSQL cannot take: a NUL (`%00`) or bytes that are not
//! UTF-8 (`%FF`) in a query parameter or a path segment. PostgreSQL's
//! `text` refuses NUL, so such a filter used to reach the database and come
//! back as a 500; and `%FF` was silently read as U+FFFD. Both are the
//! client's mistake: refused with 400 before any handler runs (JSON here,
//! an HTML page in the panel, which uses [`unreadable`] itself).

use axum::extract::Request;
use axum::http::Uri;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::HttpError;

/// Why the request's path or query is not text, if it is not.
pub fn unreadable(uri: &Uri) -> Option<String> {
    let parts = [("path", Some(uri.path())), ("query string", uri.query())];
    parts.into_iter().find_map(|(what, raw)| {
        let decoded = percent_decode(raw?.as_bytes());
        if decoded.contains(&0) {
            Some(format!("the {what} holds a NUL character (%00)"))
        } else if std::str::from_utf8(&decoded).is_err() {
            Some(format!("the {what} is not UTF-8 once decoded"))
        } else {
            None
        }
    })
}

/// Middleware for JSON routes: 400 `bad_request` for [`unreadable`] text.
pub async fn refuse_unreadable(request: Request, next: Next) -> Response {
    match unreadable(request.uri()) {
        Some(why) => {
            HttpError::BadRequest(format!("{why}: parameters must be text")).into_response()
        }
        None => next.run(request).await,
    }
}

/// `%XX` decoded; anything else, a malformed escape included, as it is.
fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let escaped = (raw[i] == b'%')
            .then(|| Some(hex(*raw.get(i + 1)?)? << 4 | hex(*raw.get(i + 2)?)?))
            .flatten();
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(raw[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(uri: &str) -> Option<String> {
        unreadable(&uri.parse().unwrap())
    }

    #[test]
    fn nul_and_bytes_that_are_not_utf8_are_found_in_paths_and_queries() {
        assert_eq!(why("/a?b=c%20d&e=%C3%A9"), None);
        assert_eq!(why("/a?b=100%"), None);
        assert!(why("/a?service=x%00").unwrap().contains("NUL"));
        assert!(why("/a?object=%FF").unwrap().contains("UTF-8"));
        assert!(why("/a?object=%c3").unwrap().contains("UTF-8"));
        assert!(why("/services/a%00b").unwrap().contains("path"));
    }
}
