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

use std::process::ExitCode;

use clap::Parser;

use crate::config::{Cli, Command, SecretsCommand};
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
            let pool = server::connect(&url, 2).await?;
            // sqlx's kept statements need a session of their own, as
            // `serve`'s do (crate::pooler).
            crate::pooler::check_sessions(&pool.connect_options(), "DATABASE_URL").await?;
            let applied = schema::migrate(&pool).await?;
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
            let pool = server::connect(&url, 2).await?;
            schema::migrate(&pool).await?;
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
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            schema::migrate(&pool).await?;
            services::run_services(&pool, command).await?;
        }
        Command::Kinds(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            schema::migrate(&pool).await?;
            kinds::run_kinds(&pool, command).await?;
        }
        Command::Watches(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            consumer::run_watches(&pool, command).await?;
        }
        Command::Deliveries(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            consumer::run_deliveries(&pool, command).await?;
        }
        Command::Fanout(command) => {
            let pool = server::connect(&url, 2).await?;
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
            let pool = server::connect(&url, 2).await?;
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
