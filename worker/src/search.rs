//! The `search` tool's view of the hybrid index: the caller's own rows, hydrated with snippets
//! through the resolver as the caller.

use async_trait::async_trait;
use serde_json::{json, Value};
use turnpike_index::{Filters, Index, Kind, Scope, SearchRequest};
use turnpike_resolver::Resolver;
use turnpike_schemas::{Identity, RecallHit, TenantId};

use crate::recall::RecallFilter;

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

    /// One page of `identity`'s hits, hydrated as `identity`.
    async fn page(
        &self,
        tenant: &TenantId,
        identity: &Identity,
        request: &SearchRequest,
    ) -> Result<turnpike_index::Page, String> {
        let scope = Scope::new(tenant.clone(), identity.clone());
        turnpike_index::hydrate::search(&self.index, &self.resolver, identity, &scope, request)
            .await
            .map_err(|e| format!("search failed: {e}"))
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
        let mut request = SearchRequest::new(query);
        request.limit = limit.clamp(1, 50);
        let page = self.page(tenant, identity, &request).await?;
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

    async fn recall(
        &self,
        tenant: &TenantId,
        identity: &Identity,
        query: &str,
        filter: &RecallFilter,
    ) -> Result<Vec<RecallHit>, String> {
        let mut request = SearchRequest::new(query);
        request.limit = filter.k.clamp(1, 100);
        request.filters = Filters {
            app: filter.app.clone(),
            conversation: filter.conversation,
            kinds: filter
                .kinds
                .iter()
                .map(|k| k.parse::<Kind>())
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?,
            ..Filters::default()
        };
        let page = self.page(tenant, identity, &request).await?;
        // A hit whose content the identity cannot read (gone, no longer granted, a stale row)
        // is not recalled.
        Ok(page
            .hits
            .into_iter()
            .filter_map(|h| {
                Some(RecallHit {
                    snippet: h.snippet?,
                    reference: h.info.reference,
                    conversation: h.info.conversation,
                    turn: h.info.turn,
                    kind: h.info.kind.as_str().to_owned(),
                    score: h.score,
                })
            })
            .collect())
    }
}
