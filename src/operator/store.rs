//! What the panel and the admin API read and do, over the views and
//! functions of `sql/functions/0600_operator.sql`. Both front ends call only
//! these, so they show the same rows and raise the same errors.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::PgPool;

use crate::db::operator::{self as db, Explained, Page};
use crate::delivery::State;
use crate::error::{Error, Result};
use crate::http::page;

pub use crate::db::operator::{Attempt, Backlog, Event, Warning, WatchRow};

/// Most rows one page of a list may hold.
pub const MAX_PAGE: i64 = 500;

/// Rows a page holds when its filter asks for no number.
pub const DEFAULT_PAGE: i64 = 100;

/// The largest page [`page`] reads for any caller (the consumer
/// API allows 1,000 a page).
const PAGE_CEILING: i64 = 1000;

/// A row of `watchpump.delivery_log`, its state typed.
pub use crate::db::operator::DeliveryRow as Delivery;

/// A delivery's message as the pump sends it, and its service's base URL:
/// what the panel needs to show the request as sent.
pub use crate::db::delivery::Sent;

/// Which deliveries to list: every filter is optional; `after` is the
/// keyset cursor (the last id of the previous page), newest first in the
/// page's order ([`PageOrder`]: by id, or by creation time when `until` is
/// the only filter besides `since`), as [`crate::http::page`] names it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryFilter {
    pub state: Option<String>,
    pub service: Option<String>,
    /// An exact object, or a prefix ending in '/'.
    pub object: Option<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// The previous page's `next_after`: what comes after it.
    pub after: Option<i64>,
    /// Deprecated: the old name of `after` (the previous page's
    /// `next_before`).
    pub before: Option<i64>,
    pub limit: Option<i64>,
    /// One watch's deliveries: the consumer API's filter
    /// (`GET /api/v1/deliveries?watch_id=`), not the admin API's.
    #[serde(skip)]
    pub watch_id: Option<i64>,
}

impl DeliveryFilter {
    /// Empty strings (an untouched form field) mean "any".
    pub fn normalized(mut self) -> Self {
        for field in [&mut self.state, &mut self.service, &mut self.object] {
            if field.as_deref().is_some_and(|v| v.trim().is_empty()) {
                *field = None;
            }
        }
        self
    }

    /// The page's size: the filter's limit, or [`DEFAULT_PAGE`].
    pub fn size(&self) -> i64 {
        self.limit.unwrap_or(DEFAULT_PAGE)
    }

    pub fn validate(&self) -> Result<()> {
        page::given(self.after, self.before).map_err(Error::Invalid)?;
        page::size(self.limit, DEFAULT_PAGE, MAX_PAGE).map_err(Error::Invalid)?;
        if let Some(state) = &self.state {
            if state.parse::<State>().is_err() {
                return Err(Error::Invalid(format!(
                    "state must be one of {}",
                    State::list()
                )));
            }
        }
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if since >= until {
                return Err(Error::Invalid("since must be before until".into()));
            }
        }
        Ok(())
    }
}

/// Which watches to list, newest first.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchFilter {
    pub service: Option<String>,
    pub resource: Option<String>,
    pub object: Option<String>,
    /// "live", "removed", or anything else for both.
    pub show: Option<String>,
    /// The previous page's `next_after`: what comes after it.
    pub after: Option<i64>,
    /// Deprecated: the old name of `after` (the previous page's
    /// `next_before`).
    pub before: Option<i64>,
    pub limit: Option<i64>,
}

pub async fn backlog(pool: &PgPool) -> Result<Vec<Backlog>> {
    Ok(db::backlog(pool).await?)
}

/// One page of deliveries, newest first ([`page()`]), of the service the
/// filter names (none if there is no such service).
pub async fn deliveries(pool: &PgPool, filter: &DeliveryFilter) -> Result<Vec<Delivery>> {
    Ok(deliveries_page(pool, filter).await?.0)
}

/// [`deliveries`] as a page of the listing convention
/// ([`crate::http::page`]): at most the filter's [`size`](DeliveryFilter::size),
/// and the cursor of the last when more follow.
pub async fn deliveries_page(
    pool: &PgPool,
    filter: &DeliveryFilter,
) -> Result<(Vec<Delivery>, Option<i64>)> {
    filter.validate()?;
    let ahead = DeliveryFilter {
        limit: Some(page::ahead(filter.size())),
        ..filter.clone()
    };
    let rows = match &filter.service {
        None => page(pool, &ahead, None).await?,
        Some(name) => match db::service_id(pool, name).await? {
            Some(id) => page(pool, &ahead, Some(id)).await?,
            None => Vec::new(),
        },
    };
    Ok(page::cut(rows, filter.size(), |d| d.delivery_id))
}

/// One page of deliveries, newest first, keyset-paginated in the page's
/// order ([`PageOrder`]): `src/db/operator/page_by_id.sql` and
/// `page_by_time.sql` say how each stays a bounded index scan at any
/// history. The filter's `service` is ignored: `service_id` stands for it.
pub async fn page(
    pool: &PgPool,
    filter: &DeliveryFilter,
    service_id: Option<i64>,
) -> Result<Vec<Delivery>> {
    let p = page_of(filter, service_id);
    let rows = match (PageOrder::of(filter, service_id), filter.until) {
        (PageOrder::CreatedAt, Some(until)) => db::page_by_time(pool, until, &p).await?,
        _ => db::page_by_id(pool, &p).await?,
    };
    Ok(rows)
}

/// The plan of [`page()`]'s statement, as `explain` (e.g. `"explain (costs
/// off)"`) prints it: for the tests that check it at volume.
pub async fn explain_page(
    pool: &PgPool,
    explain: &str,
    filter: &DeliveryFilter,
    service_id: Option<i64>,
) -> Result<Vec<String>> {
    let p = page_of(filter, service_id);
    let statement = match (PageOrder::of(filter, service_id), filter.until) {
        (PageOrder::CreatedAt, Some(until)) => Explained::PageByTime(until, p),
        _ => Explained::PageById(p),
    };
    Ok(db::explain(pool, explain, statement).await?)
}

/// The filter as the page statements take it.
fn page_of(filter: &DeliveryFilter, service_id: Option<i64>) -> Page<'_> {
    let object = filter.object.as_deref();
    let is_prefix = object.is_some_and(|o| o.ends_with('/'));
    Page {
        // Only a state of the six: anything else (which `validate` refuses)
        // is no condition.
        state: filter
            .state
            .as_deref()
            .and_then(|state| state.parse::<State>().ok())
            .map(State::as_str),
        service_id,
        watch_id: filter.watch_id,
        object: object.filter(|_| !is_prefix),
        object_prefix: object.filter(|_| is_prefix),
        since: filter.since,
        until: filter.until,
        // `validate` refused a filter with both names.
        after: filter.after.or(filter.before),
        // Callers validate their own bound (MAX_PAGE here, the consumer
        // API's 1,000); this only keeps any caller's page finite.
        limit: filter.size().clamp(1, PAGE_CEILING),
    }
}

/// The order of a page of deliveries, newest first, and so what its
/// cursor (`after`, the last delivery of the previous page) means.
///
/// A page that ends at a time (`until`) and filters by nothing else is in
/// creation order: the history's index on `(created_at, id)` reads it
/// backwards from `until` and stops after the page, at any history. By id,
/// such a page had to read every delivery of the window to find its newest
/// ids (ids and creation times disagree where transactions overlap: an id
/// is drawn at insert, a creation time is its transaction's start): an
/// hour of a day of 2.2 M deliveries is 92,000 rows, 13-26 ms, and a wider
/// window deep in a day up to a day's rows.
///
/// Every other page is by id, which its indexes walk newest first and stop
/// after the page: `(service_id, id)`, `(object, id)`, the failed rows', or
/// the primary key (a `since` alone keeps the newest rows, so its walk stops
/// too). With a service, an object, a watch or a state, a page in creation
/// order would have had to sort all of that filter's rows before `until`
/// (an object's whole history), or walk the window's rows for the few that
/// match: `tests/history.rs` saw both plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOrder {
    /// `id desc`; the next page is `id < after`.
    Id,
    /// `created_at desc, id desc`; the next page is what comes after the
    /// delivery `after` in that order.
    CreatedAt,
}

impl PageOrder {
    pub fn of(filter: &DeliveryFilter, service_id: Option<i64>) -> Self {
        let narrowed = service_id.is_some()
            || filter.watch_id.is_some()
            || filter.object.is_some()
            || filter.state.is_some();
        if filter.until.is_some() && !narrowed {
            Self::CreatedAt
        } else {
            Self::Id
        }
    }
}

pub async fn delivery(pool: &PgPool, id: i64) -> Result<Option<Delivery>> {
    Ok(db::delivery(pool, id).await?)
}

/// A delivery with its attempts and its history: what the admin API's
/// `GET /api/v1/admin/deliveries/{id}` answers and the panel's delivery
/// page shows.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = AdminDeliveryShown)]
pub struct Shown {
    pub delivery: Delivery,
    pub attempts: Vec<Attempt>,
    pub history: Vec<Event>,
}

/// The delivery `id` as [`Shown`]; None when there is no such delivery.
pub async fn shown(pool: &PgPool, id: i64) -> Result<Option<Shown>> {
    let Some(delivery) = delivery(pool, id).await? else {
        return Ok(None);
    };
    Ok(Some(Shown {
        delivery,
        attempts: attempts(pool, id).await?,
        history: history(pool, id).await?,
    }))
}

/// `watchpump.message()`: the delivery as the pump sends it.
pub async fn sent(pool: &PgPool, id: i64) -> Result<Option<Sent>> {
    Ok(crate::db::delivery::message(pool, id).await?)
}

pub async fn attempts(pool: &PgPool, delivery_id: i64) -> Result<Vec<Attempt>> {
    Ok(db::attempts(pool, delivery_id).await?)
}

pub async fn history(pool: &PgPool, delivery_id: i64) -> Result<Vec<Event>> {
    Ok(db::history(pool, delivery_id).await?)
}

/// The most recent failures, across services.
pub async fn newest_failures(pool: &PgPool, limit: i64) -> Result<Vec<Delivery>> {
    Ok(db::newest_failures(pool, limit.clamp(1, MAX_PAGE)).await?)
}

/// The plan of [`newest_failures`]'s statement (tests check it).
pub async fn explain_newest_failures(
    pool: &PgPool,
    explain: &str,
    limit: i64,
) -> Result<Vec<String>> {
    let limit = limit.clamp(1, MAX_PAGE);
    Ok(db::explain(pool, explain, Explained::NewestFailures(limit)).await?)
}

impl WatchFilter {
    /// The page's size: the filter's limit, or [`DEFAULT_PAGE`].
    pub fn size(&self) -> i64 {
        self.limit.unwrap_or(DEFAULT_PAGE)
    }

    pub fn validate(&self) -> Result<()> {
        page::given(self.after, self.before).map_err(Error::Invalid)?;
        page::size(self.limit, DEFAULT_PAGE, MAX_PAGE).map_err(Error::Invalid)?;
        Ok(())
    }
}

/// A page of watches of the listing convention ([`crate::http::page`]):
/// at most the filter's [`size`](WatchFilter::size), and the cursor of the
/// last when more follow.
pub async fn watches_page(
    pool: &PgPool,
    filter: &WatchFilter,
) -> Result<(Vec<WatchRow>, Option<i64>)> {
    filter.validate()?;
    fn given(v: &Option<String>) -> Option<&str> {
        v.as_deref().filter(|v| !v.trim().is_empty())
    }
    let w = db::Watches {
        service: given(&filter.service),
        resource: given(&filter.resource),
        object: given(&filter.object),
        live: match filter.show.as_deref() {
            Some("live") => Some(true),
            Some("removed") => Some(false),
            _ => None,
        },
        // `validate` refused a filter with both names.
        after: filter.after.or(filter.before),
        limit: page::ahead(filter.size()),
    };
    let rows = db::watches(pool, &w).await?;
    Ok(page::cut(rows, filter.size(), |w| w.watch_id))
}

/// Warnings, newest first, of one service or of all.
pub async fn warnings(pool: &PgPool, service: Option<&str>, limit: i64) -> Result<Vec<Warning>> {
    Ok(db::warnings(pool, service, limit.clamp(1, MAX_PAGE)).await?)
}

/// `watchpump.retry()`: returns the state the delivery had. Its refusals
/// are [`Error::raised`]: no such delivery, or not in a state to retry.
pub async fn retry(pool: &PgPool, delivery_id: i64, actor: &str) -> Result<String> {
    db::retry(pool, delivery_id, actor)
        .await
        .map_err(Error::raised)
}

/// `watchpump.retry_failed()`: returns how many deliveries were requeued.
/// Its refusals are [`Error::raised`].
pub async fn retry_failed(
    pool: &PgPool,
    service: &str,
    since: DateTime<Utc>,
    actor: &str,
) -> Result<i64> {
    let n = db::retry_failed(pool, service, since, actor)
        .await
        .map_err(Error::raised)?;
    Ok(i64::from(n))
}
