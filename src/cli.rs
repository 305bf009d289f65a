//! The `watchpump` command: parse, run one subcommand, and turn any error
//! into a message on stderr and a non-zero exit.

use std::process::ExitCode;

use clap::Parser;

use crate::config::{Cli, Command, FanoutCommand, KindsCommand, SecretsCommand, ServicesCommand};
use crate::error::{Error, Result};
use crate::{kinds, schema, server, services, telemetry};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match init_logs(&cli.log_format) {
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
/// NO_COLOR set) or as one JSON object per line (with the trace id when the
/// line was written inside a traced span). RUST_LOG filters them.
///
/// Traces are exported when an OTLP endpoint is set
/// ([`telemetry::Telemetry::from_env`]); otherwise the spans' target is
/// filtered out, so they cost nothing.
fn init_logs(format: &str) -> std::result::Result<Option<telemetry::Telemetry>, String> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let telemetry = telemetry::Telemetry::from_env()?;
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx::postgres::notice=warn"));
    // The spans' target: off without an endpoint, so that they cost
    // nothing; on with one, whatever RUST_LOG's level for the rest (the
    // log level must not decide what is traced).
    let level = if telemetry.is_some() { "info" } else { "off" };
    filter = filter.add_directive(
        format!("{}={level}", telemetry::TARGET)
            .parse()
            .expect("a valid directive"),
    );
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if format == "json" {
        logs.fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(telemetry::logs::JsonWithTraceId(
                tracing_subscriber::fmt::format().json().flatten_event(true),
            ))
            .boxed()
    } else {
        let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let logs = logs.with_ansi(colours);
        // With traces on, the text lines stay as they are with traces off:
        // the spans made only for traces are kept from this layer, which
        // would otherwise format every field of each of them (the JSON
        // layer sees them, for their trace id).
        if telemetry.is_some() {
            logs.with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target() != telemetry::TARGET
            }))
            .boxed()
        } else {
            logs.boxed()
        }
    };
    let traces = telemetry.as_ref().map(|t| t.layer());
    tracing_subscriber::registry()
        .with(filter)
        .with(traces)
        .with(logs)
        .init();
    Ok(telemetry)
}

/// A forced rotation during an overlap stopped a credential early: said on
/// stderr, whatever the output format, since a consumer may still be on it.
fn say_retired_early(name: &str, what: &str, doing: &str, rotated: &services::Rotated) {
    if let Some(until) = rotated.retired_early {
        eprintln!(
            "watchpump: warning: service {name}'s {what} before the last rotation, due to stop {doing} at {}, stopped now (--force)",
            until.to_rfc3339()
        );
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
            signature,
        } => {
            let allowed = allowed_destinations.unwrap_or_default();
            let signature = services::Signature::parse(&signature)?;
            let new = services::add_signed(pool, &name, &base_url, &allowed, signature).await?;
            if let Some(public) = &new.signing_public_key {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"name": new.service.name, "token": new.token,
                                           "signing_public_key": public})
                    );
                } else {
                    println!(
                        "service {} ({}) registered.\n\
                         deliveries to it are signed with ed25519 (Standard Webhooks v1a); \
                         they verify with the public key: {}\n\
                         its token, shown only this once:\n{}",
                        new.service.name, new.service.base_url, public, new.token
                    );
                }
            } else if json {
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
        ServicesCommand::RotateSecret {
            name,
            overlap,
            force,
            json,
        } => {
            let overlap = services::parse_duration(&overlap)?;
            let rotated = services::rotate_secret(pool, &name, overlap, force).await?;
            say_retired_early(&name, "signing secret", "signing", &rotated);
            if json {
                // What `services add --json` calls it: a public key is no secret.
                let field = if rotated.new.starts_with("whpk_") {
                    "signing_public_key"
                } else {
                    "signing_secret"
                };
                println!(
                    "{}",
                    serde_json::json!({"service": name, field: rotated.new,
                        "previous_secret_signs_until": rotated.previous_until,
                        "retired_early": rotated.retired_early})
                );
            } else {
                println!(
                    "service {name} has a new signing secret; the old one also signs until {}:\n{}",
                    rotated.previous_until.to_rfc3339(),
                    rotated.new
                );
            }
        }
        ServicesCommand::RotateToken {
            name,
            grace,
            force,
            json,
        } => {
            let grace = services::parse_duration(&grace)?;
            let rotated = services::rotate_token(pool, &name, grace, force).await?;
            say_retired_early(&name, "token", "working", &rotated);
            if json {
                println!(
                    "{}",
                    serde_json::json!({"service": name, "token": rotated.new,
                        "previous_token_works_until": rotated.previous_until,
                        "retired_early": rotated.retired_early})
                );
            } else {
                println!(
                    "service {name} has a new token; the old one works until {}. The new token, shown only this once:\n{}",
                    rotated.previous_until.to_rfc3339(),
                    rotated.new
                );
            }
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
        ServicesCommand::SetRate { name, rate } => {
            crate::cli_consumer::set_rate(pool, &name, &rate).await?
        }
        ServicesCommand::Pause { name } => {
            crate::cli_consumer::pause_service(pool, &name, true).await?
        }
        ServicesCommand::Resume { name } => {
            crate::cli_consumer::pause_service(pool, &name, false).await?
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
            let keys = services::at_rest::SecretKeys::from_env()?;
            let pool = server::connect(&url, 2).await?;
            schema::migrate(&pool).await?;
            let secrets = services::at_rest::count_sealed_with(&pool, keys.current_id()).await?;
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
                    services::at_rest::PREVIOUS_KEY_VAR,
                    services::at_rest::KEY_VAR
                );
            }
        }
        Command::Services(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            schema::migrate(&pool).await?;
            run_services(&pool, command).await?;
        }
        Command::Kinds(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            schema::migrate(&pool).await?;
            run_kinds(&pool, command).await?;
        }
        Command::Watches(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            crate::cli_consumer::run_watches(&pool, command).await?;
        }
        Command::Deliveries(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            crate::cli_consumer::run_deliveries(&pool, command).await?;
        }
        Command::Fanout(command) => {
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            run_fanout(&pool, command).await?;
        }
        Command::Emit {
            object,
            kind,
            payload,
        } => {
            crate::watches::check_object(&object)?;
            let payload = read_payload(&payload)?;
            let pool = server::connect(&url, 2).await?;
            schema::require(&pool).await?;
            let (change_id, deliveries) = emit_one(&pool, &object, &kind, &payload)
                .await
                .map_err(emit_error)?;
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

/// `watchpump emit`: the change and how many deliveries it made.
async fn emit_one(
    pool: &sqlx::PgPool,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
) -> std::result::Result<(i64, i64), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let counted = crate::db::operator::emit_counted(&mut tx, object, kind, payload).await?;
    tx.commit().await?;
    Ok(counted)
}

/// emit()'s refusals (bad input, strict mode's 22023 and 23514) as the
/// message it raised; a schema older than this binary as what to run.
fn emit_error(e: sqlx::Error) -> Error {
    let code = match &e {
        sqlx::Error::Database(d) => d.code().map(|c| c.to_string()),
        _ => None,
    };
    match code.as_deref() {
        // undefined_function, undefined_table, invalid_schema_name
        Some("42883" | "42P01" | "3F000") => Error::NotFound(format!(
            "{e}: the watchpump schema is missing or older than this binary; run `watchpump migrate`"
        )),
        Some("23514") => match e {
            sqlx::Error::Database(d) => Error::Invalid(
                d.message()
                    .trim_start_matches("watchpump.emit: ")
                    .to_string(),
            ),
            e => Error::Database(e),
        },
        _ => Error::raised(e),
    }
}

/// `watchpump fanout ...`: the budgets per top segment, and setting one.
async fn run_fanout(pool: &sqlx::PgPool, command: FanoutCommand) -> Result<()> {
    use crate::watches::fanout;
    match command {
        FanoutCommand::List { json } => {
            let reports = fanout::report(pool).await?;
            if json {
                println!("{}", serde_json::json!({ "top_segments": reports }));
                return Ok(());
            }
            if reports.is_empty() {
                println!("no live watches, and no budget set");
            }
            for r in reports {
                let set = if r.set_by_operator { ", set" } else { "" };
                let worst = r
                    .worst_object
                    .as_deref()
                    .map_or(String::new(), |o| format!(" at {o}"));
                println!(
                    "{}: budget {}{set}, each service at most {}; {} used{worst}",
                    r.top_segment, r.budget, r.share, r.units
                );
                for s in r.services {
                    println!("  {} {}", s.service, s.units);
                }
            }
        }
        FanoutCommand::SetBudget { top_segment, units } => {
            let units = match units.as_str() {
                "default" => None,
                n => Some(n.parse::<i64>().map_err(|_| {
                    Error::Invalid(format!(
                        "units must be a whole number of units or `default`, not {n}"
                    ))
                })?),
            };
            let budget = fanout::set_budget(pool, &top_segment, units, "cli").await?;
            println!(
                "fan-out budget of {top_segment}: {budget} units, each service at most {}",
                budget / fanout::SHARES
            );
        }
    }
    Ok(())
}

/// `watchpump kinds ...`: each prints what it did.
async fn run_kinds(pool: &sqlx::PgPool, command: KindsCommand) -> Result<()> {
    match command {
        KindsCommand::Add {
            file: Some(file), ..
        } => {
            let text = read_text(&file, "the kinds file")?;
            let declared = kinds::KindsFile::parse(&text)?;
            let mut tx = pool.begin().await?;
            let mut said = Vec::new();
            for kind in &declared.kinds {
                let created = kinds::add_in(&mut tx, kind).await?;
                said.push(format!(
                    "kind {} {}",
                    kind.name,
                    if created { "declared" } else { "updated" }
                ));
            }
            tx.commit().await?;
            for line in said {
                println!("{line}");
            }
        }
        KindsCommand::Add {
            name: Some(name),
            schema: Some(schema),
            example: Some(example),
            description,
            ..
        } => {
            let schema = serde_json::from_str(&read_text(&schema, "the schema")?)
                .map_err(|e| Error::Invalid(format!("the schema is not JSON: {e}")))?;
            let example = serde_json::from_str(&example)
                .map_err(|e| Error::Invalid(format!("the example is not JSON: {e}")))?;
            let new = kinds::NewKind {
                name,
                description,
                schema,
                example,
            };
            let created = kinds::add(pool, &new).await?;
            let what = if created { "declared" } else { "updated" };
            println!("kind {} {what}", new.name);
        }
        KindsCommand::Add { .. } => {
            return Err(Error::Invalid(
                "kinds add needs NAME --schema FILE --example JSON, or --file FILE".into(),
            ))
        }
        KindsCommand::List { json } => {
            let mut after = String::new();
            loop {
                let page = kinds::list(pool, &after, 1000).await?;
                for k in &page {
                    if json {
                        println!(
                            "{}",
                            serde_json::to_string(k).map_err(|e| Error::Invalid(e.to_string()))?
                        );
                    } else {
                        println!("{}\t{}", k.name, k.description);
                    }
                }
                match page.last() {
                    Some(last) if page.len() == 1000 => after = last.name.clone(),
                    _ => break,
                }
            }
        }
        KindsCommand::Remove { name } => {
            kinds::remove(pool, &name).await?;
            println!("kind {name} removed");
        }
    }
    Ok(())
}

/// A file's text, or stdin's for `-`.
fn read_text(arg: &str, what: &str) -> Result<String> {
    use std::io::Read;
    if arg == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Error::Invalid(format!("cannot read {what} from stdin: {e}")))?;
        return Ok(text);
    }
    std::fs::read_to_string(arg)
        .map_err(|e| Error::Invalid(format!("cannot read {what} from {arg:?}: {e}")))
}
