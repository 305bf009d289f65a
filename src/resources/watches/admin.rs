//! `/api/v1/admin/watches`: every service's watches for the operator,
//! newest first, with the admin token.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use serde_json::Value;

use crate::caller::Admin;
use crate::http::error::{Error, NoValidToken};
use crate::http::extract::Query;
use crate::http::{page, App, HttpError};
use crate::operator::store::{self, WatchFilter};

/// A page of watches, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminWatchPage {
    #[schema(value_type = Vec<Value>)]
    watches: Vec<store::WatchRow>,
    #[serde(flatten)]
    cursors: page::AdminCursors,
    #[serde(flatten)]
    read: crate::replica::Lag,
}

/// Watches, newest first
///
/// `{"watches": [...], "next_after": <id or null>}`, newest first; pass
/// `next_after` as `after` for the next (older) page.
#[utoipa::path(get,
    operation_id = "admin_watches", path = "/api/v1/admin/watches", tag = "admin", security(("admin_token" = [])),
    params(WatchFilter),
    responses(
        (status = 200, description = "a page", body = AdminWatchPage),
        (status = 422, description = "bad limit", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn watches(
    _: Admin,
    State(state): State<App>,
    Query(filter): Query<WatchFilter>,
) -> Result<Json<Value>, HttpError> {
    // A bad filter is refused without asking the standby; the lag is read
    // before the page: what changed after it is not on the page.
    filter.validate()?;
    let lag = state.reads.lag().await?;
    let (watches, next_after) = store::watches_page(state.reads.pool(), &filter).await?;
    state.settings.masked(&AdminWatchPage {
        cursors: page::AdminCursors::of(&watches, filter.size(), next_after, |w| w.watch_id),
        watches,
        read: lag,
    })
}
