//! What a consumer can do for itself (issue 20), from the panel too, as
//! `watchpump services pause|resume` and `watchpump watches
//! pause|resume|resync` do it: pause and resume a service or one of its
//! watches, and resync a watch. Each is a POST of a logged-in operator from
//! the panel's own origin ([`crate::resources::forms::Change`]) that answers
//! with the service's page and a notice.

use axum::extract::State;
use axum::response::Response;

use crate::http::html::esc;
use crate::http::extract::WatchPath;
use crate::http::App;
use crate::http::{AsHtml, HttpError};
use crate::resources::forms::{back_to, Change, ServiceChange};
use crate::watches::{pause, resync};

/// The service page's "Deliveries" forms: pause or resume the whole
/// service.
pub fn service_forms(name: &str) -> String {
    let svc = esc(name);
    format!(
        r#"<h2>Pause</h2>
<p class="muted">While paused nothing is sent; news keeps superseding older news, and nothing fails: the delivery window restarts at resume.</p>
<form class="filters" method="post" action="/panel/services/{svc}/pause"><button class="act" type="submit">Pause every delivery of {svc}</button></form>
<form class="filters" method="post" action="/panel/services/{svc}/resume"><button class="act" type="submit">Resume {svc}</button></form>"#
    )
}

/// The watches page's actions on one live watch.
pub fn watch_forms(watch_id: i64) -> String {
    let form = |what: &str, label: &str| {
        format!(
            r#"<form class="inline" method="post" action="/panel/watches/{watch_id}/{what}"><button type="submit">{label}</button></form>"#
        )
    };
    [
        form("pause", "Pause"),
        form("resume", "Resume"),
        form("resync", "Resync"),
    ]
    .join(" ")
}

async fn set_service(state: &App, name: &str, paused: bool) -> Result<Response, AsHtml> {
    let service_id = pause::service_id(&state.pool, name).await?;
    pause::set_service(&state.pool, service_id, paused).await?;
    tracing::info!(service = %name, paused, "service paused or resumed from the panel");
    Ok(back_to(
        name,
        if paused { "paused" } else { "resumed" },
        None,
    ))
}

pub async fn pause_service(
    ServiceChange { app: state, name }: ServiceChange,
) -> Result<Response, AsHtml> {
    set_service(&state, &name, true).await
}

pub async fn resume_service(
    ServiceChange { app: state, name }: ServiceChange,
) -> Result<Response, AsHtml> {
    set_service(&state, &name, false).await
}

/// The live watch's service: its id and name.
async fn owner(state: &App, watch_id: i64) -> Result<(i64, String), AsHtml> {
    let found = crate::db::operator::live_watch_owner(&state.pool, watch_id)
        .await
        .map_err(HttpError::from)?;
    Ok(found.ok_or_else(|| HttpError::NotFound(format!("There is no live watch {watch_id}.")))?)
}

async fn set_watch(state: &App, watch_id: i64, paused: bool) -> Result<Response, AsHtml> {
    let (service_id, name) = owner(state, watch_id).await?;
    pause::set_watch(&state.pool, service_id, watch_id, paused).await?;
    tracing::info!(watch_id, paused, "watch paused or resumed from the panel");
    Ok(back_to(
        &name,
        if paused {
            "watch-paused"
        } else {
            "watch-resumed"
        },
        Some(watch_id),
    ))
}

pub async fn pause_watch(
    _: Change,
    State(state): State<App>,
    watch_id: Result<WatchPath, HttpError>,
) -> Result<Response, AsHtml> {
    set_watch(&state, watch_id?.id, true).await
}

pub async fn resume_watch(
    _: Change,
    State(state): State<App>,
    watch_id: Result<WatchPath, HttpError>,
) -> Result<Response, AsHtml> {
    set_watch(&state, watch_id?.id, false).await
}

/// Starts a resync as the consumer API does (one per service at a time,
/// at most `WATCHPUMP_RESYNC_MAX_OBJECTS` objects; the operator's own, so
/// not out of the service's replay budget); its replays are queued in
/// batches after the answer.
pub async fn resync_watch(
    _: Change,
    State(state): State<App>,
    watch_id: Result<WatchPath, HttpError>,
) -> Result<Response, AsHtml> {
    let watch_id = watch_id?.id;
    let (service_id, name) = owner(&state, watch_id).await?;
    let max = state.settings.resync_max_objects;
    let started = match resync::start(&state.pool, service_id, watch_id, max).await {
        Err(crate::Error::Database(e)) if crate::api::limits::refusal_of(&e).is_some() => {
            let (message, wait) = crate::api::limits::refusal_of(&e).expect("checked above");
            return Err(
                HttpError::TooMany(format!("{message}; ask again when it is done."), wait).into(),
            );
        }
        other => other?,
    };
    resync::spawn(state.pool.clone(), watch_id, max);
    tracing::info!(
        watch_id,
        objects = started.objects,
        "resync started from the panel"
    );
    Ok(back_to(&name, "resync", Some(i64::from(started.objects))))
}
