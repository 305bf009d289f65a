//! `GET /api/v1/kinds`: the kinds of change this producer declares
//! ([`crate::kinds`]), each with its payload's JSON Schema and an example,
//! so that a consumer team reads every field without the producer's source.
//! Any service's token may read them: they describe the producer, not a
//! consumer.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::caller::Consumer;
use crate::http::error::{Error, NoValidToken};
use crate::http::extract::Query;
use crate::http::App;
use crate::http::{page, HttpError};
use crate::kinds::{self, Kind};

/// The consumer API's route.
pub fn consumer_routes() -> Router<App> {
    Router::new().route("/api/v1/kinds", get(list))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The `next_after` of the previous page: kinds named after it.
    #[serde(default)]
    after: String,
    /// 1 to 1000, default 100.
    limit: Option<i64>,
}

/// A page of kinds; a struct rather than a JSON map so that each kind reads
/// name first, as declared.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = KindPage)]
pub struct Page {
    kinds: Vec<Kind>,
    /// Pass as `after` for the next page; null on the last.
    next_after: Option<String>,
}

/// The kinds of change the producer declares
///
/// `{"kinds": [...], "next_after": <name or null>}`, by name; pass
/// `next_after` as `after` for the next page.
#[utoipa::path(get,
    operation_id = "kinds_list", path = "/api/v1/kinds", tag = "consumer",
    security(("service_token" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "a page", body = Page),
        (status = 400, description = "bad query", body = Error),
        NoValidToken,
    ))]
pub async fn list(
    State(state): State<App>,
    Consumer(_): Consumer,
    Query(q): Query<ListQuery>,
) -> Result<Json<Page>, HttpError> {
    let size = page::consumer_size(q.limit)?;
    let (kinds, next_after) = page::read(
        size,
        async |ahead| kinds::list(&state.pool, &q.after, ahead).await,
        |k| k.name.clone(),
    )
    .await?;
    Ok(Json(Page { kinds, next_after }))
}
