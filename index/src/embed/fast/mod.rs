//! The BERT encoder for sentence embeddings on AVX-512 with bf16 matrix products: the same
//! model as candle's BERT (the portable engine), computed without padding, with the matrix
//! products in bf16 (f32 sums) and everything else in f32, spread over the CPU's cores.
//!
//! Why: candle's CPU BERT runs its element-wise steps on one core and its matrix products in
//! f32; a batch is padded to its longest text. Here each text is only as long as it is, the
//! products run at twice f32's rate, and the texts of a batch are shared among threads.
//!
//! Contract: [`Encoder::embed`] gives, per token sequence, the mean of the last layer's token
//! vectors scaled to unit length — what [`super::MiniLm`] gives on the portable engine, to
//! within the rounding of the products' inputs to bf16 (tested: cosine ≥ 0.9999). It runs
//! only where [`supported`] says so; [`Encoder::load`] refuses otherwise.
//!
//! # Layout (x86-64 only; elsewhere [`Encoder::load`] refuses and the portable engine runs)
//! - `encoder`: the weights and the forward pass
//! - `gemm`: packing weights, bf16 matrix products
//! - `math`: exp, erf, GELU, softmax, layer norm

#[cfg(target_arch = "x86_64")]
mod encoder;
#[cfg(target_arch = "x86_64")]
mod gemm;
#[cfg(target_arch = "x86_64")]
mod math;

#[cfg(target_arch = "x86_64")]
pub use encoder::Encoder;

/// Whether this CPU runs the fast encoder (AVX-512 F/BW/VL with BF16, AVX2, FMA).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The shape the encoder needs from `config.json`.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub max_positions: usize,
    pub eps: f32,
}

/// Elsewhere than on x86-64 there is no fast encoder: loading one says so.
#[cfg(not(target_arch = "x86_64"))]
pub enum Encoder {}

#[cfg(not(target_arch = "x86_64"))]
impl Encoder {
    /// Refuses: the fast engine's kernels are x86-64's.
    pub fn load(_: &candle_nn::VarBuilder, _: Shape) -> Result<Self, String> {
        Err("the fast engine needs an x86-64 CPU with AVX-512 and bf16".into())
    }

    /// Never called: there is no value of this type.
    pub fn embed(&self, _: &[&[u32]], _: usize) -> Result<Vec<Vec<f32>>, String> {
        match *self {}
    }
}
