//! `preview`: follows every merge request of `acme/web` (the object prefix
//! `acme/web/merge_requests/`) and keeps one preview per open merge request:
//! made on `opened`, moved to the new head on `updated`, removed on `closed`.

use watchpump::kit::{BoxError, Delivery, Handler, Outcome, PgTransaction, WatchRequest};

use super::Consumer;

pub const PREFIX: &str = "acme/web/merge_requests/";

pub fn consumer() -> Consumer<Preview> {
    Consumer {
        service: "preview",
        database: "preview",
        listen: "127.0.0.1:9102",
        schema: include_str!("preview.sql"),
        watch: WatchRequest::new("web-previews", PREFIX).kinds(&["opened", "updated", "closed"]),
        handler: Preview,
    }
}

pub struct Preview;

impl Handler for Preview {
    async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
        let mr = d
            .object_after(PREFIX)
            .ok_or("not a merge request of acme/web")?;
        if d.kind == "closed" {
            sqlx::query("delete from previews where merge_request = $1")
                .bind(mr)
                .execute(&mut **tx)
                .await?;
            println!("preview: merge request {mr} closed, preview removed");
            return Ok(Outcome::Done);
        }
        let head = d.payload["head"]
            .as_str()
            .ok_or("a merge request change without \"head\"")?;
        let url = format!("http://mr-{mr}.preview.acme.test");
        sqlx::query(
            "insert into previews (merge_request, head, url, sequence) values ($1, $2, $3, $4)
             on conflict (merge_request) do update
             set head = excluded.head, sequence = excluded.sequence, updated_at = now()",
        )
        .bind(mr)
        .bind(head)
        .bind(&url)
        .bind(d.sequence)
        .execute(&mut **tx)
        .await?;
        println!(
            "preview: merge request {mr} {} at {head}: {url}{}",
            d.kind,
            super::trace_note()
        );
        Ok(Outcome::Done)
    }
}
