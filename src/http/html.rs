//! HTML building blocks: escaping, the page frame with its security headers,
//! and how times, ages and states read. Every value that comes from the
//! database or the request goes through [`esc`].

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query string (`?a=1&b=x%2Fy`) of the pairs whose value is not empty.
pub fn query(pairs: &[(&str, String)]) -> String {
    let mut url = reqwest::Url::parse("http://panel/").expect("a valid URL");
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
            q.append_pair(k, v);
        }
    }
    match url.query() {
        Some(q) if !q.is_empty() => format!("?{q}"),
        _ => String::new(),
    }
}

pub fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

pub fn opt_time(t: Option<DateTime<Utc>>) -> String {
    t.map(time).unwrap_or_else(|| "—".into())
}

/// `1h 5m`, `3m 20s`, `12s`.
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

pub fn state(state: &str) -> String {
    let s = esc(state);
    format!(
        r#"<span class="state {}">{}</span>"#,
        s.replace('_', "-"),
        s.replace('_', " ")
    )
}

/// The outcome of an attempt or delivery in a few words.
pub fn outcome(status: Option<i32>, error: Option<&str>) -> String {
    match (status, error) {
        (_, Some(e)) => esc(e),
        (Some(s), None) => format!("HTTP {s}"),
        (None, None) => "—".into(),
    }
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d2a3a;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.2rem;align-items:center}
header a{color:#cfe0f5;text-decoration:none}header strong{color:#fff;margin-right:1rem}
header form{margin-left:auto}main{padding:1rem 1.2rem;max-width:1200px}
h1{font-size:1.35rem;margin:.2rem 0 1rem}h2{font-size:1.05rem;margin:1.6rem 0 .5rem}
table{border-collapse:collapse;width:100%;background:#fff}th,td{padding:.35rem .55rem;border-bottom:1px solid #e2e6ea;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #e2e6ea;padding:.6rem;white-space:pre-wrap;word-break:break-all;margin:.2rem 0}
.state{padding:.05rem .45rem;border-radius:.7rem;font-size:.85em;background:#e6e9ed}
.delivered{background:#d4f2dc}.failed,.down{background:#fbd5d5}.pending,.in-flight{background:#fff1c2}
.dropped,.superseded{background:#e3e3f3}.sent,.logged{background:#d4f2dc}
.note{padding:.5rem .8rem;background:#e5f1fd;border-left:4px solid #3a86d6;margin:.6rem 0}
.error{padding:.5rem .8rem;background:#fde8e8;border-left:4px solid #d63a3a;margin:.6rem 0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem;background:#fff;padding:.8rem;border:1px solid #e2e6ea}
dt{color:#59636e}dd{margin:0}form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin-bottom:.8rem}form.inline{display:inline}
label{display:flex;flex-direction:column;font-size:.85em;color:#59636e}input,select,button{font:inherit;padding:.25rem .4rem}
button{cursor:pointer}button.act{background:#2f6fb5;color:#fff;border:0;border-radius:.25rem;padding:.35rem .9rem}
header button{background:none;border:1px solid #cfe0f5;color:#cfe0f5;border-radius:.25rem}
a{color:#1f5fa8}.muted{color:#6b7580}
";

/// A whole page in the panel's frame. `nav` adds the menu and log-out
/// button (every page but the login form).
pub fn page(status: StatusCode, title: &str, body: &str, nav: bool) -> Response {
    let menu = if nav {
        r#"<a href="/panel">Overview</a><a href="/panel/deliveries">Deliveries</a>
<a href="/panel/watches">Watches</a><a href="/panel/warnings">Warnings</a>
<form method="post" action="/panel/logout"><button type="submit">Log out</button></form>"#
    } else {
        ""
    };
    let html = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title} · watchpump</title><style>{STYLE}</style></head>
<body><header><strong>watchpump</strong>{menu}</header>
<main><h1>{title}</h1>
{body}
<p class="muted">Times are UTC.</p>
</main></body></html>"#,
        title = esc(title),
    );
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        // No script runs in the panel, and no other site may frame it.
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn queries_encode_and_skip_empty_values() {
        assert_eq!(
            query(&[
                ("object", "acme/web main".into()),
                ("state", String::new()),
                ("before", "7".into())
            ]),
            "?object=acme%2Fweb+main&before=7"
        );
        assert_eq!(query(&[("state", String::new())]), "");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(12.4), "12s");
        assert_eq!(age(200.0), "3m 20s");
        assert_eq!(age(3900.0), "1h 5m");
        assert_eq!(age(90_000.0), "1d 1h");
    }
}
