//! Two requests of one (watch, object) at once: what a timed-out request
//! the consumer is still working on meets when the pump sends the next one
//! (docs/protocol.md, "One at a time": the pump waits a hold first, but a
//! consumer slower than that still sees both at once). The inbox orders
//! them by the object's row in `watchpump_inbox.positions`: whichever
//! commits last, the newer news is what stays stored.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use watchpump::kit::{BoxError, Delivery, Handler, Outcome, PgTransaction, WatchRequest};

use crate::common::{eventually, operator_config, AppServer, TestDb};
use crate::support::{delivery, now, post, signed, Consumer};

const MAIN: &str = "acme/web/refs/heads/main";
const WAIT: Duration = Duration::from_secs(30);

/// The consumer's state of each object: the last write wins, as a naive
/// consumer's would.
const LATEST_SCHEMA: &str = "
    create table latest (object text primary key, sequence bigint not null);";

/// Writes the object's latest sequence, then waits while its delivery id
/// is held.
#[derive(Clone, Default)]
struct Gated {
    held: Arc<Mutex<HashSet<i64>>>,
    entered: Arc<Mutex<Vec<i64>>>,
}

impl Handler for Gated {
    async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
        sqlx::query(
            "insert into latest (object, sequence) values ($1, $2)
             on conflict (object) do update set sequence = excluded.sequence",
        )
        .bind(&d.object)
        .bind(d.sequence)
        .execute(&mut **tx)
        .await?;
        self.entered.lock().unwrap().push(d.delivery_id);
        while self.held.lock().unwrap().contains(&d.delivery_id) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Outcome::Done)
    }
}

struct Setup {
    consumer: Consumer,
    gated: Gated,
    watch: i64,
    _producer: (TestDb, AppServer),
}

async fn setup() -> Setup {
    let db = TestDb::new().await;
    let api = AppServer::start(&db.pool, &operator_config()).await;
    let gated = Gated::default();
    let consumer = Consumer::start(&db, &api, "deploy", LATEST_SCHEMA, gated.clone()).await;
    let watch = consumer.watch(WatchRequest::new("app-1", MAIN)).await;
    Setup {
        consumer,
        gated,
        watch,
        _producer: (db, api),
    }
}

impl Setup {
    /// Posts delivery `id` with `sequence` in a task; returns its answer.
    fn send(&self, id: i64, sequence: i64) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
        let body = serde_json::to_vec(&delivery(id, self.watch, MAIN, sequence)).unwrap();
        let headers = signed(id, now(), &body, &self.consumer.secret);
        let url = self.consumer.events_url();
        tokio::spawn(async move { post(&url, &headers, body).await })
    }

    async fn entered(&self, id: i64) {
        eventually(WAIT, "the handler runs", || async {
            self.gated.entered.lock().unwrap().contains(&id)
        })
        .await;
    }

    /// Waits until a request of the inbox waits for a lock.
    async fn one_waits(&self) {
        eventually(WAIT, "the second request waits for the first", || async {
            self.consumer
                .db
                .count(
                    "select count(*) from pg_stat_activity
                     where datname = current_database() and wait_event_type = 'Lock'",
                )
                .await
                == 1
        })
        .await;
    }

    async fn stored(&self) -> (i64, i64) {
        let db = &self.consumer.db;
        (
            db.count("select sequence from latest").await,
            db.count("select sequence from watchpump_inbox.positions")
                .await,
        )
    }
}

#[tokio::test]
async fn the_newer_request_first_and_the_older_committing_last_leave_the_newer_news_stored() {
    let s = setup().await;
    s.gated.held.lock().unwrap().insert(2);
    let newer = s.send(2, 20);
    s.entered(2).await;
    // The older request (the one a pump gave up on, still in the consumer's
    // hands) arrives while the newer one's work is uncommitted.
    let older = s.send(1, 10);
    s.one_waits().await;
    s.gated.held.lock().unwrap().remove(&2);

    let (newer, older) = (newer.await.unwrap(), older.await.unwrap());
    assert_eq!((newer.0, newer.1["status"].as_str()), (200, Some("done")));
    assert_eq!(
        (older.0, older.1["status"].as_str()),
        (200, Some("skipped"))
    );
    assert_eq!(*s.gated.entered.lock().unwrap(), vec![2]);
    assert_eq!(s.stored().await, (20, 20));
}

#[tokio::test]
async fn the_older_request_first_waits_for_nothing_and_the_newer_one_lands_after_it() {
    let s = setup().await;
    s.gated.held.lock().unwrap().insert(1);
    let older = s.send(1, 10);
    s.entered(1).await;
    let newer = s.send(2, 20);
    s.one_waits().await;
    s.gated.held.lock().unwrap().remove(&1);

    let (older, newer) = (older.await.unwrap(), newer.await.unwrap());
    assert_eq!((older.0, older.1["status"].as_str()), (200, Some("done")));
    assert_eq!((newer.0, newer.1["status"].as_str()), (200, Some("done")));
    assert_eq!(*s.gated.entered.lock().unwrap(), vec![1, 2]);
    assert_eq!(s.stored().await, (20, 20));
}
