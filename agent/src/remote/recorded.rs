//! Replaying a remote app's turn from its exchange log, without the app.
//!
//! The app's recorded actions are played back in order; the tools answer with their recorded
//! results and the model with its recorded answers. What the replay sends the app is compared
//! with what the live turn sent: the first difference (a what-if's changed tool result, say)
//! ends the replay there, since what the app would have done then is unknown.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::Value;
use turnpike_schemas::turnlog::ExchangeStep;
use turnpike_schemas::Block;

use super::driver::{Exchange, Step};
use super::protocol::ToApp;
use crate::agent_loop::Inbox;
use crate::error::{Error, Result};
use crate::model::{
    CallContext, ModelError, ModelErrorKind, ModelProvider, ModelReply, ModelRequest,
};

/// An exchange played back from its recorded steps.
pub struct RecordedExchange {
    steps: Vec<ExchangeStep>,
    at: usize,
}

impl RecordedExchange {
    pub fn new(steps: Vec<ExchangeStep>) -> Self {
        Self { steps, at: 0 }
    }

    fn diverged(what: String) -> Error {
        Error::app(format!("replay diverged: {what}"))
    }
}

#[async_trait]
impl Exchange for RecordedExchange {
    async fn start(&mut self, _context: &Value) -> Result<()> {
        Ok(())
    }

    async fn next(&mut self, _inbox: &mut dyn Inbox, _cx: &mut CallContext) -> Result<Step> {
        let step = match self.steps.get(self.at) {
            None => return Ok(Step::Closed),
            Some(ExchangeStep::Action { action }) => {
                Step::Line(serde_json::to_vec(action).unwrap_or_default())
            }
            Some(ExchangeStep::Arrived { blocks }) => Step::Arrived(blocks.clone()),
            Some(ExchangeStep::Stopped { blocks }) => Step::Stopped(blocks.clone()),
            Some(ExchangeStep::Sent { message }) => {
                return Err(Self::diverged(format!(
                    "the record sent the app {message} here, the replay sent nothing"
                )))
            }
        };
        self.at += 1;
        Ok(step)
    }

    async fn take(
        &mut self,
        _inbox: &mut dyn Inbox,
        _cx: &mut CallContext,
        _wait: std::time::Duration,
    ) -> Result<Step> {
        let step = match self.steps.get(self.at) {
            Some(ExchangeStep::Arrived { blocks }) => Step::Arrived(blocks.clone()),
            Some(ExchangeStep::Stopped { blocks }) => Step::Stopped(blocks.clone()),
            // The live take ended unanswered: the app spoke (or closed) before anything arrived.
            Some(ExchangeStep::Action { action }) => {
                Step::Line(serde_json::to_vec(action).unwrap_or_default())
            }
            None => return Ok(Step::Closed),
            Some(ExchangeStep::Sent { .. }) => {
                return Err(Self::diverged(
                    "the app takes events where the record took none".into(),
                ))
            }
        };
        self.at += 1;
        Ok(step)
    }

    async fn stop_signal(&mut self, _inbox: &mut dyn Inbox) {
        if !matches!(self.steps.get(self.at), Some(ExchangeStep::Stopped { .. })) {
            std::future::pending::<()>().await
        }
    }

    async fn stop_blocks(&mut self, _inbox: &mut dyn Inbox) -> Result<Vec<Block>> {
        match self.steps.get(self.at) {
            Some(ExchangeStep::Stopped { blocks }) => {
                let blocks = blocks.clone();
                self.at += 1;
                Ok(blocks)
            }
            _ => Err(Self::diverged(
                "the replay stops where the record did not".into(),
            )),
        }
    }

    async fn send(&mut self, message: &ToApp) -> Result<()> {
        let sent = serde_json::to_value(message).unwrap_or(Value::Null);
        match self.steps.get(self.at) {
            Some(ExchangeStep::Sent { message: recorded }) if *recorded == sent => {
                self.at += 1;
                Ok(())
            }
            Some(ExchangeStep::Sent { message: recorded }) => Err(Self::diverged(format!(
                "the app would be sent {sent} where the record sent {recorded}; what it does then is unknown to a replay"
            ))),
            _ => Err(Self::diverged(format!(
                "the replay sends the app {sent} where the record sent nothing"
            ))),
        }
    }
}

/// Answers the app's model calls with the answers recorded for them, in order.
pub struct RecordedModel {
    answers: Mutex<VecDeque<ModelReply>>,
}

impl RecordedModel {
    /// The model answers among an exchange's steps.
    pub fn from_steps(steps: &[ExchangeStep]) -> Self {
        let answers = steps
            .iter()
            .filter_map(|s| match s {
                ExchangeStep::Sent { message } => {
                    match serde_json::from_value::<ToApp>(message.clone()) {
                        Ok(ToApp::ModelResult {
                            text,
                            tool_calls,
                            usage,
                            ..
                        }) => Some(ModelReply {
                            text,
                            tool_calls,
                            usage,
                            model: None,
                            finish_reason: None,
                        }),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect();
        Self {
            answers: Mutex::new(answers),
        }
    }
}

#[async_trait]
impl ModelProvider for RecordedModel {
    async fn complete(
        &self,
        _request: &ModelRequest,
        cx: &mut CallContext,
    ) -> std::result::Result<ModelReply, ModelError> {
        let next = self.answers.lock().expect("replay lock").pop_front();
        let reply = next.ok_or_else(|| {
            ModelError::new(
                ModelErrorKind::Diverged,
                "the app asked the model more often than recorded",
            )
        })?;
        cx.delta(&reply.text);
        Ok(reply)
    }
}

/// An inbox with nothing in it: a replay's arrivals come from the exchange's steps.
pub struct EmptyInbox;

#[async_trait]
impl Inbox for EmptyInbox {
    async fn arrivals(&mut self) -> Result<Vec<Block>> {
        Ok(Vec::new())
    }

    async fn stop_requested(&mut self) {
        std::future::pending::<()>().await
    }
}
