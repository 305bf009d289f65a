//! `/api/v1/watches`: a consumer service creates, lists, reads and removes
//! its own watches. Another service's watch is 404, as if it did not exist.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::limits::{self, Write};
use crate::caller::Consumer;
use crate::http::error::{Error, NoValidToken, NotTheCallers};
use crate::http::extract::{Body, PathId, Query, WatchPath};
use crate::http::App;
use crate::http::{page, HttpError};
use crate::services::Service;
use crate::watches::{self, resync, NewWatch, Watch};


/// Create a watch (the identical live one again: 200)
///
/// 201 with the new watch, or 200 with the identical one it already has
/// (which writes nothing and takes no token of the service's bucket,
/// [`limits`]). With `"resync": true` the watch's resync starts too
/// ([`resync()`]) and the answer carries its start under `"resync"` (429 if
/// one of the service's runs, or its replay budget is spent: the watch
/// exists, and asking again is safe).
#[utoipa::path(post,
    operation_id = "watches_create", path = "/api/v1/watches", tag = "consumer",
    security(("service_token" = [])),
    request_body = NewWatch,
    responses(
        (status = 201, description = "created", body = Watch),
        (status = 200, description = "the identical live watch the service already has: nothing written", body = Watch),
        (status = 422, description = "invalid watch", body = Error),
        (status = 400, description = "not JSON", body = Error),
        NoValidToken,
        (status = 429, description = "this service's self-service writes are over its bucket (60 at once, then 1 a second: watch creation, ping, redeliver, resync, pause and resume together); with \"resync\": true, also as for the resync call; Retry-After (seconds) says when to ask again", body = Error, headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
    ))]
pub async fn create(
    State(state): State<App>,
    Consumer(service): Consumer,
    Body(new): Body<NewWatch>,
) -> Result<(StatusCode, Json<Value>), HttpError> {
    let existing = watches::find_live(&state.pool, service.id, &new).await?;
    if existing.is_none() {
        limits::take(&state.pool, &service, Write::Create).await?;
    }
    let (watch, created) = watches::create(&state.pool, service.id, &new)
        .await
        .inspect_err(|e| {
            if let Some(limit) = crate::watches::fanout::refusal_limit(e) {
                crate::watches::fanout::count(&service.name, limit);
            }
        })?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut answer = serde_json::to_value(&watch).expect("a watch serialises");
    if new.resync {
        let started = start_resync(&state, &service, watch.id).await?;
        answer["resync"] = serde_json::to_value(started).expect("a resync serialises");
    }
    Ok((status, Json(answer)))
}

/// Resync the watch: the newest matching change of every object it covers, replayed
///
/// Queues, for every object the watch covers (at most
/// WATCHPUMP_RESYNC_MAX_OBJECTS), the newest retained change that matches
/// its filters, as a delivery whose body carries "replay": true with the
/// change's own change_id and sequence. Answers at once; the replays are
/// queued in batches after the answer. See docs/protocol.md, "Resync".
///
/// Starts a resync of the watch (docs/protocol.md, "Resync"): 202
/// `{"watch_id", "objects", "truncated", "history_from", "replays_left",
/// "replays_per_day"}`, and the replays are queued in batches after the
/// answer. 404 for another service's or a removed watch, 429 while a
/// resync of the service runs, or when its replay budget is spent.
#[utoipa::path(post,
    operation_id = "watches_resync", path = "/api/v1/watches/{id}/resync", tag = "consumer",
    security(("service_token" = [])),
    params(WatchPath),
    responses(
        (status = 202, description = "started", body = resync::ConsumerStarted),
        (status = 404, description = "another service's, a removed one, or none", body = Error),
        (status = 429, description = "a resync of one of this service's watches is running (one at a time per service), its daily replay budget is spent, or this service's self-service writes are over its bucket (60 at once, then 1 a second: watch creation, ping, redeliver, resync, pause and resume together); Retry-After (seconds) says when to ask again", body = Error, headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        NoValidToken,
    ))]
pub async fn resync(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: WatchPath,
) -> Result<(StatusCode, Json<Value>), HttpError> {
    let started = start_resync(&state, &service, id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::to_value(started).expect("a resync serialises")),
    ))
}

async fn start_resync(
    state: &App,
    service: &Service,
    watch_id: i64,
) -> Result<resync::ConsumerStarted, HttpError> {
    limits::take(&state.pool, service, Write::Resync).await?;
    let max = state.settings.resync_max_objects;
    let started = resync::start_for_consumer(&state.pool, service.id, watch_id, max)
        .await
        .map_err(|e| match e {
            crate::Error::Database(e) => {
                let limit = if resync::is_out_of_replays(&e) {
                    "replay_budget"
                } else {
                    "resync_running"
                };
                limits::too_many_or_raised(e, &service.name, limit)
            }
            e => e.into(),
        })?;
    resync::spawn_for_consumer(
        state.pool.clone(),
        service.id,
        watch_id,
        u32::try_from(started.objects).unwrap_or(0),
    );
    Ok(started)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Removed watches too.
    #[serde(default)]
    include_removed: bool,
    /// The `next_after` of the previous page: watches after it.
    #[serde(default)]
    after: i64,
    /// 1 to 1000, default 100.
    limit: Option<i64>,
}

/// A page of the caller's watches.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WatchPage {
    watches: Vec<Watch>,
    /// Pass as `after` for the next page; null on the last.
    next_after: Option<i64>,
    #[serde(flatten)]
    read: crate::replica::Lag,
}

/// A pause or a resume of a watch.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Paused {
    watch_id: i64,
    paused: bool,
    /// False for a pause of a paused watch, a resume of a running one.
    changed: bool,
}

/// The delivery a ping queued.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryId {
    delivery_id: i64,
}

/// The caller's watches, by id
///
/// `{"watches": [...], "next_after": <id or null>}`; pass `next_after` as
/// `after` for the next page.
#[utoipa::path(get,
    operation_id = "watches_list", path = "/api/v1/watches", tag = "consumer",
    security(("service_token" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "a page", body = WatchPage),
        (status = 400, description = "bad query", body = Error),
        NoValidToken,
    ))]
pub async fn list(
    State(state): State<App>,
    Consumer(service): Consumer,
    Query(q): Query<ListQuery>,
) -> Result<Json<WatchPage>, HttpError> {
    let size = page::consumer_size(q.limit)?;
    // Before the page: what changed after the lag was read is not on it.
    let lag = state.reads.lag().await?;
    let pool = state.reads.pool();
    let (watches, next_after) = page::read(
        size,
        async |ahead| watches::list(pool, service.id, q.include_removed, q.after, ahead).await,
        |w| w.id,
    )
    .await?;
    Ok(Json(WatchPage {
        watches,
        next_after,
        read: lag,
    }))
}

/// One of the caller's watches
#[utoipa::path(get,
    operation_id = "watches_show", path = "/api/v1/watches/{id}", tag = "consumer",
    security(("service_token" = [])),
    params(WatchPath),
    responses(
        (status = 200, description = "the watch", body = Watch),
        NotTheCallers,
        NoValidToken,
    ))]
pub async fn show(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: WatchPath,
) -> Result<Json<Watch>, HttpError> {
    watches::get(&state.pool, service.id, id)
        .await?
        .map(Json)
        .ok_or_else(|| no_such_watch(id))
}

/// Remove a watch; its deliveries not sent are dropped
#[utoipa::path(delete,
    operation_id = "watches_remove", path = "/api/v1/watches/{id}", tag = "consumer",
    security(("service_token" = [])),
    params(WatchPath),
    responses(
        (status = 204, description = "removed"),
        NotTheCallers,
        NoValidToken,
    ))]
pub async fn remove(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: WatchPath,
) -> Result<StatusCode, HttpError> {
    if watches::remove(&state.pool, service.id, id, "removed by the consumer").await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_such_watch(id))
    }
}

/// Pause the watch: nothing sent, nothing fails
///
/// Pauses the watch: 200 `{"watch_id", "paused": true, "changed"}`;
/// `changed` is false for a watch that was paused already. While paused
/// nothing is sent and nothing fails (`crate::watches::pause`). 429 for a
/// watch resumed less than a minute ago.
#[utoipa::path(post,
    operation_id = "watches_pause", path = "/api/v1/watches/{id}/pause", tag = "consumer",
    security(("service_token" = [])),
    params(WatchPath),
    responses(
        (status = 200, description = "paused", body = Paused),
        NotTheCallers,
        NoValidToken,
        (status = 429, description = "the watch was resumed less than 60 s ago, or this service's self-service writes are over its bucket (60 at once, then 1 a second: watch creation, ping, redeliver, resync, pause and resume together); Retry-After (seconds) says when to ask again", body = Error, headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
    ))]
pub async fn pause(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: WatchPath,
) -> Result<Json<Paused>, HttpError> {
    set_paused(state, service, id, true).await
}

/// Resume the watch: waiting news sent with a fresh window
///
/// Resumes the watch: its waiting news is sent, each with a fresh delivery
/// window. 200 `{"watch_id", "paused": false, "changed"}`.
#[utoipa::path(post,
    operation_id = "watches_resume", path = "/api/v1/watches/{id}/resume", tag = "consumer",
    security(("service_token" = [])),
    params(WatchPath),
    responses(
        (status = 200, description = "resumed", body = Paused),
        NotTheCallers,
        NoValidToken,
        (status = 429, description = "this service's self-service writes are over its bucket (60 at once, then 1 a second: watch creation, ping, redeliver, resync, pause and resume together); Retry-After (seconds) says when to ask again", body = Error, headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
    ))]
pub async fn resume(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: WatchPath,
) -> Result<Json<Paused>, HttpError> {
    set_paused(state, service, id, false).await
}

async fn set_paused(
    state: App,
    service: Service,
    id: i64,
    paused: bool,
) -> Result<Json<Paused>, HttpError> {
    let what = if paused { Write::Pause } else { Write::Resume };
    limits::take(&state.pool, &service, what).await?;
    let changed = watches::pause::set_watch_by_consumer(&state.pool, service.id, id, paused)
        .await
        .map_err(|e| match e {
            crate::Error::Database(e) => limits::too_many_or_raised(e, &service.name, "repause"),
            e => e.into(),
        })?;
    Ok(Json(Paused {
        watch_id: id,
        paused,
        changed,
    }))
}

/// How often one watch may be pinged: each ping is a change and a
/// delivery kept in the history, so a consumer pinging in a loop would
/// otherwise grow both without bound. A sooner ping is a 429
/// (tests/consumer_deliveries.rs); all of a service's pings take tokens of
/// its bucket besides ([`limits`]), so that new watches do not get around
/// it.
pub const PING_EVERY_SECS: i64 = 10;

/// Send the watch a signed delivery of kind watchpump.ping
///
/// Sends the watch a delivery of kind `watchpump.ping`, queued and signed
/// like any other (`watchpump.ping()`): 202 `{"delivery_id"}`; 404 for a
/// removed watch or another service's, 429 within [`PING_EVERY_SECS`] of
/// the watch's previous ping.
#[utoipa::path(post,
    operation_id = "watches_ping", path = "/api/v1/watches/{id}/ping", tag = "consumer",
    security(("service_token" = [])),
    params(WatchPath),
    responses(
        (status = 202, description = "queued", body = DeliveryId),
        NotTheCallers,
        (status = 429, description = "pinged less than 10 s ago, or this service's self-service writes are over its bucket (60 at once, then 1 a second: watch creation, ping, redeliver, resync, pause and resume together); Retry-After (seconds) says when to ask again", body = Error, headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        NoValidToken,
    ))]
pub async fn ping(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: WatchPath,
) -> Result<(StatusCode, Json<DeliveryId>), HttpError> {
    limits::take(&state.pool, &service, Write::Ping).await?;
    let delivery_id =
        crate::db::consumer::ping(&state.pool, service.id, id, PING_EVERY_SECS as f64)
            .await
            .map_err(|e| limits::too_many_or_raised(e, &service.name, "ping"))?;
    Ok((StatusCode::ACCEPTED, Json(DeliveryId { delivery_id })))
}

fn no_such_watch(id: i64) -> HttpError {
    HttpError::NotFound(format!("no watch {id} for this service"))
}
