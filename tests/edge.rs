//! The HTTP/WebSocket edge end to end, against `turnpike serve` in its own process: a whole
//! conversation over the API with a client that drops its stream mid-turn, privacy (another
//! identity gets 404 for everything), refused input that writes nothing, limits, and the
//! OpenAPI document fuzzed by schemathesis.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use turnpike_edge::client::{Client, Cursor};
use turnpike_edge::model::Frame;
use turnpike_tests::edge::{files_under, Server, ADMIN, ALICE, ALICE_OF_BETA, BETA_ADMIN, BOB};

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

const MANIFEST: &str = r#"
app = "edge"

[agents.assistant]
provider = "script"
script = "edge.script.toml"
system_prompt = "You write notes."
tools = ["list_files", "write_file", "publish", "read_file", "ask_user"]
approval = [{ tool = "write_file" }]

[agents.echo]
provider = "echo"
"#;

const SCRIPT: &str = r##"
[[turn]]
when = "draft"
# Round 1 streams at once.
[[turn.step]]
text = "Drafting your note now. "
tool_calls = [{ name = "list_files", arguments = {} }]
# Round 2 holds until more input reaches the lane (the follow-up), which is folded in after it.
[[turn.step]]
text = "Thinking. "
tool_calls = [{ name = "list_files", arguments = {} }]
wait_for_input = true
# Round 3: the follow-up is in context; writing needs an approval, so the turn parks.
[[turn.step]]
text = "Writing it. "
tool_calls = [{ name = "write_file", arguments = { path = "note.md", content = "# Note\n\nThe launch moves to Thursday. {last_user}\n" } }]
[[turn.step]]
text = "unreachable"

[[turn]]
when = "ask me"
[[turn.step]]
tool_calls = [{ name = "ask_user", arguments = { question = "Which colour?" } }]

[[turn]]
when = "hello chat"
[[turn.step]]
text = "Hi from the script, {last_user}"

# An attachment on its own opens a turn whose first message says "The user attached …".
[[turn]]
when = "the user attached"
[[turn.step]]
text = "I see your attachment {attachment}."

# The turn an approval opens: the approved write ran (its call counts as the turn's first
# model step); publish it.
[[turn]]
[[turn.step]]
text = "unused"
[[turn.step]]
text = "Approved; publishing. "
tool_calls = [{ name = "publish", arguments = { path = "note.md" } }]
[[turn.step]]
text = "Published {file:note.md}."
"##;

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4,
    0x89, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0xF8, 0xCF, 0xC0, 0xF0,
    0x1F, 0x00, 0x05, 0x00, 0x01, 0xFF, 0x89, 0x99, 0x3D, 0x1D, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

fn apps_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.toml"), MANIFEST).unwrap();
    std::fs::write(dir.path().join("edge.script.toml"), SCRIPT).unwrap();
    dir
}

fn server(apps: &Path, extra: &[&str], search: bool) -> Server {
    Server::start(&binary(), Some(apps), extra, search).expect("turnpike serve starts")
}

/// Polls `check` until it returns `Some`, or fails after `timeout` saying `what`.
async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create(client: &Client, agent: &str) -> String {
    let reply = client
        .post(
            "/v1/conversations",
            &json!({"app": "edge", "agent": agent, "instructions": "Be brief."}),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    reply.body["id"].as_str().unwrap().to_owned()
}

async fn conversation(client: &Client, id: &str) -> Value {
    client
        .get(&format!("/v1/conversations/{id}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap()
}

/// Reads rows into `seen` until one satisfies `done`, following the stream's `rows` frames.
async fn follow_until(
    client: &Client,
    stream: &mut turnpike_edge::client::FrameStream,
    cursor: &mut Cursor,
    seen: &mut Vec<Value>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if seen.iter().any(&done) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; rows so far:\n{}",
            seen.iter()
                .map(|r| format!("{} {} {}", r["seq"], r["kind"], r["text"]))
                .collect::<Vec<_>>()
                .join("\n")
        );
        match stream.next_within(Duration::from_secs(5)).await {
            Some(Frame::Rows { .. }) | Some(Frame::Ready { .. }) | None => {
                seen.extend(cursor.read(client).await.unwrap());
            }
            Some(Frame::Delta { .. }) => {}
            Some(Frame::Closed { reason }) => panic!("the stream closed: {reason}"),
        }
    }
}

fn is_reply_containing(text: impl Into<String>) -> impl Fn(&Value) -> bool {
    let text = text.into();
    move |row: &Value| {
        row["kind"] == "assistant_message" && row["text"].as_str().unwrap_or("").contains(&text)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_over_http_with_a_stream_dropped_mid_turn_misses_nothing() {
    let apps = apps_dir();
    let admin_port = turnpike_tests::services::free_port().unwrap();
    let admin_listen = format!("127.0.0.1:{admin_port}");
    // On the embedded default's store (the database, for a new data directory).
    let server = server(apps.path(), &["--admin-listen", &admin_listen], true);
    let admin = Client::new(&format!("http://{admin_listen}"), "");
    let alice = server.client(ALICE);

    // Apps, then a new conversation.
    let listed = alice.get("/v1/apps").await.unwrap().into_ok().unwrap();
    assert!(listed["apps"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["id"] == "edge"));
    let id = create(&alice, "assistant").await;
    let view = conversation(&alice, &id).await;
    assert_eq!(view["status"], "idle");
    assert_eq!(view["owner"], "local:alice");
    assert_eq!(view["instructions"], "Be brief.");

    let mut stream = alice.stream(&id).await.unwrap();
    let Some(Frame::Ready { through }) = stream.next_within(Duration::from_secs(10)).await else {
        panic!("the stream starts with a ready frame");
    };
    assert!(through >= 1);
    let mut cursor = Cursor::new(&id);
    let mut seen = cursor.read(&alice).await.unwrap();
    assert_eq!(seen[0]["kind"], "conversation_opened");

    // A message, and its retry with the same key: accepted once.
    let path = format!("/v1/conversations/{id}/messages");
    let body = json!({"text": "please draft a note about the launch"});
    let first = alice
        .send(Method::POST, &path, Some(&body), Some("draft-1"))
        .await
        .unwrap();
    assert_eq!(first.status, 202, "{:?}", first.body);
    assert_eq!(first.body["duplicate"], false);
    let retry = alice
        .send(Method::POST, &path, Some(&body), Some("draft-1"))
        .await
        .unwrap();
    assert_eq!(retry.status, 202);
    assert_eq!(retry.body["duplicate"], true);
    assert_eq!(retry.body["lane_seq"], first.body["lane_seq"]);

    // The reply streams: wait for its first delta, then drop the stream mid-turn (the turn is
    // holding for more input).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no delta arrived");
        match stream.next_within(Duration::from_secs(5)).await {
            Some(Frame::Delta { text, .. }) if text.contains("Drafting") => break,
            Some(Frame::Rows { .. }) => seen.extend(cursor.read(&alice).await.unwrap()),
            _ => {}
        }
    }
    stream.close().await;
    assert_eq!(conversation(&alice, &id).await["status"], "running");

    // While no client listens, a follow-up arrives; the turn goes on and parks on the approval.
    let follow = alice
        .post(
            &format!("/v1/conversations/{id}/follow-ups"),
            &json!({"text": "Ana owns the checklist."}),
        )
        .await
        .unwrap();
    assert_eq!(follow.status, 202, "{:?}", follow.body);
    let pending = wait_for(Duration::from_secs(60), "the approval request", || {
        let alice = alice.clone();
        let id = id.clone();
        async move {
            let p = alice
                .get(&format!("/v1/conversations/{id}/pending"))
                .await
                .ok()?
                .into_ok()
                .ok()?;
            (!p["approvals"].as_array()?.is_empty()).then_some(p)
        }
    })
    .await;
    let approval = &pending["approvals"][0];
    assert_eq!(approval["tool"], "write_file");
    assert!(approval["arguments"]["content"]
        .as_str()
        .unwrap()
        .contains("Ana owns the checklist."));
    assert_eq!(conversation(&alice, &id).await["status"], "waiting");

    // Reconnect and resume from the cursor.
    let mut stream = alice.stream(&id).await.unwrap();
    assert!(matches!(
        stream.next_within(Duration::from_secs(10)).await,
        Some(Frame::Ready { .. })
    ));
    seen.extend(cursor.read(&alice).await.unwrap());
    assert!(seen.iter().any(|r| r["kind"] == "follow_up"));
    assert!(seen.iter().any(|r| r["kind"] == "approval_request"));

    // Approve: the write runs, the next round publishes, the reply names the file.
    let request = approval["request_id"].as_str().unwrap();
    let approved = alice
        .post(
            &format!("/v1/conversations/{id}/approvals/{request}/approve"),
            &json!({"reason": "looks right"}),
        )
        .await
        .unwrap();
    assert_eq!(approved.status, 202, "{:?}", approved.body);
    follow_until(
        &alice,
        &mut stream,
        &mut cursor,
        &mut seen,
        "the published reply",
        is_reply_containing("Published conv:fi:"),
    )
    .await;
    // The wait for that approval was measured, once.
    let (status, scrape) = admin.bytes("/metrics", false).await.unwrap();
    assert_eq!(status, 200);
    let scrape = String::from_utf8(scrape).unwrap();
    assert!(
        scrape
            .lines()
            .any(|l| l == "turnpike_approval_wait_seconds_count 1"),
        "{scrape}"
    );

    // The hosted file, through the resolver as alice, and through a short-lived signed link.
    let reply = seen
        .iter()
        .find(|r| is_reply_containing("Published conv:fi:")(r))
        .unwrap();
    let reference = reply["text"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .find(|w| w.starts_with("conv:fi:"))
        .unwrap()
        .trim_end_matches('.')
        .to_owned();
    let (status, bytes) = alice
        .bytes(&format!("/v1/files?reference={reference}"), true)
        .await
        .unwrap();
    assert_eq!(status, 200);
    let note = String::from_utf8(bytes).unwrap();
    assert!(note.contains("Ana owns the checklist."), "{note}");
    let link = alice
        .post(
            "/v1/files/links",
            &json!({"reference": reference, "ttl_seconds": 60}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let url = link["url"].as_str().unwrap();
    let (status, linked) = alice.bytes(url, false).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8(linked).unwrap(), note);
    let forged = format!("{}x", &url[..url.len() - 1]);
    assert_eq!(alice.bytes(&forged, false).await.unwrap().0, 404);

    // An attachment: stored, previewed, on the timeline; the agent sees it.
    let attached = alice
        .attach(&id, "pixel.png", "image/png", PNG.to_vec())
        .await
        .unwrap();
    assert_eq!(attached.status, 202, "{:?}", attached.body);
    let preview = format!("PNG image, 1×1 px, {} bytes", PNG.len());
    assert_eq!(attached.body["preview"], preview.as_str());
    let attachment = attached.body["reference"].as_str().unwrap().to_owned();
    assert!(attachment.starts_with(&format!("conv:at:{id}/")));
    let (status, stored) = alice
        .bytes(&format!("/v1/files?reference={attachment}"), true)
        .await
        .unwrap();
    assert_eq!((status, stored.as_slice()), (200, PNG));
    follow_until(
        &alice,
        &mut stream,
        &mut cursor,
        &mut seen,
        "the reply about the attachment",
        is_reply_containing(format!("I see your attachment {attachment}")),
    )
    .await;
    let row = seen.iter().find(|r| r["kind"] == "attachment").unwrap();
    assert_eq!(row["data"]["event"]["body"]["preview"], preview.as_str());

    // Every row was read exactly once, in order, across the dropped connection.
    let seqs: Vec<u64> = seen.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let mut fresh = Cursor::new(&id);
    let all = fresh.read(&alice).await.unwrap();
    let all_seqs: Vec<u64> = all.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        &all_seqs[..seqs.len()],
        &seqs[..],
        "nothing missed or duplicated"
    );
    assert_eq!(
        all.iter().filter(|r| r["kind"] == "user_message").count(),
        1
    );

    // Paging backwards returns the same rows, latest first per page.
    let mut back = Vec::new();
    // From the end: the largest sequence the API takes.
    let mut before = (1u64 << 53) - 1;
    loop {
        let page = alice
            .get(&format!(
                "/v1/conversations/{id}/messages?before={before}&limit=7"
            ))
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        let rows = page["rows"].as_array().unwrap().clone();
        back.splice(0..0, rows);
        match page["prev_before"].as_u64() {
            Some(b) => before = b,
            None => break,
        }
    }
    let back_seqs: Vec<u64> = back.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(back_seqs, all_seqs);
    // Both cursors: exactly the rows between them.
    let (low, high) = (all_seqs[1], all_seqs[4]);
    let window = alice
        .get(&format!(
            "/v1/conversations/{id}/messages?after={low}&before={high}"
        ))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let window_seqs: Vec<u64> = window["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(window_seqs, all_seqs[2..4]);

    // Search finds the conversation by meaning, once the index has caught up.
    let hits = wait_for(Duration::from_secs(60), "search hits", || {
        let alice = alice.clone();
        async move {
            let r = alice
                .get("/v1/search?q=when%20does%20the%20launch%20happen&limit=5")
                .await
                .ok()?
                .into_ok()
                .ok()?;
            let hits = r["hits"].as_array()?.clone();
            (!hits.is_empty()).then_some(hits)
        }
    })
    .await;
    assert!(hits.iter().all(|h| h["conversation"] == id.as_str()));
    assert!(hits
        .iter()
        .any(|h| h["snippet"].as_str().unwrap_or("").contains("launch")));

    // Admin: the record verifies and replays.
    let admin = server.client(ADMIN);
    let verified = admin
        .post(&format!("/v1/admin/conversations/{id}/verify"), &json!({}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(verified["intact"], true, "{verified}");
    let replayed = admin
        .post(&format!("/v1/admin/conversations/{id}/replay"), &json!({}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(replayed["reproduced"], true, "{replayed}");
    assert_eq!(
        alice
            .post(&format!("/v1/admin/conversations/{id}/verify"), &json!({}))
            .await
            .unwrap()
            .status,
        403
    );

    // Listing shows it with its counts.
    let list = alice
        .get("/v1/conversations")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let listed = &list["conversations"][0];
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["messages"], 2, "a message and a follow-up");
    assert_eq!(listed["status"], "idle");
    // All of it went to the database: no object was written as a file of its own.
    let store = server.store_dir();
    assert!(store.join("objects.sqlite").is_file());
    let files: Vec<String> = files_under(&store)
        .into_iter()
        .filter(|f| !f.starts_with("objects.sqlite"))
        .collect();
    assert!(files.is_empty(), "objects written as files: {files:?}");
}

/// Every conversation-scoped operation, as (method, path, JSON body).
fn every_operation(
    id: &str,
    request: &str,
    reference: &str,
) -> Vec<(Method, String, Option<Value>)> {
    let c = format!("/v1/conversations/{id}");
    let text = json!({"text": "hi"});
    vec![
        (Method::GET, c.clone(), None),
        (Method::POST, format!("{c}/close"), Some(json!({}))),
        (
            Method::POST,
            format!("{c}/grants"),
            Some(json!({"identity": "local:bob"})),
        ),
        (
            Method::DELETE,
            format!("{c}/grants"),
            Some(json!({"identity": "local:bob"})),
        ),
        (Method::GET, format!("{c}/messages"), None),
        (Method::GET, format!("{c}/messages?before=5"), None),
        (Method::POST, format!("{c}/messages"), Some(text.clone())),
        (Method::POST, format!("{c}/follow-ups"), Some(text.clone())),
        (Method::POST, format!("{c}/steer"), Some(text)),
        (Method::POST, format!("{c}/stop"), Some(json!({}))),
        (Method::GET, format!("{c}/pending"), None),
        (
            Method::POST,
            format!("{c}/approvals/{request}/approve"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("{c}/approvals/{request}/reject"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("{c}/questions/{request}/answer"),
            Some(json!({"answer": "x"})),
        ),
        (
            Method::POST,
            format!("{c}/agent"),
            Some(json!({"agent": "echo"})),
        ),
        (Method::POST, format!("{c}/compact"), None),
        (Method::GET, format!("{c}/stream"), None),
        (Method::GET, format!("{c}/events"), None),
        (
            Method::GET,
            format!("/v1/files?reference={reference}"),
            None,
        ),
        (
            Method::POST,
            "/v1/files/links".into(),
            Some(json!({"reference": reference})),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_gets_404_for_everything_of_a_conversation_it_may_not_see() {
    let apps = apps_dir();
    // Objects are counted on disk: a file per object, not the database.
    let server = server(apps.path(), &["--local-store", "files"], false);
    let alice = server.client(ALICE);
    let bob = server.client(BOB);
    let id = create(&alice, "echo").await;
    alice
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "secret plans"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let attached = alice
        .attach(&id, "pixel.png", "image/png", PNG.to_vec())
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let reference = attached["reference"].as_str().unwrap().to_owned();
    let request = "req_01M8MGM1ZZ870J023EVYHFAEVQ";
    let missing = "conv_01M8MGM1ZZ870J023EVYHFAEVQ";
    // Alice's turns may still run and write records and turn logs; everything else (the
    // directory, grants, closing, attachments) only changes if bob's requests change it.
    let outside_turns = |files: Vec<String>| -> Vec<String> {
        files
            .into_iter()
            .filter(|f| {
                !f.contains("/record/")
                    && !f.contains("/turns/")
                    && !f.contains("/attempts/")
                    && !f.starts_with("open-turns/")
            })
            .collect()
    };
    let before = outside_turns(files_under(&server.store_dir()));

    for (method, path, body) in every_operation(&id, request, &reference) {
        let reply = bob
            .send(method.clone(), &path, body.as_ref(), None)
            .await
            .unwrap();
        assert_eq!(reply.status, 404, "{method} {path}: {:?}", reply.body);
        assert_eq!(reply.code(), "not_found", "{method} {path}");
        // Exactly what a conversation that does not exist gets (no existence oracle), apart from
        // the id itself.
        let ghost_path = path.replace(&id, missing);
        let ghost_body: Option<Value> = body
            .as_ref()
            .map(|b| serde_json::from_str(&b.to_string().replace(&id, missing)).unwrap());
        let ghost = bob
            .send(method.clone(), &ghost_path, ghost_body.as_ref(), None)
            .await
            .unwrap();
        assert_eq!(ghost.status, 404, "{method} {ghost_path}");
        assert_eq!(
            reply.body["message"]
                .as_str()
                .unwrap()
                .replace(&id, missing),
            ghost.body["message"].as_str().unwrap(),
            "{method} {path}"
        );
    }
    // Bob's listing and search show nothing of alice's.
    let list = bob
        .get("/v1/conversations")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(list["conversations"], json!([]));
    assert_eq!(
        bob.bytes(&format!("/v1/files?reference={reference}"), true)
            .await
            .unwrap()
            .0,
        404
    );
    // Nothing bob did wrote anything: no object, and no event of his in the record.
    assert_eq!(outside_turns(files_under(&server.store_dir())), before);
    let rows = Cursor::new(&id).read(&alice).await.unwrap();
    for row in rows.iter().filter(|r| r["data"]["event"].is_object()) {
        assert_eq!(
            row["data"]["event"]["address"]["identity"], "local:alice",
            "{row}"
        );
    }
    assert_eq!(conversation(&alice, &id).await["messages"], 1);

    // Shared by an explicit grant, bob sees it; revoked, he does not.
    let grant = json!({"identity": "local:bob"});
    alice
        .post(&format!("/v1/conversations/{id}/grants"), &grant)
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let seen = bob
        .get(&format!("/v1/conversations/{id}/messages"))
        .await
        .unwrap();
    assert_eq!(seen.status, 200);
    assert!(seen.body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["text"] == "secret plans"));
    assert_eq!(
        bob.bytes(&format!("/v1/files?reference={reference}"), true)
            .await
            .unwrap()
            .0,
        200
    );
    // Sharing and closing stay the owner's.
    let regrant = bob
        .post(
            &format!("/v1/conversations/{id}/grants"),
            &json!({"identity": "local:eve"}),
        )
        .await
        .unwrap();
    assert_eq!(regrant.status, 404);
    alice
        .send(
            Method::DELETE,
            &format!("/v1/conversations/{id}/grants"),
            Some(&grant),
            None,
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(
        bob.get(&format!("/v1/conversations/{id}"))
            .await
            .unwrap()
            .status,
        404
    );

    // SSE works for the owner and starts with a ready frame.
    let response = reqwest::Client::new()
        .get(format!("{}/v1/conversations/{id}/events", server.base))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut body = response.bytes_stream();
    use futures::StreamExt as _;
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("a first SSE event")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: ready"), "{text}");
    assert!(text.contains("\"type\":\"ready\""), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_requests_get_a_clear_4xx_and_write_nothing() {
    let apps = apps_dir();
    // Objects are counted on disk: a file per object, not the database.
    let server = server(
        apps.path(),
        &["--rate-per-second", "0", "--local-store", "files"],
        false,
    );
    let alice = server.client(ALICE);
    let id = create(&alice, "echo").await;
    let before = files_under(&server.store_dir());
    let messages = format!("/v1/conversations/{id}/messages");
    let post = Method::POST;

    // (what, reply, expected status, expected code, a word the message must hold)
    let mut cases = Vec::new();
    let huge_text = "x".repeat(64 * 1024 + 1);
    cases.push((
        "a message over 64 KiB",
        alice
            .post(&messages, &json!({"text": huge_text}))
            .await
            .unwrap(),
        422,
        "invalid",
        "limit",
    ));
    cases.push((
        "a body over the body limit",
        // A fresh client: the server answers before reading the whole body and closes that
        // connection, which a pooled client would otherwise try to reuse.
        server
            .client(ALICE)
            .send_raw(
                post.clone(),
                &messages,
                "application/json",
                vec![b' '; 300 * 1024],
            )
            .await
            .unwrap(),
        413,
        "payload_too_large",
        "",
    ));
    cases.push((
        "malformed JSON",
        alice
            .send_raw(
                post.clone(),
                &messages,
                "application/json",
                b"{\"text\": ".to_vec(),
            )
            .await
            .unwrap(),
        400,
        "malformed",
        "",
    ));
    cases.push((
        "no JSON content type",
        alice
            .send_raw(
                post.clone(),
                &messages,
                "text/plain",
                b"{\"text\":\"hi\"}".to_vec(),
            )
            .await
            .unwrap(),
        415,
        "unsupported_media_type",
        "",
    ));
    cases.push((
        "an unknown field",
        alice
            .post(&messages, &json!({"text": "hi", "role": "system"}))
            .await
            .unwrap(),
        422,
        "invalid",
        "role",
    ));
    cases.push((
        "an empty message",
        alice
            .post(&messages, &json!({"text": "   "}))
            .await
            .unwrap(),
        422,
        "invalid",
        "empty",
    ));
    cases.push((
        "a bad idempotency key",
        alice
            .send(
                post.clone(),
                &messages,
                Some(&json!({"text": "hi"})),
                Some("has spaces"),
            )
            .await
            .unwrap(),
        422,
        "invalid",
        "idempotency",
    ));
    cases.push((
        "an attachment over 8 MiB",
        server
            .client(ALICE)
            .attach(&id, "big.png", "image/png", {
                let mut big = PNG.to_vec();
                big.resize(8 * 1024 * 1024 + 1, 0);
                big
            })
            .await
            .unwrap(),
        413,
        "payload_too_large",
        "limit",
    ));
    cases.push((
        "an executable posing as an image",
        alice
            .attach(
                &id,
                "x.png",
                "image/png",
                b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\xff\xff".to_vec(),
            )
            .await
            .unwrap(),
        415,
        "unsupported_media_type",
        "",
    ));
    cases.push((
        "an attachment name with a slash",
        alice
            .attach(&id, "../x.png", "image/png", PNG.to_vec())
            .await
            .unwrap(),
        422,
        "invalid",
        "name",
    ));
    cases.push((
        "an unknown app",
        alice
            .post("/v1/conversations", &json!({"app": "nope", "agent": "x"}))
            .await
            .unwrap(),
        404,
        "not_found",
        "not hosted",
    ));
    cases.push((
        "an unknown agent to switch to",
        alice
            .post(
                &format!("/v1/conversations/{id}/agent"),
                &json!({"agent": "ghost"}),
            )
            .await
            .unwrap(),
        404,
        "not_found",
        "ghost",
    ));
    cases.push((
        "a page past the documented bounds",
        alice.get(&format!("{messages}?limit=501")).await.unwrap(),
        422,
        "invalid",
        "limit",
    ));
    cases.push((
        "a cursor past the largest sequence",
        alice
            .get(&format!("{messages}?before={}", 1u64 << 53))
            .await
            .unwrap(),
        422,
        "invalid",
        "at most",
    ));
    cases.push((
        "a search without a query",
        alice.get("/v1/search").await.unwrap(),
        400,
        "malformed",
        "q",
    ));
    cases.push((
        "no token",
        alice.as_token("").get("/v1/conversations").await.unwrap(),
        401,
        "unauthorized",
        "token",
    ));
    cases.push((
        "a wrong token",
        alice
            .as_token("nope")
            .get("/v1/conversations")
            .await
            .unwrap(),
        401,
        "unauthorized",
        "token",
    ));
    cases.push((
        "an unknown endpoint",
        alice.get("/v1/nothing-here").await.unwrap(),
        404,
        "not_found",
        "",
    ));
    for (what, reply, status, code, word) in cases {
        assert_eq!(reply.status, status, "{what}: {:?}", reply.body);
        assert_eq!(reply.code(), code, "{what}: {:?}", reply.body);
        let message = reply.body["message"].as_str().unwrap_or("");
        assert!(!message.is_empty(), "{what}: no message");
        assert!(
            message.to_lowercase().contains(word),
            "{what}: {message:?} should mention {word:?}"
        );
        assert!(reply.body["details"].is_object(), "{what}");
    }
    // Nothing was written: no event, no attachment, no conversation.
    assert_eq!(files_under(&server.store_dir()), before);
    let view = conversation(&alice, &id).await;
    assert_eq!(view["messages"], 0);
    assert_eq!(view["turns"], 0);

    // A closed conversation refuses events with 409 and stays readable.
    alice
        .post(&format!("/v1/conversations/{id}/close"), &json!({}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let refused = alice.post(&messages, &json!({"text": "hi"})).await.unwrap();
    assert_eq!((refused.status, refused.code()), (409, "conflict"));
    assert_eq!(conversation(&alice, &id).await["status"], "closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_over_its_rate_gets_429_with_retry_after_and_others_do_not() {
    let apps = apps_dir();
    let server = server(
        apps.path(),
        &["--rate-per-second", "1", "--rate-burst", "3"],
        false,
    );
    let alice = server.client(ALICE);
    let bob = server.client(BOB);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(alice.get("/v1/apps").await.unwrap());
    }
    let limited: Vec<_> = statuses.iter().filter(|r| r.status == 429).collect();
    assert!(
        !limited.is_empty(),
        "a burst of 6 over a burst limit of 3 is limited"
    );
    assert!(statuses[0].ok());
    for r in &limited {
        assert_eq!(r.code(), "rate_limited");
        assert!(r.retry_after.is_some_and(|s| s >= 1), "{r:?}");
    }
    assert!(
        bob.get("/v1/apps").await.unwrap().ok(),
        "bob has his own budget"
    );
}

/// The schemathesis program: `$TURNPIKE_SCHEMATHESIS`, else where the services script puts it.
fn schemathesis() -> PathBuf {
    std::env::var("TURNPIKE_SCHEMATHESIS")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services/venv/bin/schemathesis".into())
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_property_based_fuzzer_finds_no_5xx_and_no_response_off_the_schema() {
    let program = schemathesis();
    assert!(
        program.exists(),
        "{} is missing: `scripts/services install tests` installs it",
        program.display()
    );
    let apps = apps_dir();
    let server = server(apps.path(), &["--rate-per-second", "0"], true);
    // The document the server serves is the one the code generates.
    let served = server
        .client(ALICE)
        .get("/v1/openapi.json")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let generated = turnpike_edge::openapi::document_value();
    assert_eq!(served, generated);
    assert!(served["paths"]["/v1/conversations/{id}/messages"]["post"].is_object());

    let base = server.base.clone();
    let workdir = tempfile::tempdir().unwrap();
    // A fixed seed keeps CI repeatable; `TURNPIKE_FUZZ_SEED` explores others.
    let seed = std::env::var("TURNPIKE_FUZZ_SEED").unwrap_or_else(|_| "1".into());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(program)
            .arg("--config-file")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/schemathesis.toml"
            ))
            .args([
                "run",
                &format!("{base}/v1/openapi.json"),
                "--header",
                // An admin, so the admin endpoints are reached too.
                &format!("Authorization: Bearer {ADMIN}"),
                "--checks",
                "all",
                // Streams never end; they are tested above.
                "--exclude-path-regex",
                "/(stream|events)$",
                "--max-examples",
                "25",
                "--seed",
                &seed,
                "--no-color",
            ])
            .env("SCHEMATHESIS_HOOKS", "")
            // Its cache of earlier failures stays out of the repository and out of this run.
            .current_dir(&workdir)
            .output()
            .expect("schemathesis runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("passed"), "{stdout}");
}

/// `turnpike chat` with its stdin and stdout piped: lines in, printed lines out.
struct Chat {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    chunks: std::sync::mpsc::Receiver<String>,
    /// Everything printed so far, and how far `expect` has matched.
    printed: String,
    matched: usize,
}

impl Chat {
    fn start(base: &str, token: &str, extra: &[&str]) -> Chat {
        use std::io::Read as _;
        let mut child = std::process::Command::new(binary())
            .args(["chat", "--url", base, "--token", token])
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut stdout = stdout;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0
                    || tx
                        .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                        .is_err()
                {
                    break;
                }
            }
        });
        Chat {
            child,
            stdin,
            chunks,
            printed: String::new(),
            matched: 0,
        }
    }

    fn type_line(&mut self, line: &str) {
        use std::io::Write as _;
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits until the output after the last match holds `needle` (streamed text need not end
    /// its line); returns the rest of that line.
    fn expect(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(at) = self.printed[self.matched..].find(needle) {
                let start = self.matched + at;
                self.matched = start + needle.len();
                let end = self.printed[start..]
                    .find('\n')
                    .map_or(self.printed.len(), |e| start + e);
                return self.printed[start..end].to_owned();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.printed.push_str(&chunk),
                Err(_) => panic!(
                    "chat never printed {needle:?}; it printed:\n{}",
                    self.printed
                ),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_client_talks_streams_answers_cards_and_reconnects_by_itself() {
    let apps = apps_dir();
    // On the default store, across a restart.
    let mut server = server(apps.path(), &[], false);
    let mut chat = Chat::start(
        &server.base,
        ALICE,
        &["--app", "edge", "--agent", "assistant"],
    );
    let header = chat.expect("conversation conv_");
    let id = header.split_whitespace().nth(1).unwrap().to_owned();
    chat.expect("/quit");
    chat.type_line("hello chat");
    chat.expect("assistant: Hi from the script, hello chat");
    chat.expect("[replied · ~");
    chat.type_line("/approve");
    chat.expect("(nothing waits for an approval)");

    // An approval card, answered from the chat.
    chat.type_line("please draft it");
    chat.expect("assistant: Drafting your note now.");
    chat.type_line("keep it short");
    chat.expect("approval needed");
    chat.type_line("/approve fine");
    chat.expect("(approved)");
    chat.expect("Published conv:fi:");
    // The reply streams before its turn commits: let the turn finish, so that what follows is
    // a new message rather than a follow-up to a turn the restart interrupts.
    turnpike_tests::edge::wait_for_status(
        &server.client(ALICE),
        &id,
        "idle",
        Duration::from_secs(60),
    )
    .await
    .unwrap();

    // The server dies and comes back: the chat reconnects by itself and goes on.
    server.restart().unwrap();
    chat.expect("(reconnected)");
    chat.type_line("hello chat again");
    chat.expect("assistant: Hi from the script, hello chat again");
    chat.type_line("/quit");
    let status = tokio::task::spawn_blocking(move || chat.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());

    // What the chat did is in the record.
    let rows = Cursor::new(&id).read(&server.client(ALICE)).await.unwrap();
    let said: Vec<&str> = rows
        .iter()
        .filter(|r| r["kind"] == "user_message")
        .filter_map(|r| r["text"].as_str())
        .collect();
    assert_eq!(said, ["hello chat", "please draft it", "hello chat again"]);
    assert!(rows
        .iter()
        .any(|r| r["kind"] == "follow_up" && r["text"] == "keep it short"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_are_answered_agents_switched_and_compaction_asked_for_over_http() {
    let apps = apps_dir();
    let server = server(apps.path(), &[], false);
    let alice = server.client(ALICE);
    let id = create(&alice, "assistant").await;
    let c = format!("/v1/conversations/{id}");
    alice
        .post(
            &format!("{c}/messages"),
            &json!({"text": "ask me something"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let pending = wait_for(Duration::from_secs(60), "the question", || {
        let (alice, c) = (alice.clone(), c.clone());
        async move {
            let p = alice
                .get(&format!("{c}/pending"))
                .await
                .ok()?
                .into_ok()
                .ok()?;
            (!p["questions"].as_array()?.is_empty()).then_some(p)
        }
    })
    .await;
    assert_eq!(pending["questions"][0]["question"], "Which colour?");
    assert_eq!(pending["approvals"], json!([]));
    assert_eq!(conversation(&alice, &id).await["status"], "waiting");
    let request = pending["questions"][0]["request_id"].as_str().unwrap();
    let answered = alice
        .post(
            &format!("{c}/questions/{request}/answer"),
            &json!({"answer": "blue"}),
        )
        .await
        .unwrap();
    assert_eq!(answered.status, 202, "{:?}", answered.body);
    wait_for(Duration::from_secs(60), "the answer to apply", || {
        let (alice, c) = (alice.clone(), c.clone());
        async move {
            let p = alice
                .get(&format!("{c}/pending"))
                .await
                .ok()?
                .into_ok()
                .ok()?;
            let view = alice.get(&c).await.ok()?.body;
            (p["questions"].as_array()?.is_empty() && view["status"] == "idle").then_some(())
        }
    })
    .await;
    let rows = Cursor::new(&id).read(&alice).await.unwrap();
    assert!(rows
        .iter()
        .any(|r| r["kind"] == "question_response" && r["text"] == "blue"));

    // Switching agents: the next turns run as the other agent.
    alice
        .post(&format!("{c}/agent"), &json!({"agent": "echo"}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    wait_for(Duration::from_secs(60), "the switch", || {
        let (alice, c) = (alice.clone(), c.clone());
        async move { (alice.get(&c).await.ok()?.body["agent"] == "echo").then_some(()) }
    })
    .await;

    // Compaction is an event like the others: accepted, then committed.
    let compact = alice
        .send(
            Method::POST,
            &format!("{c}/compact"),
            None,
            Some("compact-1"),
        )
        .await
        .unwrap();
    assert_eq!(compact.status, 202, "{:?}", compact.body);
    wait_for(
        Duration::from_secs(60),
        "the compact event in the record",
        || {
            let (alice, id) = (alice.clone(), id.clone());
            async move {
                let rows = Cursor::new(&id).read(&alice).await.ok()?;
                rows.iter().any(|r| r["kind"] == "compact").then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_crosses_a_tenant_lookups_admins_grants_and_idempotency_keys() {
    let apps = apps_dir();
    // A directory entry is damaged on disk: a file per object, not the database.
    let server = server(apps.path(), &["--local-store", "files"], false);
    let alice = server.client(ALICE);
    let id = create(&alice, "echo").await;

    // `local:alice` of tenant beta is someone else: she sees nothing of it.
    let beta_alice = server.client(ALICE_OF_BETA);
    for path in [
        format!("/v1/conversations/{id}"),
        format!("/v1/conversations/{id}/messages"),
    ] {
        assert_eq!(beta_alice.get(&path).await.unwrap().status, 404, "{path}");
    }
    let posted = beta_alice
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "hi"}),
        )
        .await
        .unwrap();
    assert_eq!(posted.status, 404);
    let listed = beta_alice
        .get("/v1/conversations")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(listed["conversations"].as_array().unwrap().len(), 0);

    // An admin of tenant beta gets the same 404 as for a missing conversation; the admin of
    // the conversation's own tenant gets the verdict.
    let verify = format!("/v1/admin/conversations/{id}/verify");
    let beta_admin = server.client(BETA_ADMIN);
    assert_eq!(
        beta_admin.post(&verify, &json!({})).await.unwrap().status,
        404
    );
    let ours = server
        .client(ADMIN)
        .post(&verify, &json!({}))
        .await
        .unwrap();
    assert_eq!(ours.status, 200, "{:?}", ours.body);

    // A grant to another tenant's identity is refused.
    let grants = format!("/v1/conversations/{id}/grants");
    let refused = alice
        .post(
            &grants,
            &json!({"identity": "local:carol", "tenant": "beta"}),
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "{:?}", refused.body);

    // Shared within the tenant, the same idempotency key sent by two identities is two events,
    // and each one's retry is a duplicate of its own.
    alice
        .post(&grants, &json!({"identity": "local:bob"}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let bob = server.client(BOB);
    let path = format!("/v1/conversations/{id}/messages");
    let send = |client: &Client, text: &str| {
        let (client, path, body) = (client.clone(), path.clone(), json!({ "text": text }));
        async move {
            client
                .send(Method::POST, &path, Some(&body), Some("same-key"))
                .await
                .unwrap()
        }
    };
    let from_alice = send(&alice, "from alice").await;
    let from_bob = send(&bob, "from bob").await;
    assert_eq!(from_alice.status, 202);
    assert_eq!(from_bob.status, 202);
    assert_eq!(from_alice.body["duplicate"], false);
    assert_eq!(
        from_bob.body["duplicate"], false,
        "bob's event was swallowed"
    );
    assert_ne!(from_alice.body["lane_seq"], from_bob.body["lane_seq"]);
    let again = send(&alice, "from alice").await;
    assert_eq!(again.body["duplicate"], true);
    assert_eq!(again.body["lane_seq"], from_alice.body["lane_seq"]);

    // A store that cannot answer is not "not found": the client is told to retry.
    let broken = create(&alice, "echo").await;
    let entry = server
        .store_dir()
        .join(format!("directory/conversations/{broken}.json"));
    std::fs::remove_file(&entry).unwrap();
    // A link to itself: every read of it fails (ELOOP), as a disk or a bucket that cannot
    // answer would.
    std::os::unix::fs::symlink(&entry, &entry).unwrap();
    let outage = alice
        .post(
            &format!("/v1/conversations/{broken}/messages"),
            &json!({"text": "hello?"}),
        )
        .await
        .unwrap();
    assert_eq!(outage.status, 503, "{:?}", outage.body);
    assert!(outage.retry_after.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grantee_whose_grant_is_revoked_mid_stream_stops_receiving() {
    let apps = apps_dir();
    let server = server(apps.path(), &[], false);
    let alice = server.client(ALICE);
    let bob = server.client(BOB);
    let id = create(&alice, "echo").await;
    let grants = format!("/v1/conversations/{id}/grants");
    alice
        .post(&grants, &json!({"identity": "local:bob"}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let mut stream = bob.stream(&id).await.unwrap();
    assert!(matches!(
        stream.next_within(Duration::from_secs(10)).await,
        Some(Frame::Ready { .. })
    ));
    alice
        .send(
            Method::DELETE,
            &grants,
            Some(&json!({"identity": "local:bob"})),
            None,
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    // Alice goes on talking; bob is told his access ended, then hears nothing more.
    alice
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "not for bob"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        assert!(
            Instant::now() < deadline,
            "the stream went on after the revocation"
        );
        match stream.next_within(Duration::from_secs(5)).await {
            Some(Frame::Closed { reason }) => break reason,
            Some(Frame::Delta { text, .. }) => {
                assert!(!text.contains("not for bob"), "a delta leaked: {text}")
            }
            _ => {}
        }
    };
    assert!(reason.contains("revoked"), "{reason}");
    assert_eq!(stream.next_within(Duration::from_secs(5)).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_the_url_is_accepted_only_where_a_browser_cannot_send_a_header() {
    let apps = apps_dir();
    let server = server(apps.path(), &[], false);
    let alice = server.client(ALICE);
    let id = create(&alice, "echo").await;
    let http = reqwest::Client::new();
    for path in [
        "/v1/conversations".to_owned(),
        format!("/v1/conversations/{id}"),
        format!("/v1/conversations/{id}/messages"),
        format!("/v1/conversations/{id}/pending"),
    ] {
        let url = format!("{}{path}?access_token={ALICE}", server.base);
        let status = http.get(&url).send().await.unwrap().status();
        assert_eq!(status, 401, "{path} took a token from the URL");
    }
    // The server-sent events stream takes it (an EventSource cannot set headers).
    let url = format!(
        "{}/v1/conversations/{id}/events?access_token={ALICE}",
        server.base
    );
    let response = http.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_flood_gets_429() {
    let apps = apps_dir();
    let server = server(
        apps.path(),
        &["--rate-per-second", "1", "--rate-burst", "3"],
        false,
    );
    // Links carry no token: a made-up one is as good as any to flood with.
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let url = format!("{}/v1/links/not-a-real-link.abc", server.base);
        statuses.push(http.get(&url).send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses[0], 404, "an invalid link is simply not found");
    assert!(
        statuses.contains(&429),
        "a flood of links is limited: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ticket_opens_its_own_conversations_stream_and_nothing_else() {
    let apps = apps_dir();
    let server = server(apps.path(), &[], false);
    let alice = server.client(ALICE);
    let (id, other) = (create(&alice, "echo").await, create(&alice, "echo").await);
    let issued = alice
        .post(
            &format!("/v1/conversations/{id}/stream-tickets"),
            &serde_json::Value::Null,
        )
        .await
        .unwrap();
    assert_eq!(issued.status, 201, "{}", issued.body);
    let ticket = issued.body["ticket"].as_str().unwrap().to_owned();
    assert!(!ticket.contains(ALICE), "the ticket is not the token");
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{}{path}", server.base);
        async move { http.get(&url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        get(format!("/v1/conversations/{id}/events?ticket={ticket}")).await,
        200
    );
    // Not another conversation's stream, not any other endpoint, not an altered ticket.
    for path in [
        format!("/v1/conversations/{other}/events?ticket={ticket}"),
        format!("/v1/conversations/{id}/messages?ticket={ticket}"),
        format!("/v1/conversations?ticket={ticket}"),
        format!("/v1/conversations/{id}/events?ticket={ticket}x"),
    ] {
        assert_eq!(get(path.clone()).await, 401, "{path}");
    }
    // Nobody gets a ticket for a conversation they cannot see.
    let bob = server.client(BOB);
    let refused = bob
        .post(
            &format!("/v1/conversations/{id}/stream-tickets"),
            &serde_json::Value::Null,
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 404);
    // The client's WebSocket uses a ticket, and receives the stream's first frame.
    let mut stream = alice.stream(&id).await.unwrap();
    assert!(matches!(
        stream.next_within(Duration::from_secs(10)).await,
        Some(Frame::Ready { .. })
    ));
}
