//! The pump running in this process, with settings that keep waiting for
//! an outcome short.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::oneshot;
use watchpump::config::PumpConfig;
use watchpump::pump::Pump;

use super::consumer::Receiver;
use super::db::{all, delivery_of, emit_with_window, TestDb};
use super::{PRODUCER, PRODUCER_TOKEN};

/// The pump configuration tests use: quick sweeps and short retries, so
/// that waiting for an outcome stays short; no timing is asserted.
pub fn pump_config() -> PumpConfig {
    let mut cfg = PumpConfig::new(PRODUCER, PRODUCER_TOKEN);
    cfg.sweep_interval_ms = 200;
    cfg.retry_initial_ms = 100;
    cfg.retry_max_ms = 400;
    cfg.connect_timeout_ms = 1000;
    cfg.request_timeout_ms = 2000;
    cfg.lease_ms = 5000;
    cfg.probe_interval_ms = 200;
    // The whole concurrency at once, as `watchpump_cli` gives a pump process.
    cfg.initial_concurrency = cfg.service_concurrency;
    cfg.allowed_destinations = Some(watchpump::destinations::Destinations::loopback());
    cfg
}

/// A pump running in this process until stopped.
pub struct RunningPump {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<watchpump::Result<()>>,
    pub name: String,
}

impl RunningPump {
    pub fn start(pool: &PgPool, cfg: PumpConfig) -> RunningPump {
        let pump = Pump::new(pool.clone(), cfg).expect("valid pump config");
        let name = pump.name().to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(pump.run(async move {
            let _ = stopped.await;
        }));
        RunningPump {
            stop: Some(stop),
            task,
            name,
        }
    }

    /// Stops gracefully and returns the pump's result.
    pub async fn stop(mut self) -> watchpump::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.expect("pump task panicked")
    }
}

/// A consumer that answers 500, a watch on `object`, and one change whose
/// delivery the running pump tries until it fails for real (its window is a
/// second). Returns the consumer and the failed delivery's id.
pub async fn failed_delivery(
    db: &TestDb,
    service: &str,
    object: &str,
    payload: serde_json::Value,
) -> (Receiver, i64) {
    let consumer = Receiver::start().await;
    consumer.reply_with(500);
    let (svc, _) = db.add_service(service, &consumer.base_url()).await;
    db.add_watch(svc.id, "app-1", object, all()).await;
    let change = emit_with_window(db, object, "push", payload, "1 second").await;
    let id = delivery_of(db, change).await;
    db.wait_state(id, "failed", Duration::from_secs(30)).await;
    (consumer, id)
}
