//! The encoder's element-wise math, written so the compiler vectorises it: the functions on
//! slices are compiled for the fast engine's CPU features (AVX-512), their loops have no
//! branches, and sums keep one accumulator per vector lane.
//!
//! Contract: [`exp`] is within 2 ulp of e^x for x in [-87, 88] (inputs outside are clamped);
//! [`erf`] is within 1e-6 of erf(x) everywhere; the slice functions compute what their
//! names say in f32, to within the rounding of a different order of summation.

/// Lanes of one AVX-512 vector of f32: the width sums are spread over.
const LANES: usize = 16;

/// e^x (Cephes' single-precision polynomial after range reduction), branch-free.
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n·ln2 is exact in its high part.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let y = (p * r).mul_add(r, r) + 1.0;
    // 2^n, built in the exponent bits (n is within [-126, 127] after the clamp).
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    y * scale
}

/// erf(x): the rational approximation Eigen and XLA use for f32 (odd numerator of degree 13
/// over an even denominator of degree 8, on x clamped to [-4, 4], where erf is ±1 in f32).
#[inline]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = (-2.726_142_3e-10_f32).mul_add(x2, 2.770_681_4e-8);
    let p = p.mul_add(x2, -2.101_024e-6);
    let p = p.mul_add(x2, -5.692_506_4e-5);
    let p = p.mul_add(x2, -7.349_906_3e-4);
    let p = p.mul_add(x2, -2.954_6e-3);
    let p = p.mul_add(x2, -1.609_603_3e-2);
    let q = (-1.456_607_2e-5_f32).mul_add(x2, -2.133_740_6e-4);
    let q = q.mul_add(x2, -1.682_827e-3);
    let q = q.mul_add(x2, -7.373_329e-3);
    let q = q.mul_add(x2, -1.426_474e-2);
    x * p / q
}

/// BERT's GELU, with erf (not the tanh approximation), in place.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn gelu(xs: &mut [f32]) {
    for x in xs {
        *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// The sum of `xs`, one accumulator per lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// `row` ← LayerNorm(`row` + `add`) with `gamma`, `beta` and `eps` (mean and variance over
/// the row, the variance biased, as BERT's).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn add_layer_norm(row: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    for (x, a) in row.iter_mut().zip(add) {
        *x += a;
    }
    layer_norm(row, gamma, beta, eps);
}

/// `row` ← LayerNorm(`row`) with `gamma`, `beta` and `eps`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn layer_norm(row: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = row.len() as f32;
    let mean = sum(row) / n;
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest: f32 = chunks
        .remainder()
        .iter()
        .map(|x| (x - mean) * (x - mean))
        .sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += (x - mean) * (x - mean);
        }
    }
    let var = (acc.iter().sum::<f32>() + rest) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((x, g), b) in row.iter_mut().zip(gamma).zip(beta) {
        *x = (*x - mean) * inv * g + b;
    }
}

/// `xs` ← softmax(`xs`), in place (shifted by the maximum, so nothing overflows).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(crate) fn softmax(xs: &mut [f32]) {
    let mut top = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, x| m.max(*x));
    for c in chunks {
        for (t, x) in top.iter_mut().zip(c) {
            *t = t.max(*x);
        }
    }
    let max = top.iter().fold(rest, |m, x| m.max(*x));
    for x in xs.iter_mut() {
        *x = exp(*x - max);
    }
    let inv = 1.0 / sum(xs);
    for x in xs.iter_mut() {
        *x *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf and exp as Python's math module computes them (double precision).
    const ERF: &[(f32, f64)] = &[
        (-3.9, -0.9999999652077514),
        (-2.0, -0.9953222650189527),
        (-0.7, -0.6778011938374184),
        (-0.05, -0.05637197779701663),
        (0.0, 0.0),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (1.7, 0.9837904585907745),
        (2.5, 0.999593047982555),
        (3.5, 0.9999992569016276),
        (5.0, 0.9999999999984626),
    ];
    const EXP: &[(f32, f64)] = &[
        (-80.0, 1.8048513878454153e-35),
        (-10.0, 4.5399929762484854e-05),
        (-1.0, 0.36787944117144233),
        (-0.001, 0.999000499833375),
        (0.0, 1.0),
        (0.3, 1.3498588075760032),
        (1.0, std::f64::consts::E),
        (5.5, 244.69193226422038),
        (20.0, 485165195.4097903),
        (80.0, 5.54062238439351e+34),
    ];

    #[test]
    fn exp_and_erf_match_double_precision() {
        for &(x, want) in ERF {
            let got = erf(x) as f64;
            assert!((got - want).abs() < 1e-6, "erf({x}) = {got}, not {want}");
        }
        for &(x, want) in EXP {
            let got = exp(x) as f64;
            let rel = ((got - want) / want).abs();
            assert!(rel < 3e-7, "exp({x}) = {got}, not {want} (relative {rel})");
        }
        // Against the standard library across the range softmax uses (x ≤ 0).
        for i in 0..=8700 {
            let x = -(i as f32) / 100.0;
            let rel = ((exp(x) - x.exp()) / x.exp()).abs();
            assert!(rel < 3e-7, "exp({x}): relative error {rel}");
        }
    }

    #[test]
    fn slice_functions_match_their_definitions() {
        if !super::super::supported() {
            eprintln!("skipped: this CPU has no AVX-512 with bf16");
            return;
        }
        let xs: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 101) as f32 / 10.0 - 5.0)
            .collect();
        // SAFETY: the CPU has the features (checked above).
        unsafe {
            let want: f32 = xs.iter().sum();
            assert!((sum(&xs) - want).abs() < 1e-4);

            let mut soft = xs.clone();
            softmax(&mut soft);
            let total: f64 = xs.iter().map(|x| (*x as f64).exp()).sum();
            for (s, x) in soft.iter().zip(&xs) {
                let want = (*x as f64).exp() / total;
                assert!((*s as f64 - want).abs() < 1e-6, "softmax {s} vs {want}");
            }

            let mut g = xs.clone();
            gelu(&mut g);
            for (g, x) in g.iter().zip(&xs) {
                let x = *x as f64;
                let want = 0.5 * x * (1.0 + erf_f64(x / std::f64::consts::SQRT_2));
                assert!(
                    (*g as f64 - want).abs() < 2e-6,
                    "gelu({x}) = {g}, not {want}"
                );
            }

            let gamma: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 / 50.0).collect();
            let beta: Vec<f32> = (0..37).map(|i| i as f32 / 100.0).collect();
            let add: Vec<f32> = (0..37).map(|i| (i % 5) as f32).collect();
            let mut row = xs.clone();
            add_layer_norm(&mut row, &add, &gamma, &beta, 1e-12);
            let summed: Vec<f64> = xs.iter().zip(&add).map(|(x, a)| (x + a) as f64).collect();
            let mean = summed.iter().sum::<f64>() / 37.0;
            let var = summed.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 37.0;
            for (i, r) in row.iter().enumerate() {
                let want =
                    (summed[i] - mean) / (var + 1e-12).sqrt() * gamma[i] as f64 + beta[i] as f64;
                assert!(
                    (*r as f64 - want).abs() < 1e-5,
                    "layer norm {i}: {r} vs {want}"
                );
            }
        }
    }

    /// erf in double precision: its Taylor series, exact enough for |x| ≤ 4 in f64.
    fn erf_f64(x: f64) -> f64 {
        let mut term = x;
        let mut total = x;
        let x2 = x * x;
        for n in 1..200 {
            term *= -x2 / n as f64;
            total += term / (2 * n + 1) as f64;
        }
        total * 2.0 / std::f64::consts::PI.sqrt()
    }
}
