//! Least privilege (issue 17 item 8, issue 34): the group roles of
//! `sql/roles.sql`, applied by `migrate`, each granted to a login role of
//! this test and used over a real connection as that role: the inspector
//! reads the views and gets 42501 on secrets, payloads and emit(); the
//! operator retries; the emitter emits and reads nothing; the pump role
//! runs `migrate`, a pump that delivers, the operator task and a
//! redelivery. Each role tries every write and every call in the schema,
//! and may do exactly what docs/operator.md's roles table says, which is
//! checked against the database's grants. The pump role cannot make
//! `prune()`, which runs as the owner, run its SQL or drop a table it names
//! (issue 34, item 1).
//!
//! Roles are cluster-wide: the login roles are named per test run and
//! dropped at the end.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::PgPool;
use watchpump::schema::ROLES;

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
        outcome(sql, sqlx::raw_sql(sql).execute(&self.pool).await)
    }

    /// [`LoginRole::try_sql`] in a transaction rolled back after it, so
    /// that a write or a call that is allowed changes nothing.
    async fn try_rolled_back(&self, sql: &str) -> String {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::raw_sql("set local statement_timeout = '10s'")
            .execute(&mut *tx)
            .await
            .unwrap();
        let result = sqlx::raw_sql(sql).execute(&mut *tx).await;
        tx.rollback().await.unwrap();
        outcome(sql, result)
    }
}

/// "ok", or the SQLSTATE of a database error.
fn outcome<T>(sql: &str, result: Result<T, sqlx::Error>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(sqlx::Error::Database(e)) => e.code().unwrap_or_default().into_owned(),
        Err(e) => panic!("{sql}: {e}"),
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

/// What `serve` does, as the pump role alone (sql/roles.sql grants it no
/// more than that): `migrate` with nothing to apply, a pump that delivers
/// and lets a delivery fail (settle(), stage_failed()), the operator task
/// (warnings, prune()) and a consumer's redelivery (redeliver() locks the
/// settled row, which needs update on it).
#[tokio::test]
async fn the_pump_role_runs_migrate_a_pump_the_operator_task_and_a_redelivery() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "web", "acme/", all()).await;
    let down = Receiver::start().await;
    down.reply_with(500);
    let (broken, _) = db.add_service("broken", &down.base_url()).await;
    db.add_watch(broken.id, "web", "down/", all()).await;

    let pump_role = LoginRole::new(&db, "watchpump_pump").await;
    // `serve` migrates at start: with nothing to apply, the pump role may.
    watchpump::schema::migrate(&pump_role.pool).await.unwrap();
    let pump = RunningPump::start(&pump_role.pool, pump_config());
    db.emit("acme/1", "push", json!({})).await;
    consumer.wait_for(1, LIMIT).await;
    let change = emit_with_window(&db, "down/1", "push", json!({}), "1 second").await;
    let failed = delivery_of(&db, change).await;
    db.wait_state(failed, "failed", LIMIT).await;
    pump.stop().await.unwrap();

    let worker = watchpump::operator::worker::Worker::new(
        pump_role.pool.clone(),
        watchpump::operator::OperatorConfig::new(),
        &pump_config(),
        "http://127.0.0.1:9/panel",
    )
    .unwrap();
    let step = worker.step().await.unwrap();
    assert_eq!(
        step.handed.len(),
        1,
        "the failure became a warning, logged: {step:?}"
    );
    worker.prune().await.unwrap();
    let previous: String =
        sqlx::query_scalar("select watchpump.redeliver($1, $2, 'consumer broken')")
            .bind(broken.id)
            .bind(failed)
            .fetch_one(&pump_role.pool)
            .await
            .unwrap();
    assert_eq!(previous, "failed");
    assert_eq!(db.delivery_state(failed).await, "pending");
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

// ---------------------------------------------------------------------------
// Each role's rights: docs/operator.md's table, the database's grants, and
// what each role can really do (issue 34, items 2-4).
// ---------------------------------------------------------------------------

/// Functions the roles table names that this branch's schema may lack:
/// `emit_many()` comes with `sql/functions/0150_emit.sql` on main (issue
/// 34). A name here that the database has is checked like any other.
const NOT_YET: &[&str] = &["emit_many"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Schema,
    Table,
    View,
    Sequence,
    Function,
}

/// The rights of each role of [`ROLES`], in that order.
type Rights = [BTreeSet<String>; 4];

/// docs/operator.md's roles table: for each object it names, what each
/// role may do. Its header names the roles, in the order of [`ROLES`].
fn documented_rights() -> BTreeMap<(Kind, String), Rights> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operator.md");
    let text = std::fs::read_to_string(path).unwrap();
    let header = format!(
        "| object | {} |",
        ROLES.map(|r| format!("`{r}`")).join(" | ")
    );
    let mut lines = text
        .lines()
        .skip_while(|l| *l != header)
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .peekable();
    assert!(
        lines.peek().is_some(),
        "docs/operator.md has no roles table headed {header}"
    );
    let mut documented = BTreeMap::new();
    for line in lines {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 5, "a row of the roles table: {line}");
        let kind = match cells[0].split_whitespace().next().unwrap() {
            "schema" => Kind::Schema,
            "table" | "tables" => Kind::Table,
            "view" | "views" => Kind::View,
            "sequence" | "sequences" => Kind::Sequence,
            "function" | "functions" => Kind::Function,
            other => panic!("the roles table's row of {other:?}: {line}"),
        };
        let rights: Rights = std::array::from_fn(|i| {
            let cell = cells[i + 1];
            if cell == "—" {
                BTreeSet::new()
            } else {
                cell.split(',').map(|r| r.trim().to_string()).collect()
            }
        });
        for name in cells[0].split('`').skip(1).step_by(2) {
            let name = name.trim_end_matches("()").to_string();
            let again = documented.insert((kind, name.clone()), rights.clone());
            assert!(again.is_none(), "{name} is in the roles table twice");
        }
    }
    documented
}

/// Every object of the `watchpump` schema (the partitions of the history
/// aside), and what the database lets each role of [`ROLES`] do to it
/// (`has_*_privilege`, which counts what PUBLIC may do too). A function is
/// every overload of its name; overloads granted differently are listed
/// in the second result.
async fn granted_rights(pool: &PgPool) -> (BTreeMap<(Kind, String), Rights>, Vec<String>) {
    let rows: Vec<(String, String, String, String, bool, bool)> = sqlx::query_as(
        "with object as (
             select 'schema' as kind, 'watchpump' as name, null::oid as oid
             union all
             select case c.relkind when 'v' then 'view' when 'S' then 'sequence' else 'table' end,
                    c.relname, c.oid
             from pg_class c
             where c.relnamespace = 'watchpump'::regnamespace and c.relkind in ('r', 'p', 'v', 'S')
               and not c.relispartition
             union all
             select 'function', p.proname, p.oid
             from pg_proc p where p.pronamespace = 'watchpump'::regnamespace
         )
         select o.kind, o.name::text, r.role, x.privilege,
                bool_or(case o.kind
                            when 'schema' then has_schema_privilege(r.role, 'watchpump', x.privilege)
                            when 'sequence' then has_sequence_privilege(r.role, o.oid, x.privilege)
                            when 'function' then has_function_privilege(r.role, o.oid, x.privilege)
                            else has_table_privilege(r.role, o.oid, x.privilege) end),
                bool_and(case o.kind
                             when 'schema' then has_schema_privilege(r.role, 'watchpump', x.privilege)
                             when 'sequence' then has_sequence_privilege(r.role, o.oid, x.privilege)
                             when 'function' then has_function_privilege(r.role, o.oid, x.privilege)
                             else has_table_privilege(r.role, o.oid, x.privilege) end)
         from object o
         cross join unnest($1::text[]) r(role)
         cross join lateral unnest(case o.kind
                                       when 'schema' then array['usage', 'create']
                                       when 'sequence' then array['usage', 'select', 'update']
                                       when 'function' then array['execute']
                                       else array['select', 'insert', 'update', 'delete', 'truncate',
                                                  'references', 'trigger'] end) x(privilege)
         group by o.kind, o.name, r.role, x.privilege",
    )
    .bind(ROLES)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut granted: BTreeMap<(Kind, String), Rights> = BTreeMap::new();
    let mut uneven = Vec::new();
    for (kind, name, role, right, any, all) in rows {
        let kind = match kind.as_str() {
            "schema" => Kind::Schema,
            "view" => Kind::View,
            "sequence" => Kind::Sequence,
            "function" => Kind::Function,
            _ => Kind::Table,
        };
        let i = ROLES.iter().position(|r| *r == role).unwrap();
        let rights = granted.entry((kind, name.clone())).or_default();
        if any {
            rights[i].insert(right.clone());
        }
        if any != all {
            uneven.push(format!(
                "{role} may {right} some overloads of {name}() and not others"
            ));
        }
    }
    (granted, uneven)
}

/// The partitions of the history (days, kept days, DEFAULT partitions and
/// the staged tables' kept tables), which no role is granted anything on.
async fn partitions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "select c.relname::text from pg_class c
         where c.relnamespace = 'watchpump'::regnamespace and c.relispartition order by 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn shown(rights: &BTreeSet<String>) -> String {
    if rights.is_empty() {
        "—".into()
    } else {
        rights.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

#[tokio::test]
async fn operator_md_roles_table_is_what_the_database_grants() {
    let db = TestDb::new().await;
    let documented = documented_rights();
    let (granted, mut wrong) = granted_rights(&db.pool).await;
    for ((kind, name), rights) in &granted {
        match documented.get(&(*kind, name.clone())) {
            None => wrong.push(format!(
                "{kind:?} {name} is not in docs/operator.md's roles table (add a row, or it to a row)"
            )),
            Some(said) => {
                for (i, role) in ROLES.iter().enumerate() {
                    if said[i] != rights[i] {
                        wrong.push(format!(
                            "{kind:?} {name}: docs/operator.md says {role} may {}, the database grants {}",
                            shown(&said[i]),
                            shown(&rights[i])
                        ));
                    }
                }
            }
        }
    }
    for (kind, name) in documented.keys() {
        if !granted.contains_key(&(*kind, name.clone())) && !NOT_YET.contains(&name.as_str()) {
            wrong.push(format!(
                "docs/operator.md's roles table names {kind:?} {name}, which the schema does not have"
            ));
        }
    }
    // The partitions are nobody's: the pump reaches them through their parent.
    let partitions = partitions(&db.pool).await;
    assert!(
        partitions.contains(&"settled_kept".to_string()),
        "{partitions:?}"
    );
    for partition in &partitions {
        let rights: Vec<String> = sqlx::query_scalar(
            "select r.role || ' may ' || x.privilege
             from unnest($1::text[]) r(role),
                  unnest(array['select', 'insert', 'update', 'delete', 'truncate', 'references',
                               'trigger']) x(privilege)
             where has_table_privilege(r.role, ('watchpump.' || quote_ident($2))::regclass, x.privilege)",
        )
        .bind(ROLES)
        .bind(partition)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        wrong.extend(
            rights
                .into_iter()
                .map(|r| format!("{r} partition {partition}")),
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A relation of the schema as a test writes it: its quoted name, its first
/// column that a statement may set (quoted; not an identity column), whether
/// it is a view, and whether it is a partition.
async fn relations(pool: &PgPool) -> Vec<(String, String, bool, bool)> {
    sqlx::query_as(
        "select quote_ident(c.relname), quote_ident(a.attname), c.relkind = 'v', c.relispartition
         from pg_class c
         cross join lateral (
             select x.attname from pg_attribute x
             where x.attrelid = c.oid and x.attnum > 0 and not x.attisdropped
               and x.attidentity = '' and x.attgenerated = ''
             order by x.attnum limit 1) a
         where c.relnamespace = 'watchpump'::regnamespace and c.relkind in ('r', 'p', 'v')
         order by c.relname",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Every function of the schema, once per overload: its name and a call of
/// it with null arguments. The arguments come from a subquery that the
/// planner may not fold into the call (`offset 0`), so that a STRICT
/// function is called (and its EXECUTE right checked) rather than folded
/// to null.
async fn function_calls(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as(
        "select p.proname::text,
                format('select watchpump.%I(%s) from (select %s offset 0) a', p.proname,
                       coalesce(string_agg('a.a' || x.n, ', ' order by x.n), ''),
                       coalesce(string_agg(format('null::%s as a%s', format_type(x.t, null), x.n), ', '
                                           order by x.n) filter (where x.n is not null), '1 as none'))
         from pg_proc p
         left join lateral unnest(p.proargtypes::oid[]) with ordinality x(t, n) on true
         where p.pronamespace = 'watchpump'::regnamespace
         group by p.oid, p.proname
         order by p.proname, p.oid",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Logs in as each role and tries every write (and read) of every table
/// and view of the schema, and every function: what docs/operator.md's
/// table grants the role succeeds (a write `where false`, which changes
/// nothing; a call reaches the function, which may refuse its null
/// arguments), and everything else is 42501. The pump's writes and calls
/// are then checked against what must stay the owner's.
#[tokio::test]
async fn each_role_writes_and_calls_exactly_what_operator_md_grants_it() {
    let db = TestDb::new().await;
    let documented = documented_rights();
    let relations = relations(&db.pool).await;
    let calls = function_calls(&db.pool).await;
    let may = |kind: Kind, name: &str, role: usize, right: &str| {
        documented
            .get(&(kind, name.trim_matches('"').to_string()))
            .is_some_and(|rights| rights[role].contains(right))
    };
    let mut wrong = Vec::new();
    let mut could: BTreeMap<&str, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for (role, group) in ROLES.iter().enumerate() {
        let login = LoginRole::new(&db, group).await;
        let (writes, calls_made) = could.entry(*group).or_default();
        for (table, column, view, partition) in &relations {
            let mut attempts = vec![(
                "select",
                format!("select count(*) from watchpump.{table} where false"),
            )];
            if !view {
                attempts.extend([
                    (
                        "insert",
                        format!("insert into watchpump.{table} ({column}) select null where false"),
                    ),
                    (
                        "update",
                        format!("update watchpump.{table} set {column} = null where false"),
                    ),
                    (
                        "delete",
                        format!("delete from watchpump.{table} where false"),
                    ),
                ]);
            }
            for (right, sql) in attempts {
                let kind = if *view { Kind::View } else { Kind::Table };
                let allowed = !partition && may(kind, table, role, right);
                let got = login.try_rolled_back(&sql).await;
                if got == "ok" && right != "select" {
                    writes.insert(format!("{right} {}", table.trim_matches('"')));
                }
                let expected = if allowed { "ok" } else { "42501" };
                if got != expected {
                    wrong.push(format!("{group}: {sql}: {got}, not {expected}"));
                }
            }
        }
        for (function, call) in &calls {
            let allowed = may(Kind::Function, function, role, "execute");
            let got = login.try_rolled_back(call).await;
            if got != "42501" {
                calls_made.insert(function.clone());
            }
            if allowed == (got == "42501") {
                wrong.push(format!(
                    "{group}: {call}: {got}, {}",
                    if allowed {
                        "refused though granted"
                    } else {
                        "not 42501"
                    }
                ));
            }
        }
        login.drop_role(&db).await;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // What least privilege means for each, whatever the table says.
    let none = BTreeSet::new();
    for reader in [
        "watchpump_inspector",
        "watchpump_operator",
        "watchpump_emitter",
    ] {
        assert_eq!(could[reader].0, none, "{reader} writes no table itself");
    }
    // The one function a reader of the views calls: in_flight(), which the
    // views call (PostgreSQL checks a view's functions against whoever
    // reads it, not the view's owner), an expression that reads nothing.
    let views_call = BTreeSet::from(["in_flight".to_string()]);
    assert_eq!(could["watchpump_inspector"].1, views_call);
    assert_eq!(
        could["watchpump_operator"].1,
        BTreeSet::from([
            "in_flight".to_string(),
            "retry".to_string(),
            "retry_failed".to_string()
        ])
    );
    let emitter: Vec<&str> = could["watchpump_emitter"]
        .1
        .iter()
        .map(String::as_str)
        .collect();
    assert!(
        emitter == ["emit"] || emitter == ["emit", "emit_many"],
        "the emitter calls emit() and emit_many() alone: {emitter:?}"
    );
    let (pump_writes, pump_calls) = &could["watchpump_pump"];
    for owner_only in [
        "partitions",
        "kinds",
        "settings",
        "schema_migrations",
        "settled_kept",
    ] {
        assert!(
            !pump_writes
                .iter()
                .any(|w| w.ends_with(&format!(" {owner_only}"))),
            "the pump writes {owner_only}: {pump_writes:?}"
        );
    }
    for owner_only in [
        "emit",
        "add_partition",
        "add_partitions_ahead",
        "make_partition_table",
        "retire_partitions",
        "keep_what_retention_keeps",
        "retire_into_default",
    ] {
        assert!(
            !pump_calls.contains(owner_only),
            "the pump calls {owner_only}()"
        );
    }
    assert!(pump_writes.contains("insert queue") && pump_calls.contains("claim"));
}

/// The escalation of issue 34, item 1, as the pump role: prune() runs as the
/// owner and made each day's partitions from SQL text in
/// watchpump.partition_templates, which the pump role could update; and it
/// locked, detached and dropped the tables that watchpump.partitions named,
/// which the pump role could write.
#[tokio::test]
async fn the_pump_role_cannot_make_prune_run_its_sql_or_retire_a_table_it_names() {
    let db = TestDb::new().await;
    let pump = LoginRole::new(&db, "watchpump_pump").await;
    let superuser = |pool: PgPool, name: String| async move {
        sqlx::query_scalar::<_, bool>("select rolsuper from pg_roles where rolname = $1")
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    // The templates are gone...
    assert_eq!(
        pump.try_sql("update watchpump.partition_templates set indexes = indexes")
            .await,
        "42P01"
    );
    // ...and a table of that name that the pump role may write, as it could
    // write the old one, is not read: its SQL would make the role a
    // superuser when prune() makes the next day.
    sqlx::raw_sql(
        "create table watchpump.partition_templates (
             parent text primary key, key text not null, storage text not null, indexes text[] not null);
         insert into watchpump.partition_templates values
             ('changes', 'occurred_at', 'fillfactor = 100', array['create unique index on watchpump.%I (id)']),
             ('settled', 'created_at', 'fillfactor = 100', array['create unique index on watchpump.%I (id)']),
             ('attempt_log', 'started_at', 'fillfactor = 90', array['create index on watchpump.%I (delivery_id)']);
         grant select, update on watchpump.partition_templates to watchpump_pump;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let payload = format!(
        "create index on watchpump.%I (id); alter role {} superuser",
        pump.name
    );
    sqlx::query("update watchpump.partition_templates set indexes = indexes || $1")
        .bind(&payload)
        .execute(&pump.pool)
        .await
        .unwrap();
    // The last day ahead goes, so that the pump's prune() makes it again.
    let last: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "select name, from_at from watchpump.partitions
         where from_at = (select max(from_at) from watchpump.partitions)",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(last.len(), 3, "{last:?}");
    for (name, _) in &last {
        sqlx::raw_sql(&format!(
            "drop table watchpump.{name}, watchpump.{name}_kept;
             delete from watchpump.partitions where name = '{name}';"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    assert_eq!(pump.try_sql("select * from watchpump.prune()").await, "ok");
    assert!(!superuser(db.pool.clone(), pump.name.clone()).await);
    let indexes: Vec<(String, i64)> = sqlx::query_as(
        "select p.parent, count(i.indexrelid)
         from watchpump.partitions p
         left join pg_index i on i.indrelid = ('watchpump.' || quote_ident(p.name))::regclass
         where p.from_at = $1 group by p.parent order by 1",
    )
    .bind(last[0].1)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            ("attempt_log".into(), 1),
            ("changes".into(), 2),
            ("settled".into(), 9)
        ],
        "the day made again has make_partition_table()'s indexes, not the table's"
    );
    sqlx::raw_sql("drop table watchpump.partition_templates")
        .execute(&db.pool)
        .await
        .unwrap();

    // The pump role may not write the rows retention acts on.
    for refused in [
        "insert into watchpump.partitions (name, parent, from_at, to_at)
         values ('services', 'settled', '2000-01-01', '2000-01-02')",
        "update watchpump.partitions set to_at = from_at - interval '400 days'",
        "delete from watchpump.partitions",
    ] {
        assert_eq!(pump.try_sql(refused).await, "42501", "{refused}");
    }

    // Rows that got in some other way (by hand, or written before 0021 by
    // a pump role that could) are refused by their shape before anything is
    // locked or dropped, constraints or not.
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    sqlx::raw_sql(
        "alter table watchpump.partitions drop constraint partitions_name_shape,
                                          drop constraint partitions_parent_check,
                                          drop constraint partitions_range_forwards;
         select watchpump.add_partition(t, '2000-02-01', '2000-02-02')
         from unnest(array['changes', 'settled', 'attempt_log']) t;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    for (crafted, named) in [
        // A table that is no partition at all.
        (
            "insert into watchpump.partitions (name, parent, from_at, to_at)
             values ('services', 'settled', '2000-01-01', '2000-01-02')",
            "'services'",
        ),
        // Another table's partition: attempt_log's DEFAULT one.
        (
            "insert into watchpump.partitions (name, parent, from_at, to_at)
             values ('attempt_log_kept', 'settled', '2000-01-01', '2000-01-02')",
            "'attempt_log_kept'",
        ),
        // A real day whose range was made to run backwards.
        (
            "update watchpump.partitions set to_at = '2000-01-01' where name = 'settled_20000201'",
            "'settled_20000201'",
        ),
    ] {
        sqlx::raw_sql(crafted).execute(&db.pool).await.unwrap();
        let refused = sqlx::query("select * from watchpump.prune()")
            .execute(&pump.pool)
            .await
            .unwrap_err();
        let refused = refused.as_database_error().unwrap();
        assert_eq!(
            refused.code().as_deref(),
            Some("42602"),
            "{crafted}: {refused}"
        );
        assert!(refused.message().contains(named), "{refused}");
        sqlx::raw_sql(
            "delete from watchpump.partitions where from_at = '2000-01-01' and name <> 'settled_20000201';
             update watchpump.partitions set to_at = '2000-02-02' where name = 'settled_20000201';",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        // Nothing was dropped, and nothing ran as the owner for the pump.
        let still: Vec<i64> = sqlx::query_scalar("select id from watchpump.services")
            .fetch_all(&db.pool)
            .await
            .unwrap();
        assert_eq!(still, [service.id], "{crafted}");
        let tables: i64 = sqlx::query_scalar(
            "select count(*) from pg_class
             where relnamespace = 'watchpump'::regnamespace
               and relname in ('settled_20000201', 'changes_20000201', 'attempt_log_20000201',
                               'attempt_log_kept')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(tables, 4, "{crafted}");
        assert!(!superuser(db.pool.clone(), pump.name.clone()).await);
    }
    pump.drop_role(&db).await;
}

/// A database upgraded to 0021_owner_code.sql with rows in
/// watchpump.partitions that watchpump did not write (a pump's role could
/// write the table before) stops the migration, naming the rows, rather
/// than as a bare constraint violation.
#[tokio::test]
async fn migration_0021_names_the_partition_rows_watchpump_did_not_write() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "alter table watchpump.partitions drop constraint partitions_name_shape,
                                          drop constraint partitions_parent_check,
                                          drop constraint partitions_range_forwards;
         insert into watchpump.partitions (name, parent, from_at, to_at)
         values ('services', 'settled', '2000-01-01', '2000-01-02');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let refused = sqlx::raw_sql(include_str!("../sql/migrations/0021_owner_code.sql"))
        .execute(&db.pool)
        .await
        .unwrap_err();
    let refused = refused.as_database_error().unwrap();
    assert_eq!(refused.code().as_deref(), Some("42602"), "{refused}");
    assert!(refused.message().contains("'services'"), "{refused}");
}

/// A database from before issue 35 has `take_tokens()` with two result
/// columns. A migration drops it and the rate's file makes the new one,
/// in the one transaction of a `migrate` run (`tests/migrate.rs` holds
/// that a run is seen whole): after it, the new one is there and the pump
/// may call it.
#[tokio::test]
async fn a_database_with_the_old_take_tokens_migrates_to_the_new_with_the_pumps_right() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "drop function watchpump.take_tokens(bigint[], integer[], integer);
         create function watchpump.take_tokens(p_service_ids bigint[], p_wanted integer[], p_default integer)
         returns table (service_id bigint, granted integer) language sql as $$ select 1::bigint, 1 $$;
         grant execute on function watchpump.take_tokens(bigint[], integer[], integer) to watchpump_pump;
         delete from watchpump.schema_migrations
         where name in ('0027_take_tokens_refill', '0250_rate');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let applied = watchpump::schema::migrate(&db.pool).await.unwrap();
    assert_eq!(applied, ["0027_take_tokens_refill", "0250_rate"]);
    let (columns, pump_may): (String, bool) = sqlx::query_as(
        "select pg_get_function_result(p), has_function_privilege('watchpump_pump', p, 'execute')
         from to_regprocedure('watchpump.take_tokens(bigint[], integer[], integer)') p",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(columns.contains("refill_seconds"), "{columns}");
    assert!(pump_may, "the pump may call the new one");
}
