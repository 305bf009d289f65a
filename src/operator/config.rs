//! The operator's knobs: panel and admin API access, the warning to notify,
//! and how long finished deliveries are kept. Flattened into
//! `watchpump serve`, so `--help` lists them with the pump's.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser};

/// Shortest admin token accepted: the token is the only thing between the
/// network and the retry buttons.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// `Debug` is written out below so that the admin token never reaches a log.
#[derive(Clone, Args)]
pub struct OperatorConfig {
    /// Token for the panel (/panel) and the admin API (/api/v1/admin);
    /// without it both are off. At least 16 characters; a long random one.
    #[arg(long, env = "WATCHPUMP_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// The panel's public URL, e.g. `https://git.example.org/panel`: links in
    /// warnings point there, the panel accepts form posts from its origin,
    /// and its session cookie is `Secure` when it is https. Default:
    /// `http://<WATCHPUMP_LISTEN>/panel`.
    #[arg(long, env = "WATCHPUMP_PANEL_URL")]
    pub panel_url: Option<String>,

    /// How long a panel login lasts, in hours.
    #[arg(long, env = "WATCHPUMP_PANEL_SESSION_HOURS", default_value_t = 12)]
    pub panel_session_hours: u32,

    /// Where warnings about failed deliveries are POSTed (the notify
    /// service's events endpoint), with the producer's token. Without it a
    /// warning is only logged and counted in metrics.
    #[arg(long, env = "WATCHPUMP_NOTIFY_URL")]
    pub notify_url: Option<String>,

    /// At most one warning per consumer service in this many seconds;
    /// failures in between are folded into the next warning and counted.
    #[arg(long, env = "WATCHPUMP_NOTIFY_FOLD_SECS", default_value_t = 3600)]
    pub notify_fold_secs: u64,

    /// Days delivered, superseded and dropped deliveries (and their
    /// attempts, and changes no delivery needs) are kept.
    #[arg(long, env = "WATCHPUMP_RETENTION_DAYS", default_value_t = 7)]
    pub retention_days: u32,

    /// Days failed deliveries are kept, unless retried before.
    #[arg(long, env = "WATCHPUMP_FAILED_RETENTION_DAYS", default_value_t = 30)]
    pub failed_retention_days: u32,

    /// Kept rows (failures kept longer, retried deliveries) deleted per
    /// pruning call; days of history are dropped whole, whatever their size.
    #[arg(long, env = "WATCHPUMP_PRUNE_BATCH", default_value_t = 500)]
    pub prune_batch: u32,

    /// How often the operator task (one pump at a time) folds failures into
    /// warnings and sends them; pruning runs every minute.
    #[arg(long, env = "WATCHPUMP_OPERATOR_INTERVAL_MS", default_value_t = 5000)]
    pub operator_interval_ms: u64,

    /// A trace viewer's URL with `{trace_id}` where the trace id goes, e.g.
    /// `https://grafana.example/explore?traceId={trace_id}`: each delivery
    /// page of the panel links its trace there (README, "Traces"). Without
    /// it the page shows the trace id alone.
    #[arg(long, env = "WATCHPUMP_TRACE_URL")]
    pub trace_url: Option<String>,
}

impl OperatorConfig {
    /// The defaults; for tests and embedding.
    pub fn new() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            operator: OperatorConfig,
        }
        Only::parse_from(["watchpump"]).operator
    }

    pub fn session_ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.panel_session_hours) * 3600)
    }
    pub fn fold_every(&self) -> Duration {
        Duration::from_secs(self.notify_fold_secs)
    }
    pub fn retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.retention_days) * 86_400)
    }
    pub fn failed_retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.failed_retention_days) * 86_400)
    }
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.operator_interval_ms)
    }

    /// The panel's URL without a trailing '/'.
    pub fn panel_url(&self, listen: SocketAddr) -> String {
        match &self.panel_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => format!("http://{listen}/panel"),
        }
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(token) = &self.admin_token {
            if token.chars().count() < MIN_ADMIN_TOKEN_LEN {
                return Err(format!(
                    "WATCHPUMP_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_LEN} characters"
                ));
            }
        }
        if let Some(url) = &self.trace_url {
            if !url.contains("{trace_id}") {
                return Err(format!(
                    "WATCHPUMP_TRACE_URL {url:?} must say where the trace id goes: {{trace_id}}"
                ));
            }
        }
        for (name, url) in [
            ("WATCHPUMP_PANEL_URL", &self.panel_url),
            ("WATCHPUMP_NOTIFY_URL", &self.notify_url),
            ("WATCHPUMP_TRACE_URL", &self.trace_url),
        ] {
            if let Some(url) = url {
                let parsed =
                    reqwest::Url::parse(url).map_err(|e| format!("{name} {url:?}: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                    return Err(format!("{name} {url:?} must be an http(s) URL with a host"));
                }
            }
        }
        if self.panel_session_hours == 0 || self.prune_batch == 0 || self.operator_interval_ms == 0
        {
            return Err(
                "the session hours, prune batch and operator interval must be above zero".into(),
            );
        }
        if self.retention_days == 0 || self.failed_retention_days == 0 {
            return Err("retention periods must be at least one day".into());
        }
        Ok(())
    }
}

impl std::fmt::Debug for OperatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("panel_url", &self.panel_url)
            .field("panel_session_hours", &self.panel_session_hours)
            .field("notify_url", &self.notify_url)
            .field("notify_fold_secs", &self.notify_fold_secs)
            .field("retention_days", &self.retention_days)
            .field("failed_retention_days", &self.failed_retention_days)
            .field("prune_batch", &self.prune_batch)
            .field("operator_interval_ms", &self.operator_interval_ms)
            .finish()
    }
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let cfg = OperatorConfig::new();
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.retention(), Duration::from_secs(7 * 86_400));
        assert_eq!(cfg.failed_retention(), Duration::from_secs(30 * 86_400));
        assert_eq!(cfg.fold_every(), Duration::from_secs(3600));
        assert_eq!(
            cfg.panel_url("127.0.0.1:8080".parse().unwrap()),
            "http://127.0.0.1:8080/panel"
        );
    }

    #[test]
    fn short_tokens_and_bad_urls_are_refused() {
        let mut cfg = OperatorConfig::new();
        cfg.admin_token = Some("short".into());
        assert!(cfg.validate().is_err());
        cfg.admin_token = Some("a-long-enough-admin-token".into());
        cfg.notify_url = Some("ftp://notify".into());
        assert!(cfg.validate().is_err());
        cfg.notify_url = Some("http://notify.internal/api/v1/events".into());
        assert!(cfg.validate().is_ok());
    }
}
