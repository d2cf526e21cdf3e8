//! What the harness knows of tools: their descriptions, an agent's allowlist over them, and
//! what a call returned. The tools themselves run in the host (the worker's built-in tools reach
//! the stores and the host machine), through [`crate::Turn::run_tool`]; the harness decides only
//! which may be called, which need an approval, and what the model is told.

use serde_json::Value;
use turnpike_schemas::Block;

use crate::message::ToolSpec;

/// What a tool returned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    pub output: Value,
    /// Blocks for the turn log besides the result (files the call hosted).
    pub blocks: Vec<Block>,
}

impl From<Value> for ToolOutput {
    fn from(output: Value) -> Self {
        Self {
            output,
            blocks: Vec::new(),
        }
    }
}

/// One tool as the harness knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDescription {
    /// Name, description and argument schema, as the model sees them.
    pub spec: ToolSpec,
    /// Whether a call has effects outside the turn's workspace (its intent is committed before
    /// it runs).
    pub side_effects: bool,
}

/// The tools a host can run, by name: what a manifest's allowlist is checked against.
pub trait ToolCatalog {
    /// The tool named `name`, if the host has it.
    fn describe(&self, name: &str) -> Option<ToolDescription>;
    /// The names of every tool, in order.
    fn names(&self) -> Vec<String>;
}

/// The tools one agent may call, in its allowlist's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Toolset {
    tools: Vec<ToolDescription>,
    /// Tools offered before the turn's sender connected their server: name → server. A call
    /// of one parks with a `connection_required` card.
    unconnected: Vec<(String, String)>,
}

impl Toolset {
    /// The tools `names` lists, from `catalog`; an unknown name is an error naming it.
    pub fn allow(catalog: &dyn ToolCatalog, names: &[String]) -> Result<Self, String> {
        let mut tools = Vec::new();
        for name in names {
            match catalog.describe(name) {
                Some(t) => tools.push(t),
                None => {
                    return Err(format!(
                        "unknown tool {name:?} (known: {})",
                        catalog.names().join(", ")
                    ))
                }
            }
        }
        Ok(Self {
            tools,
            unconnected: Vec::new(),
        })
    }

    /// The same tools and `more` after them (an agent's MCP tools, listed when its turn
    /// starts).
    pub fn with(mut self, more: impl IntoIterator<Item = ToolDescription>) -> Self {
        self.tools.extend(more);
        self
    }

    /// Adds tools of `server` that need the sender's connection to it, which they lack.
    pub fn with_unconnected(
        mut self,
        server: &str,
        more: impl IntoIterator<Item = ToolDescription>,
    ) -> Self {
        for tool in more {
            self.unconnected
                .push((tool.spec.name.clone(), server.to_owned()));
            self.tools.push(tool);
        }
        self
    }

    /// The server whose connection a call of `name` needs first, if the sender lacks it.
    pub fn needs_connection(&self, name: &str) -> Option<&str> {
        self.unconnected
            .iter()
            .find(|(tool, _)| tool == name)
            .map(|(_, server)| server.as_str())
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&ToolDescription> {
        self.tools.iter().find(|t| t.spec.name == name)
    }

    /// Whether a call of `name` has effects outside the workspace.
    pub fn side_effects(&self, name: &str) -> bool {
        self.get(name).is_some_and(|t| t.side_effects)
    }
}
