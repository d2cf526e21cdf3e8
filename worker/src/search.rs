//! The `search` tool's view of the hybrid index: the caller's own rows, hydrated with snippets
//! through the resolver as the caller.

use async_trait::async_trait;
use serde_json::{json, Value};
use turnpike_index::{Index, Scope, SearchRequest};
use turnpike_resolver::Resolver;
use turnpike_schemas::{Identity, TenantId};

use crate::tools::SearchIndex;

/// The index behind the `search` tool.
pub struct IndexSearch {
    index: Index,
    resolver: Resolver,
}

impl IndexSearch {
    pub fn new(index: Index, resolver: Resolver) -> Self {
        Self { index, resolver }
    }
}

#[async_trait]
impl SearchIndex for IndexSearch {
    async fn search(
        &self,
        tenant: &TenantId,
        identity: &Identity,
        query: &str,
        limit: usize,
    ) -> Result<Value, String> {
        let scope = Scope::new(tenant.clone(), identity.clone());
        let mut request = SearchRequest::new(query);
        request.limit = limit.clamp(1, 50);
        let page = turnpike_index::hydrate::search(
            &self.index,
            &self.resolver,
            identity,
            &scope,
            &request,
        )
        .await
        .map_err(|e| format!("search failed: {e}"))?;
        let hits: Vec<Value> = page
            .hits
            .iter()
            .map(|h| {
                json!({
                    "reference": h.info.reference,
                    "conversation": h.info.conversation,
                    "turn": h.info.turn.number(),
                    "kind": h.info.kind,
                    "snippet": h.snippet,
                    "score": h.score,
                })
            })
            .collect();
        Ok(json!({ "hits": hits }))
    }
}
