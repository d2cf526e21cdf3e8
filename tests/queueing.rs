//! Every message gets its turn (over the HTTP API of `turnpike serve`): a message arriving while
//! a turn runs waits on the lane and starts its own turn; only a `stop` (or an agent that asks
//! for `on_new_message = "interrupt"`) cancels the running turn.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use turnpike_edge::client::Client;
use turnpike_tests::edge::{
    queue_apps, say, wait_for_complete_turns, wait_for_status, Server, ALICE,
};

const LONG: Duration = Duration::from_secs(120);

fn server() -> (tempfile::TempDir, Server) {
    let apps = queue_apps();
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_turnpike"));
    let server = Server::start(&binary, Some(apps.path()), &[], false).expect("serve starts");
    (apps, server)
}

async fn create(client: &Client, agent: &str) -> String {
    turnpike_tests::edge::create(client, "queue", agent).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_message_during_a_slow_turn_waits_for_its_own_turn() {
    let (_apps, server) = server();
    let alice = server.client(ALICE);
    let id = create(&alice, "slow").await;
    say(&alice, &id, "one").await;
    // "two" arrives while turn 1's model is still thinking.
    wait_for_status(&alice, &id, "running", LONG).await.unwrap();
    say(&alice, &id, "two").await;
    let turns = wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
    assert_eq!(turns.len(), 2, "{turns:#?}");
    for (turn, word) in turns.iter().zip(["one", "two"]) {
        assert_eq!(turn.outcome.as_deref(), Some("replied"), "{turns:#?}");
        assert_eq!(turn.inputs, vec![word.to_owned()], "{turns:#?}");
        assert_eq!(
            turn.replies,
            vec![format!("answer to: {word}")],
            "{turns:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_messages_in_a_burst_get_twenty_replies_in_order() {
    let (_apps, server) = server();
    let alice = server.client(ALICE);
    let id = create(&alice, "quick").await;
    let words: Vec<String> = (1..=20).map(|i| format!("message {i:02}")).collect();
    for word in &words {
        say(&alice, &id, word).await;
    }
    let turns = wait_for_complete_turns(&alice, &id, 20, LONG)
        .await
        .unwrap();
    assert_eq!(turns.len(), 20, "{turns:#?}");
    for (turn, word) in turns.iter().zip(&words) {
        assert_eq!(turn.outcome.as_deref(), Some("replied"), "{turns:#?}");
        assert_eq!(&turn.inputs, &vec![word.clone()]);
        assert_eq!(turn.replies, vec![format!("answer to: {word}")]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupting_agent_cancels_the_running_turn_with_a_reason() {
    let (_apps, server) = server();
    let alice = server.client(ALICE);
    let id = create(&alice, "impatient").await;
    say(&alice, &id, "one").await;
    wait_for_status(&alice, &id, "running", LONG).await.unwrap();
    say(&alice, &id, "two").await;
    let turns = wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("cancelled"), "{turns:#?}");
    assert_eq!(
        turns[0].cancel_reason.as_deref(),
        Some("superseded by a new message")
    );
    assert!(turns[0].replies.is_empty());
    assert_eq!(turns[1].outcome.as_deref(), Some("replied"));
    assert_eq!(turns[1].inputs, vec!["two".to_owned()]);
    assert_eq!(turns[1].replies, vec!["answer to: two".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_still_cancels_a_running_turn_at_once() {
    let (_apps, server) = server();
    let alice = server.client(ALICE);
    let id = create(&alice, "stuck").await;
    say(&alice, &id, "one").await;
    wait_for_status(&alice, &id, "running", LONG).await.unwrap();
    alice
        .post(&format!("/v1/conversations/{id}/stop"), &json!({}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    // The model would take ten minutes: the turn ends long before that, cancelled by the stop.
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("cancelled"), "{turns:#?}");
    assert_eq!(turns[0].cancel_reason, None);
    assert!(turns[0].replies.is_empty());
}
