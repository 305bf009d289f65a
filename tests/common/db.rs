//! A database of its own per test on the test cluster, and what tests read
//! from it and stage in it.

use std::time::Duration;

use sqlx::PgPool;
use watchpump::services::Service;
use watchpump::watches::{Filters, NewWatch, Watch};

use super::wait::{check, until};

/// The test cluster's admin URL (`make test` sets it).
pub fn cluster_url() -> String {
    std::env::var("WATCHPUMP_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .expect("WATCHPUMP_TEST_DATABASE_URL: run the tests with `make test`")
}

/// Creates an empty database on the test cluster, named `wp_t_<random>` so
/// that the test run's clean-up drops it, and returns its URL.
pub async fn fresh_database() -> String {
    super::use_test_secret_key();
    let admin = cluster_url();
    let name = format!("wp_t_{:016x}", rand::random::<u64>());
    let admin_pool = watchpump::server::connect(&admin, 1)
        .await
        .expect("connect to the test cluster");
    sqlx::query(&format!("create database {name}"))
        .execute(&admin_pool)
        .await
        .unwrap();
    admin_pool.close().await;
    format!("{}/{name}", admin.rsplit_once('/').unwrap().0)
}

/// An empty database on the test cluster, not migrated.
pub async fn blank_database() -> (String, PgPool) {
    let url = fresh_database().await;
    let pool = watchpump::server::connect(&url, 2).await.unwrap();
    (url, pool)
}

/// A database of its own, migrated, on the test cluster.
pub struct TestDb {
    pub pool: PgPool,
    pub url: String,
    pub name: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let url = fresh_database().await;
        let name = url.rsplit_once('/').unwrap().1.to_string();
        let pool = watchpump::server::connect(&url, 20).await.unwrap();
        watchpump::schema::migrate(&pool).await.unwrap();
        TestDb { pool, url, name }
    }

    pub async fn add_service(&self, name: &str, base_url: &str) -> (Service, String) {
        let registered = watchpump::services::add_within(
            &self.pool,
            name,
            base_url,
            &watchpump::destinations::Destinations::loopback(),
        )
        .await
        .unwrap();
        (registered.service, registered.token)
    }

    pub async fn add_watch(
        &self,
        service_id: i64,
        resource: &str,
        object: &str,
        filters: Filters,
    ) -> Watch {
        let new = NewWatch {
            resource: resource.into(),
            object: object.into(),
            filters,
            resync: false,
        };
        watchpump::watches::create(&self.pool, service_id, &new)
            .await
            .unwrap()
            .0
    }

    /// Emits one change in a transaction of its own, committed.
    pub async fn emit(&self, object: &str, kind: &str, payload: serde_json::Value) -> i64 {
        let mut tx = self.pool.begin().await.unwrap();
        let id = watchpump::emit(&mut tx, object, kind, &payload)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id
    }

    /// Counts deliveries by state, e.g. `count_state("delivered")`.
    pub async fn count_state(&self, state: &str) -> i64 {
        sqlx::query_scalar("select count(*) from watchpump.deliveries where state = $1")
            .bind(state)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn delivery_state(&self, id: i64) -> String {
        sqlx::query_scalar("select state from watchpump.deliveries where id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Waits until delivery `id` is in `state` (panics after `limit`).
    pub async fn wait_state(&self, id: i64, state: &str, limit: Duration) {
        until(limit, &format!("delivery {id} is {state}"), || async {
            let now = self.delivery_state(id).await;
            check(now == state, format!("it is {now}"))
        })
        .await;
    }

    /// Every row watchpump keeps, as text: equal snapshots mean nothing was
    /// inserted, updated or deleted in between.
    pub async fn snapshot(&self) -> String {
        sqlx::query_scalar(
            "select concat_ws(E'\\n',
                (select jsonb_agg(to_jsonb(s) order by s.id) from watchpump.services s)::text,
                (select jsonb_agg(to_jsonb(w) order by w.id) from watchpump.watches w)::text,
                (select jsonb_agg(to_jsonb(d) order by d.id) from watchpump.deliveries d)::text,
                (select jsonb_agg(to_jsonb(c) order by c.id) from watchpump.changes c)::text)",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

/// Filters for every change.
pub fn all() -> Filters {
    Filters::default()
}

pub fn kinds(kinds: &[&str]) -> Filters {
    Filters {
        kinds: Some(kinds.iter().map(|k| k.to_string()).collect()),
        match_path: None,
    }
}

pub fn matching(path: &str) -> Filters {
    Filters {
        kinds: None,
        match_path: Some(path.to_string()),
    }
}

/// Emits one change whose deliveries are retried for `window` only (e.g.
/// '1 second'), so that a failing consumer makes them fail quickly: the
/// delivery window (`watchpump.settings`) is set in the emitting
/// transaction and put back before it commits, so that nothing else sees it.
pub async fn emit_with_window(
    db: &TestDb,
    object: &str,
    kind: &str,
    payload: serde_json::Value,
    window: &str,
) -> i64 {
    let mut tx = db.pool.begin().await.unwrap();
    let before = set_window(&mut tx, window).await;
    let id = watchpump::emit(&mut tx, object, kind, &payload)
        .await
        .unwrap();
    put_window_back(&mut tx, before).await;
    tx.commit().await.unwrap();
    id
}

/// Sets the delivery window in `tx`; returns the one it replaced.
pub async fn set_window(
    tx: &mut sqlx::PgConnection,
    window: &str,
) -> Option<sqlx::postgres::types::PgInterval> {
    sqlx::query_scalar(
        "update watchpump.settings s set delivery_window = $1::interval
         from (select delivery_window from watchpump.settings) old
         returning old.delivery_window",
    )
    .bind(window)
    .fetch_one(&mut *tx)
    .await
    .unwrap()
}

/// Puts back the delivery window [`set_window`] replaced.
pub async fn put_window_back(
    tx: &mut sqlx::PgConnection,
    before: Option<sqlx::postgres::types::PgInterval>,
) {
    sqlx::query("update watchpump.settings set delivery_window = $1")
        .bind(before)
        .execute(&mut *tx)
        .await
        .unwrap();
}

/// The one delivery of a change.
pub async fn delivery_of(db: &TestDb, change_id: i64) -> i64 {
    sqlx::query_scalar("select id from watchpump.deliveries where change_id = $1")
        .bind(change_id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// The watches a change was delivered to, by id.
pub async fn watches_of_change(db: &TestDb, change_id: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "select watch_id from watchpump.deliveries where change_id = $1 order by watch_id",
    )
    .bind(change_id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The ids of deliveries matching a condition on the `watchpump.deliveries`
/// view, e.g. `ids_where(db, "object = 'acme/x'")`.
pub async fn ids_where(db: &TestDb, condition: &str) -> Vec<i64> {
    sqlx::query_scalar(&format!(
        "select id from watchpump.deliveries where {condition} order by id"
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Puts deliveries where a pump would have left them in `state`, for a test
/// that stages a situation: 'pending', or 'in_flight' (leased by pump "p"
/// for an hour), in the queue; 'delivered', 'superseded', 'dropped' or
/// 'failed' in the history, finished (and created, if later)
/// `finished_days_ago` days ago (default now) with at least one attempt.
pub async fn set_state(db: &TestDb, ids: &[i64], state: &str, finished_days_ago: Option<i32>) {
    let ids = ids.to_vec();
    if state == "pending" || state == "in_flight" {
        sqlx::query(
            "select watchpump.requeue(array(select id from watchpump.settled where id = any($1)))",
        )
        .bind(&ids)
        .execute(&db.pool)
        .await
        .unwrap();
        sqlx::query(
            "update watchpump.queue
             set lease_until = case when $2 = 'in_flight' then now() + interval '1 hour' end,
                 leased_by = case when $2 = 'in_flight' then 'p' end,
                 attempts = attempts + case when $2 = 'in_flight' then 1 else 0 end
             where id = any($1)",
        )
        .bind(&ids)
        .bind(state)
        .execute(&db.pool)
        .await
        .unwrap();
        return;
    }
    sqlx::query(
        "select * from watchpump.settle(array(
             select watchpump.settle_as(id, $2) from watchpump.queue where id = any($1) order by id))",
    )
    .bind(&ids)
    .bind(state)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "update watchpump.settled
         set state = $2, attempts = greatest(attempts, 1),
             finished_at = now() - make_interval(days => coalesce($3, 0)),
             -- Created no later than it finished: the history is
             -- partitioned by creation day (0008_storage_v3.sql).
             created_at = least(created_at, now() - make_interval(days => coalesce($3, 0)))
         where id = any($1)",
    )
    .bind(&ids)
    .bind(state)
    .bind(finished_days_ago)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The server process of a connection, to follow it in pg_stat_activity.
pub async fn backend_pid(conn: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Whether server process `pid` is waiting for a lock.
pub async fn waits_for_a_lock(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar(
        "select coalesce(wait_event_type = 'Lock', false) from pg_stat_activity where pid = $1",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}
