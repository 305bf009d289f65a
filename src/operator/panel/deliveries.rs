//! Deliveries: the filtered list (newest first, keyset-paginated), one
//! delivery with the request as sent and every attempt, and the retry
//! actions.

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Deserialize;

use super::{SameOrigin, Session, ACTOR};
use crate::delivery::request;
use crate::delivery::State as DeliveryState;
use crate::http::html::{self, esc};
use crate::http::{AsHtml, HttpError};
use crate::operator::store::{self, Delivery, DeliveryFilter};
use crate::operator::{OperatorState, Settings, MASK};
use crate::telemetry::context::TraceParent;

/// Rows per page of the list.
const PAGE: i64 = 50;

/// The list's filters as the form sends them: every field may be empty.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    state: Option<String>,
    service: Option<String>,
    object: Option<String>,
    since: Option<String>,
    until: Option<String>,
    before: Option<String>,
}

impl ListQuery {
    fn filter(&self) -> Result<DeliveryFilter, HttpError> {
        let before = match self.before.as_deref().filter(|b| !b.is_empty()) {
            Some(b) => Some(
                b.parse()
                    .map_err(|_| HttpError::Invalid("before must be a delivery id".into()))?,
            ),
            None => None,
        };
        let filter = DeliveryFilter {
            state: self.state.clone(),
            service: self.service.clone(),
            object: self.object.clone(),
            since: parse_time("since", self.since.as_deref())?,
            until: parse_time("until", self.until.as_deref())?,
            before,
            limit: Some(PAGE),
            watch_id: None,
        }
        .normalized();
        filter.validate()?;
        Ok(filter)
    }

    fn pairs(&self) -> Vec<(&'static str, String)> {
        let v = |f: &Option<String>| f.clone().unwrap_or_default();
        vec![
            ("state", v(&self.state)),
            ("service", v(&self.service)),
            ("object", v(&self.object)),
            ("since", v(&self.since)),
            ("until", v(&self.until)),
        ]
    }
}

/// A time from a form: RFC 3339, or what `<input type="datetime-local">`
/// sends (`2026-10-21T14:30`), taken as UTC.
fn parse_time(field: &str, value: Option<&str>) -> Result<Option<DateTime<Utc>>, HttpError> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(value) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(value, f).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or_else(|| {
            HttpError::Invalid(format!(
                "{field} must be a time like 2026-10-21T14:30 (UTC), not {value:?}"
            ))
        })
}

/// The deliveries as table rows; their last errors masked with `s`.
pub(super) fn deliveries_table(rows: &[Delivery], s: &Settings) -> String {
    let mut t = String::from(
        "<table><tr><th>#</th><th>Created</th><th>Service</th><th>Object</th><th>Kind</th>\
         <th>Seq</th><th>State</th><th>Attempts</th><th>Last answer</th></tr>",
    );
    for d in rows {
        t.push_str(&format!(
            r#"<tr><td><a href="/panel/deliveries/{id}">{id}</a></td><td>{}</td><td><a href="/panel/services/{svc}">{svc}</a></td><td>{}</td><td>{}</td><td class="n">{}</td><td>{}</td><td class="n">{}</td><td>{}</td></tr>"#,
            html::time(d.created_at),
            esc(&d.object),
            esc(&d.kind),
            d.sequence,
            html::state(d.state.as_str()),
            d.attempts,
            html::outcome(d.last_status, d.last_error.as_deref().map(|e| s.mask(e)).as_deref()),
            id = d.delivery_id,
            svc = esc(&d.service),
        ));
    }
    t.push_str("</table>");
    t
}

pub async fn list(
    _: Session,
    State(state): State<OperatorState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, AsHtml> {
    let Query(q) = query.map_err(|e| HttpError::Invalid(e.body_text()))?;
    let filter = q.filter()?;
    let lag = state.reads.lag().await?;
    let rows = store::deliveries(state.reads.pool(), &filter).await?;
    let chosen = filter.state.as_deref().unwrap_or("");
    let mut options = String::from(r#"<option value="">any</option>"#);
    for s in DeliveryState::ALL.map(DeliveryState::as_str) {
        options.push_str(&format!(
            r#"<option value="{s}"{}>{}</option>"#,
            if s == chosen { " selected" } else { "" },
            s.replace('_', " ")
        ));
    }
    let value = |f: &Option<String>| esc(f.as_deref().unwrap_or(""));
    let mut body = crate::replica::panel_line(lag);
    body.push_str(&format!(
        r#"<form class="filters" method="get" action="/panel/deliveries">
<label>State <select name="state">{options}</select></label>
<label>Service <input name="service" value="{}"></label>
<label>Object (exact, or a prefix ending in /) <input name="object" size="36" value="{}"></label>
<label>Created since (UTC) <input type="datetime-local" name="since" value="{}"></label>
<label>Created before (UTC) <input type="datetime-local" name="until" value="{}"></label>
<button type="submit">Filter</button> <a href="/panel/deliveries">clear</a></form>"#,
        value(&q.service),
        value(&q.object),
        value(&q.since),
        value(&q.until),
    ));
    if rows.is_empty() {
        body.push_str(r#"<p class="muted">No deliveries match.</p>"#);
    } else {
        body.push_str(&deliveries_table(&rows, &state.settings));
    }
    if rows.len() as i64 == PAGE {
        let mut pairs = q.pairs();
        pairs.push(("before", rows[rows.len() - 1].delivery_id.to_string()));
        body.push_str(&format!(
            r#"<p><a href="/panel/deliveries{}">Older →</a></p>"#,
            esc(&html::query(&pairs))
        ));
    }
    Ok(html::page(StatusCode::OK, "Deliveries", &body, true))
}

#[derive(Debug, Deserialize)]
pub struct ShowQuery {
    done: Option<String>,
}

pub async fn show(
    _: Session,
    State(state): State<OperatorState>,
    id: Result<Path<i64>, PathRejection>,
    done: Result<Query<ShowQuery>, QueryRejection>,
) -> Result<Response, AsHtml> {
    let id = delivery_id(id)?;
    let Some(d) = store::delivery(&state.pool, id).await? else {
        return Err(no_such_delivery(id).into());
    };
    let sent = store::sent(&state.pool, id).await?;
    let attempts = store::attempts(&state.pool, id).await?;
    let history = store::history(&state.pool, id).await?;
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

pub async fn retry(
    _: Session,
    _: SameOrigin,
    State(state): State<OperatorState>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Response, AsHtml> {
    let id = delivery_id(id)?;
    store::retry(&state.pool, id, ACTOR).await?;
    Ok(Redirect::to(&format!("/panel/deliveries/{id}?done=retried")).into_response())
}

#[derive(Debug, Deserialize)]
pub struct RetryFailed {
    since: String,
}

pub async fn retry_failed(
    _: Session,
    _: SameOrigin,
    State(state): State<OperatorState>,
    Path(name): Path<String>,
    form: Result<Form<RetryFailed>, FormRejection>,
) -> Result<Response, AsHtml> {
    let Form(form) = form.map_err(HttpError::from)?;
    let since = parse_time("since", Some(&form.since))?
        .ok_or_else(|| HttpError::Invalid("since is required".into()))?;
    let n = store::retry_failed(&state.pool, &name, since, ACTOR).await?;
    let to = format!(
        "/panel/services/{}{}",
        name,
        html::query(&[("done", "requeued".into()), ("n", n.to_string())])
    );
    Ok(Redirect::to(&to).into_response())
}

fn delivery_id(id: Result<Path<i64>, PathRejection>) -> Result<i64, HttpError> {
    id.map(|Path(id)| id)
        .map_err(|_| HttpError::NotFound("There is no such delivery: ids are integers.".into()))
}

fn no_such_delivery(id: i64) -> HttpError {
    HttpError::NotFound(format!("There is no delivery {id}."))
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
