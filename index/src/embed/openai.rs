//! Any OpenAI-compatible `/v1/embeddings` endpoint.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{normalized, Embedder};
use crate::error::{Error, ErrorKind, Result};

/// Any OpenAI-compatible embeddings endpoint (`POST {base_url}/embeddings`).
pub struct OpenAiEmbedder {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    dimension: usize,
}

impl OpenAiEmbedder {
    /// `base_url` up to and including `/v1`; `dimension` is what the model returns (checked on
    /// every response).
    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
        dimension: usize,
    ) -> Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::new(ErrorKind::Embedder, format!("http client: {e}")))?;
        Ok(Self {
            client,
            url: format!("{}/embeddings", base_url.trim_end_matches('/')),
            model: model.to_owned(),
            api_key,
            dimension,
        })
    }
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn dimension(&self) -> usize {
        self.dimension
    }

    fn model(&self) -> &str {
        &self.model
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(128) {
            let mut request = self.client.post(&self.url).json(&serde_json::json!({
                "model": self.model,
                "input": chunk,
            }));
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let fail = |m: String| Error::new(ErrorKind::Embedder, format!("{}: {m}", self.url));
            let response = request.send().await.map_err(|e| fail(e.to_string()))?;
            let status = response.status();
            if !status.is_success() {
                let body = response.text().await.unwrap_or_default();
                let body: String = body.chars().take(300).collect();
                return Err(fail(format!("{status}: {body}")));
            }
            let mut parsed: EmbeddingsResponse = response
                .json()
                .await
                .map_err(|e| fail(format!("not an embeddings response: {e}")))?;
            parsed.data.sort_by_key(|d| d.index);
            if parsed.data.len() != chunk.len()
                || parsed.data.iter().enumerate().any(|(i, d)| d.index != i)
            {
                return Err(fail(format!(
                    "asked for {} embeddings, got {}",
                    chunk.len(),
                    parsed.data.len()
                )));
            }
            for d in parsed.data {
                if d.embedding.len() != self.dimension {
                    return Err(fail(format!(
                        "an embedding has {} dimensions; configured for {}",
                        d.embedding.len(),
                        self.dimension
                    )));
                }
                out.push(normalized(d.embedding));
            }
        }
        Ok(out)
    }
}
