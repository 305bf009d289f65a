//! Wake-ups: a NOTIFY on channel `watchpump` wakes the pump at once.
//!
//! NOTIFY is only a hint. sqlx's `PgListener` reconnects by itself and drops
//! whatever was sent meanwhile; `try_recv()` returns `Ok(None)` right after
//! it has reconnected, which is when the pump must sweep: something may have
//! been missed. Errors get a capped back-off of their own.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::metrics as m;

/// The channel the deliveries trigger notifies.
pub const CHANNEL: &str = "watchpump";

/// Signals from the listener to the pump loop.
#[derive(Debug, Default)]
pub struct Signals {
    /// Something may be due: claim.
    pub wake: Notify,
    /// Notifications may have been missed: sweep, then claim.
    pub sweep: Notify,
}

/// Listens until the task is aborted.
pub async fn listen(pool: PgPool, signals: Arc<Signals>) {
    let mut pause = Duration::from_millis(50);
    let mut first = true;
    loop {
        match connect(&pool).await {
            Ok(mut listener) => {
                if first {
                    // A change committed between the pump's start and this
                    // LISTEN sent its NOTIFY to no one: look once, now that
                    // none can be missed, rather than at the next sweep.
                    signals.sweep.notify_one();
                } else {
                    record_reconnect(&signals);
                }
                first = false;
                pause = Duration::from_millis(50);
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => {
                            metrics::counter!(m::WAKEUPS, "source" => "notify").increment(1);
                            signals.wake.notify_one();
                        }
                        Ok(None) => {
                            tracing::warn!("listener connection lost; reconnected, sweeping");
                            record_reconnect(&signals);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "listener failed; reconnecting");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, ?pause, "cannot listen; retrying"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

fn record_reconnect(signals: &Signals) {
    metrics::counter!(m::LISTENER_RECONNECTS).increment(1);
    metrics::counter!(m::WAKEUPS, "source" => "reconnect").increment(1);
    signals.sweep.notify_one();
}
