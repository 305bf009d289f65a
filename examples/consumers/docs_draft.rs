//! `docs_draft`: follows pushes to any branch of `acme/web` whose paths
//! include `docs/` (the producer filters with a jsonpath, so other pushes
//! never arrive) and builds a draft of the docs for each.

use watchpump::kit::{BoxError, Delivery, Handler, Outcome, PgTransaction, WatchRequest};

use super::Consumer;

pub const BRANCHES: &str = "acme/web/refs/heads/";
pub const TOUCHES_DOCS: &str = r#"$.paths[*] ? (@ starts with "docs/")"#;

pub fn consumer() -> Consumer<DocsDraft> {
    Consumer {
        service: "docs-draft",
        database: "docs_draft",
        listen: "127.0.0.1:9103",
        schema: include_str!("docs_draft.sql"),
        watch: WatchRequest::new("docs-site", BRANCHES)
            .kinds(&["push"])
            .matching(TOUCHES_DOCS),
        handler: DocsDraft,
    }
}

pub struct DocsDraft;

#[derive(serde::Deserialize)]
struct Push {
    after: String,
    paths: Vec<String>,
}

impl Handler for DocsDraft {
    async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
        let push: Push = d.payload_as()?;
        let branch = d.object_after(BRANCHES).ok_or("not a branch of acme/web")?;
        let pages: Vec<&String> = push
            .paths
            .iter()
            .filter(|p| p.starts_with("docs/"))
            .collect();
        sqlx::query(
            "insert into drafts (branch, commit, pages, sequence) values ($1, $2, $3, $4)
             on conflict do nothing",
        )
        .bind(branch)
        .bind(&push.after)
        .bind(sqlx::types::Json(&pages))
        .bind(d.sequence)
        .execute(&mut **tx)
        .await?;
        println!(
            "docs-draft: built a draft of {} page(s) for {branch} at {}{}",
            pages.len(),
            push.after,
            super::trace_note()
        );
        Ok(Outcome::Done)
    }
}
