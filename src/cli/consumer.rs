//! The operator's CLI forms of what a consumer can see and do through the
//! API (issue 20): `watchpump deliveries list|show|retry` and `watchpump
//! watches pause|resume|resync ID --service NAME`, over the same
//! views and functions as the panel and the admin API
//! ([`crate::operator::store`]). Each prints what it found or did, or
//! fails with a message and a non-zero exit ([`crate::cli`]).

use chrono::{DateTime, Utc};
use clap::Subcommand;
use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::operator::store::{self, DeliveryFilter};
use crate::watches::{pause, resync};

/// How CLI actions appear in a delivery's history.
const ACTOR: &str = "cli";

#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// List deliveries, newest first, one a line (or as JSON).
    List {
        /// Only this service's.
        #[arg(long)]
        service: Option<String>,
        /// Only this state: pending, in_flight, delivered, superseded,
        /// dropped, failed.
        #[arg(long)]
        state: Option<String>,
        /// Only this object, or the objects under a prefix ending in '/'.
        #[arg(long)]
        object: Option<String>,
        /// Only those created at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<DateTime<Utc>>,
        /// Only those after this delivery id in the listing's order, newest
        /// first (the next page; once named --before).
        #[arg(long, alias = "before")]
        after: Option<i64>,
        /// At most this many (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// One JSON object {"deliveries": [...]} instead.
        #[arg(long)]
        json: bool,
    },
    /// One delivery: its row, its attempts (identical failures in a row
    /// folded into one line) and its history.
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Queue a failed or dropped delivery again under the same id (refused
    /// when newer news of its object was sent or is on its way).
    Retry { id: i64 },
}

pub(super) async fn run_deliveries(pool: &PgPool, command: DeliveriesCommand) -> Result<()> {
    match command {
        DeliveriesCommand::List {
            service,
            state,
            object,
            since,
            after,
            limit,
            json,
        } => {
            let filter = DeliveryFilter {
                service,
                state,
                object,
                since,
                after,
                limit: Some(limit),
                watch_id: None,
                ..DeliveryFilter::default()
            };
            let page = store::deliveries(pool, &filter.normalized()).await?;
            if json {
                println!("{}", serde_json::json!({ "deliveries": page }));
                return Ok(());
            }
            println!("id\tservice\twatch\tobject\tkind\tsequence\tstate\tattempts\tlast_status\tcreated_at");
            for d in page {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    d.delivery_id,
                    d.service,
                    d.watch_id,
                    d.object,
                    d.kind,
                    d.sequence,
                    d.state,
                    d.attempts,
                    d.last_status.map_or("-".into(), |s| s.to_string()),
                    d.created_at.to_rfc3339()
                );
            }
        }
        DeliveriesCommand::Show { id, json } => {
            // What the admin API answers for it, and the panel shows.
            let shown = store::shown(pool, id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("there is no delivery {id}")))?;
            let text = if json {
                serde_json::to_string(&shown)
            } else {
                serde_json::to_string_pretty(&shown)
            }
            .map_err(|e| Error::Invalid(e.to_string()))?;
            println!("{}", crate::redact::mask(&text, &[]));
        }
        DeliveriesCommand::Retry { id } => {
            let previous = store::retry(pool, id, ACTOR).await?;
            println!("delivery {id} was {previous}; it is pending again");
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum WatchesCommand {
    /// Pause a watch: nothing is sent to it and nothing fails until it is
    /// resumed; news keeps superseding older news while it waits.
    Pause {
        id: i64,
        /// The service the watch belongs to.
        #[arg(long)]
        service: String,
    },
    /// Resume a paused watch: its waiting news is sent, each with a fresh
    /// delivery window.
    Resume {
        id: i64,
        #[arg(long)]
        service: String,
    },
    /// Resync a watch: the newest retained change of every object it
    /// covers that matches its filters is queued again for it, as a replay
    /// (docs/protocol.md, "Resync"). Runs here, to the end; at most
    /// WATCHPUMP_RESYNC_MAX_OBJECTS objects.
    Resync {
        id: i64,
        #[arg(long)]
        service: String,
        /// Objects at most (WATCHPUMP_RESYNC_MAX_OBJECTS).
        #[arg(long, env = "WATCHPUMP_RESYNC_MAX_OBJECTS", default_value_t = 10_000)]
        max_objects: u32,
    },
}

pub(super) async fn run_watches(pool: &PgPool, command: WatchesCommand) -> Result<()> {
    let (id, service, paused) = match command {
        WatchesCommand::Pause { id, service } => (id, service, true),
        WatchesCommand::Resume { id, service } => (id, service, false),
        WatchesCommand::Resync {
            id,
            service,
            max_objects,
        } => return run_resync(pool, id, &service, max_objects).await,
    };
    let service_id = pause::service_id(pool, &service).await?;
    let changed = pause::set_watch(pool, service_id, id, paused).await?;
    println!("{}", said("watch", &id.to_string(), paused, changed));
    Ok(())
}

/// `watchpump watches resync ID --service NAME`: started as the API starts
/// it (one at a time per service; the operator's own, so not out of the
/// service's replay budget), run to its end in this process.
async fn run_resync(pool: &PgPool, id: i64, service: &str, max: u32) -> Result<()> {
    let service_id = pause::service_id(pool, service).await?;
    let started = match resync::start(pool, service_id, id, max).await {
        Err(Error::Database(e)) if crate::api::limits::refusal_of(&e).is_some() => {
            let (message, _) = crate::api::limits::refusal_of(&e).expect("checked above");
            return Err(Error::Conflict(format!(
                "{message}; ask again when it is done"
            )));
        }
        other => other?,
    };
    let done = resync::run(pool, id, max).await?;
    let mut said = format!(
        "resync of watch {id}: {} object(s) looked at, {} replay(s) queued",
        done.objects, done.queued
    );
    if started.truncated {
        said.push_str(&format!(
            "; the watch covers more than {max} objects, the rest were not looked at"
        ));
    }
    if let Some(from) = started.history_from {
        said.push_str(&format!("; history is kept from {}", from.to_rfc3339()));
    }
    println!("{said}");
    Ok(())
}

/// `watchpump services pause|resume NAME`.
pub(super) async fn pause_service(pool: &PgPool, name: &str, paused: bool) -> Result<()> {
    let service_id = pause::service_id(pool, name).await?;
    let changed = pause::set_service(pool, service_id, paused).await?;
    println!("{}", said("service", name, paused, changed));
    Ok(())
}

fn said(what: &str, name: &str, paused: bool, changed: bool) -> String {
    match (paused, changed) {
        (true, true) => format!("{what} {name} paused: its deliveries wait until it is resumed"),
        (true, false) => format!("{what} {name} was paused already"),
        (false, true) => format!("{what} {name} resumed: its waiting deliveries are due now"),
        (false, false) => format!("{what} {name} was not paused"),
    }
}

/// `watchpump services set-rate NAME RATE|none`.
pub(super) async fn set_rate(pool: &PgPool, name: &str, rate: &str) -> Result<()> {
    let rate = match rate {
        "none" => None,
        text => {
            let n: i64 = text.parse().map_err(|_| {
                Error::Invalid(format!(
                    "the rate is a whole number of deliveries a second, or none; not {text:?}"
                ))
            })?;
            Some(crate::services::rate::check(n)?)
        }
    };
    crate::services::rate::set_max(pool, name, rate).await?;
    match rate {
        Some(rate) => println!("service {name} gets at most {rate} deliveries a second"),
        None => println!("service {name} has no rate limit"),
    }
    Ok(())
}
