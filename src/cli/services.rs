//! `watchpump services ...`: register, list, rotate a secret or a token,
//! move, rate-limit, pause, resume and remove a consumer service, each
//! printing what it did (as JSON with `--json` where a script reads it).

use clap::Subcommand;

use crate::destinations::Destinations;
use crate::error::{Error, Result};
use crate::services;

#[derive(Debug, Subcommand)]
pub enum ServicesCommand {
    /// Register a consumer service; prints its signing secret, and its token
    /// once, on the last line.
    Add {
        /// Service name: a-z, 0-9, '-' and '_'.
        name: String,
        /// Where the service listens; deliveries go to
        /// BASE_URL/api/v1/PRODUCER/events.
        #[arg(long)]
        base_url: String,
        /// Print one JSON object {"name", "token", "signing_secret"} instead
        /// ({"name", "token", "signing_public_key"} for ed25519).
        #[arg(long)]
        json: bool,
        /// How deliveries are signed: hmac (Standard Webhooks v1, a secret
        /// both sides hold) or ed25519 (v1a: the consumer holds only a
        /// public key, whpk_).
        #[arg(long, default_value = "hmac", value_parser = ["hmac", "ed25519"])]
        signature: String,
        /// Where base URLs may point (as for `serve`).
        #[arg(long, env = "WATCHPUMP_ALLOWED_DESTINATIONS", value_parser = Destinations::parse)]
        allowed_destinations: Option<Destinations>,
    },
    /// List the registered consumer services (never their credentials).
    List,
    /// Give a service a new signing secret; the old one keeps signing next
    /// to it (both signatures are sent: at most two secrets sign at once)
    /// until the overlap ends. Refused during the overlap of the last
    /// rotation, unless --force. Prints the new secret on the last line.
    RotateSecret {
        name: String,
        /// How long the old secret keeps signing: 90s, 30m, 24h, 7d.
        #[arg(long, default_value = crate::services::DEFAULT_OVERLAP)]
        overlap: String,
        /// Rotate even during the last rotation's overlap: the secret before
        /// the current one stops signing at once, and a consumer still on
        /// it refuses every delivery.
        #[arg(long)]
        force: bool,
        /// Print one JSON object {"service", "signing_secret" (or
        /// "signing_public_key"), "previous_secret_signs_until",
        /// "retired_early"} instead.
        #[arg(long)]
        json: bool,
    },
    /// Give a service a new token; the old one keeps working for the grace
    /// period. Refused during the grace of the last rotation, unless
    /// --force. Prints the new token on the last line.
    RotateToken {
        name: String,
        /// How long the old token keeps working: 90s, 30m, 24h, 7d.
        #[arg(long, default_value = crate::services::DEFAULT_OVERLAP)]
        grace: String,
        /// Rotate even during the last rotation's grace: the token before
        /// the current one stops working at once.
        #[arg(long)]
        force: bool,
        /// Print one JSON object {"service", "token",
        /// "previous_token_works_until", "retired_early"} instead.
        #[arg(long)]
        json: bool,
    },
    /// Point a service at a new base URL.
    SetUrl {
        name: String,
        base_url: String,
        /// Where base URLs may point (as for `serve`).
        #[arg(long, env = "WATCHPUMP_ALLOWED_DESTINATIONS", value_parser = Destinations::parse)]
        allowed_destinations: Option<Destinations>,
    },
    /// Set the most deliveries a second a service gets, all pumps together
    /// (`none`: no limit). Deliveries over it wait; none is dropped.
    SetRate {
        name: String,
        /// Deliveries a second (at least 1), or `none`.
        rate: String,
    },
    /// Pause every watch of a service: nothing is sent to it and nothing
    /// fails until it is resumed.
    Pause { name: String },
    /// Resume a paused service: its waiting news is sent, each with a fresh
    /// delivery window.
    Resume { name: String },
    /// Remove a service: its token stops working, its watches are removed
    /// and their undelivered deliveries dropped.
    Remove {
        name: String,
        /// Confirm: without it nothing is removed.
        #[arg(long)]
        yes: bool,
    },
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
pub(super) async fn run_services(pool: &sqlx::PgPool, command: ServicesCommand) -> Result<()> {
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
            super::consumer::set_rate(pool, &name, &rate).await?
        }
        ServicesCommand::Pause { name } => {
            super::consumer::pause_service(pool, &name, true).await?
        }
        ServicesCommand::Resume { name } => {
            super::consumer::pause_service(pool, &name, false).await?
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
