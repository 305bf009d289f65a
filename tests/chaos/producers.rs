//! Producers: transactions of one to three `emit()`s each, a few held open
//! for a while (the window in which a pump may settle older news of the same
//! object), some rolled back. The ledger says which changes were committed;
//! a commit cut off by a PostgreSQL restart is "in doubt" until the database
//! is asked afterwards.

use std::sync::atomic::{AtomicUsize, Ordering};
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
    pub object: String,
    pub kind: String,
    /// When it was emitted (its transaction began earlier).
    pub at: chrono::DateTime<chrono::Utc>,
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
        let ids: Vec<i64> = self.in_doubt.iter().map(|c| c.id).collect();
        let found: Vec<i64> =
            sqlx::query_scalar("select id from watchpump.changes where id = any($1)")
                .bind(&ids)
                .fetch_all(pool)
                .await
                .unwrap();
        for change in std::mem::take(&mut self.in_doubt) {
            if found.contains(&change.id) {
                self.committed.push(change);
            } else {
                self.rolled_back.push(change);
            }
        }
        self.committed.sort_by_key(|c| c.id);
        self
    }
}

/// Runs `settings.producers` producers until `settings.transactions` have
/// been started; `progress` counts them.
pub async fn run(
    pool: &PgPool,
    settings: &Settings,
    progress: Arc<AtomicUsize>,
    seed: u64,
) -> Ledger {
    let mut tasks = Vec::new();
    for p in 0..settings.producers {
        let (pool, settings, progress) = (pool.clone(), settings.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            produce(&pool, &settings, &progress, seed ^ (p as u64 + 1)).await
        }));
    }
    let mut ledger = Ledger::default();
    for t in tasks {
        ledger.merge(t.await.unwrap());
    }
    ledger
}

async fn produce(pool: &PgPool, settings: &Settings, progress: &AtomicUsize, seed: u64) -> Ledger {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ledger = Ledger::default();
    while progress.fetch_add(1, Ordering::SeqCst) < settings.transactions {
        ledger.transactions += 1;
        let mut tx = loop {
            match pool.begin().await {
                Ok(tx) => break tx,
                // PostgreSQL is restarting.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut changes = Vec::new();
        let mut failed = false;
        for _ in 0..rng.gen_range(1..=3) {
            let object = crate::random_object(&mut rng, settings);
            let kind = match rng.gen_range(0..10) {
                0 => "tag",
                1 => "merge_request",
                _ => "push",
            };
            let payload = json!({"n": ledger.transactions, "paths": ["src/main.rs"]});
            match watchpump::emit(&mut tx, &object, kind, &payload).await {
                Ok(id) => changes.push(Change {
                    id,
                    object,
                    kind: kind.to_string(),
                    at: chrono::Utc::now(),
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
            match tx.commit().await {
                Ok(()) => ledger.committed.extend(changes),
                Err(_) => ledger.in_doubt.extend(changes),
            }
        }
    }
    ledger
}
