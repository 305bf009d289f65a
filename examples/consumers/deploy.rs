//! `deploy`: app `web-prod` follows pushes to `acme/web`'s main branch and
//! deploys the newest one. The handler only stores the push (answering 2xx
//! once it is stored, as ADR 0021 asks); [`work`] deploys later, and a newer
//! push supersedes one still waiting.

use std::time::Duration;

use sqlx::PgPool;
use watchpump::kit::{BoxError, Delivery, Handler, Outcome, PgTransaction, WatchRequest};

use super::Consumer;

pub const APP: &str = "web-prod";
pub const BRANCH: &str = "acme/web/refs/heads/main";

pub fn consumer() -> Consumer<Deploy> {
    Consumer {
        service: "deploy",
        database: "deploy",
        listen: "127.0.0.1:9101",
        schema: include_str!("deploy.sql"),
        watch: WatchRequest::new(APP, BRANCH).kinds(&["push"]),
        handler: Deploy,
    }
}

pub struct Deploy;

impl Handler for Deploy {
    async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
        let app = &d.resource;
        let known: Option<String> = sqlx::query_scalar("select name from apps where name = $1")
            .bind(app)
            .fetch_optional(&mut **tx)
            .await?;
        if known.is_none() {
            println!("deploy: app {app} no longer exists; answering 410 so git drops the watch");
            return Ok(Outcome::Gone);
        }
        let commit = d.payload["after"]
            .as_str()
            .ok_or("a push without \"after\"")?;
        let superseded = sqlx::query(
            "update deploys set state = 'superseded' where app = $1 and state = 'pending'",
        )
        .bind(app)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        sqlx::query(
            "insert into deploys (app, commit, sequence, delivery_id) values ($1, $2, $3, $4)",
        )
        .bind(app)
        .bind(commit)
        .bind(d.sequence)
        .bind(d.delivery_id)
        .execute(&mut **tx)
        .await?;
        let note = if superseded > 0 {
            ", superseding the push still waiting"
        } else {
            ""
        };
        println!(
            "deploy: {app} will deploy {commit} (push #{}){note}{}",
            d.sequence,
            super::trace_note()
        );
        Ok(Outcome::Done)
    }
}

/// Deploys the newest waiting push of some app, if one waits: one step of
/// the worker. Returns the app and commit deployed.
pub async fn deploy_next(pool: &PgPool) -> Result<Option<(String, String)>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let next: Option<(i64, String, String)> = sqlx::query_as(
        "select id, app, commit from deploys where state = 'pending'
         order by received_at limit 1 for update skip locked",
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some((id, app, commit)) = next else {
        return Ok(None);
    };
    // The real work (a rollout) would go here.
    sqlx::query("update deploys set state = 'deployed', deployed_at = now() where id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some((app, commit)))
}

/// The worker: deploys what waits, checking every second.
pub async fn work(pool: PgPool) {
    loop {
        match deploy_next(&pool).await {
            Ok(Some((app, commit))) => println!("deploy: deployed {app} at {commit}"),
            Ok(None) => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(e) => {
                eprintln!("deploy: the worker failed, trying again: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
