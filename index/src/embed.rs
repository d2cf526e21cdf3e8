//! Embedders: text → vectors. A local all-MiniLM-L6-v2 run in Rust (candle), and any
//! OpenAI-compatible `/v1/embeddings` endpoint.
//!
//! Contract: `embed` returns one unit-length vector of `dimension()` floats per input, in
//! order. Inference runs off the async threads, in batches.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::error::{Error, ErrorKind, Result};

/// Turns texts into vectors.
#[async_trait]
pub trait Embedder: Send + Sync + 'static {
    /// How many floats each vector has.
    fn dimension(&self) -> usize;
    /// Which model (for logs and benchmark reports).
    fn model(&self) -> &str;
    /// One unit-length vector per text, in order.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>>;
}

/// `v` scaled to unit length (a zero vector stays zero).
pub fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

fn embedder_error(what: impl Into<String>) -> impl Fn(candle_core::Error) -> Error {
    let what = what.into();
    move |e| Error::new(ErrorKind::Embedder, format!("{what}: {e}"))
}

/// Sentence embeddings from a BERT-style model directory in the sentence-transformers layout
/// (`config.json`, `tokenizer.json`, `model.safetensors`): mean pooling over tokens, then unit
/// length. all-MiniLM-L6-v2 gives 384 dimensions.
pub struct MiniLm {
    inner: Arc<MiniLmInner>,
    model: String,
}

struct MiniLmInner {
    bert: BertModel,
    tokenizer: Tokenizer,
    dimension: usize,
}

/// Texts per forward pass.
const BATCH: usize = 32;
/// Tokens per text: what the model was trained with (longer texts are cut).
const MAX_TOKENS: usize = 256;

impl MiniLm {
    /// Loads the model from `dir`; says which file is missing or unreadable.
    pub fn load(dir: &Path) -> Result<Self> {
        let file = |name: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(Error::new(
                    ErrorKind::Embedder,
                    format!(
                        "the embedding model directory {} has no {name} (scripts/services install all fetches it)",
                        dir.display()
                    ),
                ))
            }
        };
        let config_path = file("config.json")?;
        let config: Config = std::fs::read(&config_path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            .map_err(|e| {
                Error::new(
                    ErrorKind::Embedder,
                    format!("{} is not a BERT config: {e}", config_path.display()),
                )
            })?;
        let dimension = config_hidden_size(&config_path)?;
        let mut tokenizer = Tokenizer::from_file(file("tokenizer.json")?)
            .map_err(|e| Error::new(ErrorKind::Embedder, format!("reading tokenizer.json: {e}")))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| Error::new(ErrorKind::Embedder, format!("tokenizer: {e}")))?;
        let weights = file("model.safetensors")?;
        // SAFETY: the weights file is mapped read-only and not modified while the model lives
        // (it is the model directory's own file).
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(&[weights], DType::F32, &Device::Cpu)
                .map_err(embedder_error("reading model.safetensors"))?
        };
        let bert = BertModel::load(vb, &config).map_err(embedder_error("loading the model"))?;
        let model = dir
            .file_name()
            .map_or_else(|| "local".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            inner: Arc::new(MiniLmInner {
                bert,
                tokenizer,
                dimension,
            }),
            model,
        })
    }
}

fn config_hidden_size(path: &Path) -> Result<usize> {
    #[derive(Deserialize)]
    struct Hidden {
        hidden_size: usize,
    }
    let bytes = std::fs::read(path)
        .map_err(|e| Error::new(ErrorKind::Embedder, format!("{}: {e}", path.display())))?;
    serde_json::from_slice::<Hidden>(&bytes)
        .map(|h| h.hidden_size)
        .map_err(|e| Error::new(ErrorKind::Embedder, format!("{}: {e}", path.display())))
}

impl MiniLmInner {
    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::new(ErrorKind::Embedder, format!("tokenizing: {e}")))?;
        let n = encodings.len();
        let len = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for e in &encodings {
            ids.extend_from_slice(e.get_ids());
            mask.extend_from_slice(e.get_attention_mask());
        }
        let err = embedder_error("running the model");
        let device = &self.bert.device;
        let ids = Tensor::from_vec(ids, (n, len), device).map_err(&err)?;
        let mask = Tensor::from_vec(mask, (n, len), device).map_err(&err)?;
        let types = ids.zeros_like().map_err(&err)?;
        let out = self.bert.forward(&ids, &types, Some(&mask)).map_err(&err)?;
        // Mean over the real tokens (padding masked out).
        let mask = mask
            .to_dtype(DType::F32)
            .and_then(|m| m.unsqueeze(2))
            .map_err(&err)?;
        let summed = out
            .broadcast_mul(&mask)
            .and_then(|t| t.sum(1))
            .map_err(&err)?;
        let counts = mask.sum(1).map_err(&err)?;
        let pooled = summed.broadcast_div(&counts).map_err(&err)?;
        let rows: Vec<Vec<f32>> = pooled.to_vec2().map_err(&err)?;
        Ok(rows.into_iter().map(normalized).collect())
    }
}

#[async_trait]
impl Embedder for MiniLm {
    fn dimension(&self) -> usize {
        self.inner.dimension
    }

    fn model(&self) -> &str {
        &self.model
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        // Batches of texts of about one length: a batch is padded to its longest text, and
        // attention costs the square of that. The vectors go back in the callers' order.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH) {
            let inner = self.inner.clone();
            let batch: Vec<String> = chunk.iter().map(|&i| texts[i].clone()).collect();
            let vectors = tokio::task::spawn_blocking(move || inner.embed_batch(&batch))
                .await
                .map_err(|e| Error::new(ErrorKind::Embedder, format!("embedding task: {e}")))??;
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

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
