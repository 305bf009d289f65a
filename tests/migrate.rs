//! `migrate` applies what is pending in one transaction (`sql_files`): a
//! function that a migration drops and a later file creates again is never
//! missing to its callers, and a run that fails anywhere leaves the schema
//! as it found it. Before, each file committed alone: `settle()` was
//! missing to every pump from migration 0026 until `0300_settle.sql` ran,
//! and for good had the run stopped in between.

mod common;

use std::time::{Duration, Instant};

use common::*;
use watchpump::sql_files::{self, SqlFile};

/// The schema these tests apply their own files to.
const SCHEMA: &str = "migrate_test";

/// A migration: applied once.
const fn migration(name: &'static str, sql: &'static str) -> SqlFile {
    SqlFile {
        name,
        sql,
        reapply_on_change: false,
    }
}

const FIRST: SqlFile = migration(
    "0001_first",
    "create function migrate_test.f() returns int language sql as 'select 1';",
);

const DROP: SqlFile = migration(
    "0002_drop",
    "drop function migrate_test.f(); create table migrate_test.made (id int);",
);

/// Stands for the migrations and rooms between a drop and the file that
/// creates the function again.
const SLOW: SqlFile = migration("0003_slow", "select pg_sleep(1.5);");

const BROKEN: SqlFile = migration("0004_broken", "select * from migrate_test.no_such_table;");

/// A room of functions: applied again when its text changes.
const AGAIN: SqlFile = SqlFile {
    name: "0100_again",
    sql: "create or replace function migrate_test.f() returns int language sql as 'select 2';",
    reapply_on_change: true,
};

async fn f(pool: &sqlx::PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("select migrate_test.f()")
        .fetch_one(pool)
        .await
}

async fn applied(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar("select name from migrate_test.schema_migrations order by name")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_function_dropped_and_made_again_in_one_migrate_is_never_missing_to_callers() {
    let (_url, pool) = blank_database().await;
    sql_files::apply(&pool, SCHEMA, &[FIRST]).await.unwrap();
    assert_eq!(f(&pool).await.unwrap(), 1);

    // Call it all through the migrate, as a pump calls settle().
    let migrating = sql_files::apply(&pool, SCHEMA, &[FIRST, DROP, SLOW, AGAIN]);
    tokio::pin!(migrating);
    let started = Instant::now();
    let mut calls = 0;
    let names = loop {
        tokio::select! {
            done = &mut migrating => break done.unwrap(),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                let answer = f(&pool).await;
                assert!(
                    matches!(answer, Ok(1) | Ok(2)),
                    "call {calls}, {:?} into the migrate: {answer:?}",
                    started.elapsed()
                );
                calls += 1;
            }
        }
    };
    assert_eq!(names, ["0002_drop", "0003_slow", "0100_again"]);
    assert!(
        calls >= 5,
        "only {calls} calls were made during the migrate"
    );
    assert_eq!(f(&pool).await.unwrap(), 2);
}

#[tokio::test]
async fn a_migrate_that_fails_changes_nothing_and_the_next_one_applies_it_all() {
    let (_url, pool) = blank_database().await;
    sql_files::apply(&pool, SCHEMA, &[FIRST]).await.unwrap();

    let failed = sql_files::apply(&pool, SCHEMA, &[FIRST, DROP, BROKEN, AGAIN]).await;
    let message = failed
        .expect_err("a file that fails fails the migrate")
        .to_string();
    assert!(message.contains("no_such_table"), "{message}");
    // Nothing of the run stays: the function dropped before the failure
    // is there, the table made before it is not, nor its bookkeeping.
    assert_eq!(f(&pool).await.unwrap(), 1);
    let made: Option<String> = sqlx::query_scalar("select to_regclass('migrate_test.made')::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(made, None);
    assert_eq!(applied(&pool).await, ["0001_first"]);

    // Mended, the next run applies every pending file.
    let names = sql_files::apply(&pool, SCHEMA, &[FIRST, DROP, AGAIN])
        .await
        .unwrap();
    assert_eq!(names, ["0002_drop", "0100_again"]);
    assert_eq!(f(&pool).await.unwrap(), 2);
    assert_eq!(
        applied(&pool).await,
        ["0001_first", "0002_drop", "0100_again"]
    );
}
