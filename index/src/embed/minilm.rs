//! The local sentence-embedding model: a BERT-style model directory in the
//! sentence-transformers layout (`config.json`, `tokenizer.json`, `model.safetensors`), mean
//! pooling over tokens, then unit length. all-MiniLM-L6-v2 gives 384 dimensions.
//!
//! Two engines compute it. The fast one ([`super::fast`]) runs where the CPU has AVX-512 with
//! bf16; candle's BERT runs everywhere (and is the reference). [`Engine::from_env`] reads
//! `TURNPIKE_EMBED_ENGINE` (`auto`, the default; `portable`; `fast`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::{fast, normalized, Embedder};
use crate::error::{Error, ErrorKind, Result};

/// Which code computes the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The fast engine where the CPU runs it, else the portable one.
    Auto,
    /// candle's BERT in f32: any CPU, the reference.
    Portable,
    /// AVX-512 with bf16 products (refused on a CPU without them).
    Fast,
}

impl Engine {
    /// `TURNPIKE_EMBED_ENGINE`: `auto` (or unset), `portable` or `fast`.
    pub fn from_env() -> Result<Self> {
        match std::env::var("TURNPIKE_EMBED_ENGINE").as_deref() {
            Err(_) | Ok("" | "auto") => Ok(Engine::Auto),
            Ok("portable") => Ok(Engine::Portable),
            Ok("fast") => Ok(Engine::Fast),
            Ok(other) => Err(Error::new(
                ErrorKind::Embedder,
                format!("TURNPIKE_EMBED_ENGINE={other}: expected auto, portable or fast"),
            )),
        }
    }
}

/// Sentence embeddings from a local model directory (see the module docs).
pub struct MiniLm {
    inner: Arc<MiniLmInner>,
    model: String,
}

enum Runner {
    Portable(Box<BertModel>),
    Fast(Box<fast::Encoder>),
}

struct MiniLmInner {
    runner: Runner,
    tokenizer: Tokenizer,
    dimension: usize,
    /// Threads one batch is shared among (the fast engine).
    threads: usize,
}

/// Texts per forward pass on the portable engine (a batch is padded to its longest text); the
/// fast engine, which pads nothing, takes this many per thread.
const BATCH: usize = 32;
/// Tokens per text: what the model was trained with (longer texts are cut).
const MAX_TOKENS: usize = 256;

fn embedder_error(what: impl Into<String>) -> impl Fn(candle_core::Error) -> Error {
    let what = what.into();
    move |e| Error::new(ErrorKind::Embedder, format!("{what}: {e}"))
}

/// The parts of `config.json` the fast engine needs beyond candle's `Config`.
#[derive(Deserialize)]
struct ConfigShape {
    hidden_size: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    max_position_embeddings: usize,
    layer_norm_eps: f64,
    #[serde(default = "gelu")]
    hidden_act: String,
}

fn gelu() -> String {
    "gelu".into()
}

impl MiniLm {
    /// Loads the model from `dir` on the engine `TURNPIKE_EMBED_ENGINE` names; says which file
    /// is missing or unreadable.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_on(dir, Engine::from_env()?)
    }

    /// Loads the model from `dir` on `engine`.
    pub fn load_on(dir: &Path, engine: Engine) -> Result<Self> {
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
        let bytes = std::fs::read(&config_path).map_err(|e| {
            Error::new(
                ErrorKind::Embedder,
                format!("{}: {e}", config_path.display()),
            )
        })?;
        let not_bert = |e: serde_json::Error| {
            Error::new(
                ErrorKind::Embedder,
                format!("{} is not a BERT config: {e}", config_path.display()),
            )
        };
        let config: Config = serde_json::from_slice(&bytes).map_err(not_bert)?;
        let shape: ConfigShape = serde_json::from_slice(&bytes).map_err(not_bert)?;
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
        let fast_shape = fast::Shape {
            hidden: shape.hidden_size,
            heads: shape.num_attention_heads,
            intermediate: shape.intermediate_size,
            layers: shape.num_hidden_layers,
            max_positions: shape.max_position_embeddings,
            eps: shape.layer_norm_eps as f32,
        };
        let fast = |why_not: &mut Option<String>| -> Option<Runner> {
            if shape.hidden_act != "gelu" {
                *why_not = Some(format!("activation {} (it runs gelu)", shape.hidden_act));
                return None;
            }
            fast::Encoder::load(&vb, fast_shape)
                .map(|e| Runner::Fast(Box::new(e)))
                .map_err(|e| *why_not = Some(e))
                .ok()
        };
        let mut why_not = None;
        let runner = match engine {
            Engine::Portable => None,
            Engine::Fast => Some(fast(&mut why_not).ok_or_else(|| {
                Error::new(
                    ErrorKind::Embedder,
                    format!(
                        "the fast embedding engine cannot run this: {}",
                        why_not.take().unwrap_or_default()
                    ),
                )
            })?),
            Engine::Auto => fast(&mut why_not),
        };
        if let Some(why) = why_not {
            tracing::info!(%why, "the embedder runs on the portable engine");
        }
        let runner = match runner {
            Some(r) => r,
            None => Runner::Portable(Box::new(
                BertModel::load(vb, &config).map_err(embedder_error("loading the model"))?,
            )),
        };
        let model = dir
            .file_name()
            .map_or_else(|| "local".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            inner: Arc::new(MiniLmInner {
                runner,
                tokenizer,
                dimension: shape.hidden_size,
                threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            }),
            model,
        })
    }

    /// Which engine computes the vectors.
    pub fn engine(&self) -> Engine {
        match self.inner.runner {
            Runner::Portable(_) => Engine::Portable,
            Runner::Fast(_) => Engine::Fast,
        }
    }
}

impl MiniLmInner {
    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::new(ErrorKind::Embedder, format!("tokenizing: {e}")))?;
        match &self.runner {
            Runner::Portable(bert) => Self::portable(bert, &encodings),
            Runner::Fast(encoder) => {
                // Each text without its padding (the batch is padded at the end).
                let sequences: Vec<&[u32]> = encodings
                    .iter()
                    .map(|e| {
                        let real = e.get_attention_mask().iter().filter(|m| **m != 0).count();
                        &e.get_ids()[..real]
                    })
                    .collect();
                encoder
                    .embed(&sequences, self.threads)
                    .map_err(|e| Error::new(ErrorKind::Embedder, format!("running the model: {e}")))
            }
        }
    }

    fn portable(bert: &BertModel, encodings: &[tokenizers::Encoding]) -> Result<Vec<Vec<f32>>> {
        let n = encodings.len();
        let len = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for e in encodings {
            ids.extend_from_slice(e.get_ids());
            mask.extend_from_slice(e.get_attention_mask());
        }
        let err = embedder_error("running the model");
        let device = &bert.device;
        let ids = Tensor::from_vec(ids, (n, len), device).map_err(&err)?;
        let mask = Tensor::from_vec(mask, (n, len), device).map_err(&err)?;
        let types = ids.zeros_like().map_err(&err)?;
        let out = bert.forward(&ids, &types, Some(&mask)).map_err(&err)?;
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
        let batch = match self.inner.runner {
            Runner::Portable(_) => BATCH,
            Runner::Fast(_) => BATCH * self.inner.threads,
        };
        for chunk in order.chunks(batch) {
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
