//! The operator's list of one service's deliveries covers every state,
//! newest first, with keyset pages: finished, pending and in-flight rows
//! come from different indexes and are merged.

mod common;

use common::*;
use serde_json::json;
use watchpump::operator::store::{self, DeliveryFilter};

fn for_service(service: &str, after: Option<i64>, limit: i64) -> DeliveryFilter {
    DeliveryFilter {
        state: None,
        service: Some(service.into()),
        object: None,
        since: None,
        until: None,
        after,
        before: None,
        limit: Some(limit),
        watch_id: None,
    }
}

#[tokio::test]
async fn one_services_deliveries_in_every_state_come_newest_first_in_pages() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let (docs, _) = db.add_service("docs", "http://127.0.0.1:9").await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    db.add_watch(docs.id, "site", "acme/", all()).await;
    for n in 0..12 {
        db.emit(&format!("acme/web/refs/heads/b{n}"), "push", json!({}))
            .await;
    }
    let ids: Vec<i64> =
        sqlx::query_scalar("select id from watchpump.deliveries where service_id = $1 order by id")
            .bind(deploy.id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(ids.len(), 12);
    // Four states among deploy's twelve, interleaved by id.
    let states = ["delivered", "pending", "failed", "in_flight"];
    for (i, id) in ids.iter().enumerate() {
        set_state(&db, &[*id], states[i % 4], None).await;
    }

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store::deliveries(&db.pool, &for_service("deploy", after, 5))
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 5);
        seen.extend(page.iter().map(|d| d.delivery_id));
        after = page.last().map(|d| d.delivery_id);
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(
        seen, newest_first,
        "every state, newest first, no gaps or repeats across pages"
    );

    let only_docs = store::deliveries(&db.pool, &for_service("docs", None, 100))
        .await
        .unwrap();
    assert_eq!(only_docs.len(), 12);
    assert!(only_docs.iter().all(|d| !ids.contains(&d.delivery_id)));
}

/// The page statements are planned with their values each time (a custom
/// plan), never with a generic plan that would keep one index for every
/// filter, however often they run on one connection
/// (`src/db/operator/page_by_id.sql` says why it matters).
#[tokio::test]
async fn listing_pages_are_planned_with_their_values_every_time() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    db.emit("acme/web", "push", json!({})).await;
    let one = watchpump::server::connect(&db.url, 1).await.unwrap();
    let until = chrono::Utc::now() + chrono::Duration::hours(1);
    for _ in 0..8 {
        let by_id = for_service("deploy", None, 5);
        let page = store::page(&one, &by_id, Some(deploy.id)).await.unwrap();
        assert_eq!(page.len(), 1);
        let by_time = DeliveryFilter {
            until: Some(until),
            ..Default::default()
        };
        assert_eq!(store::page(&one, &by_time, None).await.unwrap().len(), 1);
        assert_eq!(store::newest_failures(&one, 5).await.unwrap().len(), 0);
    }
    let plans: Vec<(i64, i64)> = sqlx::query_as(
        "select generic_plans, custom_plans from pg_prepared_statements
         where statement like '%page as (%' and statement not like '%pg_prepared%'",
    )
    .fetch_all(&one)
    .await
    .unwrap();
    assert_eq!(plans.len(), 3, "{plans:?}");
    assert!(
        plans
            .iter()
            .all(|&(generic, custom)| generic == 0 && custom == 8),
        "{plans:?}"
    );
}
