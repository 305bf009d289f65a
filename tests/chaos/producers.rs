//! Producers: transactions of one to three `emit()`s each, a few held open
//! for a while (the window in which a pump may settle older news of the same
//! object), some rolled back. The ledger says which changes were committed;
//! a commit cut off by a PostgreSQL restart is "in doubt" until the database
//! is asked afterwards.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sqlx::PgPool;

use crate::Settings;

#[derive(Debug, Clone)]
pub struct Change {
    pub id: i64,
    /// Unique in the run (producer.transaction.position), carried in the
    /// payload as `key`: an id is not, after a failover that lost commits.
    pub key: String,
    pub object: String,
    pub kind: String,
    /// When it was emitted (its transaction began earlier).
    pub at: chrono::DateTime<chrono::Utc>,
    /// When its commit returned (or failed): after a failover to a standby
    /// that lagged, the changes lost must be ones acknowledged late.
    pub acked: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    pub transactions: usize,
    pub committed: Vec<Change>,
    pub rolled_back: Vec<Change>,
    in_doubt: Vec<Change>,
    /// Changes whose commit was cut off, before they were resolved.
    pub in_doubt_count: usize,
    /// Their ids: one that is gone after a failover was never committed as
    /// far as its producer knew, but a pump may have sent it meanwhile.
    pub in_doubt_ids: std::collections::HashSet<i64>,
}

impl Ledger {
    fn merge(&mut self, other: Ledger) {
        self.transactions += other.transactions;
        self.committed.extend(other.committed);
        self.rolled_back.extend(other.rolled_back);
        self.in_doubt.extend(other.in_doubt);
    }

    /// Asks the database which in-doubt changes were committed.
    pub async fn resolve_in_doubt(mut self, pool: &PgPool) -> Ledger {
        self.in_doubt_count = self.in_doubt.len();
        self.in_doubt_ids = self.in_doubt.iter().map(|c| c.id).collect();
        let found = present(pool, &self.in_doubt).await;
        for change in std::mem::take(&mut self.in_doubt) {
            if found.contains(&change.key) {
                self.committed.push(change);
            } else {
                self.rolled_back.push(change);
            }
        }
        self.committed.sort_by_key(|c| c.id);
        self
    }
}

/// The keys of `changes` that the database has. After a failover that lost
/// commits, the new primary hands a lost change's id to a new change (the
/// lost WAL held the sequence's advance): only the key tells them apart.
pub async fn present(pool: &PgPool, changes: &[Change]) -> std::collections::HashSet<String> {
    let ids: Vec<i64> = changes.iter().map(|c| c.id).collect();
    let rows: Vec<(i64, Option<String>)> =
        sqlx::query_as("select id, payload->>'key' from watchpump.changes where id = any($1)")
            .bind(&ids)
            .fetch_all(pool)
            .await
            .unwrap();
    let rows: std::collections::HashMap<i64, Option<String>> = rows.into_iter().collect();
    changes
        .iter()
        .filter(|c| {
            rows.get(&c.id)
                .is_some_and(|k| k.as_deref() == Some(&c.key))
        })
        .map(|c| c.key.clone())
        .collect()
}

/// Makes change ids unambiguous again after a failover that lost commits:
/// a change the database does not have (rolled back, or lost) gets its id
/// negated in the ledger, and every request is matched to its change by
/// the payload's key, not by its id (which a new change may now carry).
pub async fn disambiguate(
    pool: &PgPool,
    mut ledger: Ledger,
    mut requests: Vec<crate::consumers::Request>,
) -> (Ledger, Vec<crate::consumers::Request>) {
    let mut all = ledger.committed.clone();
    all.extend(ledger.rolled_back.iter().cloned());
    let present = present(pool, &all).await;
    let mut ids = std::collections::HashMap::new();
    for c in ledger
        .committed
        .iter_mut()
        .chain(ledger.rolled_back.iter_mut())
    {
        if !present.contains(&c.key) && c.id > 0 {
            if ledger.in_doubt_ids.contains(&c.id) {
                ledger.in_doubt_ids.insert(-c.id);
            }
            c.id = -c.id;
        }
        ids.insert(c.key.clone(), c.id);
    }
    for r in &mut requests {
        if let Some(id) = ids.get(&r.key) {
            r.change_id = *id;
        }
    }
    (ledger, requests)
}

/// How long the producers go on besides their transactions.
#[derive(Debug, Default)]
pub struct Pace {
    /// Set: on past `settings.transactions` (the failover fault's switches
    /// must each happen under load).
    pub more: AtomicBool,
    /// Set: stop now, even in the middle of waiting for the database (a
    /// switch of the primary failed, and none may come back).
    pub give_up: AtomicBool,
}

/// Runs `settings.producers` producers until `settings.transactions` have
/// been started, and as `pace` says; `progress` counts them.
pub async fn run(
    pool: &PgPool,
    settings: &Settings,
    progress: Arc<AtomicUsize>,
    pace: Arc<Pace>,
    seed: u64,
) -> Ledger {
    let mut tasks = Vec::new();
    for p in 0..settings.producers {
        let (pool, settings, progress, pace) = (
            pool.clone(),
            settings.clone(),
            progress.clone(),
            pace.clone(),
        );
        tasks.push(tokio::spawn(async move {
            produce(&pool, &settings, &progress, &pace, p, seed ^ (p as u64 + 1)).await
        }));
    }
    let mut ledger = Ledger::default();
    for t in tasks {
        ledger.merge(t.await.unwrap());
    }
    ledger
}

async fn produce(
    pool: &PgPool,
    settings: &Settings,
    progress: &AtomicUsize,
    pace: &Pace,
    producer: usize,
    seed: u64,
) -> Ledger {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ledger = Ledger::default();
    while !pace.give_up.load(Ordering::SeqCst)
        && (progress.fetch_add(1, Ordering::SeqCst) < settings.transactions
            || pace.more.load(Ordering::SeqCst))
    {
        ledger.transactions += 1;
        let mut tx = loop {
            match pool.begin().await {
                Ok(tx) => break tx,
                Err(_) if pace.give_up.load(Ordering::SeqCst) => return ledger,
                // PostgreSQL is restarting.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut changes = Vec::new();
        let mut failed = false;
        for position in 0..rng.gen_range(1..=3) {
            let object = crate::random_object(&mut rng, settings);
            let kind = match rng.gen_range(0..10) {
                0 => "tag",
                1 => "merge_request",
                _ => "push",
            };
            let key = format!("{producer}.{}.{position}", ledger.transactions);
            let payload = json!({"n": ledger.transactions, "key": key, "paths": ["src/main.rs"]});
            match watchpump::emit(&mut tx, &object, kind, &payload).await {
                Ok(id) => changes.push(Change {
                    id,
                    key,
                    object,
                    kind: kind.to_string(),
                    at: chrono::Utc::now(),
                    acked: chrono::Utc::now(),
                }),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if !failed && rng.gen_bool(0.2) {
            // Held open: pumps settle older news of these objects meanwhile.
            tokio::time::sleep(Duration::from_millis(rng.gen_range(1..30))).await;
        }
        if failed || rng.gen_bool(settings.rollback_ratio) {
            let _ = tx.rollback().await;
            ledger.rolled_back.extend(changes);
        } else {
            let result = tx.commit().await;
            let acked = chrono::Utc::now();
            for c in &mut changes {
                c.acked = acked;
            }
            match result {
                Ok(()) => ledger.committed.extend(changes),
                Err(_) => ledger.in_doubt.extend(changes),
            }
        }
    }
    ledger
}
