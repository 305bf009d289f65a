//! The delivery states the Rust code knows are the states the database
//! allows: `watchpump::delivery::State` against the check on
//! `watchpump.settled` and the states `watchpump.deliveries` gives queued
//! rows.

mod common;

use std::collections::BTreeSet;

use common::*;
use watchpump::delivery::State;

/// The words a table's `state` check constraint allows, read from the
/// catalog (`... check (state in ('a', 'b'))` or `state = ANY (ARRAY[...])`).
async fn allowed_states(db: &TestDb, table: &str) -> BTreeSet<String> {
    let checks: Vec<String> = sqlx::query_scalar(
        "select pg_get_constraintdef(c.oid) from pg_constraint c
         where c.conrelid = $1::regclass and c.contype = 'c'
           and pg_get_constraintdef(c.oid) like '%state%'",
    )
    .bind(table)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        checks.len(),
        1,
        "{table}: one state check, found {checks:?}"
    );
    checks[0]
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The string literals of a view's definition.
async fn view_literals(db: &TestDb, view: &str) -> BTreeSet<String> {
    let definition: String = sqlx::query_scalar("select pg_get_viewdef($1::regclass)")
        .bind(view)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn the_state_enum_is_exactly_what_the_queue_and_the_settled_history_allow() {
    let db = TestDb::new().await;
    // A queued row has no state column: the view derives it from its lease.
    let queued = view_literals(&db, "watchpump.deliveries").await;
    let settled = allowed_states(&db, "watchpump.settled").await;

    let in_queue: BTreeSet<String> = State::ALL
        .into_iter()
        .filter(|s| !s.is_settled())
        .map(|s| s.as_str().to_string())
        .collect();
    let in_history: BTreeSet<String> = State::ALL
        .into_iter()
        .filter(|s| s.is_settled())
        .map(|s| s.as_str().to_string())
        .collect();
    assert_eq!(queued, in_queue);
    assert_eq!(settled, in_history);
}
