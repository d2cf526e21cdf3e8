//! `turnpike schedule list | show | create | pause | resume | delete`: the caller's schedules,
//! through the API (as the token's identity, like `turnpike chat`).

use std::process::ExitCode;

use anyhow::Result;
use serde_json::{json, Value};

use crate::cli::{Global, ScheduleArgs, ScheduleCommand};

pub async fn run(global: &Global, args: ScheduleArgs) -> Result<ExitCode> {
    let api = &args.api;
    let client = crate::commands::edge::api_client(global, &api.url, api.token.as_deref())?;
    let reach = |e: String| anyhow::anyhow!("cannot reach {}: {e}", api.url);
    let reply = match &args.command {
        ScheduleCommand::List => client.get("/v1/schedules").await.map_err(reach)?,
        ScheduleCommand::Show { id } => client
            .get(&format!("/v1/schedules/{id}"))
            .await
            .map_err(reach)?,
        ScheduleCommand::Pause { id } => client
            .post(&format!("/v1/schedules/{id}/pause"), &json!({}))
            .await
            .map_err(reach)?,
        ScheduleCommand::Resume { id } => client
            .post(&format!("/v1/schedules/{id}/resume"), &json!({}))
            .await
            .map_err(reach)?,
        ScheduleCommand::Delete { id } => client
            .delete(&format!("/v1/schedules/{id}"))
            .await
            .map_err(reach)?,
        ScheduleCommand::Create(create) => {
            let c = create.as_ref();
            let mut body = json!({ "text": c.text });
            let mut set = |key: &str, value: Value| {
                if !value.is_null() {
                    body[key] = value;
                }
            };
            set("cron", json!(c.cron));
            set("zone", json!(c.zone));
            set("every_seconds", json!(c.every));
            set("app", json!(c.app));
            set("agent", json!(c.agent));
            set("conversation", json!(c.conversation));
            set("missed", json!(c.missed));
            set("catch_up", json!(c.catch_up));
            set("overlap", json!(c.overlap));
            set("jitter_seconds", json!(c.jitter));
            set("grace_seconds", json!(c.grace));
            client.post("/v1/schedules", &body).await.map_err(reach)?
        }
    };
    let body = reply.into_ok().map_err(anyhow::Error::msg)?;
    if api.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    match &args.command {
        ScheduleCommand::List => {
            println!(
                "{:<33} {:<24} {:<25} {:<30} PAUSED",
                "ID", "WHEN", "NEXT", "LAST"
            );
            for s in body["schedules"].as_array().into_iter().flatten() {
                println!(
                    "{:<33} {:<24} {:<25} {:<30} {}",
                    s["id"].as_str().unwrap_or(""),
                    when(s),
                    s["next_ms"].as_u64().map_or("-".into(), time),
                    last(s),
                    s["paused"].as_bool().unwrap_or(false)
                );
            }
        }
        ScheduleCommand::Create(_) => println!("{}", body["id"].as_str().unwrap_or("")),
        ScheduleCommand::Delete { id } => println!("deleted {id}"),
        ScheduleCommand::Show { .. }
        | ScheduleCommand::Pause { .. }
        | ScheduleCommand::Resume { .. } => show(&body),
    }
    Ok(ExitCode::SUCCESS)
}

fn when(s: &Value) -> String {
    match (s["cron"].as_str(), s["every_seconds"].as_f64()) {
        (Some(cron), _) => format!("{cron} ({})", s["zone"].as_str().unwrap_or("UTC")),
        (None, Some(every)) => format!("every {every}s"),
        _ => "?".into(),
    }
}

fn last(s: &Value) -> String {
    match s["firings"].as_array().and_then(|f| f.first()) {
        Some(f) => format!(
            "{} {}",
            f["fire_ms"].as_u64().map_or("?".into(), time),
            f["outcome"].as_str().unwrap_or("?")
        ),
        None => "-".into(),
    }
}

pub(crate) fn time(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| ms.to_string())
}

fn show(s: &Value) {
    println!("id:           {}", s["id"].as_str().unwrap_or(""));
    println!("when:         {}", when(s));
    println!(
        "into:         {} ({}/{})",
        s["conversation"].as_str().unwrap_or(""),
        s["app"].as_str().unwrap_or(""),
        s["agent"].as_str().unwrap_or("")
    );
    println!("text:         {}", s["text"].as_str().unwrap_or(""));
    println!(
        "policies:     missed {}, overlap {}, jitter {}s, grace {}s",
        s["missed"].as_str().unwrap_or(""),
        s["overlap"].as_str().unwrap_or(""),
        s["jitter_seconds"],
        s["grace_seconds"]
    );
    println!("paused:       {}", s["paused"].as_bool().unwrap_or(false));
    println!(
        "next:         {}",
        s["next_ms"].as_u64().map_or("-".into(), time)
    );
    println!("firings (newest first):");
    for f in s["firings"].as_array().into_iter().flatten() {
        let what = match f["outcome"].as_str() {
            Some("fired") => f["conversation"].as_str().unwrap_or("").to_owned(),
            Some("skipped") => f["reason"].as_str().unwrap_or("").to_owned(),
            Some("missed") => format!("{} missed", f["missed"]),
            _ => String::new(),
        };
        println!(
            "  {}  {:<8} {what}",
            f["fire_ms"].as_u64().map_or("?".into(), time),
            f["outcome"].as_str().unwrap_or("?")
        );
    }
}
