//! The overview, a consumer service, watches and warnings.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde::Deserialize;

use crate::caller::Session;
use crate::http::app::{App, Settings};
use crate::http::html::{self, esc};
use crate::http::{AsHtml, HttpError};
use crate::operator::store::{self, Backlog, DeliveryFilter, Warning, WatchFilter};
use crate::replica;
use crate::resources::deliveries::panel::deliveries_table;
use crate::resources::services::panel as lifecycle;
use crate::services;

pub async fn overview(_: Session, State(state): State<App>) -> Result<Response, AsHtml> {
    let lag = state.reads.lag().await?;
    let backlog = store::backlog(state.reads.pool()).await?;
    let failures = store::newest_failures(state.reads.pool(), 10).await?;
    let warnings = store::warnings(state.reads.pool(), None, 5).await?;
    let mut body = replica::panel_line(lag);
    body.push_str("<h2>Consumer services</h2>");
    body.push_str(&backlog_table(&backlog));
    body.push_str("<h2>Newest failures</h2>");
    if failures.is_empty() {
        body.push_str(r#"<p class="muted">No failed deliveries.</p>"#);
    } else {
        body.push_str(&deliveries_table(&failures, &state.settings));
        body.push_str(
            r#"<p><a href="/panel/deliveries?state=failed">All failed deliveries →</a></p>"#,
        );
    }
    body.push_str("<h2>Latest warnings to notify</h2>");
    body.push_str(&warnings_table(&warnings, &state.settings));
    Ok(html::page(StatusCode::OK, "Overview", &body, true))
}

fn backlog_table(rows: &[Backlog]) -> String {
    if rows.is_empty() {
        return r#"<p class="muted">No consumer service is registered.</p>"#.into();
    }
    let mut t = String::from(
        "<table><tr><th>Service</th><th>Status</th><th>Pending</th><th>In flight</th>\
         <th>Due now</th><th>Oldest due</th><th>Failed (24 h)</th><th>Last delivered</th></tr>",
    );
    for b in rows {
        let status = if b.looks_down {
            r#"<span class="state down">looks down</span>"#
        } else {
            r#"<span class="state delivered">ok</span>"#
        };
        t.push_str(&format!(
            r#"<tr><td><a href="/panel/services/{name}">{name}</a></td><td>{status}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td></tr>"#,
            b.pending,
            b.in_flight,
            b.due_now,
            b.oldest_due_age_secs.map(html::age).unwrap_or_else(|| "—".into()),
            failed_link(&b.service, b.failed_24h),
            html::opt_time(b.last_delivered_at),
            name = esc(&b.service),
        ));
    }
    t.push_str("</table>");
    t
}

fn failed_link(service: &str, n: i64) -> String {
    if n == 0 {
        return "0".into();
    }
    let q = html::query(&[("service", service.into()), ("state", "failed".into())]);
    format!(r#"<a href="/panel/deliveries{}">{n}</a>"#, esc(&q))
}

/// The warnings as table rows; their last errors masked with `s`.
pub(super) fn warnings_table(rows: &[Warning], s: &Settings) -> String {
    if rows.is_empty() {
        return r#"<p class="muted">No warnings.</p>"#.into();
    }
    let mut t = String::from(
        "<table><tr><th>#</th><th>Service</th><th>State</th><th>Failed</th><th>Folded</th>\
         <th>Oldest failed delivery</th><th>Raised</th><th>Not before</th><th>Attempts</th>\
         <th>Last answer</th><th>Done</th></tr>",
    );
    for w in rows {
        t.push_str(&format!(
            r#"<tr><td>{}</td><td><a href="/panel/services/{svc}">{svc}</a></td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td><td>{}</td><td>{}</td><td class="n">{}</td><td>{}</td><td>{}</td></tr>"#,
            w.id,
            html::state(&w.state),
            w.failed,
            w.folded,
            html::time(w.oldest_created_at),
            html::time(w.created_at),
            html::time(w.send_after),
            w.attempts,
            html::outcome(w.last_status, w.last_error.as_deref().map(|e| s.mask(e)).as_deref()),
            html::opt_time(w.finished_at),
            svc = esc(&w.service),
        ));
    }
    t.push_str("</table>");
    t
}

#[derive(Debug, Deserialize)]
pub struct Notice {
    done: Option<String>,
    n: Option<i64>,
}

pub async fn service(
    _: Session,
    State(state): State<App>,
    Path(name): Path<String>,
    notice: Result<Query<Notice>, QueryRejection>,
) -> Result<Response, AsHtml> {
    let backlog = store::backlog(&state.pool).await?;
    let Some(b) = backlog.into_iter().find(|b| b.service == name) else {
        return Err(HttpError::NotFound(format!("There is no service {name:?}.")).into());
    };
    let failed = store::deliveries(
        &state.pool,
        &DeliveryFilter {
            service: Some(name.clone()),
            state: Some("failed".into()),
            limit: Some(20),
            watch_id: None,
            ..DeliveryFilter::default()
        },
    )
    .await?;
    let warnings = store::warnings(&state.pool, Some(&name), 10).await?;
    let svc = esc(&name);
    let mut body = String::new();
    if let Ok(Query(Notice {
        done: Some(done),
        n,
    })) = notice
    {
        if done == "moved" {
            body.push_str(r#"<p class="note">Moved: deliveries go to the new URL from their next attempt.</p>"#);
        }
        if done == "rate" {
            body.push_str(
                r#"<p class="note">Rate set: the pumps hold it from their next claim.</p>"#,
            );
        }
        let watch = n.unwrap_or(0);
        let said = match done.as_str() {
            "paused" => Some(format!("{svc} paused: nothing is sent until it is resumed; nothing fails meanwhile.")),
            "resumed" => Some(format!("{svc} resumed: what waits is due now, in order.")),
            "watch-paused" => Some(format!("Watch {watch} paused: nothing of it is sent until it is resumed.")),
            "watch-resumed" => Some(format!("Watch {watch} resumed: what waits is due now, in order.")),
            "resync" => Some(format!("Resync started: {watch} objects are looked at; their newest news is queued as replays.")),
            _ => None,
        };
        if let Some(said) = said {
            body.push_str(&format!(r#"<p class="note">{said}</p>"#));
        }
        if done == "requeued" {
            body.push_str(&format!(
                r#"<p class="note">{} failed deliveries requeued: they are pending and due now.</p>"#,
                n.unwrap_or(0)
            ));
        }
    }
    body.push_str(&format!(
        r#"<dl><dt>Status</dt><dd>{}</dd><dt>Pending</dt><dd>{} ({} due now, {} being retried)</dd>
<dt>In flight</dt><dd>{}</dd><dt>Oldest due</dt><dd>{}</dd><dt>Failed in 24 h</dt><dd>{}</dd>
<dt>Last failure</dt><dd>{}</dd><dt>Last delivered</dt><dd>{}</dd></dl>"#,
        if b.looks_down { "looks down" } else { "ok" },
        b.pending,
        b.due_now,
        b.retrying,
        b.in_flight,
        b.oldest_due_age_secs
            .map(html::age)
            .unwrap_or_else(|| "—".into()),
        b.failed_24h,
        html::opt_time(b.last_failed_at),
        html::opt_time(b.last_delivered_at),
    ));
    body.push_str(&consumer_settings(&state.pool, b.service_id).await?);
    let since = (Utc::now() - chrono::Duration::days(1)).format("%Y-%m-%dT%H:%M");
    body.push_str(&format!(
        r#"<h2>Retry failed deliveries</h2>
<form class="filters" method="post" action="/panel/services/{svc}/retry-failed">
<label>Failed since (UTC) <input type="datetime-local" name="since" value="{since}" required></label>
<button class="act" type="submit">Retry all failed for {svc} since then</button></form>"#
    ));
    body.push_str("<h2>Newest failed deliveries</h2>");
    if failed.is_empty() {
        body.push_str(r#"<p class="muted">None.</p>"#);
    } else {
        body.push_str(&deliveries_table(&failed, &state.settings));
    }
    let q = |state: &str| {
        esc(&html::query(&[
            ("service", name.clone()),
            ("state", state.into()),
        ]))
    };
    body.push_str(&format!(
        r#"<p><a href="/panel/deliveries{}">All failed</a> · <a href="/panel/deliveries{}">All deliveries</a> · <a href="/panel/watches{}">Watches</a></p>"#,
        q("failed"),
        q(""),
        esc(&html::query(&[("service", name.clone())])),
    ));
    body.push_str("<h2>Warnings to notify</h2>");
    body.push_str(&warnings_table(&warnings, &state.settings));
    let registered = services::find(&state.pool, &name).await?;
    body.push_str(&crate::resources::watches::panel::service_forms(&name));
    body.push_str(&lifecycle::forms(&name, &registered.base_url));
    Ok(html::page(
        StatusCode::OK,
        &format!("Service {name}"),
        &body,
        true,
    ))
}

pub async fn warnings(_: Session, State(state): State<App>) -> Result<Response, AsHtml> {
    let lag = state.reads.lag().await?;
    let rows = store::warnings(state.reads.pool(), None, 200).await?;
    let body = format!(
        r#"{}<p class="muted">When deliveries to a service end failed, one warning per service per fold window goes to notify; failures in between are folded into it (counted, not sent again).</p>{}"#,
        replica::panel_line(lag),
        warnings_table(&rows, &state.settings)
    );
    Ok(html::page(StatusCode::OK, "Warnings", &body, true))
}

pub async fn watches(
    _: Session,
    State(state): State<App>,
    query: Result<Query<WatchFilter>, QueryRejection>,
) -> Result<Response, AsHtml> {
    let Query(filter) = query.map_err(|e| HttpError::Invalid(e.body_text()))?;
    let filter = WatchFilter {
        limit: Some(store::DEFAULT_PAGE),
        ..filter
    };
    // Checked before the standby is asked; its lag read before the page.
    filter.validate()?;
    let lag = state.reads.lag().await?;
    let (rows, next_after) = store::watches_page(state.reads.pool(), &filter).await?;
    let value = |v: &Option<String>| esc(v.as_deref().unwrap_or(""));
    let show = filter.show.as_deref().unwrap_or("any");
    let option = |v: &str, label: &str| {
        format!(
            r#"<option value="{v}"{}>{label}</option>"#,
            if show == v { " selected" } else { "" }
        )
    };
    let mut body = replica::panel_line(lag);
    body.push_str(&format!(
        r#"<p class="muted">Consumers create and remove their watches through the watches API; the panel only shows them.</p>
<form class="filters" method="get" action="/panel/watches">
<label>Service <input name="service" value="{}"></label>
<label>Resource <input name="resource" value="{}"></label>
<label>Object <input name="object" value="{}"></label>
<label>Show <select name="show">{}{}{}</select></label>
<button type="submit">Filter</button></form>"#,
        value(&filter.service),
        value(&filter.resource),
        value(&filter.object),
        option("any", "live and removed"),
        option("live", "live"),
        option("removed", "removed"),
    ));
    body.push_str(
        "<table><tr><th>#</th><th>Service</th><th>Resource</th><th>Object</th><th>Filters</th>\
         <th>Created</th><th>Removed</th><th>Actions</th></tr>",
    );
    for w in &rows {
        let removed = match (&w.removed_at, &w.removed_reason) {
            (Some(at), reason) => format!(
                "{}<br><span class=\"muted\">{}</span>",
                html::time(*at),
                esc(reason.as_deref().unwrap_or(""))
            ),
            (None, _) => "—".into(),
        };
        body.push_str(&format!(
            r#"<tr><td>{}</td><td><a href="/panel/services/{svc}">{svc}</a></td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            w.watch_id,
            esc(&w.resource),
            esc(&w.object),
            esc(&w.filters.to_string()),
            html::time(w.created_at),
            removed,
            if w.removed_at.is_none() {
                crate::resources::watches::panel::watch_forms(w.watch_id)
            } else {
                String::new()
            },
            svc = esc(&w.service),
        ));
    }
    body.push_str("</table>");
    if let Some(next_after) = next_after {
        let next = html::query(&[
            ("service", filter.service.clone().unwrap_or_default()),
            ("resource", filter.resource.clone().unwrap_or_default()),
            ("object", filter.object.clone().unwrap_or_default()),
            ("show", filter.show.clone().unwrap_or_default()),
            ("after", next_after.to_string()),
        ]);
        body.push_str(&format!(
            r#"<p><a href="/panel/watches{}">Older →</a></p>"#,
            esc(&next)
        ));
    }
    Ok(html::page(StatusCode::OK, "Watches", &body, true))
}

/// What the consumer set or the operator set for it (issue 20): its rate
/// and its pauses.
async fn consumer_settings(pool: &sqlx::PgPool, service_id: i64) -> Result<String, AsHtml> {
    let rates = services::rate::get(pool, service_id).await?;
    let (paused, paused_watches) = crate::db::operator::pauses(pool, service_id)
        .await
        .map_err(HttpError::from)?;
    let rate = |r: Option<i32>| r.map_or("none".to_string(), |r| format!("{r}/s"));
    Ok(format!(
        r#"<dl><dt>Rate</dt><dd>{} (operator's maximum {}, the consumer's own {})</dd>
<dt>Paused</dt><dd>{}</dd></dl>"#,
        rate(rates.rate),
        rate(rates.max_rate),
        rate(rates.consumer_rate),
        if paused {
            "the whole service".to_string()
        } else if paused_watches > 0 {
            format!("{paused_watches} watches")
        } else {
            "no".to_string()
        }
    ))
}
