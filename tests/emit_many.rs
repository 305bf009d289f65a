//! `watchpump.emit_many()` (issue 33): a batch of changes in one statement,
//! each recorded and fanned out as `emit()` would, with emit()'s rules and
//! SQLSTATEs; and the rules a producer's session cannot weaken (issue 34).

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use watchpump::emit::Change;

const WAIT: Duration = Duration::from_secs(30);

/// The same watches under two top segments: `one/` for emit(), `two/` for
/// emit_many(). Exact and prefix watches, a kind filter, a match filter,
/// and a removed watch.
async fn mirrored_watches(db: &TestDb) {
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    for top in ["one", "two"] {
        db.add_watch(svc.id, "all", &format!("{top}/"), all()).await;
        db.add_watch(svc.id, "web", &format!("{top}/web/"), all())
            .await;
        db.add_watch(svc.id, "main", &format!("{top}/web/main"), all())
            .await;
        db.add_watch(svc.id, "tags", &format!("{top}/"), kinds(&["tag"]))
            .await;
        db.add_watch(
            svc.id,
            "forced",
            &format!("{top}/"),
            matching("$.forced == true"),
        )
        .await;
        let gone = db
            .add_watch(svc.id, "gone", &format!("{top}/web/"), all())
            .await;
        sqlx::query("update watchpump.watches set removed_at = now() where id = $1")
            .bind(gone.id)
            .execute(&db.pool)
            .await
            .unwrap();
    }
}

/// What was recorded of each change under `top`, in id order: the object
/// below the top segment, its sequence, kind and payload, and the
/// resources of the watches it was queued for, in delivery-id order.
async fn recorded(db: &TestDb, top: &str) -> Vec<(String, i64, String, Value, Vec<String>)> {
    sqlx::query_as(
        "select substr(c.object, length($1) + 2), c.sequence, c.kind, c.payload,
                coalesce((select array_agg(w.resource order by q.id)
                          from watchpump.queue q join watchpump.watches w on w.id = q.watch_id
                          where q.change_id = c.id), '{}')
         from watchpump.changes c where c.object like $1 || '/%' order by c.id",
    )
    .bind(top)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

fn batch() -> Vec<(String, &'static str, Value)> {
    vec![
        ("web/main".into(), "push", json!({"n": 1})),
        ("web/dev".into(), "push", json!({"n": 2, "forced": true})),
        ("web/main".into(), "tag", json!({"n": 3})),
        ("api/main".into(), "push", Value::Null),
        ("web/".into(), "push", json!({})),
        ("web/main".into(), "push", json!({"n": 4})),
        ("top".into(), "tag", json!({"forced": true})),
    ]
}

#[tokio::test]
async fn emit_many_records_and_fans_out_each_change_as_emit_does() {
    let db = TestDb::new().await;
    mirrored_watches(&db).await;
    // Objects already known continue their sequences.
    db.emit("one/web/main", "push", json!({"n": 0})).await;
    db.emit("two/web/main", "push", json!({"n": 0})).await;

    let mut tx = db.pool.begin().await.unwrap();
    let mut one = Vec::new();
    for (object, kind, payload) in batch() {
        one.push(
            watchpump::emit(&mut tx, &format!("one/{object}"), kind, &payload)
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();

    let objects: Vec<String> = batch().iter().map(|(o, _, _)| format!("two/{o}")).collect();
    let payloads: Vec<Value> = batch().into_iter().map(|(_, _, p)| p).collect();
    let changes: Vec<Change> = batch()
        .iter()
        .zip(&objects)
        .zip(&payloads)
        .map(|(((_, kind, _), object), payload)| Change {
            object,
            kind,
            payload,
        })
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    let two = watchpump::emit::emit_many(&mut tx, &changes).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(two.len(), one.len());
    assert!(
        two.windows(2).all(|w| w[0] < w[1]),
        "ids in the order given: {two:?}"
    );
    let (one, two) = (recorded(&db, "one").await, recorded(&db, "two").await);
    assert_eq!(
        one, two,
        "emit_many() recorded what emit() did, change by change"
    );
    let main: Vec<i64> = two
        .iter()
        .filter(|c| c.0 == "web/main")
        .map(|c| c.1)
        .collect();
    assert_eq!(
        main,
        vec![1, 2, 3, 4],
        "one object's sequences follow the order given"
    );
    // An SQL NULL payload is the empty object, as for emit().
    let ids: Vec<i64> = sqlx::query_scalar(
        "select watchpump.emit_many('{two/null}', '{push}', array[null::jsonb])",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let payload: Value = sqlx::query_scalar("select payload from watchpump.changes where id = $1")
        .bind(ids[0])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(payload, json!({}));
}

/// The SQLSTATE and message of emit_many() over `changes`, and whether it
/// wrote anything.
async fn refused(db: &TestDb, changes: &[(&str, &str, Value)]) -> (String, String) {
    let before: (i64, i64, i64) = counts(db).await;
    let mut tx = db.pool.begin().await.unwrap();
    let batch: Vec<Change> = changes
        .iter()
        .map(|(object, kind, payload)| Change {
            object,
            kind,
            payload,
        })
        .collect();
    let err = watchpump::emit::emit_many(&mut tx, &batch)
        .await
        .unwrap_err();
    drop(tx);
    assert_eq!(counts(db).await, before, "a refused batch writes nothing");
    match err {
        watchpump::Error::Database(e) => {
            let d = e.as_database_error().expect("a database error");
            (d.code().unwrap().to_string(), d.message().to_string())
        }
        e => panic!("{e}"),
    }
}

async fn counts(db: &TestDb) -> (i64, i64, i64) {
    sqlx::query_as(
        "select (select count(*) from watchpump.changes), (select count(*) from watchpump.queue),
                (select coalesce(sum(last_sequence), 0)::int8 from watchpump.objects)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn emit_many_refuses_a_batch_as_emit_refuses_its_first_bad_change_and_writes_nothing() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "all", "acme/", all()).await;
    let ok = ("acme/web/main", "push", json!({}));
    let big = json!({"a": "x".repeat(1_048_576)});
    let long_object = format!("acme/{}", "o".repeat(1100));
    let long_kind = "k".repeat(129);
    let cases: Vec<((&str, &str, Value), &str, &str)> = vec![
        (("", "push", json!({})), "22023", "object '' is not valid"),
        (("/acme", "push", json!({})), "22023", "is not valid"),
        (("acme//web", "push", json!({})), "22023", "is not valid"),
        (
            (&long_object, "push", json!({})),
            "54000",
            "the limit is 1024",
        ),
        (("acme/x", "", json!({})), "22023", "kind must not be empty"),
        (
            ("acme/x", &long_kind, json!({})),
            "54000",
            "the limit is 128",
        ),
        (("acme/x", "watchpump.ping", json!({})), "22023", "reserved"),
        (("acme/x", "push", big), "54000", "the limit is 1048576"),
    ];
    for ((object, kind, payload), code, says) in cases {
        let (got, message) = refused(
            &db,
            &[ok.clone(), ok.clone(), (object, kind, payload.clone())],
        )
        .await;
        assert_eq!(got, code, "{message}");
        assert!(
            message.starts_with("watchpump.emit_many: change 3: ") && message.contains(says),
            "{message}"
        );
        // emit() refuses the same change with the same SQLSTATE.
        let mut tx = db.pool.begin().await.unwrap();
        let err = watchpump::emit(&mut tx, object, kind, &payload)
            .await
            .unwrap_err();
        match err {
            watchpump::Error::Database(e) => {
                let d = e.as_database_error().unwrap();
                assert_eq!(d.code().unwrap(), code, "{}", d.message());
                assert!(
                    d.message().starts_with("watchpump.emit: "),
                    "{}",
                    d.message()
                );
            }
            e => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn emit_many_refuses_arrays_that_do_not_line_up_and_batches_over_its_limit() {
    let db = TestDb::new().await;
    let err = sqlx::query("select watchpump.emit_many('{a/b,a/c}', '{push}', '{\"{}\",\"{}\"}')")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().unwrap(),
        "22023",
        "{err}"
    );
    assert!(err.to_string().contains("one of each per change"), "{err}");
    let err = sqlx::query(
        "select watchpump.emit_many(array_agg('a/' || i), array_agg('push'::text), array_agg('{}'::jsonb))
         from generate_series(1, 100001) i",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().unwrap(),
        "54000",
        "{err}"
    );
    let empty: Vec<i64> = sqlx::query_scalar("select watchpump.emit_many('{}', '{}', '{}')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(empty.is_empty());
}

#[tokio::test]
async fn a_rolled_back_batch_sends_nothing_and_a_committed_one_wakes_a_sleeping_pump() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    let mut cfg = pump_config();
    // No sweep: only the batch's NOTIFY can wake the pump.
    cfg.sweep_interval_ms = 3_600_000;
    let pump = RunningPump::start(&db.pool, cfg);
    eventually(WAIT, "the pump sleeps", || async {
        sqlx::query_scalar::<_, i64>("select count(*) from watchpump.sleepers")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 1
    })
    .await;
    let payload = json!({"after": "9f2c"});
    let objects: Vec<String> = (0..50).map(|i| format!("acme/web/b{i}")).collect();
    let changes: Vec<Change> = objects
        .iter()
        .map(|object| Change {
            object,
            kind: "push",
            payload: &payload,
        })
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    watchpump::emit::emit_many(&mut tx, &changes).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = watchpump::emit::emit_many(&mut tx, &changes[..10])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    consumer.wait_for(10, WAIT).await;
    eventually(WAIT, "all ten delivered", || async {
        db.count_state("delivered").await == 10
    })
    .await;
    pump.stop().await.unwrap();
    let got: Vec<i64> = consumer
        .received()
        .iter()
        .map(|r| r.body["change_id"].as_i64().unwrap())
        .collect();
    assert_eq!(got.len(), 10, "nothing of the rolled back batch: {got:?}");
    assert!(got.iter().all(|id| ids.contains(id)));
}

#[tokio::test]
async fn a_producers_session_cannot_weaken_the_delivery_window() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    let mut tx = db.pool.begin().await.unwrap();
    for window in ["-1 hour", "1 microsecond"] {
        sqlx::query("select set_config('watchpump.delivery_window', $1, true)")
            .bind(window)
            .execute(&mut *tx)
            .await
            .unwrap();
        watchpump::emit(&mut tx, "acme/web/main", "push", &json!({}))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let windows: Vec<f64> = sqlx::query_scalar(
        "select extract(epoch from deadline - created_at)::float8 from watchpump.queue order by id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(windows.len(), 2);
    for w in windows {
        assert!(
            (w - 86_400.0).abs() < 60.0,
            "the window is watchpump's 24 hours: {w} s"
        );
    }
    // And watchpump's own setting refuses a window that is not positive.
    let err = sqlx::query("update watchpump.settings set delivery_window = '0 seconds'")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().unwrap(),
        "23514",
        "{err}"
    );
}

/// A traceparent far over its size (here 5 MB; 50 MB cost emit() 0.6 s of
/// trimming and matching before it was dropped) is dropped before it is
/// read: the change is recorded without a trace context, and counted as
/// malformed.
#[tokio::test]
async fn an_oversized_traceparent_is_dropped_unread_and_counted() {
    let db = TestDb::new().await;
    let before: i64 =
        sqlx::query_scalar("select case when is_called then last_value else 0 end from watchpump.trace_context_malformed")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("select set_config('watchpump.traceparent', repeat(' ', 5000000) || '00-' || repeat('a', 32) || '-' || repeat('b', 16) || '-01', true)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let change = watchpump::emit(&mut tx, "acme/web/main", "push", &json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let traceparent: Option<String> =
        sqlx::query_scalar("select traceparent from watchpump.changes where id = $1")
            .bind(change)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(traceparent, None, "recorded without a trace context");
    let after: i64 = sqlx::query_scalar("select case when is_called then last_value else 0 end from watchpump.trace_context_malformed")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(after > before, "counted as malformed");
}
