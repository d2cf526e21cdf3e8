//! Usage and budgets through the API of `turnpike serve`: every model call is a `usage` entry
//! (estimated for the scripted model, which reports none), the conversation's usage and the
//! tenant's per-day ledger roll it up, and a spent daily budget refuses the next turn — at
//! ingress with 429 `budget_exceeded`, and at dispatch (a message accepted before the budget
//! was spent) with the reason recorded. Real tokens from an OpenAI-protocol server are in
//! `tests/model.rs`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use turnpike_edge::client::{Client, Cursor};
use turnpike_tests::edge::{
    create, queue_apps, say, wait_for_complete_turns, wait_for_status, Server, ADMIN, ALICE,
    ALICE_OF_BETA, BETA_ADMIN, BOB,
};

const LONG: Duration = Duration::from_secs(60);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

async fn rows(client: &Client, id: &str) -> Vec<Value> {
    Cursor::new(id).read(client).await.unwrap()
}

async fn get(client: &Client, path: &str) -> (u16, Value) {
    let reply = client.get(path).await.unwrap();
    (reply.status, reply.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_refuses_the_next_turn_at_dispatch_and_at_ingress_for_its_tenant_only() {
    let apps = queue_apps();
    // One token a day for each tenant's use of the `queue` app: the first turn spends it.
    let server = Server::start(
        &binary(),
        Some(apps.path()),
        &["--budget", "app=queue:tokens=1"],
        false,
    )
    .expect("turnpike serve");
    let alice = server.client(ALICE);
    let id = create(&alice, "queue", "slow").await;

    // Turn 1 runs (the ledger is empty); a second message is accepted while it runs, before
    // its usage is counted.
    say(&alice, &id, "first").await;
    wait_for_status(&alice, &id, "running", LONG).await.unwrap();
    say(&alice, &id, "second").await;
    let turns = wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert_eq!(turns[0].replies, ["answer to: first"]);
    // At dispatch the budget was spent: turn 2 failed before any model call, and says why.
    assert_eq!(turns[1].outcome.as_deref(), Some("failed"), "{turns:#?}");
    assert!(turns[1].replies.is_empty(), "{turns:#?}");
    let all = rows(&alice, &id).await;
    let error = all
        .iter()
        .find(|r| r["kind"] == "error" && r["turn"] == "turn_2")
        .expect("the refusal is recorded");
    let why = error["data"]["message"].as_str().unwrap();
    assert!(
        why.contains("daily budget of app queue is spent"),
        "a clear reason: {why}"
    );
    let usage: Vec<&Value> = all.iter().filter(|r| r["kind"] == "usage").collect();
    assert_eq!(usage.len(), 1, "only turn 1 called the model: {usage:#?}");
    assert_eq!(usage[0]["turn"], "turn_1");
    assert_eq!(usage[0]["data"]["provider"], "script");
    assert_eq!(usage[0]["data"]["estimated"], true);

    // Now ingress refuses new messages and follow-ups, clearly, writing nothing…
    for what in ["messages", "follow-ups"] {
        let refused = alice
            .post(
                &format!("/v1/conversations/{id}/{what}"),
                &json!({"text": "third"}),
            )
            .await
            .unwrap();
        assert_eq!(refused.status, 429, "{what}: {:?}", refused.body);
        assert_eq!(refused.body["code"], "budget_exceeded");
        assert!(
            refused.body["message"]
                .as_str()
                .unwrap()
                .contains("renews at midnight UTC"),
            "{:?}",
            refused.body
        );
    }
    // …while a stop (which spends nothing) still passes.
    let stop = alice
        .post(&format!("/v1/conversations/{id}/stop"), &json!({}))
        .await
        .unwrap();
    assert_eq!(stop.status, 202, "{:?}", stop.body);
    assert!(rows(&alice, &id).await.iter().all(|r| r["text"] != "third"));
    // Another identity of the same tenant shares the tenant's use of the app: refused too.
    let bob = server.client(BOB);
    let bobs = create(&bob, "queue", "quick").await;
    let refused = bob
        .post(
            &format!("/v1/conversations/{bobs}/messages"),
            &json!({"text": "hi"}),
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 429, "{:?}", refused.body);
    // Another tenant's budget is its own.
    let beta = server.client(ALICE_OF_BETA);
    let betas = create(&beta, "queue", "quick").await;
    say(&beta, &betas, "hello from beta").await;
    let turns = wait_for_complete_turns(&beta, &betas, 1, LONG)
        .await
        .unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");

    // The conversation's usage rolls up its record.
    let (status, mine) = get(&alice, &format!("/v1/conversations/{id}/usage")).await;
    assert_eq!(status, 200, "{mine:#}");
    let tokens =
        |v: &Value| v["input_tokens"].as_u64().unwrap() + v["output_tokens"].as_u64().unwrap();
    assert_eq!(mine["total"]["turns"], 1, "{mine:#}");
    assert_eq!(mine["total"]["calls"], 1);
    assert_eq!(mine["estimated_calls"], 1);
    assert_eq!(
        tokens(&mine["total"]),
        usage[0]["data"]["input_tokens"].as_u64().unwrap()
            + usage[0]["data"]["output_tokens"].as_u64().unwrap()
    );
    assert_eq!(mine["by_model"][0]["provider"], "script");
    // Nobody else reads it: 404, as for anything of another's conversation.
    assert_eq!(
        get(&bob, &format!("/v1/conversations/{id}/usage")).await.0,
        404
    );
    assert_eq!(
        get(&beta, &format!("/v1/conversations/{id}/usage")).await.0,
        404
    );

    // The ledger, per UTC day, for each tenant's admins only.
    let admin = server.client(ADMIN);
    let (status, default) = get(&admin, "/v1/usage").await;
    assert_eq!(status, 200, "{default:#}");
    assert_eq!(default["tenant"], "default");
    assert_eq!(default["days"].as_array().unwrap().len(), 1);
    assert_eq!(default["total"]["turns"], 1, "{default:#}");
    assert_eq!(tokens(&default["total"]), tokens(&mine["total"]));
    let (_, by_app) = get(&admin, "/v1/usage?app=queue").await;
    assert_eq!(by_app["total"], default["total"]);
    let (_, other_app) = get(&admin, "/v1/usage?app=life").await;
    assert_eq!(other_app["total"]["turns"], 0);
    // The ledger counts a turn just after its commit: beta's may be a moment behind.
    let beta_admin = server.client(BETA_ADMIN);
    let deadline = std::time::Instant::now() + LONG;
    let beta_view = loop {
        let (_, view) = get(&beta_admin, "/v1/usage").await;
        if view["total"]["turns"] != 0 || std::time::Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(beta_view["tenant"], "beta");
    assert_eq!(
        beta_view["total"]["turns"], 1,
        "beta's own turn only: {beta_view:#}"
    );
    assert_eq!(get(&alice, "/v1/usage").await.0, 403);
    for bad in [
        "/v1/usage?since=yesterday",
        "/v1/usage?since=2026-02-30",
        "/v1/usage?since=2020-01-01",
        "/v1/usage?since=2999-01-02&until=2999-01-01",
        "/v1/usage?app=Not%20An%20Id",
    ] {
        let (status, body) = get(&admin, bad).await;
        assert_eq!(status, 422, "{bad}: {body:#}");
    }
}
