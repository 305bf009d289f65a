//! The three example consumers (`examples/consumers/`), each with its own
//! database and endpoint, against the real pump and a scripted producer:
//! pushes to main with and without docs/, a push to another branch, two
//! merge requests opened, updated and closed. Emitted in a burst, so the
//! pump may supersede older news; the checks hold whatever it superseded.

use std::time::Duration;

use serde_json::json;

use crate::common::{eventually, operator_config, pump_config, AppServer, RunningPump, TestDb};
use crate::consumers::{deploy, docs_draft, preview};
use crate::support::Consumer;

/// Every delivery finished (delivered, superseded or dropped).
async fn settled(producer: &TestDb) {
    eventually(
        Duration::from_secs(60),
        "every delivery is finished",
        || async {
            let open: i64 = sqlx::query_scalar(
            "select count(*) from watchpump.delivery_log where state in ('pending', 'in_flight')",
        )
        .fetch_one(&producer.pool)
        .await
        .unwrap();
            open == 0
        },
    )
    .await;
    let failed = producer.count_state("failed").await;
    assert_eq!(failed, 0, "no delivery failed");
}

#[tokio::test]
async fn the_three_example_consumers_end_in_the_expected_state() {
    let git = TestDb::new().await;
    let api = AppServer::start(&git.pool, &operator_config()).await;
    let pump = RunningPump::start(&git.pool, pump_config());
    let d = deploy::consumer();
    let deployer = Consumer::start(&git, &api, d.service, d.schema, d.handler).await;
    deployer.watch(d.watch).await;
    let p = preview::consumer();
    let previewer = Consumer::start(&git, &api, p.service, p.schema, p.handler).await;
    previewer.watch(p.watch).await;
    let w = docs_draft::consumer();
    let drafter = Consumer::start(&git, &api, w.service, w.schema, w.handler).await;
    drafter.watch(w.watch).await;

    let main = deploy::BRANCH;
    let mr = |n: u32| format!("{}{n}", preview::PREFIX);
    git.emit(
        main,
        "push",
        json!({"after": "a1", "paths": ["src/main.rs"]}),
    )
    .await;
    git.emit(&mr(1), "opened", json!({"head": "m1"})).await;
    git.emit(
        main,
        "push",
        json!({"after": "b2", "paths": ["docs/intro.md", "src/lib.rs"]}),
    )
    .await;
    git.emit(&mr(2), "opened", json!({"head": "n1"})).await;
    git.emit(
        "acme/web/refs/heads/docs-fix",
        "push",
        json!({"after": "c3", "paths": ["docs/guide.md"]}),
    )
    .await;
    git.emit(&mr(1), "updated", json!({"head": "m2"})).await;
    git.emit(&mr(2), "closed", json!({})).await;
    git.emit(main, "push", json!({"after": "d4", "paths": ["README.md"]}))
        .await;
    git.emit(
        "acme/api/refs/heads/main",
        "push",
        json!({"after": "e5", "paths": ["docs/x.md"]}),
    )
    .await;
    settled(&git).await;

    // deploy: each push superseded the one still waiting; the worker, run
    // now, deploys the newest push only.
    while deploy::deploy_next(&deployer.db.pool)
        .await
        .unwrap()
        .is_some()
    {}
    let deployed: Vec<(String, String)> =
        sqlx::query_as("select app, commit from deploys where state = 'deployed'")
            .fetch_all(&deployer.db.pool)
            .await
            .unwrap();
    assert_eq!(deployed, [(deploy::APP.to_string(), "d4".to_string())]);
    let waiting = deployer
        .db
        .count("select count(*) from deploys where state = 'pending'")
        .await;
    assert_eq!(waiting, 0);

    // preview: merge request 1 at its updated head, merge request 2 gone.
    let previews: Vec<(String, String)> =
        sqlx::query_as("select merge_request, head from previews order by merge_request")
            .fetch_all(&previewer.db.pool)
            .await
            .unwrap();
    assert_eq!(previews, [("1".to_string(), "m2".to_string())]);

    // docs_draft: a draft for each push that touched docs/ in acme/web, on
    // any branch; pushes without docs/ were never sent.
    let drafts: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("select branch, commit, pages from drafts order by branch")
            .fetch_all(&drafter.db.pool)
            .await
            .unwrap();
    assert_eq!(
        drafts,
        [
            (
                "docs-fix".to_string(),
                "c3".to_string(),
                json!(["docs/guide.md"])
            ),
            (
                "main".to_string(),
                "b2".to_string(),
                json!(["docs/intro.md"])
            ),
        ]
    );

    // deploy's app is deleted: the next push is answered 410, and git
    // removes the watch.
    sqlx::query("delete from apps where name = $1")
        .bind(deploy::APP)
        .execute(&deployer.db.pool)
        .await
        .unwrap();
    git.emit(main, "push", json!({"after": "f6", "paths": []}))
        .await;
    settled(&git).await;
    let live: Vec<bool> =
        sqlx::query_scalar("select live from watchpump.watch_list where service = 'deploy'")
            .fetch_all(&git.pool)
            .await
            .unwrap();
    assert_eq!(live, [false]);
    pump.stop().await.unwrap();
}
