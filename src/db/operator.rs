//! The operator's statements (`sql/functions/0600_operator.sql`): the
//! views the panel, the admin API and the CLI read (`backlog`,
//! `delivery_log`, `attempts`, `delivery_history`, `watch_list`), retry,
//! the warnings to notify, and the backlog gauges.
//!
//! The listing pages' statements are in `operator/*.sql`, read by both the
//! macro that checks them and [`explain`], so that tests can read the
//! plan of exactly what runs (`tests/history.rs` does, at volume).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

/// A row of `watchpump.backlog`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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

pub async fn backlog(pool: &PgPool) -> sqlx::Result<Vec<Backlog>> {
    sqlx::query_as!(
        Backlog,
        r#"select service_id as "service_id!", service as "service!", pending as "pending!",
                  in_flight as "in_flight!", due_now as "due_now!", failed_24h as "failed_24h!",
                  extract(epoch from oldest_due_age)::float8 as "oldest_due_age_secs?",
                  last_delivered_at as "last_delivered_at?", last_failed_at as "last_failed_at?",
                  retrying as "retrying!", looks_down as "looks_down!"
           from watchpump.backlog order by service"#
    )
    .fetch_all(pool)
    .await
}

/// A row of `watchpump.delivery_log`, its state as the database writes it
/// (`crate::operator::store::Delivery` is this with a typed state).
#[derive(Debug, Clone)]
pub struct DeliveryRow {
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
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub superseded_by: Option<i64>,
    pub last_action: Option<String>,
}

/// The id of the service named `name`, removed or not.
pub async fn service_id(pool: &PgPool, name: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("select id from watchpump.services where name = $1", name)
        .fetch_optional(pool)
        .await
}

/// What a page of deliveries is restricted to: each field may be absent.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    /// One of the six states (`crate::delivery::State::as_str`).
    pub state: Option<&'a str>,
    pub service_id: Option<i64>,
    pub watch_id: Option<i64>,
    /// An exact object.
    pub object: Option<&'a str>,
    /// Objects starting with this.
    pub object_prefix: Option<&'a str>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// The keyset cursor: the previous page's last delivery.
    pub before: Option<i64>,
    pub limit: i64,
}

/// `operator/page_by_id.sql`: a page by id, newest first; the next page is
/// `id < before`.
pub async fn page_by_id(pool: &PgPool, p: &Page<'_>) -> sqlx::Result<Vec<DeliveryRow>> {
    let mut tx = custom_plans(pool).await?;
    let rows = sqlx::query_file_as!(
        DeliveryRow,
        "src/db/operator/page_by_id.sql",
        p.state,
        p.service_id,
        p.watch_id,
        p.object,
        p.object_prefix,
        p.since,
        p.until,
        p.before,
        p.limit,
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

/// `operator/page_by_time.sql`: a time window's page in creation order,
/// newest first; the next page is what comes after the delivery `before`.
/// Only `since`, `until` (required), `before` and `limit` are read.
pub async fn page_by_time(
    pool: &PgPool,
    until: DateTime<Utc>,
    p: &Page<'_>,
) -> sqlx::Result<Vec<DeliveryRow>> {
    let mut tx = custom_plans(pool).await?;
    let rows = sqlx::query_file_as!(
        DeliveryRow,
        "src/db/operator/page_by_time.sql",
        p.since,
        until,
        p.before,
        p.limit,
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

/// `operator/newest_failures.sql`: the most recent failures, across
/// services.
pub async fn newest_failures(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<DeliveryRow>> {
    let mut tx = custom_plans(pool).await?;
    let rows = sqlx::query_file_as!(DeliveryRow, "src/db/operator/newest_failures.sql", limit)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// A transaction whose statements are planned with their values each time
/// they run (a custom plan), never with the generic plan PostgreSQL may
/// settle on after five runs of a prepared statement: the pages' optional
/// conditions (`$n is null or ...`) then fold away or into constants, and
/// the planner sees which partial index fits, how rare a service is and
/// the limit, as if they were written in. A generic plan would keep one
/// index for every filter (`tests/listing.rs` checks that none is made).
async fn custom_plans(pool: &PgPool) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query!("set local plan_cache_mode = force_custom_plan")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// A statement of this file whose plan tests read.
#[derive(Debug, Clone, Copy)]
pub enum Explained<'a> {
    PageById(Page<'a>),
    PageByTime(DateTime<Utc>, Page<'a>),
    NewestFailures(i64),
}

/// The plan of `statement` with its values bound, as `explain` (e.g.
/// `"explain (costs off)"`) prints it. The one statement here built at
/// run time: EXPLAIN's options come first, then the very text the checked
/// function sends. Sent unnamed, so that its plan is a custom plan, as
/// the function's is ([`custom_plans`]).
pub async fn explain(
    pool: &PgPool,
    explain: &str,
    statement: Explained<'_>,
) -> sqlx::Result<Vec<String>> {
    let sql = match statement {
        Explained::PageById(_) => include_str!("operator/page_by_id.sql"),
        Explained::PageByTime(..) => include_str!("operator/page_by_time.sql"),
        Explained::NewestFailures(_) => include_str!("operator/newest_failures.sql"),
    };
    let sql = format!("{explain} {sql}");
    let query = sqlx::query_scalar(&sql);
    let query = match statement {
        Explained::PageById(p) => query
            .bind(p.state)
            .bind(p.service_id)
            .bind(p.watch_id)
            .bind(p.object)
            .bind(p.object_prefix)
            .bind(p.since)
            .bind(p.until)
            .bind(p.before)
            .bind(p.limit),
        Explained::PageByTime(until, p) => {
            query.bind(p.since).bind(until).bind(p.before).bind(p.limit)
        }
        Explained::NewestFailures(limit) => query.bind(limit),
    };
    query.persistent(false).fetch_all(pool).await
}

/// One delivery, in any state.
pub async fn delivery(pool: &PgPool, id: i64) -> sqlx::Result<Option<DeliveryRow>> {
    sqlx::query_as!(
        DeliveryRow,
        r#"select delivery_id as "delivery_id!", created_at as "created_at!", service as "service!",
                  watch_id as "watch_id!", resource as "resource!", watch_object as "watch_object!",
                  object as "object!", kind as "kind!", change_id as "change_id!",
                  sequence as "sequence!", state as "state!", attempts as "attempts!",
                  next_attempt_at as "next_attempt_at!", deadline as "deadline!",
                  finished_at as "finished_at?", last_status as "last_status?",
                  last_error as "last_error?", superseded_by as "superseded_by?",
                  last_action as "last_action?"
           from watchpump.delivery_log where delivery_id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// `watchpump.message()` (`0500_delivery.sql`): the delivery as the pump
/// sends it, and its service's base URL.
#[derive(Debug, Clone)]
pub struct SentRow {
    pub delivery_id: i64,
    pub change_id: i64,
    pub watch_id: i64,
    pub attempt: i32,
    pub resource: String,
    pub object: String,
    pub kind: String,
    pub sequence: i64,
    pub occurred_at: DateTime<Utc>,
    pub payload: String,
    pub base_url: String,
    pub replay: bool,
}

pub async fn sent(pool: &PgPool, id: i64) -> sqlx::Result<Option<SentRow>> {
    sqlx::query_as!(
        SentRow,
        r#"select delivery_id as "delivery_id!", change_id as "change_id!", watch_id as "watch_id!",
                  attempt as "attempt!", resource as "resource!", object as "object!",
                  kind as "kind!", sequence as "sequence!", occurred_at as "occurred_at!",
                  payload as "payload!", base_url as "base_url!", replay as "replay!"
           from watchpump.message($1)"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// One attempt to send a delivery (`watchpump.attempts`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = AdminAttempt)]
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

pub async fn attempts(pool: &PgPool, delivery_id: i64) -> sqlx::Result<Vec<Attempt>> {
    sqlx::query_as!(
        Attempt,
        r#"select attempt as "attempt!", repeats as "repeats!", started_at as "started_at!",
                  duration_ms as "duration_ms!", status as "status?", error as "error?",
                  response_head as "response_head?", pump as "pump!"
           from watchpump.attempts where delivery_id = $1 order by attempt, id"#,
        delivery_id
    )
    .fetch_all(pool)
    .await
}

/// A row of `watchpump.delivery_history`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub event: String,
    pub detail: Option<String>,
}

pub async fn history(pool: &PgPool, delivery_id: i64) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as!(
        Event,
        r#"select at as "at!", event as "event!", detail as "detail?"
           from watchpump.delivery_history
           where delivery_id = $1 order by at, seq"#,
        delivery_id
    )
    .fetch_all(pool)
    .await
}

/// A row of `watchpump.watch_list`.
#[derive(Debug, Clone, Serialize)]
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

/// What a page of watches is restricted to: each field may be absent.
#[derive(Debug, Clone, Copy)]
pub struct Watches<'a> {
    pub service: Option<&'a str>,
    pub resource: Option<&'a str>,
    pub object: Option<&'a str>,
    /// Live (true) or removed (false) watches only.
    pub live: Option<bool>,
    /// The keyset cursor: the previous page's last watch.
    pub before: Option<i64>,
    pub limit: i64,
}

/// A page of watches, newest first, planned with its values
/// ([`custom_plans`]).
pub async fn watches(pool: &PgPool, w: &Watches<'_>) -> sqlx::Result<Vec<WatchRow>> {
    let mut tx = custom_plans(pool).await?;
    let rows = sqlx::query_as!(
        WatchRow,
        r#"select watch_id as "watch_id!", service as "service!", resource as "resource!",
                  object as "object!", filters as "filters!", created_at as "created_at!",
                  removed_at as "removed_at?", removed_reason as "removed_reason?"
           from watchpump.watch_list
           where ($1::text is null or service = $1)
             and ($2::text is null or resource = $2)
             and ($3::text is null or object = $3)
             and ($4::boolean is null or live = $4)
             and ($5::bigint is null or watch_id < $5)
           order by watch_id desc
           limit $6"#,
        w.service,
        w.resource,
        w.object,
        w.live,
        w.before,
        w.limit,
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

/// A warning to the notify service.
#[derive(Debug, Clone, Serialize)]
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

/// Warnings, newest first, of one service or of all.
pub async fn warnings(
    pool: &PgPool,
    service: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<Warning>> {
    sqlx::query_as!(
        Warning,
        "select w.id, s.name as service, w.state, w.failed, w.folded, w.oldest_created_at,
                w.first_failed_at, w.last_failed_at, w.created_at, w.send_after, w.attempts,
                w.next_attempt_at, w.last_status, w.last_error, w.finished_at
         from watchpump.warnings w join watchpump.services s on s.id = w.service_id
         where $1::text is null or s.name = $1
         order by w.id desc limit $2",
        service,
        limit,
    )
    .fetch_all(pool)
    .await
}

/// `watchpump.retry()`: the state the delivery had. Its refusals are
/// raised (P0002, 55000).
pub async fn retry(pool: &PgPool, delivery_id: i64, actor: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"select watchpump.retry($1, $2) as "previous!""#,
        delivery_id,
        actor
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.retry_failed()`: how many deliveries were requeued.
pub async fn retry_failed(
    pool: &PgPool,
    service: &str,
    since: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"select watchpump.retry_failed($1, $2, $3) as "requeued!""#,
        service,
        since,
        actor
    )
    .fetch_one(pool)
    .await
}

/// What a step of folding did for one service
/// (`watchpump.fold_failures()`).
#[derive(Debug, Clone)]
pub struct Folded {
    pub warning_id: i64,
    pub service: String,
    /// Failures added to the warning.
    pub added: i32,
    /// True when the failures joined a pending warning or opened one held
    /// back by the fold window: they raise no warning of their own now.
    pub folded: bool,
}

/// Drains the failure inbox into warnings, at most one a service per
/// `every_secs`; a warning is retried for as long as a delivery is
/// (`watchpump.delivery_window()`).
pub async fn fold_failures(pool: &PgPool, every_secs: f64) -> sqlx::Result<Vec<Folded>> {
    sqlx::query_as!(
        Folded,
        r#"select f.warning_id as "warning_id!", f.service as "service!", f.added as "added!",
                  not f.opened or w.send_after > now() as "folded!"
           from watchpump.fold_failures(make_interval(secs => $1), watchpump.delivery_window()) f
           join watchpump.warnings w on w.id = f.warning_id"#,
        every_secs
    )
    .fetch_all(pool)
    .await
}

/// A warning as notify receives it.
#[derive(Debug, Clone, Serialize)]
pub struct Due {
    pub warning_id: i64,
    pub service: String,
    pub failed: i32,
    pub folded: i32,
    pub oldest_created_at: DateTime<Utc>,
    pub first_failed_at: DateTime<Utc>,
    pub last_failed_at: DateTime<Utc>,
    #[serde(skip)]
    pub attempts: i32,
}

/// The first `limit` warnings due now, oldest first.
pub async fn due_warnings(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<Due>> {
    sqlx::query_as!(
        Due,
        "select w.id as warning_id, s.name as service, w.failed, w.folded,
                w.oldest_created_at, w.first_failed_at, w.last_failed_at, w.attempts
         from watchpump.warnings w join watchpump.services s on s.id = w.service_id
         where w.state = 'pending' and w.send_after <= now() and w.next_attempt_at <= now()
         order by w.id limit $1",
        limit
    )
    .fetch_all(pool)
    .await
}

/// `watchpump.warning_attempted()`: records one attempt to hand a warning
/// on; its state after (none if the warning is gone).
pub async fn warning_attempted(
    pool: &PgPool,
    warning_id: i64,
    outcome: &str,
    status: Option<i32>,
    error: Option<&str>,
    next: DateTime<Utc>,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "select watchpump.warning_attempted($1, $2, $3, $4, $5)",
        warning_id,
        outcome,
        status,
        error,
        next
    )
    .fetch_one(pool)
    .await
}

/// Takes the operator task's session lock, if no other pump holds it.
pub async fn try_operator_lock(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select pg_try_advisory_lock(hashtext('watchpump.operator')) as "taken!""#
    )
    .fetch_one(conn)
    .await
}

/// Takes the backlog gauges' session lock, if no other pump holds it.
pub async fn try_backlog_lock(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(r#"select pg_try_advisory_lock(hashtext('watchpump.backlog')) as "taken!""#)
        .fetch_one(conn)
        .await
}

/// One service's backlog, as `watchpump.backlog_counts()` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct BacklogCount {
    pub service: String,
    pub pending: i64,
    pub in_flight: i64,
    pub due_now: i64,
    pub failed_24h: i64,
    /// Seconds; 0 when nothing is due.
    pub oldest_due_age: f64,
}

pub async fn backlog_counts(conn: &mut PgConnection) -> sqlx::Result<Vec<BacklogCount>> {
    sqlx::query_as!(
        BacklogCount,
        r#"select service as "service!", pending as "pending!", in_flight as "in_flight!",
                  due_now as "due_now!", failed_24h as "failed_24h!",
                  oldest_due_age as "oldest_due_age!"
           from watchpump.backlog_counts()"#
    )
    .fetch_all(conn)
    .await
}

/// Each live consumer's paused watches and rate
/// (`watchpump.consumer_gauges()`).
pub async fn consumer_gauges(
    conn: &mut PgConnection,
) -> sqlx::Result<Vec<(String, i64, Option<i32>)>> {
    let rows = sqlx::query!(
        r#"select service as "service!", paused_watches as "paused_watches!", rate
           from watchpump.consumer_gauges()"#
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.service, r.paused_watches, r.rate))
        .collect())
}

/// Every service's name, removed or not.
pub async fn service_names(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("select name from watchpump.services")
        .fetch_all(conn)
        .await
}

/// Trace contexts emit() ignored as malformed: a sequence
/// (`0009_trace_context.sql`), read without a lock.
pub async fn trace_context_malformed(conn: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select case when is_called then last_value else 0 end as "malformed!"
           from watchpump.trace_context_malformed"#
    )
    .fetch_one(conn)
    .await
}

/// The W3C `traceparent` the change was emitted under, if any.
pub async fn change_traceparent(pool: &PgPool, change_id: i64) -> sqlx::Result<Option<String>> {
    Ok(sqlx::query_scalar!(
        "select traceparent from watchpump.changes where id = $1",
        change_id
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}

/// The live watch's service: its id and name.
pub async fn live_watch_owner(pool: &PgPool, watch_id: i64) -> sqlx::Result<Option<(i64, String)>> {
    let row = sqlx::query!(
        "select s.id, s.name from watchpump.watches w
         join watchpump.services s on s.id = w.service_id
         where w.id = $1 and w.removed_at is null",
        watch_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.id, r.name)))
}

/// Whether the service is paused, and how many of its live watches are.
pub async fn pauses(pool: &PgPool, service_id: i64) -> sqlx::Result<(bool, i64)> {
    let row = sqlx::query!(
        r#"select s.paused_at is not null as "paused!",
                  (select count(*) from watchpump.watches w
                   where w.service_id = s.id and w.paused_at is not null
                     and w.removed_at is null) as "paused_watches!"
           from watchpump.services s where s.id = $1"#,
        service_id
    )
    .fetch_one(pool)
    .await?;
    Ok((row.paused, row.paused_watches))
}

/// `watchpump.emit()` (`0150_emit.sql`) as the CLI calls it, with no trace
/// context ([`crate::emit::emit`] is the producer's call), and how many
/// deliveries the change made, in the caller's transaction.
pub async fn emit_counted(
    conn: &mut PgConnection,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
) -> sqlx::Result<(i64, i64)> {
    let change_id = sqlx::query_scalar!(
        r#"select watchpump.emit($1, $2, $3) as "change_id!""#,
        object,
        kind,
        payload
    )
    .fetch_one(&mut *conn)
    .await?;
    let deliveries = sqlx::query_scalar!(
        r#"select count(*) as "n!" from watchpump.deliveries where change_id = $1"#,
        change_id
    )
    .fetch_one(conn)
    .await?;
    Ok((change_id, deliveries))
}
