//! `script`: a deterministic model read from a TOML file, for demos and tests.
//!
//! ```toml
//! [[turn]]
//! when = "report"             # case-insensitive substring of the turn's first user message
//!                             # (with none, its first message: "The user attached …");
//!                             # omitted: any turn. The first matching entry wins.
//! closing = "I tried …"       # the reply to a closing call (omitted: an empty reply)
//! [[turn.step]]               # step k answers the turn's k-th model call; the last repeats
//! text = "Fetching {attachment}"
//! tool_calls = [{ name = "pull", arguments = { reference = "{attachment}" } }]
//! wait_for_input = false      # hold the reply until an event reaches the lane (max 30 s)
//! delay_ms = 0                # wait before replying
//! word_delay_ms = 0           # pause after each streamed word
//! ```
//!
//! A top-level `compaction = "…"` is the summary a compaction call gets.
//!
//! Placeholders in texts and string arguments: `{last_user}` (the latest user message),
//! `{last_tool}` (the latest tool result), `{recalled}` (what the context rebuild recalled, or
//! `nothing recalled`),
//! `{attachment}` (the latest attachment reference seen in the conversation), `{file:NAME}`
//! (the latest hosted-file reference ending in `/NAME`), `{turn_file:NAME}` (the same, but only
//! from earlier turns). Text is streamed word by word.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::{
    CallContext, ModelError, ModelErrorKind, ModelProvider, ModelReply, ModelRequest, Role,
    ToolCallRequest,
};

/// The longest a `wait_for_input` step holds its reply.
const MAX_HOLD: Duration = Duration::from_secs(30);

/// A parsed script.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default, rename = "turn")]
    turns: Vec<ScriptTurn>,
    /// The summary a compaction call gets (placeholders filled; `{messages}` is how many
    /// messages it summarised).
    #[serde(default)]
    compaction: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptTurn {
    #[serde(default)]
    when: Option<String>,
    #[serde(default)]
    closing: Option<String>,
    #[serde(default, rename = "step")]
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    wait_for_input: bool,
    #[serde(default)]
    delay_ms: u64,
    /// A pause after each streamed word (a model visibly typing).
    #[serde(default)]
    word_delay_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptCall {
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl Script {
    /// Parses a script; the error names the line and field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let script: Script = toml::from_str(text).map_err(|e| e.to_string())?;
        for (i, turn) in script.turns.iter().enumerate() {
            if turn.steps.is_empty() {
                return Err(format!("turn[{i}] has no steps"));
            }
        }
        Ok(script)
    }

    /// Reads and parses a script file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the script {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The provider.
pub struct ScriptModel {
    script: Script,
}

impl ScriptModel {
    pub fn new(script: Script) -> Self {
        Self { script }
    }
}

#[async_trait]
impl ModelProvider for ScriptModel {
    async fn complete(
        &self,
        request: &ModelRequest,
        cx: &mut CallContext,
    ) -> Result<ModelReply, ModelError> {
        if request.compaction {
            let vars = Vars::from_request(request);
            let text = vars
                .fill(self.script.compaction.as_deref().unwrap_or("(summary)"))
                .replace("{messages}", &request.messages.len().to_string());
            return Ok(ModelReply {
                text,
                ..ModelReply::default()
            });
        }
        let turn_messages = request.messages.get(request.turn_start..).unwrap_or(&[]);
        // A turn with no user message (an attachment alone, an answer) matches on its first
        // message of any role instead.
        let first_user = turn_messages
            .iter()
            .find(|m| m.role == Role::User)
            .or_else(|| turn_messages.iter().find(|m| m.role != Role::Assistant))
            .map(|m| m.content.to_lowercase())
            .unwrap_or_default();
        let Some(entry) = self.script.turns.iter().find(|t| {
            t.when
                .as_ref()
                .is_none_or(|w| first_user.contains(&w.to_lowercase()))
        }) else {
            return Err(ModelError::new(
                ModelErrorKind::Config,
                format!("the script has no turn matching {first_user:?}"),
            ));
        };
        let vars = Vars::from_request(request);
        if request.closing {
            let text = vars.fill(entry.closing.as_deref().unwrap_or(""));
            stream(&text, cx);
            return Ok(ModelReply {
                text,
                ..ModelReply::default()
            });
        }
        let index = turn_messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let step = &entry.steps[index.min(entry.steps.len() - 1)];
        if step.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(step.delay_ms)).await;
        }
        if step.wait_for_input {
            let _ = tokio::time::timeout(MAX_HOLD, cx.next_arrival()).await;
        }
        let text = vars.fill(&step.text);
        if step.word_delay_ms > 0 {
            for word in text.split_inclusive(' ') {
                cx.delta(word);
                tokio::time::sleep(Duration::from_millis(step.word_delay_ms)).await;
            }
        } else {
            stream(&text, cx);
        }
        let tool_calls = step
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCallRequest {
                id: format!("call_{}_{i}", index + 1),
                name: c.name.clone(),
                arguments: vars.fill_value(&c.arguments),
            })
            .collect();
        Ok(ModelReply {
            text,
            tool_calls,
            usage: None,
            model: None,
            finish_reason: Some("stop".into()),
        })
    }
}

fn stream(text: &str, cx: &CallContext) {
    for word in text.split_inclusive(' ') {
        cx.delta(word);
    }
}

/// What placeholders can refer to.
struct Vars {
    last_user: String,
    last_tool: String,
    recalled: String,
    /// Every reference seen in the conversation, oldest first, with whether it was before the
    /// running turn.
    references: Vec<(String, bool)>,
}

impl Vars {
    fn from_request(request: &ModelRequest) -> Self {
        let last_user = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let last_tool = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::Tool)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let recalled = request
            .messages
            .iter()
            .find(|m| m.content.starts_with(crate::timeline::RECALL_HEADER))
            .map_or_else(|| "nothing recalled".to_owned(), |m| m.content.clone());
        let mut references = Vec::new();
        for (i, m) in request.messages.iter().enumerate() {
            for word in m
                .content
                .split(|c: char| c.is_whitespace() || "\"(),".contains(c))
            {
                if word.starts_with("conv:") {
                    references.push((word.to_owned(), i < request.turn_start));
                }
            }
        }
        Self {
            last_user,
            last_tool,
            recalled,
            references,
        }
    }

    fn latest(&self, family: &str, name: Option<&str>, earlier_only: bool) -> String {
        self.references
            .iter()
            .rev()
            .filter(|(_, earlier)| *earlier || !earlier_only)
            .find(|(r, _)| {
                r.starts_with(&format!("conv:{family}:"))
                    && name.is_none_or(|n| r.ends_with(&format!("/{n}")))
            })
            .map(|(r, _)| r.clone())
            .unwrap_or_default()
    }

    fn fill(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            let name = &after[..end];
            let value = match name.split_once(':') {
                None if name == "last_user" => Some(self.last_user.clone()),
                None if name == "last_tool" => Some(self.last_tool.clone()),
                None if name == "recalled" => Some(self.recalled.clone()),
                None if name == "attachment" => Some(self.latest("at", None, false)),
                Some(("file", file)) => Some(self.latest("fi", Some(file), false)),
                Some(("turn_file", file)) => Some(self.latest("fi", Some(file), true)),
                _ => None,
            };
            match value {
                Some(v) => out.push_str(&v),
                None => out.push_str(&rest[start..start + end + 2]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn fill_value(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.fill(s)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.fill_value(v)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), self.fill_value(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Message;

    fn request(messages: Vec<Message>, turn_start: usize) -> ModelRequest {
        ModelRequest {
            tool_choice: Default::default(),
            temperature: None,
            model: "m".into(),
            messages,
            tools: Vec::new(),
            turn_start,
            closing: false,
            compaction: false,
            max_tokens: None,
        }
    }

    #[tokio::test]
    async fn steps_follow_the_turns_model_calls_and_fill_placeholders() {
        let script = Script::parse(
            r#"
            [[turn]]
            when = "REPORT"
            closing = "tried {last_user}"
            [[turn.step]]
            tool_calls = [{ name = "pull", arguments = { reference = "{attachment}" } }]
            [[turn.step]]
            text = "see {file:r.md}"
            [[turn]]
            [[turn.step]]
            text = "other"
            "#,
        )
        .unwrap();
        let model = ScriptModel::new(script);
        let mut cx = CallContext::detached();
        let mut messages = vec![
            Message::new(Role::System, "attached conv:at:conv_1/turn_1/x/a.txt"),
            Message::new(Role::User, "write a report"),
        ];
        let first = model
            .complete(&request(messages.clone(), 1), &mut cx)
            .await
            .unwrap();
        assert_eq!(first.tool_calls[0].name, "pull");
        assert_eq!(
            first.tool_calls[0].arguments["reference"],
            "conv:at:conv_1/turn_1/x/a.txt"
        );
        messages.push(Message::new(Role::Assistant, ""));
        messages.push(Message::new(
            Role::System,
            "file conv:fi:conv_1/turn_1/r.md",
        ));
        let second = model
            .complete(&request(messages.clone(), 1), &mut cx)
            .await
            .unwrap();
        assert_eq!(second.text, "see conv:fi:conv_1/turn_1/r.md");
        let mut closing = request(messages, 1);
        closing.closing = true;
        let reply = model.complete(&closing, &mut cx).await.unwrap();
        assert_eq!(reply.text, "tried write a report");
        let other = model
            .complete(&request(vec![Message::new(Role::User, "hi")], 0), &mut cx)
            .await
            .unwrap();
        assert_eq!(other.text, "other");
    }

    #[test]
    fn bad_scripts_are_refused_with_the_reason() {
        let err = Script::parse("[[turn]]\nwhen = 3\n").unwrap_err();
        assert!(err.contains("when"), "{err}");
        let err = Script::parse("[[turn]]\nwhen = \"x\"\n").unwrap_err();
        assert!(err.contains("no steps"), "{err}");
        let err = Script::parse("[[turn]]\n[[turn.step]]\ntxt = \"x\"\n").unwrap_err();
        assert!(err.contains("txt"), "{err}");
    }
}
