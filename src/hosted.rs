//! The edge's view of the harness, wired here so that neither depends on the other: the apps
//! catalogue from the hosted [`Apps`], and replay by the agent crate's own loop.

use std::sync::Arc;

use async_trait::async_trait;
use turnpike_agent::Apps;
use turnpike_edge::model::{AgentView, AppView, SkillView};
use turnpike_edge::{Catalog, Replayed, Replayer};
use turnpike_schemas::TurnLog;

/// The apps a process hosts, as the API lists them.
pub struct AppsCatalog(pub Arc<Apps>);

impl Catalog for AppsCatalog {
    fn apps(&self) -> Vec<AppView> {
        self.0
            .ids()
            .into_iter()
            .map(|app| AppView {
                id: app.to_string(),
                agents: self
                    .0
                    .agent_specs(&app)
                    .iter()
                    .map(|spec| AgentView {
                        id: spec.name.to_string(),
                        model: spec.model.clone(),
                        tools: spec.tools.specs().into_iter().map(|t| t.name).collect(),
                        context_length: spec.context_length,
                        connections: spec
                            .mcp
                            .iter()
                            .filter(|s| s.connection)
                            .map(|s| s.name.clone())
                            .collect(),
                        description: spec.description.clone(),
                        skills: spec
                            .skills
                            .iter()
                            .map(|s| SkillView {
                                id: s.id.clone(),
                                name: s.name.clone(),
                                description: s.description.clone(),
                                tags: s.tags.clone(),
                                examples: s.examples.clone(),
                            })
                            .collect(),
                    })
                    .collect(),
                tenants: self.0.tenants(&app).iter().map(|t| t.to_string()).collect(),
            })
            .collect()
    }

    fn hook(&self, app: &str, hook: &str) -> Option<turnpike_schemas::HookSpec> {
        self.0.hook(&app.parse().ok()?, hook)
    }
}

/// Replay by the harness's own loop, from the recorded outputs.
pub struct AgentReplayer;

#[async_trait]
impl Replayer for AgentReplayer {
    async fn replay(&self, logs: &[TurnLog]) -> Vec<Replayed> {
        turnpike_agent::replay::replay(logs, None)
            .await
            .into_iter()
            .map(|r| Replayed {
                turn: r.turn,
                divergence: r.divergence.map(|d| d.to_string()),
            })
            .collect()
    }
}
