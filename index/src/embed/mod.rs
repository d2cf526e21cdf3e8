//! Embedders: text → vectors. A local all-MiniLM-L6-v2 run in Rust, and any OpenAI-compatible
//! `/v1/embeddings` endpoint.
//!
//! Contract: `embed` returns one unit-length vector of `dimension()` floats per input, in
//! order. Inference runs off the async threads, in batches.
//!
//! # Layout
//! - [`minilm`]: the local model — tokenizer, batching, and the choice of engine
//! - [`fast`]: the encoder on AVX-512 with bf16 matrix products, where the CPU has them
//! - candle's BERT is the portable engine (and the reference the fast one is tested against)
//! - [`openai`]: OpenAI-compatible endpoints

use async_trait::async_trait;

use crate::error::Result;

pub mod fast;
pub mod minilm;
pub mod openai;

pub use minilm::{Engine, MiniLm};
pub use openai::OpenAiEmbedder;

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
