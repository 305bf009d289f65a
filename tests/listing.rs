//! The operator's list of one service's deliveries covers every state,
//! newest first, with keyset pages: finished, pending and in-flight rows
//! come from different indexes and are merged.

mod common;

use common::*;
use serde_json::json;
use watchpump::operator::store::{self, DeliveryFilter};

fn for_service(service: &str, before: Option<i64>, limit: i64) -> DeliveryFilter {
    DeliveryFilter {
        state: None,
        service: Some(service.into()),
        object: None,
        since: None,
        until: None,
        before,
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
    let mut before = None;
    loop {
        let page = store::deliveries(&db.pool, &for_service("deploy", before, 5))
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 5);
        seen.extend(page.iter().map(|d| d.delivery_id));
        before = page.last().map(|d| d.delivery_id);
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
