//! The echo app: a native app that replies `echo: <text>` without a model. It stands in where
//! lanes and the record are tested on their own, and still goes through both batches.

use async_trait::async_trait;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::EventBody;

use crate::apps::App;
use crate::error::Result;
use crate::turn::Turn;

/// Replies `echo: <text>` to every message and follow-up, folding in what arrives on the lane
/// between rounds; a stop cancels the turn.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoAgent;

#[async_trait]
impl App for EchoAgent {
    async fn on_reactive_event(&self, turn: &dyn Turn) -> Result<TurnOutcome> {
        let mut events: Vec<EventBody> = turn.inputs().iter().map(|e| e.body.clone()).collect();
        for _ in 0..turn.max_rounds() {
            for body in &events {
                match body {
                    EventBody::Message { text } | EventBody::FollowUp { text } => {
                        turn.say(format!("echo: {text}"))
                    }
                    EventBody::Steer { text } => turn.say(format!("steering: {text}")),
                    EventBody::Stop { .. } => return Ok(TurnOutcome::Cancelled),
                    _ => {}
                }
            }
            events = turn
                .fold_arrivals()
                .await?
                .into_iter()
                .map(|e| e.body)
                .collect();
            if events.is_empty() {
                break;
            }
        }
        Ok(TurnOutcome::Replied)
    }
}
