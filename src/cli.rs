//! The `watchpump` command: parse, run one subcommand, and turn any error
//! into a message on stderr and a non-zero exit.

use std::process::ExitCode;

use clap::Parser;

use crate::config::{Cli, Command, ServicesCommand};
use crate::error::{Error, Result};
use crate::{schema, server, services};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(&cli.log_format);
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
    match runtime.block_on(run(cli)) {
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

/// The payload of `watchpump emit`: the argument itself, `-` for stdin or
/// `@FILE`; a JSON object without NUL characters (jsonb cannot hold them).
fn read_payload(arg: &str) -> Result<serde_json::Value> {
    use std::io::Read;
    let text = match arg {
        "-" => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Error::Invalid(format!("cannot read the payload from stdin: {e}")))?;
            text
        }
        _ => match arg.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path).map_err(|e| {
                Error::Invalid(format!("cannot read the payload from {path:?}: {e}"))
            })?,
            None => arg.to_string(),
        },
    };
    let payload: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("payload is not JSON: {e}")))?;
    if !payload.is_object() {
        return Err(Error::Invalid("payload must be a JSON object".into()));
    }
    if holds_nul(&payload) {
        return Err(Error::Invalid(
            "payload contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
                .into(),
        ));
    }
    Ok(payload)
}

fn holds_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// Logs to stderr, as text (ANSI colours only on a terminal, and never with
/// NO_COLOR set) or as one JSON object per line. RUST_LOG filters them.
fn init_logs(format: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx::postgres::notice=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        logs.with_ansi(colours).init();
    }
}

/// `watchpump services ...`: each prints what it did.
async fn run_services(pool: &sqlx::PgPool, command: ServicesCommand) -> Result<()> {
    match command {
        ServicesCommand::Add {
            name,
            base_url,
            json,
            allowed_destinations,
        } => {
            let allowed = allowed_destinations.unwrap_or_default();
            let new = services::add_within(pool, &name, &base_url, &allowed).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"name": new.service.name, "token": new.token,
                                       "signing_secret": new.signing_secret})
                );
            } else {
                println!(
                    "service {} ({}) registered.\n\
                     deliveries to it are signed (Standard Webhooks) with: {}\n\
                     its token, shown only this once:\n{}",
                    new.service.name, new.service.base_url, new.signing_secret, new.token
                );
            }
        }
        ServicesCommand::List => {
            for s in services::list(pool).await? {
                // Base URLs with credentials are refused; a row older than
                // that rule still prints without them.
                let base_url = crate::redact::mask(&s.base_url, &[]);
                println!("{}\t{base_url}\t{}", s.name, s.created_at.to_rfc3339());
            }
        }
        ServicesCommand::RotateSecret { name, overlap } => {
            let overlap = services::parse_duration(&overlap)?;
            let (secret, until) = services::rotate_secret(pool, &name, overlap).await?;
            println!(
                "service {name} has a new signing secret; the old one also signs until {}:\n{secret}",
                until.to_rfc3339()
            );
        }
        ServicesCommand::RotateToken { name, grace } => {
            let grace = services::parse_duration(&grace)?;
            let (token, until) = services::rotate_token(pool, &name, grace).await?;
            println!(
                "service {name} has a new token; the old one works until {}. The new token, shown only this once:\n{token}",
                until.to_rfc3339()
            );
        }
        ServicesCommand::SetUrl {
            name,
            base_url,
            allowed_destinations,
        } => {
            let allowed = allowed_destinations.unwrap_or_default();
            let s = services::set_url_within(pool, &name, &base_url, &allowed).await?;
            println!(
                "service {} now receives deliveries at {}",
                s.name, s.base_url
            );
        }
        ServicesCommand::Remove { name, yes } => {
            let service = services::find(pool, &name).await?;
            if !yes {
                return Err(Error::Invalid(format!(
                    "not removing service {}: its token would stop working, its watches be removed and \
                     their undelivered deliveries dropped; run again with --yes to do so",
                    service.name
                )));
            }
            let removal = services::remove(pool, &name, "cli").await?;
            println!(
                "service {name} removed: {} watches removed, {} undelivered deliveries dropped",
                removal.watches, removal.deliveries
            );
        }
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    let url = cli
        .database_url
        .ok_or_else(|| Error::Config("DATABASE_URL (or --database-url) is required".into()))?;
    match cli.command {
        Command::Migrate => {
            let pool = server::connect(&url, 2).await?;
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
        Command::Services(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::migrate(&pool).await?;
            run_services(&pool, command).await?;
        }
        Command::Emit {
            object,
            kind,
            payload,
        } => {
            let payload = read_payload(&payload)?;
            let pool = server::connect(&url, 2).await?;
            let mut tx = pool.begin().await?;
            let change_id = crate::emit(&mut tx, &object, &kind, &payload).await?;
            let deliveries: i64 = sqlx::query_scalar(
                "select count(*) from watchpump.deliveries where change_id = $1",
            )
            .bind(change_id)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            println!("change {change_id}: {deliveries} deliveries");
        }
    }
    Ok(())
}
