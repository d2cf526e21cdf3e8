//! `turnpike webhook list | create | delete | dead-letters | redeliver`: the caller's outbound
//! webhooks, through the API (as the token's identity, like `turnpike schedule`).

use std::process::ExitCode;

use anyhow::Result;
use serde_json::json;

use crate::cli::{Global, WebhookArgs, WebhookCommand};
use crate::commands::schedule::time;

pub async fn run(global: &Global, args: WebhookArgs) -> Result<ExitCode> {
    let api = &args.api;
    let client = crate::commands::edge::api_client(global, &api.url, api.token.as_deref())?;
    let reach = |e: String| anyhow::anyhow!("cannot reach {}: {e}", api.url);
    let reply = match &args.command {
        WebhookCommand::List => client.get("/v1/webhooks").await.map_err(reach)?,
        WebhookCommand::Create {
            endpoint,
            events,
            conversation,
        } => {
            let mut body = json!({ "url": endpoint, "events": events });
            if let Some(c) = conversation {
                body["conversation"] = json!(c);
            }
            client.post("/v1/webhooks", &body).await.map_err(reach)?
        }
        WebhookCommand::Delete { id } => client
            .delete(&format!("/v1/webhooks/{id}"))
            .await
            .map_err(reach)?,
        WebhookCommand::DeadLetters => client
            .get("/v1/webhooks/dead-letters")
            .await
            .map_err(reach)?,
        WebhookCommand::Redeliver { id } => client
            .post(
                &format!("/v1/webhooks/dead-letters/{id}/redeliver"),
                &json!({}),
            )
            .await
            .map_err(reach)?,
    };
    let body = reply.into_ok().map_err(anyhow::Error::msg)?;
    if api.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
    match &args.command {
        WebhookCommand::List => {
            println!("{:<30} {:<50} {:<30} CONVERSATION", "ID", "URL", "EVENTS");
            for w in body["webhooks"].as_array().into_iter().flatten() {
                let events: Vec<String> = w["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                println!(
                    "{:<30} {:<50} {:<30} {}",
                    text(&w["id"]),
                    text(&w["url"]),
                    if events.is_empty() {
                        "all".to_owned()
                    } else {
                        events.join(",")
                    },
                    w["conversation"].as_str().unwrap_or("all")
                );
            }
        }
        WebhookCommand::Create { .. } => {
            println!("id:     {}", text(&body["id"]));
            println!("secret: {}", text(&body["secret"]));
            println!(
                "(the secret is shown this once: verify deliveries' webhook-signature with it)"
            );
        }
        WebhookCommand::Delete { id } => println!("deleted {id}"),
        WebhookCommand::DeadLetters => {
            println!(
                "{:<37} {:<16} {:<21} {:<9} LAST ERROR",
                "ID", "TYPE", "CREATED", "ATTEMPTS"
            );
            for d in body["dead_letters"].as_array().into_iter().flatten() {
                println!(
                    "{:<37} {:<16} {:<21} {:<9} {}",
                    text(&d["id"]),
                    text(&d["type"]),
                    d["created_ms"].as_u64().map_or("?".into(), time),
                    d["attempts"],
                    text(&d["last_error"])
                );
            }
        }
        WebhookCommand::Redeliver { id } => println!("{id} is in line again"),
    }
    Ok(ExitCode::SUCCESS)
}
