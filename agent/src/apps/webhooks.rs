//! `[webhooks.<name>]` in a manifest: an app-wide outbound webhook, checked when it loads.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use turnpike_schemas::webhook::{EventKind, WebhookSpec};
use turnpike_schemas::{AgentId, TenantId};

use crate::spec::AgentSpec;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhook {
    url: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    events: Vec<String>,
    secret_env: String,
}

pub(super) fn webhook_spec(
    tenants: &[TenantId],
    agents: &BTreeMap<AgentId, Arc<AgentSpec>>,
    name: &str,
    raw: RawWebhook,
) -> Result<WebhookSpec, String> {
    let field = |f: &str| format!("webhooks.{name}.{f}");
    super::jobs::job_name("webhooks", "a webhook's", name)?;
    let url = url::Url::parse(&raw.url).map_err(|e| format!("{}: {e}", field("url")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "{}: an http or https URL with a host",
            field("url")
        ));
    }
    let tenant = super::jobs::job_tenant(&field, tenants, raw.tenant.as_deref())?;
    let agent = match raw.agent {
        None => None,
        Some(a) => {
            let agent: AgentId = a.parse().map_err(|e| format!("{}: {e}", field("agent")))?;
            if !agents.contains_key(&agent) {
                return Err(format!("{}: the app has no agent {agent}", field("agent")));
            }
            Some(agent)
        }
    };
    let mut events = Vec::new();
    for e in &raw.events {
        let kind = EventKind::parse(e).ok_or_else(|| {
            let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
            format!("{}: {e:?} is none of {}", field("events"), known.join(", "))
        })?;
        events.push(kind);
    }
    if raw.secret_env.trim().is_empty() {
        return Err(format!(
            "{}: name an environment variable",
            field("secret_env")
        ));
    }
    Ok(WebhookSpec {
        name: name.to_owned(),
        url: raw.url,
        tenant,
        agent,
        events,
        secret_env: raw.secret_env,
    })
}
