//! Agents: what runs inside a turn. The built-in echo agent stands in until the agent loop
//! exists; it still goes through both batches of the record.

use async_trait::async_trait;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::EventBody;

use crate::error::Result;
use crate::turn::TurnContext;

/// Runs the work of one turn between batch one and batch two.
#[async_trait]
pub trait Agent: Send + Sync + 'static {
    /// Does the turn's work through `turn` and says how it ended.
    async fn run(&self, turn: &mut TurnContext) -> Result<TurnOutcome>;
}

/// Replies `echo: <text>` to every message and follow-up, folding in what arrives on the lane
/// between rounds; a stop cancels the turn.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoAgent;

#[async_trait]
impl Agent for EchoAgent {
    async fn run(&self, turn: &mut TurnContext) -> Result<TurnOutcome> {
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
