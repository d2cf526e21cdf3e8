//! Memory across conversations: what the index remembers of a user, listed and forgotten over
//! the API (`/v1/memory`), by its owner only; forgotten rows never come back — not through
//! search, not after `index rebuild --full` — and an agent may opt out of being remembered.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnpike_edge::client::Client;
use turnpike_tests::edge::{create, say, wait_for_complete_turns, Server, ALICE, BOB};

const LONG: Duration = Duration::from_secs(90);

const MANIFEST: &str = r#"
app = "mem"

[agents.keep]
provider = "echo"

[agents.secret]
provider = "echo"
index = false
"#;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

async fn conversation(client: &Client, agent: &str, said: &[&str]) -> String {
    let id = create(client, "mem", agent).await;
    for (n, text) in said.iter().enumerate() {
        say(client, &id, text).await;
        wait_for_complete_turns(client, &id, n + 1, LONG)
            .await
            .unwrap();
    }
    id
}

async fn memory(client: &Client, query: &str) -> Vec<Value> {
    let page = client
        .get(&format!("/v1/memory{query}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    page["rows"].as_array().unwrap().clone()
}

/// Waits until the index remembers `count` rows of `conversation`.
async fn remembered(client: &Client, conversation: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + LONG;
    loop {
        let rows = memory(client, &format!("?conversation={conversation}")).await;
        if rows.len() >= count {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "only {rows:?} of {conversation} indexed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn search(client: &Client, q: &str) -> Vec<Value> {
    let page = client
        .get(&format!("/v1/search?q={}&limit=50", urlencode(q)))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    page["hits"].as_array().unwrap().clone()
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn ids(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_listed_and_forgotten_by_its_owner_and_stays_forgotten_after_a_rebuild() {
    let apps = tempfile::tempdir().unwrap();
    std::fs::write(apps.path().join("mem.toml"), MANIFEST).unwrap();
    let mut server = Server::start(&binary(), Some(apps.path()), &[], true).unwrap();
    let alice = server.client(ALICE);
    let bob = server.client(BOB);

    let locker = conversation(&alice, "keep", &["My locker code is 4512."]).await;
    let lunch = conversation(&alice, "keep", &["The cafeteria opens at noon."]).await;
    let hidden = conversation(&alice, "secret", &["My passport number is X99."]).await;
    let locker_rows = remembered(&alice, &locker, 2).await;
    let lunch_rows = remembered(&alice, &lunch, 2).await;
    let all = memory(&alice, "").await;
    assert_eq!(all.len(), 4, "{all:#?}");
    assert!(all.iter().all(|r| r["conversation"] != hidden.as_str()));
    // Rows say where they came from.
    let prompt = locker_rows
        .iter()
        .find(|r| r["kind"] == "prompt")
        .unwrap()
        .clone();
    assert_eq!(prompt["turn"], "turn_1");
    assert_eq!(prompt["agent"], "keep");

    // Bob sees none of it and can forget none of it — also once the conversation is shared
    // with him (its memory is its owner's).
    let shared = alice
        .post(
            &format!("/v1/conversations/{locker}/grants"),
            &json!({"identity": "local:bob"}),
        )
        .await
        .unwrap();
    assert_eq!(shared.status, 200, "{:?}", shared.body);
    assert!(memory(&bob, "").await.is_empty());
    let row = prompt["id"].as_str().unwrap();
    let refused = bob
        .delete(&format!("/v1/memory/{}", urlencode(row)))
        .await
        .unwrap();
    assert_eq!(refused.status, 404, "{:?}", refused.body);
    let refused = bob
        .delete(&format!("/v1/memory?conversation={locker}"))
        .await
        .unwrap();
    assert_eq!(refused.status, 404, "{:?}", refused.body);
    assert_eq!(memory(&alice, "").await.len(), 4);

    // Alice forgets one row, then a whole conversation.
    let done = alice
        .delete(&format!("/v1/memory/{}", urlencode(row)))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(done["forgotten"], 1);
    let done = alice
        .delete(&format!("/v1/memory?conversation={lunch}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(done["forgotten"], 2);
    let left = ids(&memory(&alice, "").await);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(!left.contains(&row.to_owned()));
    for r in &lunch_rows {
        assert!(!left.contains(&r["id"].as_str().unwrap().to_owned()));
    }
    let forgotten_refs: Vec<&str> = std::iter::once(prompt["reference"].as_str().unwrap())
        .chain(lunch_rows.iter().map(|r| r["reference"].as_str().unwrap()))
        .collect();
    for q in ["locker code 4512", "cafeteria noon", "passport number"] {
        for hit in search(&alice, q).await {
            let reference = hit["reference"].as_str().unwrap();
            assert!(!forgotten_refs.contains(&reference), "{q}: {hit}");
            assert_ne!(hit["conversation"], hidden.as_str(), "{q}: {hit}");
        }
    }
    // The record keeps what was said: forgetting is the index's, not the conversation's.
    let rows = turnpike_edge::client::Cursor::new(&lunch)
        .read(&alice)
        .await
        .unwrap();
    assert!(rows
        .iter()
        .any(|r| r["text"] == "The cafeteria opens at noon."));

    // A later turn of a forgotten conversation is remembered again.
    alice
        .post(
            &format!("/v1/conversations/{lunch}/messages"),
            &json!({"text": "Lunch is soup today."}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    wait_for_complete_turns(&alice, &lunch, 2, LONG)
        .await
        .unwrap();
    let again = remembered(&alice, &lunch, 2).await;
    assert!(again.iter().all(|r| r["turn"] == "turn_2"), "{again:#?}");

    // The index rebuilt from the records, every turn again: what was forgotten stays so,
    // and the opted-out agent's turns are still not remembered.
    server.process.kill();
    let rebuild = std::process::Command::new(binary())
        .args(["--data-dir", server.data.path().to_str().unwrap()])
        .args(["index", "rebuild", "--full"])
        .env(
            "TURNPIKE_EMBEDDING_MODEL",
            turnpike_tests::index::model_dir(),
        )
        .output()
        .unwrap();
    assert!(
        rebuild.status.success(),
        "{}",
        String::from_utf8_lossy(&rebuild.stderr)
    );
    let said = String::from_utf8_lossy(&rebuild.stdout);
    assert!(
        said.contains("indexed 4 turns of 3 conversations"),
        "{said}"
    );
    server.restart().unwrap();
    let alice = server.client(ALICE);
    let after = ids(&memory(&alice, "").await);
    let mut expected: Vec<String> = left.clone();
    expected.extend(ids(&again));
    expected.sort();
    let mut after_sorted = after.clone();
    after_sorted.sort();
    assert_eq!(
        after_sorted, expected,
        "a rebuild brings back only what was not forgotten"
    );
}
