//! Secrets out of what is stored and shown (issue 9).
//!
//! A consumer is semi-trusted, and what it answers lands in
//! `watchpump.attempts.response_head` and `last_error`, then in the panel and
//! the admin API. A consumer that echoes its request back would otherwise
//! hand every operator (and every copy of the table) the producer's token.
//! [`mask`] is the one function that decides what is a secret: the pump
//! applies it before it stores an answer, the panel and the admin API again
//! before they show anything (for rows stored before, and for text that
//! did not come from a consumer).

/// What a masked secret reads as.
pub const MASK: &str = "••••••••";

/// The shortest known secret masked wherever it appears; a shorter one (a
/// test's `x`) would mask ordinary text.
const MIN_SECRET: usize = 4;

/// `text` with every secret replaced by [`MASK`]:
///
/// - each of `secrets` (the producer's token, the admin token) wherever it
///   appears;
/// - the value of an `Authorization` header echoed back
///   (`authorization: ...`, `"Authorization":"..."`), keeping its scheme;
/// - `Bearer <token>` and `Basic <credentials>` anywhere (the scheme kept);
/// - watchpump service tokens, `wps_<id>_<hex>` (the id kept);
/// - signing secrets, `whsec_<base64>`;
/// - the user and password of a URL, `scheme://user:pass@host`.
pub fn mask(text: &str, secrets: &[&str]) -> String {
    mask_with(text, secrets, false)
}

/// [`mask`] for a text cut at a length limit (a consumer's answer, kept to
/// its first 512 bytes): also a beginning of one of `secrets`, from its
/// first 4 characters, that ends the text, as the cut may fall in the middle
/// of a token. Only there: in a text that was not cut, a string that ends
/// as a secret begins (`web-prod` beside a token `prod…`) is no secret, and
/// masking it would garble a payload or a name.
pub fn mask_cut(text: &str, secrets: &[&str]) -> String {
    mask_with(text, secrets, true)
}

fn mask_with(text: &str, secrets: &[&str], cut: bool) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= MIN_SECRET) {
        out = out.replace(secret, MASK);
        if cut {
            out = mask_cut_secret(&out, secret);
        }
    }
    let out = mask_header_values(&out);
    let out = mask_scheme_values(&out);
    let out = mask_prefixed(&out, "wps_", service_token_secret);
    let out = mask_prefixed(&out, "whsec_", |rest| (0, run(rest, is_base64)));
    mask_url_credentials(&out)
}

/// Masks the end of `text` if it is the beginning of `secret`.
fn mask_cut_secret(text: &str, secret: &str) -> String {
    let longest = (MIN_SECRET..secret.len())
        .rev()
        .find(|&n| secret.is_char_boundary(n) && text.ends_with(&secret[..n]));
    match longest {
        Some(n) => format!("{}{MASK}", &text[..text.len() - n]),
        None => text.to_string(),
    }
}

fn is_token_char(c: char) -> bool {
    !c.is_whitespace() && !matches!(c, '"' | '\'' | ',' | ';' | '<' | '>' | '\\' | '&')
}

fn is_base64(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '-' | '_')
}

/// The length of the run of `ok` characters at the start of `s`.
fn run(s: &str, ok: impl Fn(char) -> bool) -> usize {
    s.find(|c: char| !ok(c)).unwrap_or(s.len())
}

/// Finds `needle` (ASCII, lower case) in `hay` ignoring ASCII case, from
/// byte `from`.
fn find_ignore_case(hay: &str, needle: &str, from: usize) -> Option<usize> {
    let bytes = hay.as_bytes();
    (from..=bytes.len().checked_sub(needle.len())?)
        .find(|&i| bytes[i..i + needle.len()].eq_ignore_ascii_case(needle.as_bytes()))
}

/// `Bearer x`, `Basic x` (a whole word, any case, then spaces): the token
/// after it masked.
fn mask_scheme_values(text: &str) -> String {
    let mut out = text.to_string();
    for scheme in ["bearer", "basic"] {
        let mut from = 0;
        while let Some(at) = find_ignore_case(&out, scheme, from) {
            from = at + scheme.len();
            let word_start = out[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric());
            let rest = &out[from..];
            let spaces = run(rest, |c| c == ' ' || c == '\t');
            let token = run(&rest[spaces..], is_token_char);
            if !word_start || spaces == 0 || token == 0 || rest[spaces..].starts_with(MASK) {
                continue;
            }
            let start = from + spaces;
            out.replace_range(start..start + token, MASK);
            from = start + MASK.len();
        }
    }
    out
}

/// The value after `authorization` and a `:` or `=` (quotes and spaces
/// around them allowed), to the end of the line or the closing quote: its
/// first word kept when more follow (the scheme), the rest masked.
fn mask_header_values(text: &str) -> String {
    let mut out = text.to_string();
    let mut from = 0;
    while let Some(at) = find_ignore_case(&out, "authorization", from) {
        from = at + "authorization".len();
        let rest = &out[from..];
        let quote_or_space = |c| matches!(c, '"' | '\\' | ' ');
        let before = run(rest, quote_or_space);
        if !matches!(rest[before..].chars().next(), Some(':' | '=')) {
            continue;
        }
        let lead = before + 1 + run(&rest[before + 1..], quote_or_space);
        let value_len = run(&rest[lead..], |c| !matches!(c, '"' | '\\' | '\r' | '\n'));
        let value = &rest[lead..lead + value_len];
        let scheme = match value.split_once(' ') {
            Some((scheme, secret)) if !secret.trim().is_empty() => scheme.len() + 1,
            _ => 0,
        };
        if value[scheme..].trim().is_empty() || &value[scheme..] == MASK {
            continue;
        }
        let start = from + lead + scheme;
        out.replace_range(start..from + lead + value_len, MASK);
        from = start + MASK.len();
    }
    out
}

/// After `wps_`: `<digits>_<hex>`; the id is kept, the hex masked.
fn service_token_secret(rest: &str) -> (usize, usize) {
    let digits = run(rest, |c| c.is_ascii_digit());
    if digits == 0 || !rest[digits..].starts_with('_') {
        return (0, 0);
    }
    (
        digits + 1,
        run(&rest[digits + 1..], |c| c.is_ascii_hexdigit()),
    )
}

/// After each `prefix`, `secret(rest)` says how much to keep and how much
/// then to mask.
fn mask_prefixed(text: &str, prefix: &str, secret: impl Fn(&str) -> (usize, usize)) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        out.push_str(&rest[..at + prefix.len()]);
        rest = &rest[at + prefix.len()..];
        let (keep, masked) = secret(rest);
        if masked > 0 {
            out.push_str(&rest[..keep]);
            out.push_str(MASK);
            rest = &rest[keep + masked..];
        }
    }
    out.push_str(rest);
    out
}

/// `scheme://user:pass@host` → `scheme://••••••••@host`.
/// `text` with the user information of every URL in it (`scheme://user:pw@`)
/// masked: for messages about a URL that may carry credentials.
pub fn mask_url_credentials(text: &str) -> String {
    mask_userinfo(text, false)
}

/// [`mask_url_credentials`] for a database URL: a user name alone
/// (`postgres://postgres@host`) is shown as it is, since masking it
/// suggests a password where there is none and hides which role connects,
/// unless it is long enough to be a token used as a user name.
pub fn mask_database_url(url: &str) -> String {
    mask_userinfo(url, true)
}

fn mask_userinfo(text: &str, keep_plain_user: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        let authority = run(rest, |c| is_token_char(c) && !matches!(c, '/' | '?' | '#'));
        if let Some(userinfo) = rest[..authority].rfind('@').filter(|&n| n > 0) {
            let user = &rest[..userinfo];
            let plain_user = keep_plain_user && !user.contains(':') && user.len() <= PLAIN_USER_MAX;
            if user != MASK && !plain_user {
                out.push_str(MASK);
                rest = &rest[userinfo..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Longest user name shown unmasked in a URL without a password:
/// PostgreSQL's default NAMEDATALEN allows 63, but user names are short,
/// and tokens passed as user names (GitHub's are 40 characters) are not.
const PLAIN_USER_MAX: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    fn m(text: &str) -> String {
        mask(text, &["producer-secret", "admin-token-for-tests"])
    }

    #[test]
    fn known_secrets_are_masked_wherever_they_appear() {
        let token = format!("wps_12_{}", "ab".repeat(32));
        assert_eq!(
            m(&format!(
                "Bearer producer-secret, admin-token-for-tests, {token}, wps_x, wps_3_short"
            )),
            format!("Bearer {MASK}, {MASK}, wps_12_{MASK}, wps_x, wps_3_short")
        );
        assert_eq!(m("echo: producer-secret!"), format!("echo: {MASK}!"));
    }

    #[test]
    fn a_secret_cut_off_at_the_end_of_a_cut_text_is_masked() {
        let cut = |text: &str| mask_cut(text, &["producer-secret", "admin-token-for-tests"]);
        assert_eq!(cut("token was: produc"), format!("token was: {MASK}"));
        assert_eq!(cut("wps_7_abcdef"), format!("wps_7_{MASK}"));
        // Too short a beginning to be one.
        assert_eq!(cut("the pro"), "the pro");
        // A whole secret anywhere, as in any text.
        assert_eq!(cut("producer-secret!"), format!("{MASK}!"));
    }

    #[test]
    fn a_text_not_cut_keeps_an_end_that_only_looks_like_a_secrets_beginning() {
        assert_eq!(m("resource: web-produc"), "resource: web-produc");
        assert_eq!(m("admin-to"), "admin-to");
        // What looks like a token by its own shape is masked all the same.
        assert_eq!(m("wps_7_abcdef"), format!("wps_7_{MASK}"));
    }

    #[test]
    fn echoed_authorization_headers_are_masked_keeping_the_scheme() {
        assert_eq!(
            m("authorization: Bearer abc.def\r\nhost: x"),
            format!("authorization: Bearer {MASK}\r\nhost: x")
        );
        assert_eq!(
            m(r#"{"headers":{"Authorization":"Token zzz","x":1}}"#),
            format!(r#"{{"headers":{{"Authorization":"Token {MASK}","x":1}}}}"#)
        );
        assert_eq!(
            m(r#"{\"authorization\": \"s3cr3t\"}"#),
            format!(r#"{{\"authorization\": \"{MASK}\"}}"#)
        );
        assert_eq!(
            m("Proxy-Authorization: Digest username=\"a\", response=\"b\""),
            format!("Proxy-Authorization: Digest {MASK}\"a\", response=\"b\"")
        );
        assert_eq!(m("no authorization here"), "no authorization here");
    }

    #[test]
    fn bearer_and_basic_values_are_masked_anywhere() {
        assert_eq!(
            m("got BEARER eyJhbGciOi.x.y; basic dXNlcjpwYXNz=="),
            format!("got BEARER {MASK}; basic {MASK}")
        );
        // Only whole words followed by a value.
        assert_eq!(m("unbearable Bearer"), "unbearable Bearer");
    }

    #[test]
    fn signing_secrets_and_url_credentials_are_masked() {
        assert_eq!(
            m("secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw= end"),
            format!("secret whsec_{MASK} end")
        );
        assert_eq!(
            m("error sending request for url (http://user:pw@host:9/x)"),
            format!("error sending request for url (http://{MASK}@host:9/x)")
        );
        assert_eq!(m("http://host:9/a@b"), "http://host:9/a@b");
        // In a database URL, a user without a password is no secret; a
        // password, or a token as user name, is.
        assert_eq!(
            mask_database_url("postgres://postgres@127.0.0.1:54329/watchpump"),
            "postgres://postgres@127.0.0.1:54329/watchpump"
        );
        assert_eq!(
            mask_database_url("postgres://app:pw@db/x"),
            format!("postgres://{MASK}@db/x")
        );
        assert_eq!(
            mask_database_url("postgres://ghp_16C7e42F292c6912E7710c838347Ae178B4a@db/x"),
            format!("postgres://{MASK}@db/x")
        );
        assert_eq!(m("https://deploy@host/x"), format!("https://{MASK}@host/x"));
    }

    #[test]
    fn masking_is_idempotent_and_leaves_plain_text_alone() {
        let once = m("authorization: Bearer abc producer-secret wps_1_ff");
        assert_eq!(m(&once), once);
        let plain = r#"{"ok":true,"delivery_id":7,"note":"recorded"}"#;
        assert_eq!(m(plain), plain);
    }
}
