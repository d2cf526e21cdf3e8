//! The remote app protocol, version 2: what a worker sends an app and what the app may answer.
//! `docs/remote-apps.md` describes it for app authors; `docs/remote-apps.schema.json` is its
//! JSON schema. Every message is one JSON object; the app's actions are one per line (NDJSON).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::Block;

use crate::model::{Message, ToolCallRequest, Usage};

/// The protocol version this worker speaks (sent as `Turnpike-Protocol` and in the context).
/// 2: events are taken with `next_events`, never pushed (version 1 pushed them).
pub const PROTOCOL_VERSION: u32 = 2;

/// The longest id an app may give an action (ids are ASCII letters, digits, `_` and `-`, so
/// that no two map to one stored name).
pub const MAX_ID_BYTES: usize = 64;

/// One action of an app, read from its stream. Unknown fields and unknown types are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Text for the user, streamed as it comes; consecutive `say`s make one reply.
    Say { text: String },
    /// Calls one of the agent's tools; the worker runs it (approval gate, cell, resolver) and
    /// sends a [`ToApp::ToolResult`] with the same id.
    Tool {
        id: String,
        name: String,
        #[serde(default)]
        arguments: Value,
    },
    /// Asks the deployment's model; the worker sends a [`ToApp::ModelResult`] with the same id.
    Model {
        id: String,
        /// The messages to send; absent: the conversation as the built-in loop would send it
        /// (system prompt, history, this turn).
        #[serde(default)]
        messages: Option<Vec<Message>>,
        /// Offer the agent's tools to the model (its calls come back to the app, not run).
        #[serde(default)]
        tools: bool,
        /// Stream the model's text to the user as part of the reply, too.
        #[serde(default)]
        say: bool,
        #[serde(default)]
        temperature: Option<f32>,
        #[serde(default)]
        max_tokens: Option<u32>,
    },
    /// Asks the user a question: the turn parks until the answer (the `ask_user` tool).
    AskUser { id: String, question: String },
    /// Publishes a file of the workspace (the `publish` tool).
    Publish { id: String, path: String },
    /// Takes what reached the conversation since the turn started (follow-ups, steers,
    /// attachments): the worker commits it to this turn and answers [`ToApp::Events`] with the
    /// same id — at once with what waits, or, when nothing waits, after the first arrival or
    /// `wait_ms` (at most the turn's deadline), whichever is first. What the app does not take
    /// before its `done` starts the next turn, as with the built-in loop.
    NextEvents {
        id: String,
        #[serde(default)]
        wait_ms: u64,
    },
    /// The turn is done.
    Done {},
    /// The app failed; the turn fails with this message.
    Error { message: String },
    /// Nothing to do yet (keeps the read timeout from firing); not recorded.
    Keepalive {},
}

impl Action {
    /// Parses one line of an app's stream, or says what is wrong with it.
    pub fn parse(line: &[u8]) -> Result<Self, String> {
        let action: Action = serde_json::from_slice(line).map_err(|e| {
            let shown: String = String::from_utf8_lossy(line).chars().take(120).collect();
            format!("malformed action {shown:?}: {e}")
        })?;
        if let Some(id) = action.id() {
            let valid = !id.is_empty()
                && id.len() <= MAX_ID_BYTES
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                return Err(format!(
                    "an action id must be 1–{MAX_ID_BYTES} ASCII letters, digits, `_` or `-`, not {id:?}"
                ));
            }
        }
        if let Action::Model {
            temperature: Some(t),
            ..
        } = &action
        {
            if !(0.0..=2.0).contains(t) {
                return Err(format!("model temperature must be 0–2, not {t}"));
            }
        }
        Ok(action)
    }

    /// The id of an action that waits for an answer.
    pub fn id(&self) -> Option<&str> {
        match self {
            Action::Tool { id, .. }
            | Action::Model { id, .. }
            | Action::AskUser { id, .. }
            | Action::Publish { id, .. }
            | Action::NextEvents { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The tool call an action stands for (`tool`, `ask_user`, `publish`).
    pub fn as_call(&self) -> Option<ToolCallRequest> {
        let (id, name, arguments) = match self {
            Action::Tool {
                id,
                name,
                arguments,
            } => (id, name.as_str(), arguments.clone()),
            Action::AskUser { id, question } => {
                (id, "ask_user", serde_json::json!({ "question": question }))
            }
            Action::Publish { id, path } => (id, "publish", serde_json::json!({ "path": path })),
            _ => return None,
        };
        Some(ToolCallRequest {
            id: id.clone(),
            name: name.to_owned(),
            arguments,
        })
    }
}

/// What a worker sends an app during a turn (`POST /v1/turns/{exchange}/messages`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToApp {
    /// A tool call's result.
    ToolResult { id: String, ok: bool, output: Value },
    /// A model call's answer.
    ModelResult {
        id: String,
        text: String,
        tool_calls: Vec<ToolCallRequest>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    /// What reached the conversation while the turn runs (follow-ups, steers, attachments),
    /// already committed to its record: the answer to the app's [`Action::NextEvents`] with
    /// that id (may be empty). Turns recorded before `next_events` existed hold these without
    /// an id, sent as the events came.
    Events {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        blocks: Vec<Block>,
    },
    /// The call with this id parks the turn (an approval, a question): the turn ends here and
    /// a later turn continues once it is answered. Nothing more is read from the app.
    Parked { id: String, reason: String },
    /// An action was refused: the turn fails with this reason. Nothing more is read.
    Refused { message: String },
    /// The user stopped the turn. Nothing more is read.
    Stop {},
    /// The turn ended (sent when the app's stream is still open).
    End { outcome: TurnOutcome },
}

/// The limits of one turn, sent to the app with its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Tool calls the turn may make.
    pub max_rounds: u32,
    /// Actions the app may send (keepalives not counted).
    pub max_actions: u32,
    /// Bytes the app's stream may carry in all.
    pub max_bytes: u64,
    /// The longest one line (action) may be.
    pub max_line_bytes: u64,
    /// The longest the app may stay silent (the SDK sends keepalives).
    pub read_timeout_ms: u64,
    /// The longest the whole exchange may take.
    pub deadline_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_and_bad_ones_say_why() {
        let ok = [
            (r#"{"type":"say","text":"hi"}"#, "say"),
            (
                r#"{"type":"tool","id":"t1","name":"read_file","arguments":{"path":"a"}}"#,
                "tool",
            ),
            (r#"{"type":"model","id":"m1","say":true}"#, "model"),
            (r#"{"type":"ask_user","id":"q","question":"why?"}"#, "ask"),
            (r#"{"type":"publish","id":"p","path":"out.md"}"#, "publish"),
            (r#"{"type":"done"}"#, "done"),
            (r#"{"type":"keepalive"}"#, "keepalive"),
            (r#"{"type":"next_events","id":"e1"}"#, "next_events"),
            (
                r#"{"type":"next_events","id":"e2","wait_ms":500}"#,
                "next_events",
            ),
        ];
        for (line, what) in ok {
            assert!(Action::parse(line.as_bytes()).is_ok(), "{what}: {line}");
        }
        let bad = [
            (r#"{"type":"shout","text":"hi"}"#, "unknown variant"),
            (r#"{"type":"say","text":"hi","colour":1}"#, "unknown field"),
            (
                r#"{"type":"tool","name":"read_file"}"#,
                "missing field `id`",
            ),
            (r#"{"type":"tool","id":"","name":"x"}"#, "action id"),
            (r#"{"type":"tool","id":"a.b","name":"x"}"#, "action id"),
            (
                r#"{"type":"model","id":"m","temperature":9}"#,
                "temperature",
            ),
            ("not json", "malformed action"),
            (r#"[1,2]"#, "malformed action"),
        ];
        for (line, expected) in bad {
            let e = Action::parse(line.as_bytes()).unwrap_err();
            assert!(e.contains(expected), "{line}: {e}");
        }
    }

    #[test]
    fn ask_user_and_publish_are_tool_calls() {
        let a = Action::parse(br#"{"type":"publish","id":"p","path":"out.md"}"#).unwrap();
        let call = a.as_call().unwrap();
        assert_eq!((call.id.as_str(), call.name.as_str()), ("p", "publish"));
        assert_eq!(call.arguments["path"], "out.md");
        let a = Action::parse(br#"{"type":"ask_user","id":"q","question":"ok?"}"#).unwrap();
        assert_eq!(a.as_call().unwrap().name, "ask_user");
        assert!(Action::parse(br#"{"type":"done"}"#)
            .unwrap()
            .as_call()
            .is_none());
    }

    /// The published schema names every action and message these types know, with the same
    /// required fields (a variant added here without the schema fails this).
    #[test]
    fn the_published_schema_matches_the_types() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/remote-apps.schema.json"
        );
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let defs = &schema["$defs"];
        let actions = [
            r#"{"type":"say","text":"t"}"#,
            r#"{"type":"tool","id":"i","name":"n"}"#,
            r#"{"type":"model","id":"i"}"#,
            r#"{"type":"ask_user","id":"i","question":"q"}"#,
            r#"{"type":"publish","id":"i","path":"p"}"#,
            r#"{"type":"next_events","id":"i"}"#,
            r#"{"type":"done"}"#,
            r#"{"type":"error","message":"m"}"#,
            r#"{"type":"keepalive"}"#,
        ];
        let listed = defs["action"]["oneOf"].as_array().unwrap().len();
        assert_eq!(listed, actions.len(), "every action is in the schema");
        for text in actions {
            let action = Action::parse(text.as_bytes()).unwrap();
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let kind = value["type"].as_str().unwrap();
            let def = &defs[format!("action_{kind}")];
            let required: Vec<&str> = def["required"]
                .as_array()
                .unwrap_or_else(|| panic!("no schema for {kind}"))
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let mut fields: Vec<&str> = value
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            fields.sort_unstable();
            let mut want = required.clone();
            want.sort_unstable();
            assert_eq!(
                fields, want,
                "{kind}: the minimal action has the required fields"
            );
            // Every field the type serialises is one the schema knows.
            let full = serde_json::to_value(&action).unwrap();
            for key in full.as_object().unwrap().keys() {
                assert!(
                    def["properties"].get(key).is_some(),
                    "{kind}.{key} not in the schema"
                );
            }
        }
        let messages = [
            ToApp::ToolResult {
                id: "i".into(),
                ok: true,
                output: serde_json::json!(1),
            },
            ToApp::ModelResult {
                id: "i".into(),
                text: "t".into(),
                tool_calls: vec![],
                usage: None,
            },
            ToApp::Events {
                id: Some("i".into()),
                blocks: vec![],
            },
            ToApp::Parked {
                id: "i".into(),
                reason: "r".into(),
            },
            ToApp::Refused {
                message: "m".into(),
            },
            ToApp::Stop {},
            ToApp::End {
                outcome: TurnOutcome::Replied,
            },
        ];
        assert_eq!(
            defs["to_app"]["oneOf"].as_array().unwrap().len(),
            messages.len()
        );
        for message in messages {
            let value = serde_json::to_value(&message).unwrap();
            let kind = value["type"].as_str().unwrap();
            let def = &defs[format!("to_app_{kind}")];
            for required in def["required"].as_array().unwrap() {
                let required = required.as_str().unwrap();
                assert!(value.get(required).is_some(), "{kind} lacks {required}");
            }
            for key in value.as_object().unwrap().keys() {
                assert!(
                    def["properties"].get(key).is_some(),
                    "{kind}.{key} not in the schema"
                );
            }
        }
    }
}
