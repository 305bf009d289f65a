//! The `watchpump` command: parse, run one subcommand, and turn any error
//! into a message on stderr and a non-zero exit.
//!
//! This file dispatches; each group of subcommands is a file beside it:
//! `services.rs` (`watchpump services ...`), `kinds.rs` (`watchpump kinds
//! ...`), `fanout.rs` (`watchpump fanout ...`), `consumer.rs` (`watchpump
//! deliveries|watches ...` and `services pause|resume|set-rate`: the
//! consumer's own calls, in the operator's hands), `emit.rs` (`watchpump
//! emit`: its payload, its statement and its refusals), and `logs.rs` (the
//! logs and traces every subcommand writes).
//!
//! Each group's grammar (its clap `Subcommand` enum, whose doc comments are
//! what `--help` prints) is declared in its file, beside the function that
//! matches on it; this file declares the top level ([`Cli`], [`Command`])
//! and `secrets`, which it runs itself. `serve`'s flags are
//! [`crate::config::ServeConfig`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::services::at_rest;
use crate::{schema, server};

mod consumer;
mod emit;
mod fanout;
mod kinds;
mod logs;
mod services;

pub use consumer::{DeliveriesCommand, WatchesCommand};
pub use fanout::FanoutCommand;
pub use kinds::KindsCommand;
pub use services::ServicesCommand;

/// Deliver a producer's committed changes to the services that watch them.
#[derive(Debug, Parser)]
#[command(name = "watchpump", version, about)]
pub struct Cli {
    /// PostgreSQL connection URL of the producer's database.
    ///
    /// PostgreSQL itself, not a pooler in transaction mode, which `serve`
    /// and `migrate` refuse at start (docs/operator.md, "Connection
    /// poolers").
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// How logs are written to stderr: `text` for people (coloured on a
    /// terminal only), `json` (one object per line) for log collectors.
    #[arg(long, env = "WATCHPUMP_LOG_FORMAT", global = true, default_value = "text",
          value_parser = ["text", "json"])]
    pub log_format: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update the `watchpump` schema (also done by `serve`).
    Migrate,
    /// Run the pump and the watches API until SIGTERM or Ctrl-C.
    ///
    /// Traces (OpenTelemetry, OTLP over HTTP/protobuf) are off unless an
    /// endpoint is set, and are configured only by the standard variables:
    /// OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4318) or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL, .../v1/traces);
    /// OTEL_SERVICE_NAME (default watchpump); OTEL_RESOURCE_ATTRIBUTES;
    /// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default
    /// parentbased_always_on); OTEL_EXPORTER_OTLP_TIMEOUT and _HEADERS;
    /// OTEL_BSP_MAX_QUEUE_SIZE (2048 spans; more are dropped and counted in
    /// watchpump_trace_spans_dropped_total), OTEL_BSP_MAX_EXPORT_BATCH_SIZE
    /// and OTEL_BSP_SCHEDULE_DELAY; OTEL_SDK_DISABLED=true turns them off.
    #[command(verbatim_doc_comment)]
    Serve(Box<ServeConfig>),
    /// Register and list consumer services.
    #[command(subcommand)]
    Services(ServicesCommand),
    /// Signing secrets at rest (encrypted with WATCHPUMP_SECRET_KEY).
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// Declare, list and remove the kinds of change the producer emits
    /// (each with a JSON Schema and an example payload), for consumers to
    /// read at GET /api/v1/kinds and, in strict mode, for emit() to check.
    #[command(subcommand)]
    Kinds(KindsCommand),
    /// Consumers' deliveries: list, show one, retry one.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Consumers' watches: pause and resume one.
    #[command(subcommand)]
    Watches(WatchesCommand),
    /// The fan-out budgets: what the watches covering one object may cost
    /// emit(), per top segment of the objects (each service may hold half).
    #[command(subcommand)]
    Fanout(FanoutCommand),
    /// Record a change and fan it out to the matching watches (for trying
    /// things out; producers call watchpump.emit() in their own transaction).
    Emit {
        /// The changed object, e.g. acme/web/refs/heads/main.
        object: String,
        /// The kind of change, e.g. push.
        kind: String,
        /// The change's payload, a JSON object; `-` reads it from stdin,
        /// `@FILE` from a file (for payloads too large for an argument).
        #[arg(default_value = "{}")]
        payload: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Encrypt every signing secret again with WATCHPUMP_SECRET_KEY, opening
    /// those of the previous key with WATCHPUMP_SECRET_KEY_PREVIOUS (a key
    /// rotation; docs/operator.md). `migrate` does the same. Every `serve`
    /// needs the new key first: one without it cannot sign for the services
    /// rekeyed.
    Rekey {
        /// Print one JSON object {"key_id", "secrets"} instead.
        #[arg(long)]
        json: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match logs::init_logs(&cli.log_format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("watchpump: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("watchpump: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(cli));
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("watchpump: {e}");
            match e {
                Error::Invalid(_) | Error::Config(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let url = cli
        .database_url
        .ok_or_else(|| Error::Config("DATABASE_URL (or --database-url) is required".into()))?;
    match cli.command {
        Command::Migrate => {
            let pool = crate::db::connection::connect(&url, 2).await?;
            // sqlx's kept statements need a session of their own, as
            // `serve`'s do (crate::pooler).
            crate::pooler::check_sessions(&pool.connect_options(), "DATABASE_URL").await?;
            let applied = server::migrate_patiently(&pool).await?;
            if applied.is_empty() {
                println!("schema is up to date");
            } else {
                println!("applied: {}", applied.join(", "));
            }
            // Stored filters the language refuses keep working; say which.
            for finding in crate::watches::audit::stored_filters(&pool).await? {
                eprintln!("warning: {finding}");
            }
        }
        Command::Serve(cfg) => server::serve(&url, *cfg, server::shutdown_signal()).await?,
        Command::Secrets(SecretsCommand::Rekey { json }) => {
            // migrate seals what is not sealed with the current key; the
            // key is checked first, so that an unset key is refused even on
            // a database with nothing to seal.
            let keys = at_rest::SecretKeys::from_env()?;
            let pool = crate::db::connection::connect(&url, 2).await?;
            server::migrate_patiently(&pool).await?;
            let secrets = at_rest::count_sealed_with(&pool, keys.current_id()).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"key_id": keys.current_id(), "secrets": secrets})
                );
            } else {
                println!(
                    "every signing secret ({secrets}) is encrypted with key {}; {} can be unset \
                     once every `watchpump serve` has {} set to it",
                    keys.current_id(),
                    at_rest::PREVIOUS_KEY_VAR,
                    at_rest::KEY_VAR
                );
            }
        }
        Command::Services(command) => {
            let pool = crate::db::connection::connect(&url, 2).await?;
            schema::require(&pool).await?;
            server::migrate_patiently(&pool).await?;
            services::run_services(&pool, command).await?;
        }
        Command::Kinds(command) => {
            let pool = crate::db::connection::connect(&url, 2).await?;
            schema::require(&pool).await?;
            server::migrate_patiently(&pool).await?;
            kinds::run_kinds(&pool, command).await?;
        }
        Command::Watches(command) => {
            let pool = crate::db::connection::connect(&url, 2).await?;
            schema::require(&pool).await?;
            consumer::run_watches(&pool, command).await?;
        }
        Command::Deliveries(command) => {
            let pool = crate::db::connection::connect(&url, 2).await?;
            schema::require(&pool).await?;
            consumer::run_deliveries(&pool, command).await?;
        }
        Command::Fanout(command) => {
            let pool = crate::db::connection::connect(&url, 2).await?;
            schema::require(&pool).await?;
            fanout::run_fanout(&pool, command).await?;
        }
        Command::Emit {
            object,
            kind,
            payload,
        } => {
            crate::watches::check_object(&object)?;
            let payload = emit::read_payload(&payload)?;
            let pool = crate::db::connection::connect(&url, 2).await?;
            schema::require(&pool).await?;
            let (change_id, deliveries) = emit::emit_one(&pool, &object, &kind, &payload)
                .await
                .map_err(emit::emit_error)?;
            let plural = if deliveries == 1 {
                "delivery"
            } else {
                "deliveries"
            };
            println!("change {change_id}: {deliveries} {plural}");
        }
    }
    Ok(())
}
