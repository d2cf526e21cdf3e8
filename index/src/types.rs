//! What the index holds and what a search asks for and returns.

use std::fmt;

use serde::{Deserialize, Serialize};
use turnpike_schemas::{AgentId, AppId, ConversationId, Identity, TenantId, TurnId};

use crate::error::{Error, Result};

/// What an indexed row stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// What the user wrote (a message, a follow-up, a steer).
    Prompt,
    /// What the agent answered.
    Completion,
    /// A compaction summary.
    Summary,
    /// A file the user attached.
    Attachment,
    /// A file a turn hosted.
    File,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Prompt,
        Kind::Completion,
        Kind::Summary,
        Kind::Attachment,
        Kind::File,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Prompt => "prompt",
            Kind::Completion => "completion",
            Kind::Summary => "summary",
            Kind::Attachment => "attachment",
            Kind::File => "file",
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown kind {s:?} (prompt, completion, summary, attachment, file)"
                ))
            })
    }
}

/// Whose rows a query may see: one identity of one tenant. Every query carries one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub tenant: TenantId,
    pub identity: Identity,
}

impl Scope {
    pub fn new(tenant: TenantId, identity: Identity) -> Self {
        Self { tenant, identity }
    }
}

/// A row's id: stable across re-indexing (the reference of the block it came from), so writing
/// a row again replaces it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RowId(String);

impl RowId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the index knows about a row besides its words and embedding: the same in what is
/// written ([`IndexRow`]), what a retriever finds ([`Candidate`]), what a search returns
/// ([`Hit`]) and what the embedded vector store keeps beside each vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowInfo {
    pub id: RowId,
    pub app: AppId,
    pub agent: AgentId,
    pub conversation: ConversationId,
    /// Serialised as the bare number (the stored form predates the typed id).
    #[serde(with = "turn_number")]
    pub turn: TurnId,
    pub kind: Kind,
    /// Where the content lives (a turn-log block, a hosted file, an attachment).
    pub reference: String,
    /// When it was said or made, in milliseconds since the epoch.
    pub at_ms: i64,
}

/// A [`TurnId`] as its number.
mod turn_number {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};
    use turnpike_schemas::TurnId;

    pub fn serialize<S: Serializer>(turn: &TurnId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(turn.number())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TurnId, D::Error> {
        TurnId::new(u64::deserialize(d)?).ok_or_else(|| D::Error::custom("turn 0 does not exist"))
    }
}

/// One indexed item. The text is indexed (words and embedding) but never stored: hits are
/// hydrated from the turn log through the resolver.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexRow {
    pub scope: Scope,
    pub info: RowInfo,
    pub text: String,
    pub embedding: Vec<f32>,
}

/// Optional narrowing of a search; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Filters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<AppId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationId>,
    /// Any of these kinds; empty: all kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<Kind>,
    /// At or after (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Before (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
}

impl Filters {
    /// Whether a row passes (the backends push filters into their queries; this is the same
    /// rule, for code that checks rows itself).
    pub fn admits(&self, row: &RowInfo) -> bool {
        self.app.as_ref().is_none_or(|a| *a == row.app)
            && self.agent.as_ref().is_none_or(|a| *a == row.agent)
            && self.conversation.is_none_or(|c| c == row.conversation)
            && (self.kinds.is_empty() || self.kinds.contains(&row.kind))
            && self.since_ms.is_none_or(|s| row.at_ms >= s)
            && self.until_ms.is_none_or(|u| row.at_ms < u)
    }
}

/// Which retrievers a search uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Reciprocal-rank fusion of both.
    #[default]
    Hybrid,
    /// Full text only.
    Lexical,
    /// Embeddings only.
    Vector,
}

impl std::str::FromStr for Mode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hybrid" => Ok(Mode::Hybrid),
            "lexical" => Ok(Mode::Lexical),
            "vector" => Ok(Mode::Vector),
            other => Err(Error::invalid(format!(
                "unknown mode {other:?} (hybrid, lexical, vector)"
            ))),
        }
    }
}

/// A recency boost: a hit `half_life_ms` old gets half of `weight` added, on the fused scale
/// (where one retriever's hit at the top of its bulk counts 1), so `weight = 1` lets a fresh
/// hit jump about one retriever's vote.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recency {
    pub half_life_ms: i64,
    pub weight: f64,
    /// "Now" for the boost (ms since the epoch); the caller's clock.
    pub now_ms: i64,
}

/// A search.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchRequest {
    pub text: String,
    pub mode: Mode,
    pub filters: Filters,
    /// Hits per page (1..=100).
    pub limit: usize,
    /// Where the page starts in the ranked list (from a previous page's `next_offset`).
    pub offset: usize,
    /// At most this many hits from any one conversation.
    pub per_conversation: Option<usize>,
    pub recency: Option<Recency>,
}

impl SearchRequest {
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            mode: Mode::Hybrid,
            filters: Filters::default(),
            limit: 10,
            offset: 0,
            per_conversation: None,
            recency: None,
        }
    }

    /// Checks the request; says what is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.text.trim().is_empty() {
            return Err(Error::invalid("the query is empty"));
        }
        if self.text.len() > MAX_QUERY_BYTES {
            return Err(Error::invalid(format!(
                "the query is {} bytes; at most {MAX_QUERY_BYTES}",
                self.text.len()
            )));
        }
        if !(1..=100).contains(&self.limit) {
            return Err(Error::invalid(format!(
                "limit must be 1..=100, not {}",
                self.limit
            )));
        }
        if self.per_conversation == Some(0) {
            return Err(Error::invalid("per_conversation must be at least 1"));
        }
        if let (Some(s), Some(u)) = (self.filters.since_ms, self.filters.until_ms) {
            if s >= u {
                return Err(Error::invalid("the time range is empty (since ≥ until)"));
            }
        }
        if let Some(r) = self.recency {
            if r.half_life_ms <= 0 || !r.weight.is_finite() || r.weight < 0.0 {
                return Err(Error::invalid(
                    "recency needs a positive half-life and a non-negative weight",
                ));
            }
        }
        Ok(())
    }
}

/// The longest query accepted.
pub const MAX_QUERY_BYTES: usize = 4096;

/// A row a retriever found, with its score under that retriever.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub info: RowInfo,
    pub score: f64,
}

/// A retriever's view of a hit: its 1-based rank and raw score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetrieverScore {
    pub rank: usize,
    pub score: f64,
}

/// A ranked hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    #[serde(flatten)]
    pub info: RowInfo,
    /// The fused score (distribution-based fusion, `fusion`; plus the recency boost if asked).
    pub score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lexical: Option<RetrieverScore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<RetrieverScore>,
    /// A short excerpt of the content, read through the resolver as the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snippet: Option<String>,
}

/// One page of hits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page {
    pub hits: Vec<Hit>,
    /// The offset of the next page, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_info_keeps_the_stored_shape_and_refuses_what_is_not_an_id() {
        // The embedded vector store keeps this JSON beside every vector: its shape predates the
        // typed ids (the turn is a bare number), and entries written then must still read.
        let stored = r#"{"id":"r1","app":"shop","agent":"clerk","conversation":"conv_01ARZ3NDEKTSV4RRFFQ69G5FAV","turn":3,"kind":"prompt","reference":"x","at_ms":7}"#;
        let info: RowInfo = serde_json::from_str(stored).unwrap();
        assert_eq!(info.turn.number(), 3);
        assert_eq!(info.id.as_str(), "r1");
        assert_eq!(serde_json::to_string(&info).unwrap(), stored);
        for bad in [
            stored.replace("\"turn\":3", "\"turn\":0"),
            stored.replace("conv_01ARZ3NDEKTSV4RRFFQ69G5FAV", "c1"),
            stored.replace("\"shop\"", "\"Shop Floor\""),
        ] {
            assert!(serde_json::from_str::<RowInfo>(&bad).is_err(), "{bad}");
        }
    }
}
