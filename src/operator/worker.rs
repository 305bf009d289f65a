//! The operator's periodic task: fold failures into warnings, send them,
//! hold what paused watches were sent, end pauses past their maximum,
//! release what resumed watches hold, and prune, in one pump at a time.
//!
//! Every pump runs a [`Worker`]; the one holding a session-level advisory
//! lock on a connection of its own does the work. The lock goes with that
//! connection, so when its pump dies another takes over at its next tick.
//! No transaction stays open while the lock is held, so vacuum is never held
//! back. [`Worker::step`] is one unit of work, for tests to drive.

use std::future::Future;
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::Instant;

use crate::config::PumpConfig;
use crate::error::Result;
use crate::operator::notify::{self, Folded, Handed, Notifier};
use crate::operator::prune::{self, Pruned};
use crate::operator::OperatorConfig;

/// How often the lock holder prunes.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// What one [`Worker::step`] did.
#[derive(Debug, Default)]
pub struct Step {
    pub folded: Vec<Folded>,
    pub handed: Vec<Handed>,
}

pub struct Worker {
    pool: PgPool,
    cfg: OperatorConfig,
    notifier: Notifier,
}

impl Worker {
    pub fn new(
        pool: PgPool,
        cfg: OperatorConfig,
        pump: &PumpConfig,
        panel_url: &str,
    ) -> Result<Self> {
        cfg.validate().map_err(crate::Error::Config)?;
        let notifier = Notifier::new(cfg.notify_url.clone(), pump, panel_url)?;
        Ok(Worker {
            pool,
            cfg,
            notifier,
        })
    }

    /// Folds new failures into warnings and hands the due ones to notify.
    pub async fn step(&self) -> Result<Step> {
        // Paused watches (issue 20): news arrived since the last tick is
        // held, and supersedes older held news; pauses past their maximum
        // end, and resumed watches release what they still hold, a batch
        // a round (issue 34).
        crate::watches::pause::hold_paused(&self.pool).await?;
        crate::watches::pause::expire_pauses(&self.pool).await?;
        crate::watches::pause::release_resumed(&self.pool).await?;
        let folded = notify::fold(&self.pool, self.cfg.fold_every()).await?;
        let handed = self.notifier.send_due(&self.pool).await?;
        Ok(Step { folded, handed })
    }

    /// One pruning round.
    pub async fn prune(&self) -> Result<Pruned> {
        prune::run(
            &self.pool,
            self.cfg.retention(),
            self.cfg.failed_retention(),
            self.cfg.prune_batch,
        )
        .await
    }

    /// Ticks until `shutdown` resolves; works only while holding the lock.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(self.cfg.interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lock = Lock::default();
        let mut last_prune: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => {}
            }
            if !self.hold_lock(&mut lock).await {
                continue;
            }
            match self.step().await {
                Ok(step) => log_step(&step),
                Err(e) => tracing::warn!(error = %e, "operator step failed; retrying next tick"),
            }
            let prune_due = match last_prune {
                Some(at) => at.elapsed() >= PRUNE_EVERY,
                None => true,
            };
            if prune_due {
                last_prune = Some(Instant::now());
                match self.prune().await {
                    Ok(p) if p != Pruned::default() => {
                        tracing::info!(
                            deliveries = p.deliveries,
                            failed = p.failed,
                            changes = p.changes,
                            "pruned"
                        )
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "pruning failed; retrying later"),
                }
            }
        }
        if let Some(conn) = lock.conn {
            let _ = conn.close().await;
        }
    }

    /// Whether this worker holds the lock now. Keeps one connection: the
    /// holder pings it, the others ask for the lock again on it each tick.
    async fn hold_lock(&self, lock: &mut Lock) -> bool {
        if lock.conn.is_none() {
            let options = crate::leader::lock_connection(&self.pool.connect_options());
            match PgConnection::connect_with(&options).await {
                Ok(conn) => lock.conn = Some(conn),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot connect for the operator lock");
                    return false;
                }
            }
        }
        let conn = lock.conn.as_mut().expect("connected above");
        let check = async {
            if lock.held {
                conn.ping().await.map(|()| true)
            } else {
                crate::db::operator::try_operator_lock(conn).await
            }
        };
        // Cut off from the database, a check would wait for TCP to give up.
        let answer = tokio::time::timeout(crate::leader::LOCK_CHECK_TIMEOUT, check)
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut));
        match answer {
            Ok(true) => {
                if !lock.held {
                    tracing::info!("this pump runs the operator task (warnings, pruning)");
                }
                lock.held = true;
                true
            }
            Ok(false) => false,
            Err(e) => {
                if lock.held {
                    tracing::warn!(error = %e, "lost the operator lock's connection; another pump may take over");
                } else {
                    tracing::warn!(error = %e, "cannot ask for the operator lock");
                }
                *lock = Lock::default();
                false
            }
        }
    }
}

/// The connection that holds (or asks for) the advisory lock.
#[derive(Default)]
struct Lock {
    conn: Option<PgConnection>,
    held: bool,
}

fn log_step(step: &Step) {
    for f in &step.folded {
        tracing::info!(warning_id = f.warning_id, service = %f.service, added = f.added,
            folded = f.folded, "failed deliveries noted for a warning");
    }
    for h in &step.handed {
        tracing::debug!(
            warning_id = h.warning_id,
            state = h.state.as_str(),
            "warning handed on"
        );
    }
}
