//! A service's lifecycle from the panel, as `watchpump services ...` and
//! the admin API do it: rotate its signing secret or its token (the old one
//! keeps working for an overlap), move it to a new URL, remove it. Each is a
//! POST of a logged-in operator from the panel's own origin
//! ([`crate::resources::forms::ServiceChange`]); a new credential is shown once,
//! on the answer's page (which is never cached), and stored nowhere else
//! but as the registry stores it.

use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::caller::PANEL_ACTOR as ACTOR;
use crate::http::extract::Form;
use crate::http::html::{self, esc};
use crate::http::App;
use crate::http::{AsHtml, HttpError};
use crate::resources::forms::{back_to, ServiceChange};
use crate::services::{self, Credential};

/// The forms of the service page's "Lifecycle" section.
pub fn forms(name: &str, base_url: &str) -> String {
    let svc = esc(name);
    let action = |what: &str| format!("/panel/services/{svc}/{what}");
    format!(
        r#"<h2>Lifecycle</h2>
<form class="filters" method="post" action="{url}">
<label>Base URL <input name="base_url" value="{base}" size="40" required></label>
<button class="act" type="submit">Move {svc} to this URL</button></form>
<form class="filters" method="post" action="{rate}">
<label>Deliveries a second, all pumps together (empty: no limit) <input name="rate" size="6" inputmode="numeric"></label>
<button class="act" type="submit">Set the rate of {svc}</button></form>
<form class="filters" method="post" action="{secret}">
<label>Old secret signs for <input name="overlap" value="{overlap}" size="6"></label>
<label><input type="checkbox" name="force" value="yes"> even during the last rotation's overlap (its older secret stops at once)</label>
<button class="act" type="submit">Rotate the signing secret</button></form>
<form class="filters" method="post" action="{token}">
<label>Old token works for <input name="overlap" value="{overlap}" size="6"></label>
<label><input type="checkbox" name="force" value="yes"> even during the last rotation's grace (its older token stops at once)</label>
<button class="act" type="submit">Rotate the token</button></form>
<form class="filters" method="post" action="{remove}">
<label>Type <code>{svc}</code> to confirm <input name="confirm" size="16" required></label>
<button class="act" type="submit">Remove {svc}, its watches and their undelivered deliveries</button></form>"#,
        url = action("url"),
        rate = action("rate"),
        base = esc(base_url),
        secret = action("rotate-secret"),
        token = action("rotate-token"),
        remove = action("remove"),
        overlap = services::DEFAULT_OVERLAP,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlapForm {
    overlap: Option<String>,
    /// The checkbox: present (`yes`) to rotate during an overlap.
    force: Option<String>,
}

/// A page that shows a new credential once.
fn shown_once(name: &str, what: &str, value: &str, old_until: DateTime<Utc>) -> Response {
    let svc = esc(name);
    html::page(
        StatusCode::OK,
        &format!("New {what} for {name}"),
        &format!(
            r#"<p class="note">Hand this to the team that runs {svc}. It is shown once: this page is not stored, and watchpump keeps no copy it can show again.</p>
<pre id="credential">{}</pre>
<p>The old {what} keeps working until {}.</p>
<p><a href="/panel/services/{svc}">Back to {svc}</a></p>"#,
            esc(value),
            html::time(old_until),
        ),
        true,
    )
}

/// Rotates one credential and shows the new one once; during the last
/// rotation's overlap, a 409 page that says until when, unless the form's
/// `force` box is ticked.
async fn rotate(
    state: &App,
    name: &str,
    Form(given): Form<OverlapForm>,
    credential: Credential,
) -> Result<Response, AsHtml> {
    let overlap = services::parse_overlap(given.overlap.as_deref())?;
    let force = given.force.is_some();
    let (rotated, what) = match credential {
        Credential::SigningSecret => (
            services::rotate_secret(&state.pool, name, overlap, force).await?,
            "signing secret",
        ),
        Credential::Token => (
            services::rotate_token(&state.pool, name, overlap, force).await?,
            "token",
        ),
    };
    tracing::info!(service = %name, retired_early = ?rotated.retired_early, "{what} rotated from the panel");
    Ok(shown_once(name, what, &rotated.new, rotated.previous_until))
}

pub async fn rotate_secret(
    ServiceChange { app: state, name }: ServiceChange,
    given: Form<OverlapForm>,
) -> Result<Response, AsHtml> {
    rotate(&state, &name, given, Credential::SigningSecret).await
}

pub async fn rotate_token(
    ServiceChange { app: state, name }: ServiceChange,
    given: Form<OverlapForm>,
) -> Result<Response, AsHtml> {
    rotate(&state, &name, given, Credential::Token).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlForm {
    base_url: String,
}

pub async fn set_url(
    ServiceChange { app: state, name }: ServiceChange,
    Form(new): Form<UrlForm>,
) -> Result<Response, AsHtml> {
    let allowed = &state.settings.destinations;
    let service = services::set_url_within(&state.pool, &name, &new.base_url, allowed).await?;
    tracing::info!(service = %name, base_url = %service.base_url, "service moved from the panel");
    Ok(back_to(&name, "moved", None))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateForm {
    rate: String,
}

/// The most deliveries a second the service gets (issue 20), as
/// `watchpump services set-rate`; an empty field lifts the limit.
pub async fn set_rate(
    ServiceChange { app: state, name }: ServiceChange,
    Form(given): Form<RateForm>,
) -> Result<Response, AsHtml> {
    let rate = match given.rate.trim() {
        "" => None,
        text => {
            let n: i64 = text.parse().map_err(|_| {
                HttpError::Invalid(format!(
                    "The rate is a whole number of deliveries a second, not {text:?}."
                ))
            })?;
            Some(services::rate::check(n).map_err(HttpError::from)?)
        }
    };
    services::rate::set_max(&state.pool, &name, rate).await?;
    tracing::info!(service = %name, rate = ?rate, "service rate set from the panel");
    Ok(back_to(&name, "rate", None))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveForm {
    confirm: String,
}

pub async fn remove(
    ServiceChange { app: state, name }: ServiceChange,
    Form(given): Form<RemoveForm>,
) -> Result<Response, AsHtml> {
    if given.confirm.trim() != name {
        return Err(HttpError::Invalid(format!(
            "Type the service's name, {name:?}, to confirm its removal; nothing was removed."
        ))
        .into());
    }
    let removal = services::remove(&state.pool, &name, ACTOR).await?;
    tracing::info!(service = %name, watches = removal.watches, dropped = removal.deliveries, "service removed from the panel");
    Ok(html::page(
        StatusCode::OK,
        &format!("Service {name} removed"),
        &format!(
            r#"<p class="note">{} watches removed, {} undelivered deliveries dropped. Its token no longer works.</p>
<p><a href="/panel">Back to the overview</a></p>"#,
            removal.watches, removal.deliveries
        ),
        true,
    ))
}
