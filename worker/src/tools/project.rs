//! `checkout {path?, turn?}`: materialises files of the conversation's project — the version the
//! turn started from, or the one a given turn published — into the workspace.

use async_trait::async_trait;
use serde_json::{json, Value};
use turnpike_schemas::{RefPath, TurnId};

use super::{Tool, ToolContext, ToolOutput};
use turnpike_agent::model::ToolSpec;

/// The tool.
pub struct Checkout;

#[async_trait]
impl Tool for Checkout {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "checkout".into(),
            description:
                "Bring project files into the workspace: a file or folder (default: all) \
                          of the latest version, or of the version a turn published (e.g. turn_41)."
                    .into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string"}, "turn": {"type": "string", "description": "turn_<n>"}}}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let Some(handle) = &cx.project else {
            return Err("this turn has no project".into());
        };
        let path = match args.get("path").and_then(Value::as_str) {
            Some(p) if !p.is_empty() && p != "." => {
                Some(RefPath::parse(p).map_err(|e| format!("path {p:?}: {e}"))?)
            }
            _ => None,
        };
        let commit = match args.get("turn").and_then(Value::as_str) {
            Some(t) => {
                let turn: TurnId = t.parse().map_err(|e| format!("turn {t:?}: {e}"))?;
                let commit = handle
                    .lineage
                    .ref_of(turn)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("{turn} published no version"))?;
                Some(commit)
            }
            None if handle.base.is_none() => {
                return Err("the project has no version yet".into());
            }
            None => None,
        };
        let project = handle.get().await?;
        let files = project
            .materialise(path.as_ref(), commit)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({ "files": files }).into())
    }
}
