//! `watchpump fanout ...`: the fan-out budgets per top segment, and
//! setting one.

use crate::config::FanoutCommand;
use crate::error::{Error, Result};

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
