//! `watchpump kinds ...`: declare kinds (one, or a file of them), list
//! and remove them.

use clap::Subcommand;

use crate::error::{Error, Result};
use crate::kinds;

#[derive(Debug, Subcommand)]
pub enum KindsCommand {
    /// Declare a kind (or replace its declaration): `kinds add NAME --schema
    /// FILE --example JSON`, or every kind of a kinds file with `--file`.
    Add {
        /// The kind's name, as emit() is given it, e.g. push.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        name: Option<String>,
        /// The payload's JSON Schema, from a file, or `-` for stdin; within
        /// the subset strict mode checks (type, required, properties,
        /// items, enum, additionalProperties: false).
        #[arg(long, requires = "name", required_unless_present = "file")]
        schema: Option<String>,
        /// An example payload, a JSON object that fits the schema.
        #[arg(long, requires = "name", required_unless_present = "file")]
        example: Option<String>,
        /// What a change of this kind means, for consumer teams.
        #[arg(long, default_value = "", requires = "name")]
        description: String,
        /// A kinds file, `{"kinds": [{"name", "description", "schema",
        /// "example"}, ...]}` (such as kinds/git.json): declares each, or
        /// none if one is refused.
        #[arg(long)]
        file: Option<String>,
    },
    /// List the declared kinds: name and description (`--json`: everything).
    List {
        /// One JSON object per kind, with its schema and example.
        #[arg(long)]
        json: bool,
    },
    /// Remove a kind's declaration (in strict mode emit() then refuses it).
    Remove { name: String },
}

/// `watchpump kinds ...`: each prints what it did.
pub(super) async fn run_kinds(pool: &sqlx::PgPool, command: KindsCommand) -> Result<()> {
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
