//! Matrix products in bf16 with f32 sums, on AVX-512 BF16 (`vdpbf16ps`): `out = x · Wᵀ + b`
//! for a linear layer's weight `W` (out × in, as PyTorch stores it).
//!
//! The weight is packed once, at load, into panels of [`NR`] output columns: for each pair of
//! input positions `(2p, 2p+1)`, the panel holds the 64 columns' two values side by side, so one
//! `vdpbf16ps` multiplies one broadcast pair of `x` with 16 columns' pairs and adds both
//! products into 16 f32 sums. A tile of [`MR`] rows × [`NR`] columns keeps its 24 sums in
//! registers over the whole input length.
//!
//! Contract: [`matmul`] computes each output as the f32 sum of bf16(x)·bf16(w) products plus
//! the f32 bias: the inputs are rounded to bf16 (8 bits of mantissa), the sums are not.

use std::arch::x86_64::{
    __m256bh, __m256i, __m512, __m512bh, _mm256_storeu_si256, _mm512_cvtneps_pbh, _mm512_dpbf16_ps,
    _mm512_loadu_ps, _mm512_loadu_si512, _mm512_set1_epi32, _mm512_storeu_ps,
};

/// Output columns per panel: four vectors of 16 f32 sums.
pub(crate) const NR: usize = 64;
/// Rows per tile: 6 × 4 = 24 sums in registers (of 32), beside 4 weight vectors and a
/// broadcast.
const MR: usize = 6;
/// Rows of `x` per block: what one pass over a panel keeps warm in the caches.
const M_BLOCK: usize = 96;

/// A linear layer's weight and bias, packed for [`matmul`].
pub(crate) struct Linear {
    /// bf16 bits, panel after panel (see the module docs).
    panels: Vec<u16>,
    bias: Vec<f32>,
    /// Output columns.
    n: usize,
    /// Input length.
    k: usize,
}

/// `x` rounded to bf16 (to nearest, ties to even), as bits.
pub(crate) fn bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

impl Linear {
    /// Packs `weight` (`n` rows of `k`, row-major) and `bias` (`n`). `n` must be a multiple of
    /// [`NR`] and `k` of 32 (true of BERT's layers); anything else is refused.
    pub(crate) fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> Result<Self, String> {
        if n == 0 || !n.is_multiple_of(NR) || k == 0 || !k.is_multiple_of(32) {
            return Err(format!(
                "a {n} × {k} layer does not fit the bf16 kernels (outputs a multiple of {NR}, inputs of 32)"
            ));
        }
        if weight.len() != n * k || bias.len() != n {
            return Err(format!(
                "a {n} × {k} layer was given {} weights and {} biases",
                weight.len(),
                bias.len()
            ));
        }
        let mut panels = vec![0u16; n * k];
        for (j, panel) in panels.chunks_exact_mut(NR * k).enumerate() {
            for (p, pair) in panel.chunks_exact_mut(2 * NR).enumerate() {
                for c in 0..NR {
                    let row = &weight[(j * NR + c) * k..][..k];
                    pair[2 * c] = bf16(row[2 * p]);
                    pair[2 * c + 1] = bf16(row[2 * p + 1]);
                }
            }
        }
        Ok(Self {
            panels,
            bias: bias.to_vec(),
            n,
            k,
        })
    }
}

/// `out` ← bf16 bits of `x` (rounded to nearest even); `x.len()` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn to_bf16(x: &[f32], out: &mut [u16]) {
    assert!(x.len().is_multiple_of(16) && out.len() >= x.len());
    for (src, dst) in x.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
        // SAFETY: both chunks hold exactly 16 elements (64 and 32 bytes); unaligned access.
        unsafe {
            let v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr()));
            _mm256_storeu_si256(
                dst.as_mut_ptr().cast(),
                std::mem::transmute::<__m256bh, __m256i>(v),
            );
        }
    }
}

/// `out` (m × n, row-major) ← `x` (m × k bf16 bits, row-major) · Wᵀ + b.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn matmul(x: &[u16], m: usize, layer: &Linear, out: &mut [f32]) {
    let (n, k) = (layer.n, layer.k);
    assert!(x.len() >= m * k && out.len() >= m * n);
    for i0 in (0..m).step_by(M_BLOCK) {
        let i1 = (i0 + M_BLOCK).min(m);
        for j in 0..n / NR {
            let panel = &layer.panels[j * NR * k..][..NR * k];
            let bias = &layer.bias[j * NR..][..NR];
            let mut i = i0;
            while i < i1 {
                let rows = (i1 - i).min(MR);
                let x = &x[i * k..(i + rows) * k];
                let out = &mut out[i * n + j * NR..(i + rows - 1) * n + (j + 1) * NR];
                match rows {
                    6 => tile::<6>(x, k, panel, bias, out, n),
                    5 => tile::<5>(x, k, panel, bias, out, n),
                    4 => tile::<4>(x, k, panel, bias, out, n),
                    3 => tile::<3>(x, k, panel, bias, out, n),
                    2 => tile::<2>(x, k, panel, bias, out, n),
                    _ => tile::<1>(x, k, panel, bias, out, n),
                }
                i += rows;
            }
        }
    }
}

/// One tile: `R` rows of `x` (each `k` long) times one panel, plus the bias, into `out` (whose
/// rows are `stride` apart; the tile's first column at 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
#[inline]
fn tile<const R: usize>(
    x: &[u16],
    k: usize,
    panel: &[u16],
    bias: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    assert!(x.len() == R * k && panel.len() == NR * k && bias.len() == NR);
    assert!(out.len() == (R - 1) * stride + NR);
    // SAFETY: every access below is within the slices checked above: a pair `p < k/2` of row
    // `r < R` is x[r·k + 2p ..+2]; a panel's pair p is panel[p·2·NR ..+2·NR] (four vectors of
    // 32 bf16); the bias and each output row have NR floats. All loads and stores are
    // unaligned ones.
    unsafe {
        let b: [__m512; 4] = std::array::from_fn(|v| _mm512_loadu_ps(bias.as_ptr().add(16 * v)));
        let mut acc = [b; R];
        let xp = x.as_ptr().cast::<i32>();
        let wp = panel.as_ptr();
        for p in 0..k / 2 {
            let w: [__m512bh; 4] = std::array::from_fn(|v| {
                std::mem::transmute(_mm512_loadu_si512(wp.add(p * 2 * NR + 32 * v).cast()))
            });
            for (r, sums) in acc.iter_mut().enumerate() {
                let pair = xp.add(r * k / 2 + p).read_unaligned();
                let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                for (s, w) in sums.iter_mut().zip(w) {
                    *s = _mm512_dpbf16_ps(*s, a, w);
                }
            }
        }
        for (r, sums) in acc.iter().enumerate() {
            for (v, s) in sums.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(r * stride + 16 * v), *s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn from_bf16(b: u16) -> f32 {
        f32::from_bits((b as u32) << 16)
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(-2.5), 0xc020);
        assert!(from_bf16(bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(bf16(f32::INFINITY)), f32::INFINITY);
    }

    #[test]
    fn layers_that_do_not_fit_the_kernels_are_refused() {
        assert!(Linear::new(&[0.0; 32 * 32], &[0.0; 32], 32, 32).is_err());
        assert!(Linear::new(&[0.0; 64 * 48], &[0.0; 64], 64, 48).is_err());
        assert!(Linear::new(&[0.0; 64 * 32], &[0.0; 63], 64, 32).is_err());
        assert!(Linear::new(&[0.0; 64 * 32], &[0.0; 64], 64, 32).is_ok());
    }

    /// Every row count (full tiles, each short tile, more than one row block) against the
    /// same products summed in f64 from the bf16-rounded inputs.
    #[test]
    fn products_match_the_sums_of_rounded_inputs() {
        if !super::super::supported() {
            eprintln!("skipped: this CPU has no AVX-512 with bf16");
            return;
        }
        let (n, k) = (128, 96);
        let weight = values(n * k, 1);
        let bias = values(n, 2);
        let layer = Linear::new(&weight, &bias, n, k).unwrap();
        for m in [1, 2, 3, 4, 5, 6, 7, 13, 96, 97, 200] {
            let x = values(m * k, m as u64 + 3);
            let mut xb = vec![0u16; m * k];
            let mut out = vec![f32::NAN; m * n];
            // SAFETY: the CPU has the features (checked above).
            unsafe {
                to_bf16(&x, &mut xb);
                matmul(&xb, m, &layer, &mut out);
            }
            for (xv, xr) in x.iter().zip(&xb) {
                assert_eq!(
                    bf16(*xv),
                    *xr,
                    "the vector rounding agrees with the scalar one"
                );
            }
            for i in 0..m {
                for c in 0..n {
                    let want: f64 = bias[c] as f64
                        + (0..k)
                            .map(|t| {
                                from_bf16(xb[i * k + t]) as f64
                                    * from_bf16(bf16(weight[c * k + t])) as f64
                            })
                            .sum::<f64>();
                    let got = out[i * n + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "m {m}, row {i}, column {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
