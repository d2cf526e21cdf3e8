//! The encoder: its weights, packed for the kernels, and the forward pass (see the parent
//! module's docs).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use super::gemm::{matmul, to_bf16, Linear};
use super::{math, supported, Shape};

/// Tokens per forward pass of one thread: bounds its buffers (the widest, the feed-forward's
/// 1536 columns, is 12 MiB at this size).
const TOKENS_PER_PASS: usize = 2048;

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl Norm {
    /// Each row of `rows` (rows as wide as the norm) ← LayerNorm(row + the same row of
    /// `added`): a residual connection and its norm.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    fn add_to_rows(&self, rows: &mut [f32], added: &[f32], eps: f32) {
        let width = self.gamma.len();
        for (x, add) in rows.chunks_exact_mut(width).zip(added.chunks_exact(width)) {
            math::add_layer_norm(x, add, &self.gamma, &self.beta, eps);
        }
    }
}

/// `out` ← `x` (m rows, f32) · Wᵀ + b of `layer`, its inputs rounded to bf16 in `packed`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
fn project(x: &[f32], m: usize, layer: &Linear, packed: &mut [u16], out: &mut [f32]) {
    to_bf16(x, packed);
    matmul(packed, m, layer, out);
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
    /// Reads and packs the weights of a BERT model (sentence-transformers names, bare or under
    /// `bert.` as candle also reads them). Refuses a CPU without the features, or a shape the
    /// kernels do not take.
    pub fn load(vb: &VarBuilder, shape: Shape) -> LoadResult<Self> {
        let vb = &if vb.contains_tensor("embeddings.word_embeddings.weight") {
            vb.clone()
        } else {
            vb.pp("bert")
        };
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
        let rows_of = |vb: &VarBuilder| -> LoadResult<usize> {
            vb.get_unchecked("weight")
                .map(|t| t.dims().first().copied().unwrap_or(0))
                .map_err(|e| format!("{}.weight: {e}", vb.prefix()))
        };
        let words = emb.pp("word_embeddings");
        let vocabulary = rows_of(&words)?;
        let segments = emb.pp("token_type_embeddings");
        let segment_types = rows_of(&segments)?.max(1);
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
        let segments = tensor(&segments, &[segment_types, h], "weight")?;
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
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
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
                .map(|t| {
                    t.join().map_err(|panic| {
                        let why = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        format!("an encoder thread failed: {why}")
                    })
                })
                .collect::<LoadResult<_>>()
        })?;
        for (i, v) in done.into_iter().flatten() {
            out[i] = v;
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
                crate::embed::normalized(mean)
            })
            .collect()
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    fn layer(&self, layer: &Layer, sequences: &[&[u32]], m: usize, b: &mut Buffers) {
        let h = self.shape.hidden;
        let inter = self.shape.intermediate;
        // Attention.
        project(&b.hidden[..m * h], m, &layer.qkv, &mut b.packed, &mut b.qkv);
        let mut row = 0;
        for s in sequences {
            self.attention(&b.qkv, row, s.len(), &mut b.context, &mut b.scratch);
            row += s.len();
        }
        project(
            &b.context[..m * h],
            m,
            &layer.attention_out,
            &mut b.packed,
            &mut b.projected,
        );
        layer
            .attention_norm
            .add_to_rows(&mut b.hidden[..m * h], &b.projected, self.shape.eps);
        // Feed-forward.
        project(&b.hidden[..m * h], m, &layer.up, &mut b.packed, &mut b.wide);
        math::gelu(&mut b.wide[..m * inter]);
        project(
            &b.wide[..m * inter],
            m,
            &layer.down,
            &mut b.packed,
            &mut b.projected,
        );
        layer
            .output_norm
            .add_to_rows(&mut b.hidden[..m * h], &b.projected, self.shape.eps);
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::{DType, Device, Tensor};
    use candle_transformers::models::bert::{BertModel, Config};

    use super::*;

    const H: usize = 64;
    const INTER: usize = 128;
    const HEADS: usize = 4;
    const LAYERS: usize = 2;
    const VOCAB: usize = 50;
    const POSITIONS: usize = 40;

    /// A small BERT with made-up weights (deterministic), under `prefix`.
    fn weights(prefix: &str) -> HashMap<String, Tensor> {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut out = HashMap::new();
        let mut put = |name: String, shape: &[usize], around: f32, spread: f32| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    around + spread * (((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
                })
                .collect();
            let t = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
            out.insert(format!("{prefix}{name}"), t);
        };
        put(
            "embeddings.word_embeddings.weight".into(),
            &[VOCAB, H],
            0.0,
            1.0,
        );
        put(
            "embeddings.position_embeddings.weight".into(),
            &[POSITIONS, H],
            0.0,
            0.5,
        );
        put(
            "embeddings.token_type_embeddings.weight".into(),
            &[2, H],
            0.0,
            0.5,
        );
        put("embeddings.LayerNorm.weight".into(), &[H], 1.0, 0.2);
        put("embeddings.LayerNorm.bias".into(), &[H], 0.0, 0.1);
        for l in 0..LAYERS {
            let p = format!("encoder.layer.{l}.");
            for part in ["query", "key", "value"] {
                put(
                    format!("{p}attention.self.{part}.weight"),
                    &[H, H],
                    0.0,
                    0.3,
                );
                put(format!("{p}attention.self.{part}.bias"), &[H], 0.0, 0.1);
            }
            put(
                format!("{p}attention.output.dense.weight"),
                &[H, H],
                0.0,
                0.2,
            );
            put(format!("{p}attention.output.dense.bias"), &[H], 0.0, 0.1);
            put(
                format!("{p}attention.output.LayerNorm.weight"),
                &[H],
                1.0,
                0.2,
            );
            put(
                format!("{p}attention.output.LayerNorm.bias"),
                &[H],
                0.0,
                0.1,
            );
            put(
                format!("{p}intermediate.dense.weight"),
                &[INTER, H],
                0.0,
                0.2,
            );
            put(format!("{p}intermediate.dense.bias"), &[INTER], 0.0, 0.1);
            put(format!("{p}output.dense.weight"), &[H, INTER], 0.0, 0.2);
            put(format!("{p}output.dense.bias"), &[H], 0.0, 0.1);
            put(format!("{p}output.LayerNorm.weight"), &[H], 1.0, 0.2);
            put(format!("{p}output.LayerNorm.bias"), &[H], 0.0, 0.1);
        }
        out
    }

    fn shape() -> Shape {
        Shape {
            hidden: H,
            heads: HEADS,
            intermediate: INTER,
            layers: LAYERS,
            max_positions: POSITIONS,
            eps: 1e-12,
        }
    }

    fn builder(prefix: &str) -> VarBuilder<'static> {
        VarBuilder::from_tensors(weights(prefix), DType::F32, &Device::Cpu)
    }

    /// Sequences of every length from 1 to the model's limit, tokens spread over the
    /// vocabulary.
    fn sequences() -> Vec<Vec<u32>> {
        (1..=POSITIONS)
            .map(|len| {
                (0..len)
                    .map(|i| ((i * 7 + len * 3) % VOCAB) as u32)
                    .collect()
            })
            .collect()
    }

    /// candle's BERT on the same weights, mean-pooled and unit length: the reference.
    fn reference(sequences: &[Vec<u32>]) -> Vec<Vec<f32>> {
        let config: Config = serde_json::from_value(serde_json::json!({
            "vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "intermediate_size": INTER, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "max_position_embeddings": POSITIONS,
            "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
            "pad_token_id": 0
        }))
        .unwrap();
        let bert = BertModel::load(builder(""), &config).unwrap();
        sequences
            .iter()
            .map(|s| {
                let ids = Tensor::new(s.as_slice(), &Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let types = ids.zeros_like().unwrap();
                let out = bert.forward(&ids, &types, None).unwrap();
                let mean: Vec<f32> = out.mean(1).unwrap().squeeze(0).unwrap().to_vec1().unwrap();
                crate::embed::normalized(mean)
            })
            .collect()
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// The made-up model loaded, or `None` (said on stderr) where this CPU cannot run the
    /// encoder.
    fn loaded() -> Option<Encoder> {
        if !supported() {
            eprintln!("skipped: this CPU has no AVX-512 with bf16");
            return None;
        }
        Some(Encoder::load(&builder(""), shape()).unwrap())
    }

    /// The encoder computes candle's BERT: every length up to the model's limit, weights bare
    /// or under `bert.`.
    #[test]
    fn the_encoder_computes_candles_bert() {
        if !supported() {
            assert!(Encoder::load(&builder(""), shape()).is_err());
            eprintln!("skipped: this CPU has no AVX-512 with bf16");
            return;
        }
        let seqs = sequences();
        let want = reference(&seqs);
        for prefix in ["", "bert."] {
            let encoder = Encoder::load(&builder(prefix), shape()).unwrap();
            let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
            let got = encoder.embed(&refs, 2).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let c = cosine(g, w);
                assert!(c >= 0.9999, "length {}: cosine {c} against candle", i + 1);
            }
        }
    }

    /// A text's vector does not depend on its company: one thread or several, one pass or
    /// many (the passes are capped at TOKENS_PER_PASS tokens), alone or in a batch — bit for
    /// bit, since every row is computed by itself.
    #[test]
    fn vectors_do_not_depend_on_threads_passes_or_batches() {
        let Some(encoder) = loaded() else {
            return;
        };
        // Enough tokens for several passes per thread.
        let seqs: Vec<Vec<u32>> = sequences().into_iter().cycle().take(400).collect();
        assert!(seqs.iter().map(Vec::len).sum::<usize>() > 3 * TOKENS_PER_PASS);
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let one = encoder.embed(&refs, 1).unwrap();
        let three = encoder.embed(&refs, 3).unwrap();
        assert_eq!(one, three);
        for i in [0, 17, 39, 399] {
            let alone = encoder.embed(&refs[i..=i], 2).unwrap();
            assert_eq!(alone[0], one[i], "sequence {i}");
        }
    }

    /// What the model cannot take is refused with a reason, before any work; nothing is
    /// nothing.
    #[test]
    fn sequences_the_model_cannot_take_are_refused() {
        let Some(encoder) = loaded() else {
            return;
        };
        assert_eq!(encoder.embed(&[], 2).unwrap(), Vec::<Vec<f32>>::new());
        let long = vec![1u32; POSITIONS + 1];
        let err = encoder.embed(&[&[1, 2], &long], 2).unwrap_err();
        assert!(err.contains("41 tokens"), "{err}");
        let err = encoder.embed(&[&[]], 2).unwrap_err();
        assert!(err.contains("0 tokens"), "{err}");
        let err = encoder.embed(&[&[1, VOCAB as u32]], 2).unwrap_err();
        assert!(err.contains("outside the vocabulary"), "{err}");
        // A shape the kernels do not take.
        let odd = Shape {
            hidden: 48,
            ..shape()
        };
        assert!(Encoder::load(&builder(""), odd).is_err());
    }
}
