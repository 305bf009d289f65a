//! `watchpump fanout ...`: the fan-out budgets per top segment, and
//! setting one.

use clap::Subcommand;

use crate::error::{Error, Result};

#[derive(Debug, Subcommand)]
pub enum FanoutCommand {
    /// Each top segment with watches under it (or a budget of its own): its
    /// budget, each service's share, the object under it whose watches cost
    /// the most and what they cost, and what each service holds.
    List {
        /// One JSON object {"top_segments": [...]} instead.
        #[arg(long)]
        json: bool,
    },
    /// Set the budget of the objects under one top segment (`acme/`), in
    /// units: 1 per watch, 25 per unit of filter cost; one change there may
    /// then make emit() write that many rows. `default` goes back to the
    /// default (watchpump.settings.fanout_units, else 1200).
    SetBudget {
        /// The top segment: up to and including the first '/' (`acme/`),
        /// or a whole object without one.
        top_segment: String,
        /// Units, 1 to 1000000, or `default`.
        units: String,
    },
}

/// `watchpump fanout ...`: the budgets per top segment, and setting one.
pub(super) async fn run_fanout(pool: &sqlx::PgPool, command: FanoutCommand) -> Result<()> {
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
