//! `watchpump serve`: connect, migrate, then run the pump, the watches API
//! and the metrics endpoint until SIGTERM or Ctrl-C.

use std::future::{Future, IntoFuture};

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, AppState};
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::pump::Pump;
use crate::{metrics, schema, services};

/// Opens a pool on `database_url` with `size` connections.
pub async fn connect(database_url: &str, size: u32) -> Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(database_url)
        .await?)
}

/// Runs everything until `shutdown` resolves; then the API stops taking
/// requests, the pump finishes its sends, and this returns.
pub async fn serve(
    database_url: &str,
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    cfg.pump.validate().map_err(Error::Config)?;
    // One connection more than asked for: the listener keeps one for itself.
    let pool = connect(database_url, cfg.db_pool.max(2) + 1).await?;
    let applied = schema::migrate(&pool).await?;
    if !applied.is_empty() {
        tracing::info!(?applied, "schema updated");
    }
    if cfg.metrics_listen != "off" {
        let addr = cfg.metrics_listen.parse().map_err(|e| {
            Error::Config(format!(
                "metrics listen address {:?}: {e}",
                cfg.metrics_listen
            ))
        })?;
        metrics::install(addr).map_err(Error::Config)?;
        for service in services::list(&pool).await? {
            metrics::register_service(&service.name);
        }
        tracing::info!(%addr, "metrics at /metrics");
    }
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", cfg.listen)))?;
    tracing::info!(addr = %cfg.listen, "watches API listening");

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let app = api::app(AppState { pool: pool.clone() });
    let api = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
    );
    let pump = Pump::new(pool.clone(), cfg.pump)?;
    let pump = tokio::spawn(pump.run(stopped(stop_rx)));

    shutdown.await;
    tracing::info!("shutting down: no new claims, finishing sends in flight");
    let _ = stop_tx.send(true);
    let pump_result = pump
        .await
        .map_err(|e| Error::Config(format!("pump task: {e}")))?;
    let _ = api.await;
    pool.close().await;
    pump_result
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}
