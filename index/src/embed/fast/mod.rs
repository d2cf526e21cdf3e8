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
//! within the rounding of the products' inputs to bf16 (cosine ≥ 0.999 is tested). It runs
//! only where [`supported`] says so; [`Encoder::load`] refuses otherwise.
//!
//! # Layout
//! - [`gemm`]: packing weights, bf16 matrix products
//! - [`math`]: exp, erf, GELU, softmax, layer norm

mod gemm;
mod math;

use candle_core::Tensor;
use candle_nn::VarBuilder;

use gemm::{matmul, to_bf16, Linear};

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

/// Tokens per forward pass of one thread: bounds its buffers (the widest, the feed-forward's
/// 1536 columns, is 12 MiB at this size).
const TOKENS_PER_PASS: usize = 2048;

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

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

struct Layer {
    /// Query, key and value in one product (3 × hidden outputs).
    qkv: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    up: Linear,
    down: Linear,
    output_norm: Norm,
}

/// The encoder's weights, packed for the fast kernels.
pub struct Encoder {
    shape: Shape,
    words: Vec<f32>,
    positions: Vec<f32>,
    /// Token type 0's embedding (sentence embeddings use one segment).
    segment: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
}

type LoadResult<T> = std::result::Result<T, String>;

fn tensor(vb: &VarBuilder, shape: &[usize], name: &str) -> LoadResult<Vec<f32>> {
    vb.get(shape, name)
        .and_then(|t: Tensor| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| format!("{}.{name}: {e}", vb.prefix()))
}

fn linear(vb: &VarBuilder, outputs: usize, inputs: usize) -> LoadResult<(Vec<f32>, Vec<f32>)> {
    Ok((
        tensor(vb, &[outputs, inputs], "weight")?,
        tensor(vb, &[outputs], "bias")?,
    ))
}

fn norm(vb: &VarBuilder, width: usize) -> LoadResult<Norm> {
    Ok(Norm {
        gamma: tensor(vb, &[width], "weight")?,
        beta: tensor(vb, &[width], "bias")?,
    })
}

impl Encoder {
    /// Reads and packs the weights of a BERT model (sentence-transformers names, no prefix).
    /// Refuses a CPU without the features, or a shape the kernels do not take.
    pub fn load(vb: &VarBuilder, shape: Shape) -> LoadResult<Self> {
        if !supported() {
            return Err("this CPU has no AVX-512 with bf16".into());
        }
        let h = shape.hidden;
        if shape.heads == 0 || !h.is_multiple_of(shape.heads) {
            return Err(format!(
                "{h} dimensions do not split into {} heads",
                shape.heads
            ));
        }
        let emb = vb.pp("embeddings");
        let words = emb.pp("word_embeddings");
        let vocabulary = words
            .get_unchecked("weight")
            .map_err(|e| format!("embeddings.word_embeddings.weight: {e}"))?
            .dims()
            .first()
            .copied()
            .unwrap_or(0);
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let att = l.pp("attention");
            let (q, qb) = linear(&att.pp("self.query"), h, h)?;
            let (k, kb) = linear(&att.pp("self.key"), h, h)?;
            let (v, vbias) = linear(&att.pp("self.value"), h, h)?;
            let qkv = Linear::new(&[q, k, v].concat(), &[qb, kb, vbias].concat(), 3 * h, h)?;
            let (o, ob) = linear(&att.pp("output.dense"), h, h)?;
            let (u, ub) = linear(&l.pp("intermediate.dense"), shape.intermediate, h)?;
            let (d, db) = linear(&l.pp("output.dense"), h, shape.intermediate)?;
            layers.push(Layer {
                qkv,
                attention_out: Linear::new(&o, &ob, h, h)?,
                attention_norm: norm(&att.pp("output.LayerNorm"), h)?,
                up: Linear::new(&u, &ub, shape.intermediate, h)?,
                down: Linear::new(&d, &db, h, shape.intermediate)?,
                output_norm: norm(&l.pp("output.LayerNorm"), h)?,
            });
        }
        let segments = tensor(&emb.pp("token_type_embeddings"), &[2, h], "weight")
            .or_else(|_| tensor(&emb.pp("token_type_embeddings"), &[1, h], "weight"))?;
        Ok(Self {
            shape,
            words: tensor(&words, &[vocabulary, h], "weight")?,
            positions: tensor(
                &emb.pp("position_embeddings"),
                &[shape.max_positions, h],
                "weight",
            )?,
            segment: segments[..h].to_vec(),
            embedding_norm: norm(&emb.pp("LayerNorm"), h)?,
            layers,
        })
    }

    /// One unit-length vector per token sequence, in order, the sequences shared among
    /// `threads` threads. A token outside the vocabulary, or a sequence longer than the
    /// model's positions or empty, is refused.
    pub fn embed(&self, sequences: &[&[u32]], threads: usize) -> LoadResult<Vec<Vec<f32>>> {
        let vocabulary = self.words.len() / self.shape.hidden;
        for s in sequences {
            if s.is_empty() || s.len() > self.shape.max_positions {
                return Err(format!(
                    "a sequence of {} tokens (the model takes 1 to {})",
                    s.len(),
                    self.shape.max_positions
                ));
            }
            if let Some(t) = s.iter().find(|t| **t as usize >= vocabulary) {
                return Err(format!(
                    "token {t} is outside the vocabulary of {vocabulary}"
                ));
            }
        }
        // Longest first, dealt round-robin: each thread gets about as many tokens.
        let mut order: Vec<usize> = (0..sequences.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(sequences[i].len()));
        let threads = threads.clamp(1, sequences.len().max(1));
        let shares: Vec<Vec<usize>> = (0..threads)
            .map(|t| order.iter().copied().skip(t).step_by(threads).collect())
            .collect();
        let mut out = vec![Vec::new(); sequences.len()];
        let done: Vec<Vec<(usize, Vec<f32>)>> = std::thread::scope(|scope| {
            let running: Vec<_> = shares
                .iter()
                .map(|share| {
                    scope.spawn(move || {
                        // SAFETY: the CPU has the features: `load` checked them.
                        unsafe { self.embed_share(sequences, share) }
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_default())
                .collect()
        });
        for (i, v) in done.into_iter().flatten() {
            out[i] = v;
        }
        if out.iter().any(Vec::is_empty) {
            return Err("an encoder thread failed".into());
        }
        Ok(out)
    }

    /// The vectors of `share` (indices into `sequences`), in passes of about
    /// [`TOKENS_PER_PASS`] tokens.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    fn embed_share(&self, sequences: &[&[u32]], share: &[usize]) -> Vec<(usize, Vec<f32>)> {
        let mut out = Vec::with_capacity(share.len());
        let mut buffers = Buffers::default();
        let mut start = 0;
        while start < share.len() {
            let mut end = start;
            let mut tokens = 0;
            while end < share.len()
                && (end == start || tokens + sequences[share[end]].len() <= TOKENS_PER_PASS)
            {
                tokens += sequences[share[end]].len();
                end += 1;
            }
            let pass: Vec<&[u32]> = share[start..end].iter().map(|&i| sequences[i]).collect();
            let vectors = self.forward(&pass, &mut buffers);
            out.extend(share[start..end].iter().copied().zip(vectors));
            start = end;
        }
        out
    }

    /// The pooled, unit-length vectors of `sequences`, run through every layer together.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    fn forward(&self, sequences: &[&[u32]], b: &mut Buffers) -> Vec<Vec<f32>> {
        let h = self.shape.hidden;
        let m: usize = sequences.iter().map(|s| s.len()).sum();
        b.resize(m, h, self.shape.intermediate);
        // Embeddings: word + position + segment, normalised.
        let mut row = 0;
        for s in sequences {
            for (position, &token) in s.iter().enumerate() {
                let x = &mut b.hidden[row * h..][..h];
                let word = &self.words[token as usize * h..][..h];
                let pos = &self.positions[position * h..][..h];
                for (((x, w), p), g) in x.iter_mut().zip(word).zip(pos).zip(&self.segment) {
                    *x = w + p + g;
                }
                let n = &self.embedding_norm;
                math::layer_norm(x, &n.gamma, &n.beta, self.shape.eps);
                row += 1;
            }
        }
        for layer in &self.layers {
            self.layer(layer, sequences, m, b);
        }
        // Mean over each sequence's tokens, then unit length.
        let mut row = 0;
        sequences
            .iter()
            .map(|s| {
                let mut mean = vec![0f32; h];
                for x in b.hidden[row * h..(row + s.len()) * h].chunks_exact(h) {
                    for (a, x) in mean.iter_mut().zip(x) {
                        *a += x;
                    }
                }
                row += s.len();
                let n = s.len() as f32;
                mean.iter_mut().for_each(|a| *a /= n);
                super::normalized(mean)
            })
            .collect()
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    fn layer(&self, layer: &Layer, sequences: &[&[u32]], m: usize, b: &mut Buffers) {
        let h = self.shape.hidden;
        let inter = self.shape.intermediate;
        // Attention.
        to_bf16(&b.hidden[..m * h], &mut b.packed);
        matmul(&b.packed, m, &layer.qkv, &mut b.qkv);
        let mut row = 0;
        for s in sequences {
            self.attention(&b.qkv, row, s.len(), &mut b.context, &mut b.scratch);
            row += s.len();
        }
        to_bf16(&b.context[..m * h], &mut b.packed);
        matmul(&b.packed, m, &layer.attention_out, &mut b.projected);
        let n = &layer.attention_norm;
        for (x, add) in b.hidden[..m * h]
            .chunks_exact_mut(h)
            .zip(b.projected.chunks_exact(h))
        {
            math::add_layer_norm(x, add, &n.gamma, &n.beta, self.shape.eps);
        }
        // Feed-forward.
        to_bf16(&b.hidden[..m * h], &mut b.packed);
        matmul(&b.packed, m, &layer.up, &mut b.wide);
        math::gelu(&mut b.wide[..m * inter]);
        to_bf16(&b.wide[..m * inter], &mut b.packed);
        matmul(&b.packed, m, &layer.down, &mut b.projected);
        let n = &layer.output_norm;
        for (x, add) in b.hidden[..m * h]
            .chunks_exact_mut(h)
            .zip(b.projected.chunks_exact(h))
        {
            math::add_layer_norm(x, add, &n.gamma, &n.beta, self.shape.eps);
        }
    }

    /// Self-attention of one sequence (rows `first..first + len` of `qkv`, whose rows hold
    /// query, key and value side by side) into the same rows of `context`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    fn attention(
        &self,
        qkv: &[f32],
        first: usize,
        len: usize,
        context: &mut [f32],
        scratch: &mut Scratch,
    ) {
        let h = self.shape.hidden;
        let d = h / self.shape.heads;
        let scale = 1.0 / (d as f32).sqrt();
        let rows = &qkv[first * 3 * h..(first + len) * 3 * h];
        scratch.keys.resize(d * len, 0.0);
        scratch.scores.resize(len, 0.0);
        for head in 0..self.shape.heads {
            // The head's keys, transposed: keys[c·len + j] = key j's component c.
            for (j, r) in rows.chunks_exact(3 * h).enumerate() {
                for (c, k) in r[h + head * d..][..d].iter().enumerate() {
                    scratch.keys[c * len + j] = *k;
                }
            }
            for (i, r) in rows.chunks_exact(3 * h).enumerate() {
                let q = &r[head * d..][..d];
                let scores = &mut scratch.scores[..len];
                scores.fill(0.0);
                for (c, qc) in q.iter().enumerate() {
                    let qc = qc * scale;
                    for (s, k) in scores.iter_mut().zip(&scratch.keys[c * len..][..len]) {
                        *s += qc * k;
                    }
                }
                math::softmax(scores);
                let out = &mut context[(first + i) * h + head * d..][..d];
                out.fill(0.0);
                for (p, v) in scores.iter().zip(rows.chunks_exact(3 * h)) {
                    for (o, v) in out.iter_mut().zip(&v[2 * h + head * d..][..d]) {
                        *o += p * v;
                    }
                }
            }
        }
    }
}

/// A thread's working memory, reused across passes.
#[derive(Default)]
struct Buffers {
    hidden: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    projected: Vec<f32>,
    wide: Vec<f32>,
    packed: Vec<u16>,
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    keys: Vec<f32>,
    scores: Vec<f32>,
}

impl Buffers {
    fn resize(&mut self, m: usize, h: usize, inter: usize) {
        self.hidden.resize(m * h, 0.0);
        self.qkv.resize(m * 3 * h, 0.0);
        self.context.resize(m * h, 0.0);
        self.projected.resize(m * h, 0.0);
        self.wide.resize(m * inter, 0.0);
        self.packed.resize(m * inter.max(h), 0);
    }
}
