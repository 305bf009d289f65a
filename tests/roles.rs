//! Least privilege (issue 17 item 8): the group roles of `sql/roles.sql`,
//! applied by `migrate`, each granted to a login role of this test and used
//! over a real connection as that role: the inspector reads the views and
//! gets 42501 on secrets, payloads and emit(); the operator retries; the
//! emitter emits and reads nothing; the pump role runs `migrate` and a pump
//! that delivers.
//!
//! Roles are cluster-wide: the login roles are named per test run and
//! dropped at the end.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::PgPool;

const LIMIT: Duration = Duration::from_secs(20);

/// A login role of its own, member of `group`, connected to `db`; dropped
/// by [`LoginRole::drop_role`].
struct LoginRole {
    name: String,
    pool: PgPool,
}

impl LoginRole {
    async fn new(db: &TestDb, group: &str) -> LoginRole {
        let name = format!("wp_t_{group}_{:08x}", rand::random::<u32>());
        sqlx::raw_sql(&format!(
            "create role {name} login; grant {group} to {name};"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
        // The test cluster trusts local connections: the role's name is
        // the whole of its credentials here.
        let (base, rest) = db.url.split_once("://").unwrap();
        let host_and_db = rest.split_once('@').unwrap().1;
        let url = format!("{base}://{name}@{host_and_db}");
        let pool = watchpump::server::connect(&url, 4).await.unwrap();
        LoginRole { name, pool }
    }

    async fn drop_role(self, db: &TestDb) {
        self.pool.close().await;
        sqlx::raw_sql(&format!("drop owned by {0}; drop role {0};", self.name))
            .execute(&db.pool)
            .await
            .unwrap();
    }

    /// The SQLSTATE `sql` fails with, or "ok".
    async fn try_sql(&self, sql: &str) -> String {
        match sqlx::raw_sql(sql).execute(&self.pool).await {
            Ok(_) => "ok".into(),
            Err(sqlx::Error::Database(e)) => e.code().unwrap_or_default().into_owned(),
            Err(e) => panic!("{sql}: {e}"),
        }
    }
}

#[tokio::test]
async fn migrate_defines_the_four_group_roles_without_login() {
    let db = TestDb::new().await;
    let roles: Vec<(String, bool)> = sqlx::query_as(
        "select rolname::text, rolcanlogin from pg_roles where rolname like 'watchpump\\_%' order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let names: Vec<&str> = roles.iter().map(|(n, _)| n.as_str()).collect();
    for role in watchpump::schema::ROLES {
        assert!(names.contains(&role), "{role} missing: {names:?}");
    }
    assert!(roles.iter().all(|(_, login)| !login), "{roles:?}");
    assert!(watchpump::schema::missing_roles(&db.pool)
        .await
        .unwrap()
        .is_empty());
    // Idempotent: a second run changes nothing and fails on nothing.
    watchpump::schema::migrate(&db.pool).await.unwrap();
}

#[tokio::test]
async fn the_inspector_reads_the_views_and_gets_42501_on_secrets_payloads_and_emit() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "web", "acme/", all()).await;
    db.emit("acme/1", "push", json!({ "secret": "payload" }))
        .await;
    let ada = LoginRole::new(&db, "watchpump_inspector").await;

    for view in [
        "backlog",
        "delivery_log",
        "delivery_history",
        "watch_list",
        "deliveries",
        "attempts",
        "warnings",
    ] {
        assert_eq!(
            ada.try_sql(&format!("select * from watchpump.{view}"))
                .await,
            "ok",
            "{view}"
        );
    }
    let service_row: (String, i64) =
        sqlx::query_as("select service, pending from watchpump.backlog")
            .fetch_one(&ada.pool)
            .await
            .unwrap();
    assert_eq!(service_row, ("deploy".into(), 1));
    let logged: i64 = sqlx::query_scalar("select count(*) from watchpump.delivery_log")
        .fetch_one(&ada.pool)
        .await
        .unwrap();
    assert_eq!(logged, 1);

    for refused in [
        "select signing_secret from watchpump.services",
        "select previous_signing_secret from watchpump.services",
        "select token_hash from watchpump.services",
        "select payload from watchpump.changes",
        "select watchpump.emit('acme/2', 'push', '{}')",
        "select watchpump.retry(1)",
        "update watchpump.services set base_url = 'http://127.0.0.1:1'",
    ] {
        assert_eq!(ada.try_sql(refused).await, "42501", "{refused}");
    }
    ada.drop_role(&db).await;
}

#[tokio::test]
async fn the_operator_retries_and_the_emitter_emits_and_neither_reads_secrets() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "web", "acme/", all()).await;
    let change = db.emit("acme/1", "push", json!({})).await;
    let id = delivery_of(&db, change).await;
    set_state(&db, &[id], "failed", None).await;

    let operator = LoginRole::new(&db, "watchpump_operator").await;
    let was: String = sqlx::query_scalar("select watchpump.retry($1)")
        .bind(id)
        .fetch_one(&operator.pool)
        .await
        .unwrap();
    assert_eq!(was, "failed");
    assert_eq!(db.delivery_state(id).await, "pending");
    let actor: String = sqlx::query_scalar(
        "select actor from watchpump.actions where delivery_id = $1 order by id desc limit 1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        actor,
        format!("sql:{}", operator.name),
        "the operator, not the owner"
    );
    assert_eq!(
        operator
            .try_sql("select watchpump.retry_failed('deploy', now() - interval '1 day')")
            .await,
        "ok"
    );
    assert_eq!(
        operator
            .try_sql("select * from watchpump.delivery_log")
            .await,
        "ok"
    );
    for refused in [
        "select signing_secret from watchpump.services",
        "select payload from watchpump.changes",
        "select watchpump.emit('acme/2', 'push', '{}')",
    ] {
        assert_eq!(operator.try_sql(refused).await, "42501", "{refused}");
    }

    // emit() runs as its owner: the emitter writes the change and its
    // delivery without a grant on either table.
    let emitter = LoginRole::new(&db, "watchpump_emitter").await;
    let mut tx = emitter.pool.begin().await.unwrap();
    let emitted = watchpump::emit(&mut tx, "acme/2", "push", &json!({ "n": 2 })).await;
    tx.commit().await.unwrap();
    let emitted = emitted.unwrap();
    assert_eq!(watches_of_change(&db, emitted).await.len(), 1);
    for refused in [
        "select * from watchpump.changes",
        "select * from watchpump.delivery_log",
        "select signing_secret from watchpump.services",
        "select watchpump.retry(1)",
        "insert into watchpump.changes (object, kind, payload) values ('x', 'y', '{}')",
    ] {
        assert_eq!(emitter.try_sql(refused).await, "42501", "{refused}");
    }
    // The function's search_path is fixed: a caller's own schema cannot
    // stand in for pg_catalog's or watchpump's objects.
    let config: Vec<String> = sqlx::query_scalar(
        "select unnest(proconfig) from pg_proc where proname = 'emit'
         and pronamespace = 'watchpump'::regnamespace",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        config.contains(&"search_path=pg_catalog, watchpump, pg_temp".to_string()),
        "{config:?}"
    );
    operator.drop_role(&db).await;
    emitter.drop_role(&db).await;
}

#[tokio::test]
async fn the_pump_role_runs_migrate_and_a_pump_that_delivers() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "web", "acme/", all()).await;

    let pump_role = LoginRole::new(&db, "watchpump_pump").await;
    // `serve` migrates at start: with nothing to apply, the pump role may.
    watchpump::schema::migrate(&pump_role.pool).await.unwrap();
    let pump = RunningPump::start(&pump_role.pool, pump_config());
    db.emit("acme/1", "push", json!({})).await;
    consumer.wait_for(1, LIMIT).await;
    pump.stop().await.unwrap();
    assert_eq!(
        pump_role.try_sql("create table watchpump.x (a int)").await,
        "42501"
    );
    pump_role.drop_role(&db).await;
}

#[tokio::test]
async fn an_owner_without_createrole_migrates_and_grants_to_roles_a_dba_made() {
    // The roles exist in the test cluster (every migrate of a superuser
    // makes them), as after a DBA ran sql/roles.sql. The producer's own
    // role, which may not create roles, owns a database and migrates it.
    let admin = TestDb::new().await;
    let owner = format!("wp_t_owner_{:08x}", rand::random::<u32>());
    let database = format!("wp_t_{:016x}", rand::random::<u64>());
    for sql in [
        format!("create role {owner} login nocreaterole"),
        format!("create database {database} owner {owner}"),
    ] {
        sqlx::query(&sql).execute(&admin.pool).await.unwrap();
    }
    let (base, rest) = admin.url.split_once("://").unwrap();
    let host = rest.split_once('@').unwrap().1.rsplit_once('/').unwrap().0;
    let url = format!("{base}://{owner}@{host}/{database}");
    let pool = watchpump::server::connect(&url, 2).await.unwrap();
    watchpump::schema::migrate(&pool).await.unwrap();

    let granted: Vec<String> = sqlx::query_scalar(
        "select table_name::text from information_schema.role_table_grants
         where grantee = 'watchpump_inspector' order by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        granted.contains(&"backlog".to_string()) && granted.contains(&"delivery_log".to_string()),
        "{granted:?}"
    );
    let definer: Vec<(String, bool)> = sqlx::query_as(
        "select proname::text, prosecdef from pg_proc
         where pronamespace = 'watchpump'::regnamespace and proname in ('emit', 'retry', 'retry_failed')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(definer.len(), 3);
    assert!(definer.iter().all(|(_, d)| *d), "{definer:?}");
    pool.close().await;
    for sql in [
        format!("drop database {database} with (force)"),
        format!("drop role {owner}"),
    ] {
        sqlx::query(&sql).execute(&admin.pool).await.unwrap();
    }
}

/// A pump that starts while another pump's operator task makes and retires
/// days of history grants on every table of the schema (`sql/roles.sql`).
/// A GRANT that meets a table being created or dropped fails ("tuple
/// concurrently updated"), and a pump whose start-up fails exits: a chaos
/// run in CI lost a pump so. The grants and the partition makers therefore
/// take turns on prune()'s lock; here `migrate` runs again and again beside
/// days made and retired, and never fails.
#[tokio::test]
async fn migrate_beside_days_made_and_retired_never_fails() {
    let db = TestDb::new().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (pool, stop) = (db.pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut retired = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                // A day 40 days ago, made as add_partitions_ahead() makes
                // days, then retired by prune() (it is past retention).
                let made = sqlx::query(
                    "select watchpump.add_partition(t, d, d + interval '1 day')
                     from unnest(array['changes', 'settled', 'attempt_log']) t,
                          (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                                  - interval '40 days' as d) day
                     where not exists (select from watchpump.partitions p
                                       where p.parent = t and p.from_at = d)",
                )
                .execute(&pool)
                .await;
                let pruned = sqlx::query("select * from watchpump.prune('7 days', '30 days', 500)")
                    .execute(&pool)
                    .await;
                let gone: Result<bool, _> = sqlx::query_scalar(
                    "select not exists (select from watchpump.partitions p
                                        where p.from_at < now() - interval '39 days')",
                )
                .fetch_one(&pool)
                .await;
                if made.is_ok() && pruned.is_ok() && gone.is_ok_and(|gone| gone) {
                    retired += 1;
                }
            }
            retired
        })
    };
    for round in 0..150 {
        if let Err(e) = watchpump::schema::migrate(&db.pool).await {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            panic!("migrate {round} failed beside days made and retired: {e}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let retired = churn.await.unwrap();
    assert!(retired > 0, "no day was made and retired meanwhile");
    eprintln!("{retired} days made and retired beside 150 runs of migrate");
}
