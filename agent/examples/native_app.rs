//! A native app: Rust callbacks instead of the built-in agent loop (the book's "Writing apps"
//! guide includes this file; CI builds it, so the guide's code compiles).
//!
//! `on_reactive_event` runs between batch one and batch two of every turn routed to the app:
//! the turn's inputs are already committed, and what it says or pushes is committed with
//! `turn_complete`. Everything durable stays the runtime's; the callback keeps nothing.

use std::sync::Arc;

use async_trait::async_trait;
use turnpike_agent::apps::{App, Apps};
use turnpike_agent::turn::Turn;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::EventBody;

/// Counts the words of every message of the turn.
struct WordCounter;

#[async_trait]
impl App for WordCounter {
    async fn on_reactive_event(&self, turn: &dyn Turn) -> turnpike_agent::Result<TurnOutcome> {
        let words: usize = turn
            .inputs()
            .iter()
            .filter_map(|event| match &event.body {
                EventBody::Message { text } => Some(text.split_whitespace().count()),
                _ => None,
            })
            .sum();
        turn.say(format!("{words} words, {}.", turn.identity()));
        Ok(TurnOutcome::Replied)
    }
}

fn main() {
    // A worker hosts it like any app: every agent of app `counter` is routed to it.
    let apps = Apps::new().with_native("counter".parse().unwrap(), Arc::new(WordCounter));
    let route = apps
        .route(
            &"default".parse().unwrap(),
            &"counter".parse().unwrap(),
            &"any".parse().unwrap(),
        )
        .expect("the native app is hosted");
    assert!(route.agent.is_none(), "a native app has no manifest");
    println!("app `counter` is hosted natively");
}
