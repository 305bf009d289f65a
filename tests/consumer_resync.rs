//! Resync (issue 20, docs/protocol.md "Resync"): the newest retained change
//! of every object a watch covers, that matches its filters, queued again
//! as a replayed delivery. Against the real pump and a real consumer on
//! loopback, with a live emit racing the resync; its bound, its one-at-a-
//! time rule, another service's watch, a resync at creation, pruned
//! history; and the paused-watch check in claim() at many paused watches.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

/// The API on loopback (with `max` objects per resync), a service `deploy`
/// with a consumer, another service `docs`, and the pump running.
struct Setup {
    db: TestDb,
    http: reqwest::Client,
    base: String,
    consumer: Receiver,
    deploy_id: i64,
    token: String,
    docs_token: String,
    _pump: RunningPump,
}

impl Setup {
    async fn start(max: u32) -> Setup {
        let db = TestDb::new().await;
        let consumer = Receiver::start().await;
        let (deploy, token) = db.add_service("deploy", &consumer.base_url()).await;
        let (_, docs_token) = db.add_service("docs", "http://127.0.0.1:9").await;
        let mut pump = pump_config();
        pump.resync_max_objects = max;
        let addr = serve(watchpump::api::app(api_state(&db.pool, &pump))).await;
        Setup {
            _pump: RunningPump::start(&db.pool, pump_config()),
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
            consumer,
            deploy_id: deploy.id,
            token,
            docs_token,
            db,
        }
    }

    async fn post(&self, path: &str, token: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(Method::POST, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        (resp.status(), resp.json().await.unwrap())
    }

    async fn resync(&self, watch_id: i64) -> (StatusCode, Value) {
        self.post(
            &format!("/api/v1/watches/{watch_id}/resync"),
            &self.token,
            None,
        )
        .await
    }

    /// Waits until no resync runs and nothing is queued.
    async fn settle(&self) {
        eventually(LONG, "the resync ends and the queue empties", || async {
            let left: i64 = sqlx::query_scalar(
                "select (select count(*) from watchpump.resyncs)
                      + (select count(*) from watchpump.queue)",
            )
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
            left == 0
        })
        .await;
    }

    /// What the consumer received, per object, in arrival order: (sequence,
    /// replay, change_id, kind).
    fn per_object(&self) -> BTreeMap<String, Vec<(i64, bool, i64, String)>> {
        let mut seen: BTreeMap<String, Vec<(i64, bool, i64, String)>> = BTreeMap::new();
        for r in self.consumer.received() {
            seen.entry(r.body["object"].as_str().unwrap().to_string())
                .or_default()
                .push((
                    r.body["sequence"].as_i64().unwrap(),
                    r.body.get("replay") == Some(&Value::Bool(true)),
                    r.body["change_id"].as_i64().unwrap(),
                    r.body["kind"].as_str().unwrap().to_string(),
                ));
        }
        seen
    }
}

/// The order a consumer sees with replays (docs/protocol.md, "Resync"):
/// per object, sequences never go backwards; only a replay may repeat the
/// sequence last sent.
fn assert_in_order(object: &str, got: &[(i64, bool, i64, String)]) {
    for pair in got.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            b.0 > a.0 || (b.1 && b.0 == a.0),
            "{object}: {b:?} arrived after {a:?}: {got:?}"
        );
    }
}

/// The newest change of `object` of kind `kind`: (id, sequence).
async fn newest(db: &TestDb, object: &str, kind: &str) -> (i64, i64) {
    sqlx::query_as(
        "select id, sequence from watchpump.changes where object = $1 and kind = $2
         order by sequence desc limit 1",
    )
    .bind(object)
    .bind(kind)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_resync_sends_the_newest_matching_change_of_each_object_in_order_with_a_live_emit_racing_it(
) {
    let s = Setup::start(10_000).await;
    // History from before the watch: per object two pushes and a tag on
    // top (the watch follows pushes only), and an object it does not cover.
    let objects: Vec<String> = (0..40).map(|i| format!("acme/web/o{i:02}")).collect();
    for o in &objects {
        s.db.emit(o, "push", json!({"n": 1})).await;
        s.db.emit(o, "push", json!({"n": 2})).await;
        s.db.emit(o, "tag", json!({"n": 3})).await;
    }
    s.db.emit("acme/api/x", "push", json!({"n": 1})).await;
    let watch =
        s.db.add_watch(s.deploy_id, "app", "acme/web/", kinds(&["push"]))
            .await;

    // A producer racing the resync: pushes to the first half of the objects.
    let racer = {
        let db_pool = s.db.pool.clone();
        let racing: Vec<String> = objects[..20].to_vec();
        tokio::spawn(async move {
            for round in 0..5 {
                for o in &racing {
                    let mut tx = db_pool.begin().await.unwrap();
                    watchpump::emit(&mut tx, o, "push", &json!({"round": round}))
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            }
        })
    };
    let (status, body) = s.resync(watch.id).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["watch_id"], watch.id);
    assert_eq!(body["objects"], 40, "{body}");
    assert_eq!(body["truncated"], false);
    racer.await.unwrap();
    s.settle().await;

    let seen = s.per_object();
    assert!(!seen.contains_key("acme/api/x"), "not covered by the watch");
    assert_eq!(seen.len(), 40, "every covered object: {seen:?}");
    for (i, o) in objects.iter().enumerate() {
        let got = &seen[o];
        assert_in_order(o, got);
        assert!(
            got.iter().all(|d| d.3 == "push"),
            "{o}: pushes only: {got:?}"
        );
        let (id, sequence) = newest(&s.db, o, "push").await;
        let last = got.last().unwrap();
        assert_eq!(
            (last.2, last.0),
            (id, sequence),
            "{o} ends at its newest push"
        );
        if i >= 20 {
            // Untouched by the racer: exactly its newest push, replayed,
            // with the change's own id and sequence (the tag on top of it
            // does not match the watch).
            assert_eq!(got, &vec![(2, true, id, "push".to_string())], "{o}");
        }
    }
    let replayed: Vec<Value> = s
        .consumer
        .received()
        .into_iter()
        .filter(|r| r.body.get("replay").is_some())
        .map(|r| r.body)
        .collect();
    assert!(replayed.len() >= 20);
    for body in &replayed {
        let (object, kind, sequence): (String, String, i64) =
            sqlx::query_as("select object, kind, sequence from watchpump.changes where id = $1")
                .bind(body["change_id"].as_i64().unwrap())
                .fetch_one(&s.db.pool)
                .await
                .unwrap();
        assert_eq!(
            (object.as_str(), kind.as_str(), sequence),
            (
                body["object"].as_str().unwrap(),
                body["kind"].as_str().unwrap(),
                body["sequence"].as_i64().unwrap()
            ),
            "a replay carries its change's original change_id and sequence"
        );
        assert_eq!(body["replay"], true);
    }
    // The consumer's own list shows the replays like any delivery.
    let delivered = s.db.count_state("delivered").await;
    assert_eq!(delivered as usize, s.consumer.count());
}

#[tokio::test]
async fn a_newer_live_change_supersedes_a_queued_replay_with_a_higher_delivery_id() {
    // The race resync must win, built step by step: a live delivery of a
    // newer change whose delivery id is LOWER than the replay's (its emit
    // was uncommitted while the resync read the object). The watch is
    // paused meanwhile so that both wait together; on resume only the
    // newer news goes, and the replay is superseded by it. The resync also
    // ends while the producer's transaction is open: it waits on no emit.
    let s = Setup::start(10_000).await;
    s.db.emit("acme/web/a", "push", json!({"n": 1})).await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;
    let (status, _) = s
        .post(
            &format!("/api/v1/watches/{}/pause", watch.id),
            &s.token,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut live = s.db.pool.begin().await.unwrap();
    watchpump::emit(&mut live, "acme/web/a", "push", &json!({"n": 2}))
        .await
        .unwrap();
    let (status, body) = s.resync(watch.id).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    eventually(LONG, "the resync ends", || async {
        let n: i64 = sqlx::query_scalar("select count(*) from watchpump.resyncs")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
        n == 0
    })
    .await;
    live.commit().await.unwrap();
    let queued: Vec<(i64, i64, bool)> =
        sqlx::query_as("select id, sequence, replay from watchpump.queue order by id")
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(queued.len(), 2, "{queued:?}");
    assert_eq!(
        (queued[0].1, queued[0].2),
        (2, false),
        "live, lower id: {queued:?}"
    );
    assert_eq!(
        (queued[1].1, queued[1].2),
        (1, true),
        "replay, higher id: {queued:?}"
    );
    let (status, _) = s
        .post(
            &format!("/api/v1/watches/{}/resume", watch.id),
            &s.token,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    s.settle().await;
    let got: Vec<i64> = s
        .consumer
        .received()
        .iter()
        .map(|r| r.body["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![2], "only the newer news is sent");
    let (state, by): (String, Option<i64>) =
        sqlx::query_as("select state, superseded_by from watchpump.settled where id = $1")
            .bind(queued[1].0)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), by), ("superseded", Some(queued[0].0)));
}

#[tokio::test]
async fn a_resync_goes_through_at_most_max_objects_and_one_runs_at_a_time() {
    let s = Setup::start(5).await;
    for i in 0..12 {
        s.db.emit(&format!("acme/web/o{i:02}"), "push", json!({}))
            .await;
    }
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;

    // A resync running (its slot taken as resync_start() takes it): 429,
    // and nothing is queued.
    let _: (i32,) = sqlx::query_as("select objects from watchpump.resync_start($1, $2, 5)")
        .bind(s.deploy_id)
        .bind(watch.id)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    let (status, body) = s.resync(watch.id).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
    let queued: i64 = sqlx::query_scalar("select count(*) from watchpump.queue")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(queued, 0);
    sqlx::query("select watchpump.resync_finish($1)")
        .bind(watch.id)
        .execute(&s.db.pool)
        .await
        .unwrap();

    let (status, body) = s.resync(watch.id).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (body["objects"].clone(), body["truncated"].clone()),
        (json!(5), json!(true))
    );
    s.settle().await;
    let got: Vec<String> = s
        .consumer
        .received()
        .iter()
        .map(|r| r.body["object"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        got.len(),
        5,
        "WATCHPUMP_RESYNC_MAX_OBJECTS objects, no more: {got:?}"
    );

    // Another service's watch, a removed one, no id: 404, nothing queued.
    let (status, _) = s
        .post(
            &format!("/api/v1/watches/{}/resync", watch.id),
            &s.docs_token,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = s.post("/api/v1/watches/nope/resync", &s.token, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    watchpump::watches::remove(&s.db.pool, s.deploy_id, watch.id, "test")
        .await
        .unwrap();
    let (status, _) = s.resync(watch.id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let slots: i64 = sqlx::query_scalar("select count(*) from watchpump.resyncs")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(slots, 0, "a refused resync takes no slot");
}

#[tokio::test]
async fn a_watch_created_with_resync_true_receives_the_current_state() {
    let s = Setup::start(10_000).await;
    for o in ["acme/web/a", "acme/web/b"] {
        s.db.emit(o, "push", json!({"state": "old"})).await;
        s.db.emit(o, "push", json!({"state": "new"})).await;
    }
    let (status, body) = s
        .post(
            "/api/v1/watches",
            &s.token,
            Some(json!({"resource": "app", "object": "acme/web/", "resync": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["resync"]["objects"], 2, "{body}");
    assert_eq!(body["resync"]["watch_id"], body["id"]);
    s.settle().await;
    let mut got: Vec<(String, Value, bool)> = s
        .consumer
        .received()
        .iter()
        .map(|r| {
            (
                r.body["object"].as_str().unwrap().to_string(),
                r.body["payload"]["state"].clone(),
                r.body["replay"] == true,
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("acme/web/a".to_string(), json!("new"), true),
            ("acme/web/b".to_string(), json!("new"), true)
        ]
    );
    // The same watch again, without resync: 200, and nothing more is sent.
    let (status, body) = s
        .post(
            "/api/v1/watches",
            &s.token,
            Some(json!({"resource": "app", "object": "acme/web/"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("resync").is_none());
}

#[tokio::test]
async fn a_resync_after_pruning_says_where_history_begins_and_replays_nothing_pruned() {
    let s = Setup::start(10_000).await;
    s.db.emit("acme/web/a", "push", json!({})).await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;
    // Retire today's day of changes (prune() does this once a day is past
    // retention): the object's only change goes.
    let (today_ends,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as(
        "select to_at from watchpump.partitions
         where parent = 'changes' and from_at <= now() and to_at > now()",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    sqlx::query("select * from watchpump.retire_partitions($1, interval '0', interval '0')")
        .bind(today_ends)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let (status, body) = s.resync(watch.id).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let history_from: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(body["history_from"].clone()).unwrap();
    assert_eq!(
        history_from, today_ends,
        "history now begins where the retired day ended: {body}"
    );
    assert_eq!(
        body["objects"], 1,
        "the object is covered, its history gone"
    );
    s.settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.consumer.count(), 0, "nothing retained to replay");
}

#[tokio::test]
async fn the_cli_resyncs_a_watch_and_refuses_another_services() {
    let s = Setup::start(10_000).await;
    s.db.emit("acme/web/a", "push", json!({})).await;
    let watch = s.db.add_watch(s.deploy_id, "app", "acme/web/", all()).await;
    let out = watchpump_cli(Some(&s.db.url))
        .args([
            "watches",
            "resync",
            "--service",
            "deploy",
            &watch.id.to_string(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 object"), "{stdout}");
    s.consumer.wait_for(1, LONG).await;
    assert_eq!(s.consumer.received()[0].body["replay"], true);

    let out = watchpump_cli(Some(&s.db.url))
        .args([
            "watches",
            "resync",
            "--service",
            "docs",
            &watch.id.to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no live watch"), "{stderr}");
}

#[tokio::test]
async fn claim_checks_a_rows_watch_for_a_pause_without_reading_every_paused_watch() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(deploy.id, "app", "acme/web/", all()).await;
    // 20,000 paused watches of the service.
    sqlx::query(
        "insert into watchpump.watches (service_id, resource, object, paused_at)
         select $1, 'r' || i, 'other/' || i || '/', now() from generate_series(1, 20000) i",
    )
    .bind(deploy.id)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("analyze watchpump.watches")
        .execute(&db.pool)
        .await
        .unwrap();
    db.emit("acme/web/a", "push", json!({})).await;
    let mut tx = db.pool.begin().await.unwrap();
    let claimed: Vec<(i64,)> =
        sqlx::query_as("select watch_id from watchpump.claim('p', '{}', 10, interval '1 minute')")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(claimed, vec![(watch.id,)]);
    // Index entries the claim read from watches_paused in this transaction:
    // a probe per queued row scanned, not one per paused watch.
    let read: i64 = sqlx::query_scalar(
        "select pg_stat_get_xact_tuples_returned('watchpump.watches_paused'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(read < 10, "claim read {read} paused watches' index entries");
    tx.rollback().await.unwrap();
}
