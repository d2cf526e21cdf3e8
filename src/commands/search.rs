//! `turnpike search` and `turnpike index rebuild`.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use turnpike_index::indexer::Indexer;
use turnpike_index::{Filters, Kind, Recency, Scope, SearchRequest};

use crate::cli::{Global, IndexCommand, SearchArgs};
use crate::env::{now_ms, open_index, Env};

/// Builds the request the flags describe; says which flag is wrong.
fn request(args: &SearchArgs) -> Result<SearchRequest> {
    let mut request = SearchRequest::new(args.query.clone());
    request.mode = args.mode.parse().context("--mode")?;
    request.filters = Filters {
        app: args.app.clone(),
        agent: args.agent.clone(),
        conversation: args.conversation,
        kinds: args
            .kinds
            .iter()
            .map(|k| k.parse::<Kind>())
            .collect::<Result<_, _>>()
            .context("--kind")?,
        since_ms: args.since_ms,
        until_ms: args.until_ms,
    };
    request.limit = args.limit;
    request.offset = args.offset;
    request.per_conversation = args.per_conversation;
    request.recency = args.recency_half_life_hours.map(|h| Recency {
        half_life_ms: (h * 3_600_000.0) as i64,
        weight: 1.0,
        now_ms: now_ms() as i64,
    });
    request.validate()?;
    Ok(request)
}

/// `turnpike search QUERY --actor A`.
pub async fn search(global: &Global, args: SearchArgs) -> Result<ExitCode> {
    let request = request(&args)?;
    let env = Env::open(global)?;
    let index = open_index(global).await.map_err(anyhow::Error::msg)?;
    let scope = Scope::new(args.actor.tenant.clone(), args.actor.identity.clone());
    let page = turnpike_index::hydrate::search(
        &index,
        &env.resolver(),
        &args.actor.identity,
        &scope,
        &request,
    )
    .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    if page.hits.is_empty() {
        println!("no hits");
    }
    for (i, hit) in page.hits.iter().enumerate() {
        let retriever = |name: &str, s: Option<turnpike_index::RetrieverScore>| {
            s.map(|s| format!(" {name} #{} ({:.3})", s.rank, s.score))
                .unwrap_or_default()
        };
        println!(
            "{:>3}. {:.4}{}{}  {} {} turn_{}",
            request.offset + i + 1,
            hit.score,
            retriever("lexical", hit.lexical),
            retriever("vector", hit.vector),
            hit.info.kind.as_str(),
            hit.info.conversation,
            hit.info.turn.number()
        );
        println!("     {}", hit.info.reference);
        if let Some(snippet) = &hit.snippet {
            println!("     {snippet}");
        }
    }
    if let Some(next) = page.next_offset {
        println!("next page: --offset {next}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `turnpike index rebuild`.
pub async fn index(global: &Global, command: IndexCommand) -> Result<ExitCode> {
    let IndexCommand::Rebuild { conversation, full } = command;
    let env = Env::open(global)?;
    let index = open_index(global).await.map_err(anyhow::Error::msg)?;
    let indexer = Indexer::new(index, env.conversations.store().clone());
    let (conversations, turns) = match conversation {
        Some(c) => (1, indexer.index_conversation(c, full).await?),
        None => indexer.rebuild(full).await?,
    };
    println!("indexed {turns} turns of {conversations} conversations");
    Ok(ExitCode::SUCCESS)
}
