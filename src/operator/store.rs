//! What the panel and the admin API read and do, over the views and
//! functions of `sql/functions/0600_operator.sql`. Both front ends call only
//! these, so they show the same rows and raise the same errors.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, QueryBuilder};

use crate::delivery::{Message, State};
use crate::error::{Error, Result};

/// Most rows one page of a list may hold.
pub const MAX_PAGE: i64 = 500;

/// The largest page [`page_query_of`] reads for any caller (the consumer
/// API allows 1,000 a page).
const PAGE_CEILING: i64 = 1000;

/// A row of `watchpump.backlog`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Backlog {
    pub service_id: i64,
    pub service: String,
    pub pending: i64,
    pub in_flight: i64,
    pub due_now: i64,
    pub failed_24h: i64,
    /// Seconds the oldest due delivery has waited; none when nothing is due.
    pub oldest_due_age_secs: Option<f64>,
    pub last_delivered_at: Option<DateTime<Utc>>,
    pub last_failed_at: Option<DateTime<Utc>>,
    pub retrying: i64,
    pub looks_down: bool,
}

/// A row of `watchpump.delivery_log`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Delivery {
    pub delivery_id: i64,
    pub created_at: DateTime<Utc>,
    pub service: String,
    pub watch_id: i64,
    pub resource: String,
    pub watch_object: String,
    pub object: String,
    pub kind: String,
    pub change_id: i64,
    pub sequence: i64,
    #[sqlx(try_from = "String")]
    pub state: State,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub superseded_by: Option<i64>,
    pub last_action: Option<String>,
}

/// A delivery's message as the pump sends it, and its service's base URL:
/// what the panel needs to show the request as sent.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Sent {
    #[sqlx(flatten)]
    pub message: Message,
    pub base_url: String,
}

/// One attempt to send a delivery.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Attempt {
    /// The first attempt this row stands for.
    pub attempt: i32,
    /// How many identical failed attempts in a row the row stands for
    /// (`attempt` to `attempt + repeats - 1`); 1 for most.
    pub repeats: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: f64,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub response_head: Option<String>,
    pub pump: String,
}

/// A row of `watchpump.delivery_history`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub event: String,
    pub detail: Option<String>,
}

/// A row of `watchpump.watch_list`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct WatchRow {
    pub watch_id: i64,
    pub service: String,
    pub resource: String,
    pub object: String,
    pub filters: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub removed_reason: Option<String>,
}

/// A warning to the notify service.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Warning {
    pub id: i64,
    pub service: String,
    pub state: String,
    pub failed: i32,
    pub folded: i32,
    pub oldest_created_at: DateTime<Utc>,
    pub first_failed_at: DateTime<Utc>,
    pub last_failed_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub send_after: DateTime<Utc>,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Which deliveries to list: every filter is optional; `before` is the
/// keyset cursor (the last id of the previous page), newest first in the
/// page's order ([`PageOrder`]: by id, or by creation time when `until` is
/// the only filter besides `since`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryFilter {
    pub state: Option<String>,
    pub service: Option<String>,
    /// An exact object, or a prefix ending in '/'.
    pub object: Option<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
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

    pub fn validate(&self) -> Result<()> {
        if let Some(state) = &self.state {
            if state.parse::<State>().is_err() {
                return Err(Error::Invalid(format!(
                    "state must be one of {}",
                    State::list()
                )));
            }
        }
        if let Some(limit) = self.limit {
            if !(1..=MAX_PAGE).contains(&limit) {
                return Err(Error::Invalid(format!("limit must be 1 to {MAX_PAGE}")));
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
pub struct WatchFilter {
    pub service: Option<String>,
    pub resource: Option<String>,
    pub object: Option<String>,
    /// "live", "removed", or anything else for both.
    pub show: Option<String>,
    pub before: Option<i64>,
    pub limit: Option<i64>,
}

pub async fn backlog(pool: &PgPool) -> Result<Vec<Backlog>> {
    Ok(sqlx::query_as(
        "select service_id, service, pending, in_flight, due_now, failed_24h,
                extract(epoch from oldest_due_age)::float8 as oldest_due_age_secs,
                last_delivered_at, last_failed_at, retrying, looks_down
         from watchpump.backlog order by service",
    )
    .fetch_all(pool)
    .await?)
}

const DELIVERY_COLUMNS: &str = "delivery_id, created_at, service, watch_id, resource, \
    watch_object, object, kind, change_id, sequence, state, attempts, next_attempt_at, \
    deadline, finished_at, last_status, last_error, superseded_by, last_action";

/// One page of deliveries, newest first. Each filter becomes a condition
/// only when given, and the state and the service's id are written into the
/// statement as literals (the state is one of [`State`], the id
/// comes from the database): the planner then sees which partial index
/// fits and how rare the service is, with any plan cache. The limit is a
/// literal too, never a generic-plan guess.
pub async fn deliveries(pool: &PgPool, filter: &DeliveryFilter) -> Result<Vec<Delivery>> {
    filter.validate()?;
    let service_id = match &filter.service {
        Some(service) => {
            let id: Option<i64> =
                sqlx::query_scalar("select id from watchpump.services where name = $1")
                    .bind(service)
                    .fetch_optional(pool)
                    .await?;
            match id {
                Some(id) => Some(id),
                None => return Ok(Vec::new()),
            }
        }
        None => None,
    };
    Ok(page_query("", filter, service_id)
        .build_query_as()
        .fetch_all(pool)
        .await?)
}

/// The statement behind [`deliveries`], after `prefix` (tests put
/// `explain` there to check its plan). Keyset-paginated in two steps, so
/// that its plan cannot depend on statistics that flip: first the page's
/// ids in page order ([`PageOrder`]), from the queue and from the history
/// separately, each an index scan that stops after `limit` rows (the
/// history's per-day partitions each walk an index backwards: its primary
/// key, `(service_id, id)`, `(object, id)`, `(created_at, id)`, or the
/// partial index of failed rows; a time filter leaves only its days); then
/// each of the `limit` rows of `delivery_log`, one lookup by key per id.
/// (`order by ... limit` over the view's union and joins was planned either
/// way: 6 ms or 2 s at 1 M rows.)
///
/// The lookup is a lateral subquery with `limit 1`, which the planner
/// cannot flatten into a join: it stays a nested loop of key lookups, never
/// a hash join or a parallel plan (`delivery_id = any (array(...))` over the
/// view was planned as a parallel Gather Merge at 1 M rows: 30 ms of worker
/// start-up for a 2 ms read). Each page row carries its delivery's
/// `created_at`, the history's partition key, so that each lookup reads one
/// day of `settled` and one of `changes` (the view's lateral lookup), pruned
/// at run time, rather than probing every day.
pub fn page_query<'a>(
    prefix: &str,
    filter: &'a DeliveryFilter,
    service_id: Option<i64>,
) -> QueryBuilder<'a, Postgres> {
    page_query_of(prefix, DELIVERY_COLUMNS, filter, service_id)
}

/// [`page_query`] selecting `columns` of `watchpump.delivery_log` (the
/// consumer API lists fewer than the operator's pages).
pub fn page_query_of<'a>(
    prefix: &str,
    columns: &str,
    filter: &'a DeliveryFilter,
    service_id: Option<i64>,
) -> QueryBuilder<'a, Postgres> {
    // Callers validate their own bound (MAX_PAGE here, the consumer API's
    // 1,000); this only keeps any caller's page finite.
    let limit = filter.limit.unwrap_or(50).clamp(1, PAGE_CEILING);
    let order = PageOrder::of(filter, service_id);
    let state = filter
        .state
        .as_ref()
        .and_then(|state| state.parse::<State>().ok());
    let (queued, settled) = match state {
        None => (Some(""), Some(String::new())),
        Some(State::Pending) => (Some(" and not watchpump.in_flight(d.lease_until)"), None),
        Some(State::InFlight) => (Some(" and watchpump.in_flight(d.lease_until)"), None),
        Some(other) => (None, Some(format!(" and d.state = '{other}'"))),
    };
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(prefix);
    q.push("with ");
    if let (PageOrder::CreatedAt, Some(before)) = (order, filter.before) {
        // Where the previous page ended: its last delivery's creation time,
        // in the queue or the history (one probe of each day's index on
        // id). A cursor that retention has since removed finds none, and
        // the listing ends there.
        q.push(
            "cursor as (select coalesce(\
             (select c.created_at from watchpump.queue c where c.id = ",
        )
        .push_bind(before)
        .push("), (select c.created_at from watchpump.settled c where c.id = ")
        .push_bind(before)
        .push(")) as created_at), ");
    }
    q.push("page as (select u.id, u.created_at from (");
    let mut first = true;
    for (table, state_condition) in [("queue", queued.map(str::to_string)), ("settled", settled)] {
        let Some(state_condition) = state_condition else {
            continue;
        };
        if !first {
            q.push(" union all ");
        }
        first = false;
        q.push(format!(
            "(select d.id, d.created_at from watchpump.{table} d where true{state_condition}"
        ));
        push_conditions(&mut q, filter, service_id);
        match (order, filter.before) {
            (PageOrder::Id, Some(before)) => {
                q.push(" and d.id < ").push_bind(before);
            }
            (PageOrder::CreatedAt, Some(before)) => {
                q.push(" and (d.created_at, d.id) < ((select created_at from cursor), ")
                    .push_bind(before)
                    .push(")");
            }
            (_, None) => {}
        }
        q.push(format!(" order by {} limit {limit})", order.keys("d")));
    }
    q.push(format!(
        ") u order by {} limit {limit}) \
         select l.* from page p cross join lateral (\
         select {columns} from watchpump.delivery_log l \
         where l.delivery_id = p.id and l.created_at = p.created_at limit 1) l \
         order by {}",
        order.keys("u"),
        order.keys("p")
    ));
    q
}

/// The order of a page of deliveries, newest first, and so what its
/// cursor (`before`, the last delivery of the previous page) means.
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
    /// `id desc`; the next page is `id < before`.
    Id,
    /// `created_at desc, id desc`; the next page is what comes after the
    /// delivery `before` in that order.
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

    /// The `order by` keys on the table aliased `alias`.
    fn keys(self, alias: &str) -> String {
        match self {
            Self::Id => format!("{alias}.id desc"),
            Self::CreatedAt => format!("{alias}.created_at desc, {alias}.id desc"),
        }
    }
}

/// The filter's conditions on a table of deliveries aliased `d`, but its
/// cursor ([`PageOrder`] says what `before` means).
fn push_conditions<'a>(
    q: &mut QueryBuilder<'a, Postgres>,
    filter: &'a DeliveryFilter,
    service_id: Option<i64>,
) {
    if let Some(id) = service_id {
        q.push(format!(" and d.service_id = {id}"));
    }
    if let Some(watch_id) = filter.watch_id {
        q.push(" and d.watch_id = ").push_bind(watch_id);
    }
    match filter.object.as_deref() {
        Some(prefix) if prefix.ends_with('/') => {
            q.push(" and starts_with(d.object, ")
                .push_bind(prefix)
                .push(")");
        }
        Some(object) => {
            q.push(" and d.object = ").push_bind(object);
        }
        None => {}
    }
    if let Some(since) = filter.since {
        q.push(" and d.created_at >= ").push_bind(since);
    }
    if let Some(until) = filter.until {
        q.push(" and d.created_at < ").push_bind(until);
    }
}

pub async fn delivery(pool: &PgPool, id: i64) -> Result<Option<Delivery>> {
    Ok(sqlx::query_as(&format!(
        "select {DELIVERY_COLUMNS} from watchpump.delivery_log where delivery_id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?)
}

/// `watchpump.message()`: the delivery as the pump sends it.
pub async fn sent(pool: &PgPool, id: i64) -> Result<Option<Sent>> {
    Ok(sqlx::query_as("select * from watchpump.message($1)")
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

pub async fn attempts(pool: &PgPool, delivery_id: i64) -> Result<Vec<Attempt>> {
    Ok(sqlx::query_as(
        "select attempt, repeats, started_at, duration_ms, status, error, response_head, pump
         from watchpump.attempts where delivery_id = $1 order by attempt, id",
    )
    .bind(delivery_id)
    .fetch_all(pool)
    .await?)
}

pub async fn history(pool: &PgPool, delivery_id: i64) -> Result<Vec<Event>> {
    Ok(sqlx::query_as(
        "select at, event, detail from watchpump.delivery_history
         where delivery_id = $1 order by at, seq",
    )
    .bind(delivery_id)
    .fetch_all(pool)
    .await?)
}

/// The most recent failures, across services.
pub async fn newest_failures(pool: &PgPool, limit: i64) -> Result<Vec<Delivery>> {
    let limit = limit.clamp(1, MAX_PAGE);
    // Keyset in two steps like [`page_query`]: the ids through the partial
    // index of failures by time, then each row by key in its day.
    Ok(sqlx::query_as(&newest_failures_query(limit))
        .fetch_all(pool)
        .await?)
}

/// The statement behind [`newest_failures`] (tests check its plan).
pub fn newest_failures_query(limit: i64) -> String {
    format!(
        "with page as (select d.id, d.created_at, d.finished_at from watchpump.settled d
                       where d.state = 'failed' order by d.finished_at desc limit {limit})
         select l.* from page p cross join lateral (
             select {DELIVERY_COLUMNS} from watchpump.delivery_log l
             where l.delivery_id = p.id and l.created_at = p.created_at limit 1) l
         order by p.finished_at desc, p.id desc"
    )
}

pub async fn watches(pool: &PgPool, filter: &WatchFilter) -> Result<Vec<WatchRow>> {
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
        "select watch_id, service, resource, object, filters, created_at, removed_at, removed_reason
         from watchpump.watch_list where true",
    );
    let given = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    if let Some(service) = given(&filter.service) {
        q.push(" and service = ").push_bind(service);
    }
    if let Some(resource) = given(&filter.resource) {
        q.push(" and resource = ").push_bind(resource);
    }
    if let Some(object) = given(&filter.object) {
        q.push(" and object = ").push_bind(object);
    }
    match filter.show.as_deref() {
        Some("live") => {
            q.push(" and live");
        }
        Some("removed") => {
            q.push(" and not live");
        }
        _ => {}
    }
    if let Some(before) = filter.before {
        q.push(" and watch_id < ").push_bind(before);
    }
    let limit = filter.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    q.push(format!(" order by watch_id desc limit {limit}"));
    Ok(q.build_query_as().fetch_all(pool).await?)
}

/// Warnings, newest first, of one service or of all.
pub async fn warnings(pool: &PgPool, service: Option<&str>, limit: i64) -> Result<Vec<Warning>> {
    let limit = limit.clamp(1, MAX_PAGE);
    Ok(sqlx::query_as(&format!(
        "select w.id, s.name as service, w.state, w.failed, w.folded, w.oldest_created_at,
                w.first_failed_at, w.last_failed_at, w.created_at, w.send_after, w.attempts,
                w.next_attempt_at, w.last_status, w.last_error, w.finished_at
         from watchpump.warnings w join watchpump.services s on s.id = w.service_id
         where $1::text is null or s.name = $1
         order by w.id desc limit {limit}"
    ))
    .bind(service)
    .fetch_all(pool)
    .await?)
}

/// `watchpump.retry()`: returns the state the delivery had. Its refusals
/// are [`Error::raised`]: no such delivery, or not in a state to retry.
pub async fn retry(pool: &PgPool, delivery_id: i64, actor: &str) -> Result<String> {
    sqlx::query_scalar("select watchpump.retry($1, $2)")
        .bind(delivery_id)
        .bind(actor)
        .fetch_one(pool)
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
    let n: i32 = sqlx::query_scalar("select watchpump.retry_failed($1, $2, $3)")
        .bind(service)
        .bind(since)
        .bind(actor)
        .fetch_one(pool)
        .await
        .map_err(Error::raised)?;
    Ok(i64::from(n))
}
