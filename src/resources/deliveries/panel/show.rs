//! One delivery's page: where it stands, its change's trace, the request
//! as sent (cut at 64 KiB and masked), every attempt and its history,
//! with the retry button when it failed or was dropped.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::no_such_delivery;
use crate::caller::Session;
use crate::delivery::request;
use crate::delivery::State as DeliveryState;
use crate::http::app::{App, Settings};
use crate::http::html::{self, esc};
use crate::http::extract::DeliveryPath;
use crate::http::{AsHtml, HttpError};
use crate::operator::store::{self, Delivery};
use crate::redact::MASK;
use crate::telemetry::context::TraceParent;

#[derive(Debug, Deserialize)]
pub struct ShowQuery {
    done: Option<String>,
}

pub async fn show(
    _: Session,
    State(state): State<App>,
    id: Result<DeliveryPath, HttpError>,
    done: Result<Query<ShowQuery>, QueryRejection>,
) -> Result<Response, AsHtml> {
    let id = id?.id;
    // What the admin API answers for it, as a page.
    let Some(store::Shown {
        delivery: d,
        attempts,
        history,
    }) = store::shown(&state.pool, id).await?
    else {
        return Err(no_such_delivery(id).into());
    };
    let sent = store::sent(&state.pool, id).await?;
    let s = &state.settings;
    let mut body = String::new();
    if let Ok(Query(ShowQuery { done: Some(done) })) = done {
        if done == "retried" {
            body.push_str(r#"<p class="note">Requeued: the delivery is pending and due now, with a fresh deadline.</p>"#);
        }
    }
    body.push_str(&summary(&d, s));
    body.push_str(&trace(&state.pool, d.change_id, s).await?);
    if matches!(d.state, DeliveryState::Failed | DeliveryState::Dropped) {
        body.push_str(&format!(
            r#"<form method="post" action="/panel/deliveries/{id}/retry"><p><button class="act" id="retry" type="submit">Retry</button> <span class="muted">back to pending, due now, same delivery id</span></p></form>"#
        ));
    }
    if let Some(sent) = sent {
        body.push_str(&request_as_sent(&d, &sent, s));
    }
    body.push_str("<h2>Attempts</h2>");
    if attempts.is_empty() {
        body.push_str(r#"<p class="muted">Not attempted yet.</p>"#);
    } else {
        body.push_str("<table><tr><th>#</th><th>Started</th><th>Took</th><th>Answer</th><th>Pump</th><th>First bytes of the answer</th></tr>");
        for a in &attempts {
            body.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{:.1} ms</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
                attempt_numbers(a.attempt, a.repeats),
                html::time(a.started_at),
                a.duration_ms,
                esc(&s.mask(&html::outcome(a.status, a.error.as_deref()))),
                esc(&a.pump),
                esc(&s.mask(a.response_head.as_deref().unwrap_or(""))),
            ));
        }
        body.push_str("</table>");
    }
    body.push_str("<h2>History</h2><table><tr><th>At</th><th>Event</th><th>Detail</th></tr>");
    for e in &history {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            html::time(e.at),
            esc(&e.event),
            esc(&s.mask(e.detail.as_deref().unwrap_or(""))),
        ));
    }
    body.push_str("</table>");
    Ok(html::page(
        StatusCode::OK,
        &format!("Delivery {id}"),
        &body,
        true,
    ))
}

fn summary(d: &Delivery, s: &Settings) -> String {
    let superseded = d
        .superseded_by
        .map(|n| {
            format!(
                r#"<dt>Superseded by</dt><dd><a href="/panel/deliveries/{n}">delivery {n}</a></dd>"#
            )
        })
        .unwrap_or_default();
    let next = if d.state == DeliveryState::Pending {
        format!(
            "<dt>Next attempt</dt><dd>{}</dd>",
            html::time(d.next_attempt_at)
        )
    } else {
        String::new()
    };
    format!(
        r#"<dl><dt>State</dt><dd>{}</dd><dt>Service</dt><dd><a href="/panel/services/{svc}">{svc}</a></dd>
<dt>Watch</dt><dd>#{} for resource <code>{}</code> following <code>{}</code></dd>
<dt>Change</dt><dd>#{} · {} of <code>{}</code> · sequence {}</dd>
<dt>Created</dt><dd>{}</dd><dt>Attempts</dt><dd>{}</dd>{next}<dt>Deadline</dt><dd>{}</dd>
<dt>Finished</dt><dd>{}</dd><dt>Last answer</dt><dd>{}</dd>{superseded}
<dt>Last action</dt><dd>{}</dd></dl>"#,
        html::state(d.state.as_str()),
        d.watch_id,
        esc(&d.resource),
        esc(&d.watch_object),
        d.change_id,
        esc(&d.kind),
        esc(&d.object),
        d.sequence,
        html::time(d.created_at),
        d.attempts,
        html::time(d.deadline),
        html::opt_time(d.finished_at),
        esc(&s.mask(&html::outcome(d.last_status, d.last_error.as_deref()))),
        esc(d.last_action.as_deref().unwrap_or("—")),
        svc = esc(&d.service),
    )
}

/// The change's trace (issue 21): its trace id, linked to the trace viewer
/// of `WATCHPUMP_TRACE_URL` when it is set.
async fn trace(pool: &sqlx::PgPool, change_id: i64, s: &Settings) -> Result<String, AsHtml> {
    let traceparent = crate::db::operator::change_traceparent(pool, change_id).await?;
    let Some(trace) = traceparent.and_then(|t| TraceParent::parse(&t, None)) else {
        return Ok(r#"<dl><dt>Trace</dt><dd class="muted">none (the change was emitted outside a traced span)</dd></dl>"#.into());
    };
    let id = trace.trace_id_hex();
    let shown = match &s.trace_url {
        Some(url) => format!(
            r#"<a id="trace" href="{}"><code>{id}</code></a>"#,
            esc(&url.replace("{trace_id}", &id))
        ),
        None => format!(r#"<code id="trace">{id}</code>"#),
    };
    Ok(format!("<dl><dt>Trace</dt><dd>{shown}</dd></dl>"))
}

fn request_as_sent(d: &Delivery, sent: &store::Sent, s: &Settings) -> String {
    let m = &sent.message;
    let url = request::events_url(&sent.base_url, &s.producer);
    let when = if d.attempts == 0 {
        "as it will be sent"
    } else {
        "as sent on the last attempt"
    };
    let request = request::render(&url, m.delivery_id, m.attempt, &m.body(&s.producer), MASK);
    // Cut, then masked: the masking recognises a credential by its start,
    // and, in a text that was cut, a known secret's beginning at its end.
    let cut = request.len() > SHOWN_REQUEST_BYTES;
    let shown = prefix(&request, SHOWN_REQUEST_BYTES);
    let shown = if cut {
        s.mask_cut(shown)
    } else {
        s.mask(shown)
    };
    let note = if cut {
        format!(
            r#"<p class="note" id="request-cut">The first {} KiB of {} bytes are shown.</p>"#,
            SHOWN_REQUEST_BYTES / 1024,
            request.len()
        )
    } else {
        String::new()
    };
    format!(
        r#"<h2>Request <span class="muted">({when}; tokens masked)</span></h2>{note}<pre id="request">{}</pre>"#,
        esc(&shown)
    )
}

/// The most of a request (headers and body) a delivery's page shows: 64 KiB,
/// enough to read any body a person reads in a browser, with a note and the
/// whole size beyond it. A 100 MB payload made a 102 MB page and took
/// `serve` to 984 MB (issue 17); `tests/panel.rs` holds the bound.
const SHOWN_REQUEST_BYTES: usize = 64 * 1024;

/// At most `limit` bytes of `text`, ending on a character boundary.
fn prefix(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The attempts one row stands for: `#3`, or `#3-7 (5×)` for identical
/// failures in a row folded into it (the started time is the first's).
fn attempt_numbers(first: i32, repeats: i32) -> String {
    if repeats > 1 {
        format!("#{first}-{} ({repeats}×)", first + repeats - 1)
    } else {
        format!("#{first}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn folded_attempts_show_their_range_and_count() {
        assert_eq!(super::attempt_numbers(1, 1), "#1");
        assert_eq!(super::attempt_numbers(3, 5), "#3-7 (5×)");
    }
}
