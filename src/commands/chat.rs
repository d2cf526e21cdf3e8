//! `turnpike chat`: an interactive terminal client of the API. Pick or start a conversation,
//! type to send (a message, or a follow-up while a turn runs), watch the reply stream, answer
//! approval cards and questions, switch agents, attach files, compact; a token meter follows
//! every turn. The live stream reconnects by itself and resumes from its cursor, so nothing is
//! missed or shown twice.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use turnpike_edge::client::{Client, Cursor};
use turnpike_edge::model::Frame;

use crate::cli::{ChatArgs, Global};

const HELP: &str = "type to talk (a follow-up while the agent works). Commands:
  /approve [reason]   /reject [reason]   approve or reject the pending call
  /answer TEXT        answer the agent's question
  /connect TOKEN      connect the service a call waits for with your token (it resumes)
  /steer TEXT         redirect the running turn        /stop      cancel it
  /switch AGENT       hand over to another agent       /compact   summarise older turns now
  /attach PATH        attach an image, a PDF or a text file
  /pending  /help  /quit";

/// What the printer knows between frames.
#[derive(Default)]
struct View {
    me: String,
    /// Streamed text on screen that no committed row has confirmed yet.
    streamed: String,
    /// Whether the streamed line is still open (no newline yet).
    open_line: bool,
    /// A committed reply printed before its deltas came: those deltas are not printed again.
    suppress: String,
    /// Rough tokens since the last compaction (text length / 4).
    tokens: usize,
    context_length: u32,
    /// The context as the last model call's `usage` row measured it (its input and output):
    /// what the meter shows when there is one; `exact` when the provider reported it.
    measured: Option<(u64, bool)>,
    /// Tokens every model call of the conversation used, and their cost (millionths of a $).
    used: u64,
    cost_micro_usd: u64,
}

pub async fn run(global: &Global, args: ChatArgs) -> Result<ExitCode> {
    let client = crate::commands::edge::api_client(global, &args.url, args.token.as_deref())?;
    let apps = client
        .get("/v1/apps")
        .await
        .map_err(|e| {
            anyhow!(
                "cannot reach {}: {e} (is `turnpike serve` running?)",
                args.url
            )
        })?
        .into_ok()
        .map_err(anyhow::Error::msg)?;
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let conversation = match &args.conversation {
        Some(c) => c.clone(),
        None => pick(&client, &apps, &args, &mut input).await?,
    };
    let view = get_ok(&client, &format!("/v1/conversations/{conversation}")).await?;
    let context_length = context_length(&apps, &view);
    println!(
        "conversation {conversation} — app {}, agent {} ({})",
        view["app"].as_str().unwrap_or("?"),
        view["agent"].as_str().unwrap_or("?"),
        view["status"].as_str().unwrap_or("?")
    );
    println!("{HELP}");
    let mut state = View {
        me: view["owner"].as_str().unwrap_or("").to_owned(),
        context_length,
        ..View::default()
    };
    // The history is summarised, not replayed; everything after it is shown.
    let mut cursor = Cursor::new(&conversation);
    let history = cursor.read(&client).await.map_err(anyhow::Error::msg)?;
    for row in &history {
        count_tokens(&mut state, row);
    }
    if history.len() > 1 {
        println!("({} earlier rows; {})", history.len(), meter(&state));
    }
    let state = Arc::new(Mutex::new(state));
    let follower = tokio::spawn(follow(client.clone(), cursor, state.clone()));

    while let Some(line) = input.next_line().await? {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match command(&client, &conversation, line).await {
            Ok(Some(note)) => println!("{note}"),
            Ok(None) => break,
            Err(e) => println!("! {e}"),
        }
    }
    follower.abort();
    Ok(ExitCode::SUCCESS)
}

fn context_length(apps: &Value, view: &Value) -> u32 {
    apps["apps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["id"] == view["app"])
        .flat_map(|a| a["agents"].as_array().cloned().unwrap_or_default())
        .find(|a| a["id"] == view["agent"])
        .and_then(|a| a["context_length"].as_u64())
        .unwrap_or(0) as u32
}

/// Lists the caller's conversations and asks which one (or starts one).
async fn pick(
    client: &Client,
    apps: &Value,
    args: &ChatArgs,
    input: &mut tokio::io::Lines<BufReader<tokio::io::Stdin>>,
) -> Result<String> {
    if args.app.is_none() {
        let list = get_ok(client, "/v1/conversations?limit=10").await?;
        let convs = list["conversations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !convs.is_empty() {
            println!("your conversations:");
            for (i, c) in convs.iter().enumerate() {
                println!(
                    "  {}. {} — {}/{}, {} messages, {}",
                    i + 1,
                    c["id"].as_str().unwrap_or("?"),
                    c["app"].as_str().unwrap_or("?"),
                    c["agent"].as_str().unwrap_or("?"),
                    c["messages"],
                    c["status"].as_str().unwrap_or("?")
                );
            }
            print!("pick a number, or press enter for a new conversation: ");
            std::io::stdout().flush().ok();
            let answer = input.next_line().await?.unwrap_or_default();
            if let Ok(n) = answer.trim().parse::<usize>() {
                if let Some(c) = convs.get(n.wrapping_sub(1)) {
                    return Ok(c["id"].as_str().unwrap_or_default().to_owned());
                }
                bail!("there is no conversation {n}");
            }
        }
    }
    let first_app = &apps["apps"][0];
    let app = args
        .app
        .clone()
        .or_else(|| first_app["id"].as_str().map(str::to_owned))
        .context("this deployment hosts no apps")?;
    let agent = args
        .agent
        .clone()
        .or_else(|| {
            apps["apps"]
                .as_array()?
                .iter()
                .find(|a| a["id"] == app.as_str())?["agents"][0]["id"]
                .as_str()
                .map(str::to_owned)
        })
        .context("name an agent with --agent")?;
    let created = client
        .post("/v1/conversations", &json!({"app": app, "agent": agent}))
        .await
        .map_err(anyhow::Error::msg)?
        .into_ok()
        .map_err(anyhow::Error::msg)?;
    Ok(created["id"].as_str().unwrap_or_default().to_owned())
}

/// GETs `path`; a refusal becomes an error naming its status, code and message.
async fn get_ok(client: &Client, path: &str) -> Result<Value> {
    client
        .get(path)
        .await
        .map_err(anyhow::Error::msg)?
        .into_ok()
        .map_err(anyhow::Error::msg)
}

/// Sends with an idempotency key, retrying transport failures with the same key (accepted once).
async fn submit(client: &Client, path: &str, body: Value) -> Result<Value> {
    let key = ulid::Ulid::new().to_string();
    let mut last = String::new();
    for attempt in 0..4 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(300 * attempt)).await;
        }
        match client
            .send(Method::POST, path, Some(&body), Some(&key))
            .await
        {
            Ok(reply) if reply.status == 429 || reply.status == 503 => {
                last = format!("{} {}", reply.status, reply.body["message"]);
                let wait = reply.retry_after.unwrap_or(1).min(10);
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            Ok(reply) => return reply.into_ok().map_err(anyhow::Error::msg),
            Err(e) => last = e,
        }
    }
    Err(anyhow!("not sent: {last}"))
}

/// Runs one typed line; `None` to quit.
async fn command(client: &Client, conv: &str, line: &str) -> Result<Option<String>> {
    let c = format!("/v1/conversations/{conv}");
    let (word, rest) = match line.strip_prefix('/') {
        Some(cmd) => {
            let (w, r) = cmd.split_once(' ').unwrap_or((cmd, ""));
            (w, r.trim())
        }
        None => ("", line),
    };
    let reason = |r: &str| if r.is_empty() { Value::Null } else { json!(r) };
    let done = |what: &str| Ok(Some(format!("({what})")));
    match word {
        "" => {
            let view = client.get(&c).await.map_err(anyhow::Error::msg)?.body;
            if view["status"] == "running" {
                submit(client, &format!("{c}/follow-ups"), json!({"text": rest})).await?;
                done("sent as a follow-up to the running turn")
            } else {
                submit(client, &format!("{c}/messages"), json!({"text": rest})).await?;
                Ok(Some(String::new()))
            }
        }
        "quit" | "exit" | "q" => Ok(None),
        "help" => Ok(Some(HELP.to_owned())),
        "approve" | "reject" => {
            let pending = get_ok(client, &format!("{c}/pending")).await?;
            let Some(request) = pending["approvals"][0]["request_id"].as_str() else {
                return done("nothing waits for an approval");
            };
            submit(
                client,
                &format!("{c}/approvals/{request}/{word}"),
                json!({"reason": reason(rest)}),
            )
            .await?;
            done(if word == "approve" {
                "approved"
            } else {
                "rejected"
            })
        }
        "connect" => {
            let pending = get_ok(client, &format!("{c}/pending")).await?;
            let Some(server) = pending["approvals"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|a| a["connection"].as_str())
            else {
                return done("no call waits for a connection");
            };
            if rest.is_empty() {
                return done("usage: /connect TOKEN");
            }
            let view = get_ok(client, &c).await?;
            let app = view["app"].as_str().unwrap_or_default();
            let made = client
                .send(
                    Method::PUT,
                    &format!("/v1/connections/{app}/{server}"),
                    Some(&json!({ "token": rest })),
                    None,
                )
                .await
                .map_err(anyhow::Error::msg)?
                .into_ok()
                .map_err(anyhow::Error::msg)?;
            let resumed = made["resumed"].as_array().map_or(0, Vec::len);
            Ok(Some(format!(
                "(connected {app}/{server}; {resumed} waiting call(s) resumed)"
            )))
        }
        "answer" => {
            let pending = get_ok(client, &format!("{c}/pending")).await?;
            let Some(request) = pending["questions"][0]["request_id"].as_str() else {
                return done("no question is waiting");
            };
            submit(
                client,
                &format!("{c}/questions/{request}/answer"),
                json!({"answer": rest}),
            )
            .await?;
            done("answered")
        }
        "pending" => {
            let pending = get_ok(client, &format!("{c}/pending")).await?;
            Ok(Some(serde_json::to_string_pretty(&pending)?))
        }
        "steer" => {
            submit(client, &format!("{c}/steer"), json!({"text": rest})).await?;
            done("steered")
        }
        "follow" => {
            submit(client, &format!("{c}/follow-ups"), json!({"text": rest})).await?;
            done("sent as a follow-up")
        }
        "stop" => {
            submit(
                client,
                &format!("{c}/stop"),
                json!({"reason": reason(rest)}),
            )
            .await?;
            done("stop sent")
        }
        "switch" => {
            submit(client, &format!("{c}/agent"), json!({"agent": rest})).await?;
            done(&format!("switching to {rest}"))
        }
        "compact" => {
            submit(client, &format!("{c}/compact"), json!({})).await?;
            done("compaction requested")
        }
        "attach" => {
            let path = std::path::Path::new(rest);
            let bytes = std::fs::read(path).with_context(|| format!("reading {rest}"))?;
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .context("the path needs a file name")?;
            let media = match path
                .extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                Some("png") => "image/png",
                Some("jpg" | "jpeg") => "image/jpeg",
                Some("gif") => "image/gif",
                Some("webp") => "image/webp",
                Some("pdf") => "application/pdf",
                _ => "text/plain",
            };
            let reply = client
                .attach(conv, name, media, bytes)
                .await
                .map_err(anyhow::Error::msg)?
                .into_ok()
                .map_err(anyhow::Error::msg)?;
            done(&format!(
                "attached {}: {}",
                reply["reference"].as_str().unwrap_or("?"),
                reply["preview"].as_str().unwrap_or("")
            ))
        }
        other => Ok(Some(format!("unknown command /{other}; /help lists them"))),
    }
}

/// Follows the conversation: streamed text as it comes, committed rows once each; reconnects
/// with backoff when the stream drops.
async fn follow(client: Client, mut cursor: Cursor, state: Arc<Mutex<View>>) {
    let conv = cursor.conversation.clone();
    let mut backoff = Duration::from_millis(250);
    let mut first = true;
    loop {
        let mut stream = match client.stream(&conv).await {
            Ok(s) => {
                if !first {
                    println!("(reconnected)");
                }
                backoff = Duration::from_millis(250);
                s
            }
            Err(_) => {
                if first {
                    println!("(the live stream is unavailable; retrying)");
                    first = false;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        first = false;
        while let Some(frame) = stream.next().await {
            match frame {
                Frame::Delta { text, .. } => {
                    let mut view = state.lock().expect("view lock");
                    if let Some(rest) = view.suppress.strip_prefix(text.as_str()) {
                        view.suppress = rest.to_owned();
                        continue;
                    }
                    if !view.open_line {
                        print!("assistant: ");
                        view.open_line = true;
                    }
                    print!("{text}");
                    view.streamed.push_str(&text);
                    std::io::stdout().flush().ok();
                }
                Frame::Ready { .. } | Frame::Rows { .. } => match cursor.read(&client).await {
                    Ok(rows) => {
                        let mut view = state.lock().expect("view lock");
                        for row in &rows {
                            show(&mut view, row);
                        }
                    }
                    Err(e) => println!("! reading rows: {e}"),
                },
                Frame::Closed { reason } => {
                    println!("\n! {reason}");
                    return;
                }
            }
        }
        println!("\n(connection lost; reconnecting)");
        tokio::time::sleep(backoff).await;
    }
}

fn count_tokens(view: &mut View, row: &Value) {
    if row["kind"] == "usage" {
        let data = &row["data"];
        let (input, output) = (
            data["input_tokens"].as_u64().unwrap_or(0),
            data["output_tokens"].as_u64().unwrap_or(0),
        );
        view.measured = Some((input.saturating_add(output), data["estimated"] != true));
        view.used = view.used.saturating_add(input.saturating_add(output));
        view.cost_micro_usd = view
            .cost_micro_usd
            .saturating_add(data["cost"]["micro_usd"].as_u64().unwrap_or(0));
        return;
    }
    if row["kind"] == "compaction_marker" {
        view.tokens = row["data"]["summary"].as_str().map_or(0, |s| s.len() / 4);
        view.measured = None;
        return;
    }
    if let Some(text) = row["text"].as_str() {
        view.tokens += text.len() / 4 + 1;
    } else if row["kind"] == "tool_result" || row["kind"] == "tool_call" {
        view.tokens += row["data"].to_string().len() / 4;
    }
}

fn short(v: &Value, max: usize) -> String {
    let mut s = if let Some(t) = v.as_str() {
        t.to_owned()
    } else {
        v.to_string()
    };
    if s.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(0);
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Prints one committed row (the user's own messages are on screen already).
fn show(view: &mut View, row: &Value) {
    count_tokens(view, row);
    if view.open_line {
        println!();
        view.open_line = false;
    }
    let data = &row["data"];
    let who = data["event"]["address"]["identity"].as_str().unwrap_or("");
    let mine = who == view.me;
    match row["kind"].as_str().unwrap_or("") {
        "user_message" | "follow_up" | "steer" if !mine => {
            println!("[{who}] {}", row["text"].as_str().unwrap_or(""));
        }
        "assistant_message" => {
            // Replies are committed at the end of their turn; their text usually streamed
            // already. Print only what did not.
            let text = row["text"].as_str().unwrap_or("");
            if let Some(rest) = view.streamed.strip_prefix(text) {
                view.streamed = rest.to_owned();
            } else {
                println!("assistant: {text}");
                view.suppress = if view.streamed.is_empty() {
                    text.to_owned()
                } else {
                    String::new()
                };
                view.streamed.clear();
            }
        }
        "tool_call" => println!(
            "  ↳ {}({})",
            data["tool"].as_str().unwrap_or("?"),
            short(&data["arguments"], 120)
        ),
        "tool_result" => println!(
            "  ↳ {} {}",
            if data["ok"] == true { "ok" } else { "failed" },
            short(&data["output"], 160)
        ),
        "approval_request" if data["connection"].is_string() => {
            let server = data["connection"].as_str().unwrap_or("?");
            println!("┌─ connection needed: {server} ──────────────────────");
            println!(
                "│ {}({}) needs your own connection to {server}",
                data["tool"].as_str().unwrap_or("?"),
                short(&data["arguments"], 400)
            );
            println!("└─ /connect TOKEN (the call then runs) or /reject [reason]");
        }
        "approval_request" => {
            println!("┌─ approval needed ────────────────────────────────");
            println!(
                "│ {}({})",
                data["tool"].as_str().unwrap_or("?"),
                short(&data["arguments"], 400)
            );
            println!("└─ /approve [reason] or /reject [reason]");
        }
        "approval_resolved" => println!(
            "  (call {})",
            if data["approved"] == true {
                "approved"
            } else {
                "rejected"
            }
        ),
        "question_request" => println!("? {}  — /answer TEXT", row["text"].as_str().unwrap_or("")),
        "attachment" => println!(
            "  (attached {}: {})",
            data["event"]["body"]["name"].as_str().unwrap_or("?"),
            data["event"]["body"]["preview"].as_str().unwrap_or("")
        ),
        "agent_switched" => println!("  (now talking to {})", data["to"].as_str().unwrap_or("?")),
        "recall" => {
            let refs: Vec<&str> = data["references"]
                .as_array()
                .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            match data["note"].as_str() {
                Some(note) => println!("  ({note})"),
                None if refs.is_empty() => {}
                None => println!("  (recalled: {})", refs.join(", ")),
            }
        }
        "compaction_marker" => println!("  (older turns compacted into a summary)"),
        "error" => println!("! {}", data["message"].as_str().unwrap_or("")),
        "cancelled" => println!("  (turn cancelled)"),
        "turn_complete" => {
            println!(
                "  [{} · {}]",
                data["outcome"].as_str().unwrap_or("done"),
                meter(view)
            );
        }
        _ => {}
    }
}

/// The token meter: the context's fill against the agent's context length (as the last model
/// call's usage measured it, else the estimate), and what the conversation used so far.
fn meter(view: &View) -> String {
    let (tokens, approx) = match view.measured {
        Some((tokens, exact)) => (tokens, if exact { "" } else { "~" }),
        None => (view.tokens as u64, "~"),
    };
    let mut meter = if view.context_length > 0 {
        format!(
            "{approx}{tokens} / {} tokens ({}%)",
            view.context_length,
            tokens.saturating_mul(100) / u64::from(view.context_length)
        )
    } else {
        format!("{approx}{tokens} tokens")
    };
    if view.used > 0 {
        meter.push_str(&format!(" · {} used", view.used));
    }
    if view.cost_micro_usd > 0 {
        meter.push_str(&format!(" · ${:.4}", view.cost_micro_usd as f64 / 1e6));
    }
    meter
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn usage(input: u64, output: u64, estimated: bool, micro: Option<u64>) -> Value {
        let mut data =
            json!({"input_tokens": input, "output_tokens": output, "estimated": estimated});
        if let Some(m) = micro {
            data["cost"] = json!({"micro_usd": m, "prices": "v1"});
        }
        json!({"kind": "usage", "data": data})
    }

    #[test]
    fn the_meter_reads_the_last_calls_usage_and_sums_the_spend() {
        let mut view = View {
            context_length: 1000,
            ..View::default()
        };
        count_tokens(
            &mut view,
            &json!({"kind": "user_message", "text": "x".repeat(400)}),
        );
        assert_eq!(meter(&view), "~101 / 1000 tokens (10%)");
        count_tokens(&mut view, &usage(300, 50, false, Some(1_500)));
        count_tokens(&mut view, &usage(400, 100, false, Some(2_500)));
        // The context is what the last call read and wrote; the spend is every call's.
        assert_eq!(meter(&view), "500 / 1000 tokens (50%) · 850 used · $0.0040");
        count_tokens(&mut view, &usage(10, 10, true, None));
        assert_eq!(meter(&view), "~20 / 1000 tokens (2%) · 870 used · $0.0040");
        // After a compaction the estimate holds until the next call measures again.
        count_tokens(
            &mut view,
            &json!({"kind": "compaction_marker", "data": {"summary": "y".repeat(40)}}),
        );
        assert_eq!(meter(&view), "~10 / 1000 tokens (1%) · 870 used · $0.0040");
    }
}
