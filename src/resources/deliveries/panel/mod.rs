//! Deliveries: the filtered list (newest first, keyset-paginated) and the
//! retry actions. One delivery's page, with the request as sent and every
//! attempt, is `show.rs`: it renders one record, where this file reads
//! forms and pages through many.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Deserialize;

use crate::caller::{Session, PANEL_ACTOR as ACTOR};
use crate::delivery::State as DeliveryState;
use crate::http::app::{App, Settings};
use crate::http::extract::{DeliveryPath, Form};
use crate::http::html::{self, esc};
use crate::http::{AsHtml, HttpError};
use crate::operator::store::{self, Delivery, DeliveryFilter};
use crate::resources::forms::{back_to, Change, ServiceChange};

mod show;

pub use show::show;

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
    /// The previous page's last delivery (`crate::http::page`); old links
    /// named it `before`.
    #[serde(alias = "before")]
    after: Option<String>,
}

impl ListQuery {
    fn filter(&self) -> Result<DeliveryFilter, HttpError> {
        let after = match self.after.as_deref().filter(|b| !b.is_empty()) {
            Some(b) => Some(
                b.parse()
                    .map_err(|_| HttpError::Invalid("after must be a delivery id".into()))?,
            ),
            None => None,
        };
        let filter = DeliveryFilter {
            state: self.state.clone(),
            service: self.service.clone(),
            object: self.object.clone(),
            since: parse_time("since", self.since.as_deref())?,
            until: parse_time("until", self.until.as_deref())?,
            after,
            before: None,
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
pub(crate) fn deliveries_table(rows: &[Delivery], s: &Settings) -> String {
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
    State(state): State<App>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, AsHtml> {
    let Query(q) = query.map_err(|e| HttpError::Invalid(e.body_text()))?;
    let filter = q.filter()?;
    // Checked before the standby is asked; its lag read before the page.
    filter.validate()?;
    let lag = state.reads.lag().await?;
    let (rows, next_after) = store::deliveries_page(state.reads.pool(), &filter).await?;
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
    if let Some(next_after) = next_after {
        let mut pairs = q.pairs();
        pairs.push(("after", next_after.to_string()));
        body.push_str(&format!(
            r#"<p><a href="/panel/deliveries{}">Older →</a></p>"#,
            esc(&html::query(&pairs))
        ));
    }
    Ok(html::page(StatusCode::OK, "Deliveries", &body, true))
}

pub async fn retry(
    _: Change,
    State(state): State<App>,
    id: Result<DeliveryPath, HttpError>,
) -> Result<Response, AsHtml> {
    let id = id?.id;
    store::retry(&state.pool, id, ACTOR).await?;
    Ok(Redirect::to(&format!("/panel/deliveries/{id}?done=retried")).into_response())
}

#[derive(Debug, Deserialize)]
pub struct RetryFailed {
    since: String,
}

pub async fn retry_failed(
    ServiceChange { app: state, name }: ServiceChange,
    Form(form): Form<RetryFailed>,
) -> Result<Response, AsHtml> {
    let since = parse_time("since", Some(&form.since))?
        .ok_or_else(|| HttpError::Invalid("since is required".into()))?;
    let n = store::retry_failed(&state.pool, &name, since, ACTOR).await?;
    Ok(back_to(&name, "requeued", Some(n)))
}

fn no_such_delivery(id: i64) -> HttpError {
    HttpError::NotFound(format!("There is no delivery {id}."))
}
