//! Fused CPU kernels of the encoder, as candle custom ops.
//!
//! Stock candle runs a BERT layer as some twenty separate ops, each reading and writing the
//! whole activation tensor, with a scalar `erf` in GELU, head transposes, and the 2·B·H small
//! attention GEMMs of a layer run one after the other. Profiled on a MiniLM forward pass, about
//! 40% of the time went to that element-wise work rather than to the GEMMs. Here a layer is five
//! ops:
//!
//! 1. [`FusedLinear`] (QKV): `x·Wᵀ + b`, the bias preloaded into the output so that the GEMM
//!    accumulates onto it (`gemm`'s `dst = dst + x·Wᵀ`), no separate broadcast-add.
//! 2. [`FusedAttention`]: reads Q, K and V straight out of the fused QKV rows (no transposes),
//!    and per (batch, block of query rows) computes scores, scale, mask, softmax and the value
//!    product with register-blocked loops, writing each head's context into its columns of the
//!    (B, L, hidden) output. Batches × row blocks run in parallel on rayon.
//! 3. [`FusedLinear`] (attention output) with a residual-and-LayerNorm epilogue: the residual
//!    and bias are preloaded, the GEMM accumulates, and each row is normalized while it is
//!    still in cache.
//! 4. [`FusedLinear`] (FFN up) with a bias and GELU epilogue (a vectorized `erf`).
//! 5. [`FusedLinear`] (FFN down) with the residual-and-LayerNorm epilogue.
//!
//! Embeddings are one [`FusedEmbeddings`] op: the three gathers, their sum and the LayerNorm.
//!
//! GEMMs go to the `gemm` crate (the same one candle uses, with its AVX-512 kernels enabled by
//! the `x86-v4` feature in the workspace). The element-wise and attention loops are written
//! once, as plain Rust that LLVM vectorizes (lane-wise accumulators, fixed-width blocks, no
//! reductions across lanes inside loops), and compiled three times: for AVX-512, for AVX2+FMA
//! and for the baseline target. [`Isa`] picks one at load time from run-time detection.
//!
//! # Safety
//!
//! This is the only module of the crate with `unsafe` code besides the memory-mapped weights.
//! The invariants it relies on:
//!
//! * **Instruction sets.** The `#[target_feature]` functions (modules `avx512` and `avx2`) are
//!   only called through [`Isa`], whose level is private to this module: an `Isa` can only be
//!   made by [`Isa::detect`] (after `is_x86_feature_detected!` confirmed every feature that the
//!   level's functions enable), as the portable level, or by lowering a detected one
//!   ([`Isa::capped`]). No code path raises a level above what was detected.
//! * **GEMM bounds.** `gemm::gemm` reads and writes through raw pointers and strides. It is
//!   called only from [`gemm_f32`], which checks that the three slices hold `m·k`, `k·n` and
//!   `m·n` elements before passing their row-major strides; everything else is safe slices.
//! * Everything else (attention, LayerNorm, GELU, embeddings) is safe Rust on slices; parallel
//!   writes go through `par_chunks_mut`, so no two tasks share an output row.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::amx::{gemm_bf16_rows, Amx, Bf16Matrix};
use super::config::Activation;
use super::hooks::RowHooks;
use super::quant::{gemm_int8_rows, quantize_table_rows, QuantIsa, QuantizedMatrix};

/// Instruction-set levels the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The instruction set the fused kernels run with, and the one of the int8 products under
/// them; only ever as wide as the CPU supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Isa(Level, QuantIsa);

/// A level to cap an [`Isa`] at, for tests and for forcing the fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IsaCap {
    /// No cap.
    Best,
    /// The int8 products in registers, not on AMX tiles.
    NoAmx,
    /// At most AVX2+FMA, the int8 products included.
    Avx2,
    /// At most AVX2+FMA, with the int8 products on AVX-VNNI where the CPU has it: what a
    /// CPU with AVX-VNNI and without AVX-512 runs.
    AvxVnni,
    /// Baseline code only.
    Portable,
}

impl Isa {
    /// The widest level this CPU runs.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa(Level::Avx512, QuantIsa::detect());
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa(Level::Avx2, QuantIsa::detect().at_most_avx_vnni());
            }
        }
        Isa(Level::Portable, QuantIsa::portable())
    }

    /// Baseline code, valid on every CPU of the target.
    #[cfg(test)]
    pub(crate) fn portable() -> Isa {
        Isa(Level::Portable, QuantIsa::portable())
    }

    /// This level, lowered to `cap` if it is above it (never raised).
    pub(crate) fn capped(self, cap: IsaCap) -> Isa {
        match cap {
            IsaCap::Best => self,
            IsaCap::NoAmx => Isa(self.0, self.1.without_amx()),
            IsaCap::Portable => Isa(Level::Portable, QuantIsa::portable()),
            #[cfg(target_arch = "x86_64")]
            IsaCap::Avx2 => Isa(self.0.min(Level::Avx2), self.1.at_most_avx2()),
            #[cfg(target_arch = "x86_64")]
            IsaCap::AvxVnni => Isa(self.0.min(Level::Avx2), self.1.at_most_avx_vnni()),
            #[cfg(not(target_arch = "x86_64"))]
            IsaCap::Avx2 | IsaCap::AvxVnni => self,
        }
    }

    /// The int8 kernels' level under this one: the widest the CPU runs (VNNI of either width
    /// where it has it) for AVX-512, AVX-VNNI or AVX2 for AVX2 as capped, the portable loop for
    /// the portable level.
    pub(crate) fn int8(self) -> QuantIsa {
        self.1
    }

    /// The level's name, for reports.
    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            Level::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512",
        }
    }
}

/// Calls `generic::$f` compiled for the level of `$isa`.
macro_rules! dispatch {
    ($isa:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $isa.0 {
            // SAFETY: an `Isa` at this level exists only when detection confirmed the features
            // (see the module's invariants).
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::$f($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::$f($($arg),*) },
            Level::Portable => generic::$f::<false>($($arg),*),
        }
    };
}

/// The kernels' entry points compiled with `$features`; each forwards to `generic` with FMA.
macro_rules! compiled_for {
    ($module:ident, $features:literal, $avx512:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $module {
            use super::generic;

            #[target_feature(enable = $features)]
            pub(super) unsafe fn activate(x: &mut [f32], activation: super::Activation) {
                generic::activate::<true>(x, activation)
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn layer_norm_rows(
                x: &mut [f32],
                gamma: &[f32],
                beta: &[f32],
                eps: f32,
            ) {
                generic::layer_norm_rows::<true>(x, gamma, beta, eps)
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn attention_rows(
                task: &super::AttentionTask,
                first_row: usize,
                out: &mut [f32],
            ) {
                generic::attention_rows_with::<true, $avx512>(task, first_row, out)
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn pack_head(task: &super::PackTask, kt: &mut [f32], v: &mut [f32]) {
                generic::pack_head::<true>(task, kt, v)
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn attention_rows_tiles(
                task: &super::TileTask,
                first_row: usize,
                out: &mut [f32],
            ) {
                generic::attention_rows_tiles::<true>(task, first_row, out)
            }
        }
    };
}

compiled_for!(avx512, "avx512f,avx2,fma", true);
compiled_for!(avx2, "avx2,fma", false);

/// The two inner blocks of the attention in AVX-512 intrinsics: LLVM's own vectorization of
/// the portable loops used narrow vectors and gathers there and ran at a fraction of the rate.
#[cfg(target_arch = "x86_64")]
mod avx512_blocks {
    use std::arch::x86_64::*;

    use super::{R, W};

    /// `out[r] = Σ_i a(i, r) · b[i·stride + offset .. + W]` for the R rows of `a`.
    ///
    /// # Safety
    /// AVX-512F must be available (the caller is compiled for it), and `b` must hold
    /// `(a.len - 1)·stride + offset + W` values, which is asserted (as is `a`'s extent, by
    /// [`Lhs::check`](super::Lhs::check)).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn outer_block(
        a: &super::Lhs,
        b: &[f32],
        stride: usize,
        offset: usize,
        out: &mut [[f32; W]; R],
    ) {
        if a.len == 0 {
            *out = [[0.0; W]; R];
            return;
        }
        a.check();
        assert!((a.len - 1) * stride + offset + W <= b.len());
        let mut acc = [_mm512_setzero_ps(); R];
        let mut ptr = b.as_ptr().add(offset);
        let mut ap = a.data.as_ptr();
        for _ in 0..a.len {
            // SAFETY: in bounds by the assertions above (step i reads b[i·stride + offset ..]
            // [..W], and a.data[i·step + r·lane] for r < R).
            let v = _mm512_loadu_ps(ptr);
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(*ap.add(r * a.lane)), v, *acc);
            }
            ptr = ptr.add(stride);
            ap = ap.add(a.step);
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }
}

/// The left factor of an attention block: element (i, r), `i < len`, `r < R`, at
/// `data[i·step + r·lane]`. The queries are stored i-major (`step` R, `lane` 1), the
/// probabilities row-major as the softmax leaves them (`step` 1, `lane` the padded key count),
/// so that neither is transposed.
pub(crate) struct Lhs<'a> {
    data: &'a [f32],
    len: usize,
    step: usize,
    lane: usize,
}

impl Lhs<'_> {
    #[inline(always)]
    fn at(&self, i: usize, r: usize) -> f32 {
        self.data[i * self.step + r * self.lane]
    }

    /// Asserts that every element lies in `data`.
    #[inline(always)]
    fn check(&self) {
        assert!(
            self.len == 0 || (self.len - 1) * self.step + (R - 1) * self.lane < self.data.len()
        );
    }
}

/// Width of the fixed blocks the loops are written in: one AVX-512 register of f32.
const W: usize = 16;
/// Query rows computed together in attention (register blocking).
const R: usize = 8;
/// Query rows per parallel attention task.
const ROWS_PER_TASK: usize = 32;
/// Rows per parallel task of the element-wise epilogues.
const EPILOGUE_ROWS: usize = 16;

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// The shared loops, generic over whether `mul_add` is a native FMA (it is a slow library
/// call without one, so the portable build multiplies and adds instead).
mod generic {
    use super::super::amx::{pack_rows_for, product_into};
    use super::{Activation, AttentionTask, Lhs, PackTask, TileTask, R, W};

    #[inline(always)]
    fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
        if FMA {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }

    /// `e^x`, branch-free: 2^n · p(r) with a degree-6 polynomial (relative error about 2e-7);
    /// exactly 0 below -87 (where f32 would go subnormal), as the mask needs.
    #[inline(always)]
    pub(super) fn exp<const FMA: bool>(x: f32) -> f32 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits.
        const SHIFT: f32 = 12_582_912.0;
        let xc = x.clamp(-87.0, 88.0);
        let t = fma::<FMA>(xc, LOG2E, SHIFT);
        let n = t - SHIFT;
        let r = fma::<FMA>(-n, LN2_LO, fma::<FMA>(-n, LN2_HI, xc));
        let mut p = 1.0 / 720.0;
        p = fma::<FMA>(p, r, 1.0 / 120.0);
        p = fma::<FMA>(p, r, 1.0 / 24.0);
        p = fma::<FMA>(p, r, 1.0 / 6.0);
        p = fma::<FMA>(p, r, 0.5);
        p = fma::<FMA>(p, r, 1.0);
        p = fma::<FMA>(p, r, 1.0);
        // n + 127 sits in the low bits of t; shifted into the exponent field it is 2^n.
        let scale = f32::from_bits((t.to_bits().wrapping_add(127)) << 23);
        if x < -87.0 {
            0.0
        } else {
            p * scale
        }
    }

    /// erf(x) as an odd rational function of x on [-4, 4] (±1 beyond, where f32's erf is
    /// ±1 too): degree 13 over degree 8, the coefficients of Eigen's and XLA's f32 erf. One
    /// division and no exponential, which made GELU about 30% cheaper than Abramowitz &
    /// Stegun's 7.1.26 with an exp; absolute error 3.3e-7 against 1.5e-7.
    #[inline(always)]
    fn erf<const FMA: bool>(x: f32) -> f32 {
        const ALPHA: [f32; 7] = [
            -2.726_142_3e-10,
            2.770_681_4e-8,
            -2.101_024e-6,
            -5.692_506_4e-5,
            -7.349_906_3e-4,
            -2.954_600_1e-3,
            -1.609_603_3e-2,
        ];
        const BETA: [f32; 5] = [
            -1.456_607_2e-5,
            -2.133_740_6e-4,
            -1.682_827e-3,
            -7.373_329e-3,
            -1.426_474e-2,
        ];
        let x = x.clamp(-4.0, 4.0);
        let x2 = x * x;
        let mut p = ALPHA[0];
        for a in &ALPHA[1..] {
            p = fma::<FMA>(x2, p, *a);
        }
        let mut q = BETA[0];
        for b in &BETA[1..] {
            q = fma::<FMA>(x2, q, *b);
        }
        x * p / q
    }

    #[inline(always)]
    fn tanh<const FMA: bool>(x: f32) -> f32 {
        let e = exp::<FMA>(2.0 * x.clamp(-44.0, 44.0));
        1.0 - 2.0 / (e + 1.0)
    }

    #[inline(always)]
    pub(super) fn activate<const FMA: bool>(x: &mut [f32], activation: Activation) {
        match activation {
            Activation::Gelu => {
                for v in x.iter_mut() {
                    let u = *v;
                    *v = 0.5 * u * (1.0 + erf::<FMA>(u * std::f32::consts::FRAC_1_SQRT_2));
                }
            }
            Activation::GeluTanh => {
                const C: f32 = 0.797_884_6; // sqrt(2/pi)
                for v in x.iter_mut() {
                    let u = *v;
                    let inner = C * fma::<FMA>(0.044_715 * u, u * u, u);
                    *v = 0.5 * u * (1.0 + tanh::<FMA>(inner));
                }
            }
            Activation::Relu => {
                for v in x.iter_mut() {
                    *v = v.max(0.0);
                }
            }
        }
    }

    /// `x` added into W lanes (a sequential f32 sum would not vectorize), and the sum of the
    /// values past the last whole W.
    #[inline(always)]
    fn lane_sums(x: &[f32]) -> ([f32; W], f32) {
        let mut acc = [0f32; W];
        let mut chunks = x.chunks_exact(W);
        for c in &mut chunks {
            for t in 0..W {
                acc[t] += c[t];
            }
        }
        (acc, chunks.remainder().iter().sum::<f32>())
    }

    /// The sum of `x`, its lanes added left to right.
    #[inline(always)]
    fn sum(x: &[f32]) -> f32 {
        let (acc, tail) = lane_sums(x);
        acc.iter().sum::<f32>() + tail
    }

    #[inline(always)]
    fn sum_sq_dev<const FMA: bool>(x: &[f32], mean: f32) -> f32 {
        let mut acc = [0f32; W];
        let mut chunks = x.chunks_exact(W);
        for c in &mut chunks {
            for t in 0..W {
                let d = c[t] - mean;
                acc[t] = fma::<FMA>(d, d, acc[t]);
            }
        }
        let tail: f32 = chunks
            .remainder()
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum();
        acc.iter().sum::<f32>() + tail
    }

    #[inline(always)]
    fn max(x: &[f32]) -> f32 {
        let mut acc = [f32::MIN; W];
        let mut chunks = x.chunks_exact(W);
        for c in &mut chunks {
            for t in 0..W {
                acc[t] = acc[t].max(c[t]);
            }
        }
        let tail = chunks.remainder().iter().fold(f32::MIN, |a, &b| a.max(b));
        halves(acc, f32::max).max(tail)
    }

    /// The sum of `x` in W lanes folded in halves: the same terms as [`sum`] in another order
    /// (so not the same float), with a few shuffles in place of a chain of W dependent adds.
    #[inline(always)]
    fn sum_in_halves(x: &[f32]) -> f32 {
        let (acc, tail) = lane_sums(x);
        halves(acc, |a, b| a + b) + tail
    }

    /// `acc`'s lanes combined pairwise, the upper half into the lower, W/2 then W/4 ... 1
    /// lanes wide: vector shuffles where a left-to-right fold is W dependent scalar steps. For
    /// `max`, any order gives the same value.
    #[inline(always)]
    fn halves(mut acc: [f32; W], f: impl Fn(f32, f32) -> f32) -> f32 {
        let mut width = W / 2;
        while width > 0 {
            for t in 0..width {
                acc[t] = f(acc[t], acc[t + width]);
            }
            width /= 2;
        }
        acc[0]
    }

    /// LayerNorm of each row of `x` (rows of `gamma.len()`), in place; two passes over the row
    /// (mean, then variance) as candle does, for the same rounding.
    #[inline(always)]
    pub(super) fn layer_norm_rows<const FMA: bool>(
        x: &mut [f32],
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
    ) {
        let n = gamma.len();
        for row in x.chunks_exact_mut(n) {
            let mean = sum(row) / n as f32;
            let var = sum_sq_dev::<FMA>(row, mean) / n as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                *v = fma::<FMA>((*v - mean) * inv, *g, *b);
            }
        }
    }

    /// Transposes one head's keys to (head_dim, lp) and copies its values to (L, dp), both
    /// zero-padded, so that the attention loops run on whole W-blocks.
    #[inline(always)]
    pub(super) fn pack_head<const FMA: bool>(task: &PackTask, kt: &mut [f32], v: &mut [f32]) {
        let PackTask {
            rows,
            stride,
            k_offset,
            v_offset,
            l,
            lp,
            d,
            dp,
        } = *task;
        for j in 0..l {
            let row = &rows[j * stride..];
            let k = &row[k_offset..k_offset + d];
            for (dd, &value) in k.iter().enumerate() {
                kt[dd * lp + j] = value;
            }
            v[j * dp..j * dp + d].copy_from_slice(&row[v_offset..v_offset + d]);
        }
    }

    /// `out[r] = Σ_i a(i, r) · b[i·stride + offset .. + W]`: the register-blocked inner product
    /// both attention GEMMs are made of (S = Q·Kᵀ over head_dim, context = P·V over keys).
    #[inline(always)]
    fn outer_block<const FMA: bool, const AVX512: bool>(
        a: &Lhs,
        b: &[f32],
        stride: usize,
        offset: usize,
        out: &mut [[f32; W]; R],
    ) {
        #[cfg(target_arch = "x86_64")]
        if AVX512 {
            // SAFETY: `AVX512` is true only in the instantiation called from the `avx512`
            // module, whose functions run only where detection found AVX-512F.
            unsafe { super::avx512_blocks::outer_block(a, b, stride, offset, out) };
            return;
        }
        a.check();
        let mut acc = [[0f32; W]; R];
        for i in 0..a.len {
            let bv: &[f32; W] = b[i * stride + offset..i * stride + offset + W]
                .try_into()
                .unwrap();
            for (r, acc) in acc.iter_mut().enumerate() {
                let ai = a.at(i, r);
                for t in 0..W {
                    acc[t] = fma::<FMA>(ai, bv[t], acc[t]);
                }
            }
        }
        *out = acc;
    }

    /// The additive mask over `l` keys (0 each without one), padded with "excluded" up to
    /// `padded` keys.
    #[inline(always)]
    fn key_bias(mask: Option<&[f32]>, l: usize, padded: usize) -> Vec<f32> {
        let mut bias = vec![f32::MIN; padded];
        match mask {
            Some(m) => bias[..l].copy_from_slice(m),
            None => bias[..l].fill(0.0),
        }
        bias
    }

    /// Scores, scale, mask, softmax and value product for the query rows
    /// `first_row..first_row + out.len() / hidden` of one sequence, all heads.
    #[inline(always)]
    pub(super) fn attention_rows<const FMA: bool>(
        task: &AttentionTask,
        first_row: usize,
        out: &mut [f32],
    ) {
        attention_rows_with::<FMA, false>(task, first_row, out)
    }

    /// [`attention_rows`], with the AVX-512 inner blocks when `AVX512`.
    #[inline(always)]
    pub(super) fn attention_rows_with<const FMA: bool, const AVX512: bool>(
        task: &AttentionTask,
        first_row: usize,
        out: &mut [f32],
    ) {
        let AttentionTask {
            qkv,
            kt,
            v,
            mask,
            heads,
            l,
            lp,
            d,
            dp,
            scale,
        } = *task;
        let hidden = heads * d;
        let stride = 3 * hidden;
        let rows = out.len() / hidden;
        let bias = key_bias(mask, l, lp);
        let mut q = vec![[0f32; R]; d];
        let mut s = vec![0f32; R * lp];
        let mut inv = [0f32; R];
        for h in 0..heads {
            let kt = &kt[h * d * lp..(h + 1) * d * lp];
            let v = &v[h * l * dp..(h + 1) * l * dp];
            for g in (0..rows).step_by(R) {
                let valid = R.min(rows - g);
                // Q rows of this group, transposed and pre-scaled; missing rows repeat the
                // last one (computed, never written).
                for r in 0..R {
                    let i = first_row + g + r.min(valid - 1);
                    let src = &qkv[i * stride + h * d..i * stride + h * d + d];
                    for (qd, x) in q.iter_mut().zip(src) {
                        qd[r] = x * scale;
                    }
                }
                // S = Q·Kᵀ + mask, W keys at a time with R×W accumulators.
                let mut acc = [[0f32; W]; R];
                let queries = Lhs {
                    data: q.as_flattened(),
                    len: d,
                    step: R,
                    lane: 1,
                };
                for jb in (0..lp).step_by(W) {
                    outer_block::<FMA, AVX512>(&queries, kt, lp, jb, &mut acc);
                    let b: &[f32; W] = bias[jb..jb + W].try_into().unwrap();
                    for r in 0..R {
                        let dst: &mut [f32; W] =
                            (&mut s[r * lp + jb..r * lp + jb + W]).try_into().unwrap();
                        for t in 0..W {
                            dst[t] = acc[r][t] + b[t];
                        }
                    }
                }
                // Softmax of each row, left unnormalised in place (the padding past l has
                // weight 0); each row's 1 / sum scales its context once it is summed, rather
                // than every weight.
                for (r, inv) in inv.iter_mut().enumerate() {
                    let row = &mut s[r * lp..(r + 1) * lp];
                    let m = max(row);
                    for x in row.iter_mut() {
                        *x = exp::<FMA>(*x - m);
                    }
                    *inv = 1.0 / sum(row);
                }
                // Context = P·V, W output columns at a time, P read row-major from `s`.
                let weights = Lhs {
                    data: &s,
                    len: l,
                    step: 1,
                    lane: lp,
                };
                for db in (0..dp).step_by(W) {
                    outer_block::<FMA, AVX512>(&weights, v, dp, db, &mut acc);
                    let width = W.min(d - db);
                    for (r, a) in acc.iter().enumerate().take(valid) {
                        let o = (g + r) * hidden + h * d + db;
                        for (o, a) in out[o..o + width].iter_mut().zip(a) {
                            *o = a * inv[r];
                        }
                    }
                }
            }
        }
    }

    /// [`attention_rows`] with both products in bf16 on AMX tiles: `Q·Kᵀ` from the queries'
    /// rows against the head's packed keys, then the unnormalised softmax in f32 rounded to
    /// bf16 against its packed values. Scores, mask, softmax and the final scaling stay f32.
    #[inline(always)]
    pub(super) fn attention_rows_tiles<const FMA: bool>(
        task: &TileTask,
        first_row: usize,
        out: &mut [f32],
    ) {
        let TileTask {
            amx,
            qkv,
            keys,
            values,
            mask,
            heads,
            l,
            d,
            scale,
        } = *task;
        let hidden = heads * d;
        let stride = 3 * hidden;
        let rows = out.len() / hidden;
        let (Some(k0), Some(v0)) = (keys.first(), values.first()) else {
            return;
        };
        let (np, dnp) = (k0.padded_n(), v0.padded_n());
        let bias = key_bias(mask, l, np);
        let mut lines = Vec::new();
        let mut s = vec![0f32; rows * np];
        let mut context = vec![0f32; rows * dnp];
        let mut inv = vec![0f32; rows];
        for (h, (keys, values)) in keys.iter().zip(values).enumerate() {
            let queries = &qkv[first_row * stride + h * d..];
            pack_rows_for(amx, queries, stride, rows, keys, &mut lines);
            product_into(amx, &lines, rows, keys, &mut s);
            for (row, inv) in s.chunks_exact_mut(np).zip(inv.iter_mut()) {
                for (x, b) in row.iter_mut().zip(&bias) {
                    *x = fma::<FMA>(*x, scale, *b);
                }
                let m = max(row);
                for x in row.iter_mut() {
                    *x = exp::<FMA>(*x - m);
                }
                *inv = 1.0 / sum_in_halves(row);
            }
            pack_rows_for(amx, &s, np, rows, values, &mut lines);
            product_into(amx, &lines, rows, values, &mut context);
            for (r, inv) in inv.iter().enumerate() {
                let o = &mut out[r * hidden + h * d..r * hidden + (h + 1) * d];
                for (o, c) in o.iter_mut().zip(&context[r * dnp..]) {
                    *o = c * inv;
                }
            }
        }
    }
}

/// What [`generic::pack_head`] needs about one (sequence, head).
pub(crate) struct PackTask<'a> {
    rows: &'a [f32],
    stride: usize,
    k_offset: usize,
    v_offset: usize,
    l: usize,
    lp: usize,
    d: usize,
    dp: usize,
}

/// What [`generic::attention_rows`] needs about one sequence.
pub(crate) struct AttentionTask<'a> {
    /// The sequence's QKV rows, (L, 3·hidden).
    qkv: &'a [f32],
    /// Its keys per head, (heads, d, lp).
    kt: &'a [f32],
    /// Its values per head, (heads, L, dp).
    v: &'a [f32],
    /// Its additive key mask, (L).
    mask: Option<&'a [f32]>,
    heads: usize,
    l: usize,
    lp: usize,
    d: usize,
    dp: usize,
    scale: f32,
}

/// What [`generic::attention_rows_tiles`] needs about one sequence.
pub(crate) struct TileTask<'a> {
    amx: Amx,
    /// The sequence's QKV rows, (L, 3·hidden).
    qkv: &'a [f32],
    /// Its keys per head, `head_dim × L` as the scores' right factor.
    keys: &'a [Bf16Matrix],
    /// Its values per head, `L × head_dim`.
    values: &'a [Bf16Matrix],
    /// Its additive key mask, (L).
    mask: Option<&'a [f32]>,
    heads: usize,
    l: usize,
    d: usize,
    scale: f32,
}

/// `dst (m×n) += lhs (m×k) · rhs (k×n)`, all row-major, on rayon.
fn gemm_f32(dst: &mut [f32], lhs: &[f32], rhs: &[f32], m: usize, k: usize, n: usize) {
    assert!(dst.len() == m * n && lhs.len() == m * k && rhs.len() == k * n);
    if m == 0 || n == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the lengths were checked above, and the strides (row stride = columns, column
    // stride 1) keep every access of an m×k, k×n and m×n row-major matrix inside its slice.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            true,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            1,
            n as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// The contiguous contents of a CPU tensor of element type `T`.
fn contiguous<'a, T: candle_core::WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> candle_core::Result<&'a [T]> {
    let Ok(data) = T::cpu_storage_as_slice(storage) else {
        candle_core::bail!(
            "{what}: expected {}, got {:?}",
            T::DTYPE.as_str(),
            candle_core::backend::BackendStorage::dtype(storage)
        )
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{what}: expected a contiguous tensor"),
    }
}

/// The flat f32 contents of a tensor.
fn to_vec(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()
}

/// A LayerNorm's parameters.
#[derive(Debug, Clone)]
pub(crate) struct NormParams {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl NormParams {
    pub(crate) fn from_layer_norm(
        norm: &candle_nn::LayerNorm,
        eps: f64,
    ) -> candle_core::Result<Self> {
        let gamma = to_vec(norm.weight())?;
        let beta = match norm.bias() {
            Some(b) => to_vec(b)?,
            None => vec![0.0; gamma.len()],
        };
        Ok(Self {
            gamma,
            beta,
            eps: eps as f32,
        })
    }
}

/// What a [`FusedLinear`] does to its output rows after the GEMM.
#[derive(Debug, Clone)]
pub(crate) enum Epilogue {
    /// Nothing: `x·Wᵀ + b`.
    None,
    /// An activation: `act(x·Wᵀ + b)`.
    Activation(Activation),
    /// `LayerNorm(x·Wᵀ + b + residual)`; the residual is the op's second input.
    ResidualNorm(NormParams),
}

/// The number format of a [`FusedLinear`]'s weights and products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinearFormat {
    /// f32 weights, f32 products (`gemm`).
    F32,
    /// int8 weights per output column, activations quantized per row to u8, i32 products
    /// (see [`super::quant`]).
    Int8,
    /// bf16 weights and activations, f32 products on AMX tiles (see [`super::amx`]); only
    /// where [`Amx::detect`] found them.
    Bf16,
}

/// Why `--dtype bf16` cannot run here, in one line.
pub(crate) const BF16_NEEDS_AMX: &str = "bf16 on the cpu needs AMX (Intel Xeon since Sapphire \
    Rapids, Linux), which this CPU or OS does not offer; use f32, int8 or auto";

/// A linear layer's weights in the format its products run in.
#[derive(Debug, Clone)]
enum LinearWeights {
    /// Transposed, k×n.
    F32(Vec<f32>),
    Int8(QuantizedMatrix, QuantIsa),
    Bf16(Bf16Matrix, Amx),
}

/// A linear layer `x·Wᵀ + b` with its epilogue, weights stored transposed (k×n) at load.
#[derive(Debug, Clone)]
pub(crate) struct FusedLinear {
    k: usize,
    n: usize,
    weights: LinearWeights,
    bias: Vec<f32>,
    epilogue: Epilogue,
    isa: Isa,
}

impl FusedLinear {
    /// From a candle `Linear` (weight n×k, optional bias n), with its products in `format`.
    pub(crate) fn new(
        linear: &candle_nn::Linear,
        epilogue: Epilogue,
        isa: Isa,
        format: LinearFormat,
    ) -> candle_core::Result<Self> {
        let (n, k) = linear.weight().dims2()?;
        let w_t = to_vec(&linear.weight().t()?.contiguous()?)?;
        let weights = match format {
            LinearFormat::F32 => LinearWeights::F32(w_t),
            LinearFormat::Int8 => {
                LinearWeights::Int8(QuantizedMatrix::quantize(&w_t, k, n)?, isa.int8())
            }
            LinearFormat::Bf16 => match Amx::detect() {
                Some(amx) => LinearWeights::Bf16(Bf16Matrix::pack(&w_t, k, n)?, amx),
                None => candle_core::bail!("{}", BF16_NEEDS_AMX),
            },
        };
        let bias = match linear.bias() {
            Some(b) => to_vec(b)?,
            None => vec![0.0; n],
        };
        if bias.len() != n {
            candle_core::bail!("linear bias has {} values for {n} outputs", bias.len());
        }
        if let Epilogue::ResidualNorm(p) = &epilogue {
            if p.gamma.len() != n || p.beta.len() != n {
                candle_core::bail!("LayerNorm of {} for {n} outputs", p.gamma.len());
            }
        }
        Ok(Self {
            k,
            n,
            weights,
            bias,
            epilogue,
            isa,
        })
    }

    /// This f32 layer with its products in int8, smoothed for inputs whose largest magnitudes
    /// are `input_amax` (measured on calibration text): input `kk` gets the SmoothQuant factor
    /// `amax(x_kk)^α / amax(w_kk)^(1-α)`. An input never seen active keeps factor 1.
    pub(crate) fn smoothed_int8(
        &self,
        input_amax: &[f32],
        alpha: f32,
    ) -> candle_core::Result<Self> {
        let LinearWeights::F32(w_t) = &self.weights else {
            candle_core::bail!("int8 smoothing needs the layer's f32 weights");
        };
        if input_amax.len() != self.k {
            candle_core::bail!(
                "int8 smoothing: {} maxima for {} inputs",
                input_amax.len(),
                self.k
            );
        }
        let factors: Vec<f32> = input_amax
            .iter()
            .zip(w_t.chunks_exact(self.n))
            .map(|(&a, row)| {
                let w = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let f = a.powf(alpha) / w.powf(1.0 - alpha);
                if f.is_finite() && f > 0.0 {
                    f
                } else {
                    1.0
                }
            })
            .collect();
        let q = QuantizedMatrix::quantize_smoothed(w_t, self.k, self.n, &factors)?;
        Ok(Self {
            k: self.k,
            n: self.n,
            weights: LinearWeights::Int8(q, self.isa.int8()),
            bias: self.bias.clone(),
            epilogue: self.epilogue.clone(),
            isa: self.isa,
        })
    }

    fn out_shape(&self, layout: &Layout) -> candle_core::Result<(usize, Shape)> {
        let dims = layout.dims();
        match dims.last() {
            Some(&k) if k == self.k => {}
            _ => candle_core::bail!("fused linear: input {dims:?}, expected last dim {}", self.k),
        }
        let m = dims[..dims.len() - 1].iter().product();
        let mut out = dims.to_vec();
        *out.last_mut().expect("non-empty") = self.n;
        Ok((m, Shape::from(out)))
    }

    fn run(&self, x: &[f32], m: usize, residual: Option<&[f32]>) -> Vec<f32> {
        let n = self.n;
        let isa = self.isa;
        let finish = |rows: &mut [f32]| match &self.epilogue {
            Epilogue::None => {}
            Epilogue::Activation(a) => dispatch!(isa, activate(rows, *a)),
            Epilogue::ResidualNorm(p) => {
                dispatch!(isa, layer_norm_rows(rows, &p.gamma, &p.beta, p.eps))
            }
        };
        match &self.weights {
            LinearWeights::F32(w_t) => {
                // gemm adds onto the output, so it starts as the bias (and residual).
                let mut out = Vec::with_capacity(m * n);
                match residual {
                    Some(res) => {
                        for row in res.chunks_exact(n) {
                            out.extend(row.iter().zip(&self.bias).map(|(r, b)| r + b));
                        }
                    }
                    None => (0..m).for_each(|_| out.extend_from_slice(&self.bias)),
                }
                gemm_f32(&mut out, x, w_t, m, self.k, n);
                if !matches!(self.epilogue, Epilogue::None) {
                    out.par_chunks_mut(EPILOGUE_ROWS * n).for_each(finish);
                }
                out
            }
            // The int8 product runs in tasks of whole rows, each of which sets up its rows and
            // applies the epilogue while they are in its core's cache, rather than in passes
            // of their own over the whole output.
            LinearWeights::Int8(w, isa) => {
                let hooks = RowHooks {
                    bias: &self.bias,
                    residual,
                    finish,
                };
                gemm_int8_rows(*isa, x, w, &hooks)
            }
            // As int8: tasks of whole rows, each finished while in its core's cache.
            LinearWeights::Bf16(w, amx) => {
                let hooks = RowHooks {
                    bias: &self.bias,
                    residual,
                    finish,
                };
                gemm_bf16_rows(*amx, x, w, &hooks)
            }
        }
    }
}

impl CustomOp1 for FusedLinear {
    fn name(&self) -> &'static str {
        "decide-fused-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        if matches!(self.epilogue, Epilogue::ResidualNorm(_)) {
            candle_core::bail!("fused linear: the residual epilogue needs the residual input");
        }
        let (m, shape) = self.out_shape(l)?;
        let x = contiguous::<f32>(s, l, "fused linear input")?;
        Ok((CpuStorage::F32(self.run(x, m, None)), shape))
    }
}

impl CustomOp2 for FusedLinear {
    fn name(&self) -> &'static str {
        "decide-fused-linear-residual"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if !matches!(self.epilogue, Epilogue::ResidualNorm(_)) {
            candle_core::bail!("fused linear: a residual input without the residual epilogue");
        }
        let (m, shape) = self.out_shape(l1)?;
        if l2.dims() != shape.dims() {
            candle_core::bail!(
                "fused linear: residual {:?}, expected {:?}",
                l2.dims(),
                shape.dims()
            );
        }
        let x = contiguous::<f32>(s1, l1, "fused linear input")?;
        let res = contiguous::<f32>(s2, l2, "fused linear residual")?;
        Ok((CpuStorage::F32(self.run(x, m, Some(res))), shape))
    }
}

/// Multi-head self-attention over fused QKV rows (B, L, 3·hidden) → context (B, L, hidden);
/// the optional second input is the additive key mask (B·L values, e.g. (B, 1, 1, L)).
#[derive(Debug, Clone)]
pub(crate) struct FusedAttention {
    heads: usize,
    head_dim: usize,
    isa: Isa,
    /// Where the products run in bf16 on AMX tiles (a bf16 layer's attention).
    tiles: Option<Amx>,
}

impl FusedAttention {
    /// Attention over `heads` heads of `head_dim`, in f32, or with its two products in bf16
    /// on `tiles`.
    pub(crate) fn new(heads: usize, head_dim: usize, isa: Isa, tiles: Option<Amx>) -> Self {
        Self {
            heads,
            head_dim,
            isa,
            tiles,
        }
    }

    fn run(
        &self,
        qkv: &[f32],
        layout: &Layout,
        mask: Option<&[f32]>,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let hidden = self.heads * self.head_dim;
        let (b, l) = match layout.dims() {
            &[b, l, w] if w == 3 * hidden => (b, l),
            dims => candle_core::bail!(
                "fused attention: qkv {dims:?}, expected (B, L, {})",
                3 * hidden
            ),
        };
        if let Some(m) = mask {
            if m.len() != b * l {
                candle_core::bail!("fused attention: mask of {} values for {b}×{l}", m.len());
            }
        }
        let segments: Vec<(usize, usize)> = (0..b).map(|i| (i * l, l)).collect();
        let out = self.run_segments(qkv, &segments, mask)?;
        Ok((CpuStorage::F32(out), Shape::from((b, l, hidden))))
    }

    /// Attention within each segment `(first row, rows)` of the QKV rows, which lie back to
    /// back: the segments are the sequences, and no row attends outside its own. The mask,
    /// when given, holds one additive value per row. Rows outside every segment stay zero.
    fn run_segments(
        &self,
        qkv: &[f32],
        segments: &[(usize, usize)],
        mask: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        let (heads, d) = (self.heads, self.head_dim);
        let hidden = heads * d;
        let rows = qkv.len() / (3 * hidden).max(1);
        let mut end = 0;
        for &(start, len) in segments {
            if start < end || start + len > rows {
                candle_core::bail!(
                    "fused attention: segment {start}..{} outside or overlapping the {rows} rows",
                    start + len
                );
            }
            end = start + len;
        }
        // Each sequence's output rows, split off in order so that sequences run in parallel.
        let mut out = vec![0f32; rows * hidden];
        let mut parts = Vec::with_capacity(segments.len());
        let mut rest: &mut [f32] = &mut out;
        let mut at = 0;
        for &(start, len) in segments {
            let (_, tail) = rest.split_at_mut((start - at) * hidden);
            let (part, tail) = tail.split_at_mut(len * hidden);
            parts.push(part);
            rest = tail;
            at = start + len;
        }
        segments
            .par_iter()
            .zip(parts)
            .for_each(|(&(start, l), out)| {
                if l == 0 || d == 0 {
                    return;
                }
                let rows = &qkv[start * 3 * hidden..(start + l) * 3 * hidden];
                let mask = mask.map(|m| &m[start..start + l]);
                match self.tiles {
                    Some(amx) => self.sequence_on_tiles(amx, rows, mask, out),
                    None => self.sequence(rows, mask, out),
                }
            });
        Ok(out)
    }

    /// One sequence's attention (its QKV rows, (L, 3·hidden)) into its output rows, in f32.
    fn sequence(&self, rows: &[f32], mask: Option<&[f32]>, out: &mut [f32]) {
        let (heads, d, isa) = (self.heads, self.head_dim, self.isa);
        let hidden = heads * d;
        let l = rows.len() / (3 * hidden);
        let (lp, dp) = (round_up(l, W), round_up(d, W));
        // Keys transposed and values padded, per head, in parallel.
        let mut kt = vec![0f32; heads * d * lp];
        let mut v = vec![0f32; heads * l * dp];
        kt.par_chunks_mut(d * lp)
            .zip(v.par_chunks_mut(l * dp))
            .enumerate()
            .for_each(|(h, (kt, v))| {
                let task = PackTask {
                    rows,
                    stride: 3 * hidden,
                    k_offset: hidden + h * d,
                    v_offset: 2 * hidden + h * d,
                    l,
                    lp,
                    d,
                    dp,
                };
                dispatch!(isa, pack_head(&task, kt, v));
            });
        let task = AttentionTask {
            qkv: rows,
            kt: &kt,
            v: &v,
            mask,
            heads,
            l,
            lp,
            d,
            dp,
            scale: 1.0 / (d as f32).sqrt(),
        };
        out.par_chunks_mut(ROWS_PER_TASK * hidden)
            .enumerate()
            .for_each(|(block, out)| {
                dispatch!(isa, attention_rows(&task, block * ROWS_PER_TASK, out))
            });
    }

    /// [`Self::sequence`] with the products in bf16 on AMX tiles: each head's keys and values
    /// packed once as the tiles read them, in parallel, then the query rows in blocks.
    fn sequence_on_tiles(&self, amx: Amx, rows: &[f32], mask: Option<&[f32]>, out: &mut [f32]) {
        let (heads, d, isa) = (self.heads, self.head_dim, self.isa);
        let hidden = heads * d;
        let stride = 3 * hidden;
        let l = rows.len() / stride;
        let (keys, values): (Vec<_>, Vec<_>) = (0..heads)
            .into_par_iter()
            .map(|h| {
                (
                    Bf16Matrix::from_columns(amx, &rows[hidden + h * d..], stride, d, l),
                    Bf16Matrix::from_rows(amx, &rows[2 * hidden + h * d..], stride, l, d),
                )
            })
            .unzip();
        let task = TileTask {
            amx,
            qkv: rows,
            keys: &keys,
            values: &values,
            mask,
            heads,
            l,
            d,
            scale: 1.0 / (d as f32).sqrt(),
        };
        out.par_chunks_mut(ROWS_PER_TASK * hidden)
            .enumerate()
            .for_each(|(block, out)| {
                dispatch!(isa, attention_rows_tiles(&task, block * ROWS_PER_TASK, out))
            });
    }

    /// This attention over packed sequences: see [`PackedAttention`].
    pub(crate) fn packed<'a>(&'a self, segments: &'a [(usize, usize)]) -> PackedAttention<'a> {
        PackedAttention {
            attention: self,
            segments,
        }
    }
}

/// [`FusedAttention`] over a packed batch: the sequences lie back to back in one (1, T, 3·hidden)
/// QKV tensor with no padding, and `segments` says where each begins and how long it is. A
/// batch of a 150-token conversation and its 15-token last message costs 165 rows instead of
/// 300, and no GEMM of the layer sees a padding row.
pub(crate) struct PackedAttention<'a> {
    attention: &'a FusedAttention,
    segments: &'a [(usize, usize)],
}

impl CustomOp1 for PackedAttention<'_> {
    fn name(&self) -> &'static str {
        "decide-fused-attention-packed"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = contiguous::<f32>(s, l, "fused attention qkv")?;
        let hidden = self.attention.heads * self.attention.head_dim;
        let t = match l.dims() {
            &[1, t, w] if w == 3 * hidden => t,
            dims => candle_core::bail!(
                "packed attention: qkv {dims:?}, expected (1, T, {})",
                3 * hidden
            ),
        };
        let out = self.attention.run_segments(qkv, self.segments, None)?;
        Ok((CpuStorage::F32(out), Shape::from((1, t, hidden))))
    }
}

impl CustomOp1 for FusedAttention {
    fn name(&self) -> &'static str {
        "decide-fused-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = contiguous::<f32>(s, l, "fused attention qkv")?;
        self.run(qkv, l, None)
    }
}

impl CustomOp2 for FusedAttention {
    fn name(&self) -> &'static str {
        "decide-fused-attention-masked"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = contiguous::<f32>(s1, l1, "fused attention qkv")?;
        let mask = contiguous::<f32>(s2, l2, "fused attention mask")?;
        self.run(qkv, l1, Some(mask))
    }
}

/// Word + token-type + position embeddings and their LayerNorm, in one op over
/// (ids, type ids, positions), each (B, L) u32.
#[derive(Debug, Clone)]
pub(crate) struct FusedEmbeddings {
    hidden: usize,
    words: WordTable,
    types: Vec<f32>,
    positions: Vec<f32>,
    norm: NormParams,
    isa: Isa,
}

/// The word embeddings: most of a small encoder's weights (11.7 M of MiniLM's 22.7 M), so the
/// int8 model keeps them in int8 too, one symmetric scale per row, dequantized as rows are
/// gathered.
#[derive(Debug, Clone)]
enum WordTable {
    F32(Vec<f32>),
    Int8 { values: Vec<i8>, scales: Vec<f32> },
}

impl FusedEmbeddings {
    /// The op over these tables; `format` int8 stores the word embeddings in int8.
    pub(crate) fn new(
        words: &Tensor,
        types: &Tensor,
        positions: &Tensor,
        norm: NormParams,
        isa: Isa,
        format: LinearFormat,
    ) -> candle_core::Result<Self> {
        let hidden = words.dim(1)?;
        if types.dim(1)? != hidden || positions.dim(1)? != hidden || norm.gamma.len() != hidden {
            candle_core::bail!("embedding tables of different widths");
        }
        let table = to_vec(words)?;
        let words = match format {
            // bf16 is for the products: a gathered f32 row costs nothing to keep exact.
            LinearFormat::F32 | LinearFormat::Bf16 => WordTable::F32(table),
            LinearFormat::Int8 => {
                let (values, scales) = quantize_table_rows(&table, hidden)?;
                WordTable::Int8 { values, scales }
            }
        };
        Ok(Self {
            hidden,
            words,
            types: to_vec(types)?,
            positions: to_vec(positions)?,
            norm,
            isa,
        })
    }
}

impl CustomOp3 for FusedEmbeddings {
    fn name(&self) -> &'static str {
        "decide-fused-embeddings"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let ids = contiguous::<u32>(s1, l1, "token ids")?;
        let types = contiguous::<u32>(s2, l2, "token type ids")?;
        let positions = contiguous::<u32>(s3, l3, "positions")?;
        if types.len() != ids.len() || positions.len() != ids.len() {
            candle_core::bail!("embeddings: ids, type ids and positions differ in length");
        }
        let h = self.hidden;
        let table_rows = |len: usize, i: u32, what: &str| {
            let start = i as usize * h;
            if start + h > len {
                candle_core::bail!("{what} {i} is out of range ({} rows)", len / h);
            }
            Ok(start..start + h)
        };
        let table = |t: &[f32], i: u32, what: &str| table_rows(t.len(), i, what);
        let mut out = vec![0f32; ids.len() * h];
        for (t, row) in out.chunks_exact_mut(h).enumerate() {
            let ty = table(&self.types, types[t], "token type id")?;
            let p = table(&self.positions, positions[t], "position")?;
            let rest = self.types[ty].iter().zip(&self.positions[p]);
            match &self.words {
                WordTable::F32(words) => {
                    let w = table(words, ids[t], "token id")?;
                    for (o, (a, (b, c))) in row.iter_mut().zip(words[w].iter().zip(rest)) {
                        *o = a + b + c;
                    }
                }
                WordTable::Int8 { values, scales } => {
                    let w = table_rows(values.len(), ids[t], "token id")?;
                    let scale = scales[ids[t] as usize];
                    for (o, (a, (b, c))) in row.iter_mut().zip(values[w].iter().zip(rest)) {
                        *o = *a as f32 * scale + b + c;
                    }
                }
            }
        }
        let isa = self.isa;
        let n = &self.norm;
        out.par_chunks_mut(EPILOGUE_ROWS * h)
            .for_each(|rows| dispatch!(isa, layer_norm_rows(rows, &n.gamma, &n.beta, n.eps)));
        let mut shape = l1.dims().to_vec();
        shape.push(h);
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Module, Tensor, D};
    use candle_nn::{Embedding, LayerNorm, Linear};

    use super::*;

    /// Every level this CPU runs: the detected one and all below it.
    fn levels() -> Vec<Isa> {
        let best = Isa::detect();
        let mut out = vec![best];
        for cap in [IsaCap::AvxVnni, IsaCap::Avx2, IsaCap::Portable] {
            let isa = best.capped(cap);
            if !out.contains(&isa) {
                out.push(isa);
            }
        }
        out
    }

    /// Every level, each without tiles and, where the CPU has AMX, with them (the attention of
    /// a bf16 layer).
    fn levels_and_tiles() -> Vec<(Isa, Option<Amx>)> {
        let mut out: Vec<_> = levels().into_iter().map(|isa| (isa, None)).collect();
        match Amx::detect() {
            Some(amx) => out.extend(levels().into_iter().map(|isa| (isa, Some(amx)))),
            None => eprintln!("attention on AMX tiles: skipped, this CPU has no AMX bf16"),
        }
        out
    }

    fn randn(shape: &[usize]) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap()
    }

    /// Largest |a - b| / (1 + |b|) over all elements.
    fn max_err(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        a.iter()
            .zip(&b)
            .map(|(x, y)| {
                assert!(x.is_finite(), "non-finite output {x}");
                (x - y).abs() / (1.0 + y.abs())
            })
            .fold(0.0, f32::max)
    }

    fn norm(n: usize) -> (LayerNorm, NormParams) {
        let gamma = randn(&[n]).affine(0.3, 1.0).unwrap();
        let beta = (randn(&[n]) * 0.1).unwrap();
        let ln = LayerNorm::new(gamma, beta, 1e-12);
        let p = NormParams::from_layer_norm(&ln, 1e-12).unwrap();
        (ln, p)
    }

    // Shapes with tails: nothing here is a multiple of the vector width except the real
    // MiniLM widths.
    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 19),
        (40, 384, 1152),
        (9, 1536, 384),
        (130, 384, 384),
    ];

    #[test]
    fn exp_and_erf_are_accurate() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.05;
            let want = (x as f64).exp();
            let got = generic::exp::<false>(x) as f64;
            if x > 88.0 {
                // Clamped below f32's overflow at 88.72: large and finite.
                assert!(got.is_finite() && got > 1e38, "exp({x}) = {got}");
            } else if x >= -87.0 {
                assert!(
                    (got - want).abs() <= 3e-7 * want,
                    "exp({x}) = {got}, want {want}"
                );
            } else {
                assert_eq!(got, 0.0);
            }
        }
        assert_eq!(generic::exp::<false>(f32::MIN), 0.0);
        assert_eq!(generic::exp::<false>(f32::NEG_INFINITY), 0.0);
        let x: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.02).collect();
        let t = Tensor::new(x.as_slice(), &Device::Cpu).unwrap();
        let want = t.gelu_erf().unwrap().to_vec1::<f32>().unwrap();
        let mut got = x.clone();
        generic::activate::<false>(&mut got, Activation::Gelu);
        for ((g, w), x) in got.iter().zip(&want).zip(&x) {
            assert!((g - w).abs() < 2e-6, "gelu({x}) = {g}, want {w}");
        }
    }

    #[test]
    fn linear_with_each_epilogue_matches_candle() {
        for isa in levels() {
            for &(m, k, n) in &SHAPES {
                let w = (randn(&[n, k]) * (1.0 / (k as f64).sqrt())).unwrap();
                let b = randn(&[n]);
                let linear = Linear::new(w, Some(b));
                let x = randn(&[1, m, k]);
                let plain = linear.forward(&x).unwrap();

                let op = FusedLinear::new(&linear, Epilogue::None, isa, LinearFormat::F32).unwrap();
                let err = max_err(&x.apply_op1_no_bwd(&op).unwrap(), &plain);
                assert!(err < 1e-5, "{isa:?} {m}x{k}x{n} linear: {err}");

                for (act, want) in [
                    (Activation::Gelu, plain.gelu_erf().unwrap()),
                    (Activation::GeluTanh, plain.gelu().unwrap()),
                    (Activation::Relu, plain.relu().unwrap()),
                ] {
                    let op = FusedLinear::new(
                        &linear,
                        Epilogue::Activation(act),
                        isa,
                        LinearFormat::F32,
                    )
                    .unwrap();
                    let err = max_err(&x.apply_op1_no_bwd(&op).unwrap(), &want);
                    assert!(err < 1e-5, "{isa:?} {m}x{k}x{n} {act:?}: {err}");
                }

                let residual = randn(&[1, m, n]);
                let (ln, p) = norm(n);
                let want = ln.forward(&(&plain + &residual).unwrap()).unwrap();
                let op =
                    FusedLinear::new(&linear, Epilogue::ResidualNorm(p), isa, LinearFormat::F32)
                        .unwrap();
                let got = x.apply_op2_no_bwd(&residual, &op).unwrap();
                let err = max_err(&got, &want);
                // A row of one value normalizes to beta exactly in both; otherwise the
                // variance of a near-constant row amplifies rounding: 1e-4 is still tight.
                assert!(err < 1e-4, "{isa:?} {m}x{k}x{n} residual+norm: {err}");
            }
        }
    }

    /// Root-mean-square of `a - b` over that of `b`.
    fn rms_err(a: &Tensor, b: &Tensor) -> f32 {
        let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let diff: f32 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
        let base: f32 = b.iter().map(|y| y * y).sum();
        (diff / base.max(1e-30)).sqrt()
    }

    /// `format`'s products against f32's, with each epilogue, at every instruction-set level:
    /// within `rms_bound` of the output's size and `max_bound` anywhere.
    fn close_to_f32(
        format: LinearFormat,
        shapes: &[(usize, usize, usize)],
        rms_bound: f32,
        max_bound: f32,
    ) {
        for isa in levels() {
            for &(m, k, n) in shapes {
                let w = (randn(&[n, k]) * (1.0 / (k as f64).sqrt())).unwrap();
                let linear = Linear::new(w, Some(randn(&[n])));
                let x = randn(&[1, m, k]);
                let residual = randn(&[1, m, n]);
                let (_, p) = norm(n);
                for epilogue in [
                    Epilogue::None,
                    Epilogue::Activation(Activation::Gelu),
                    Epilogue::ResidualNorm(p),
                ] {
                    let run = |format| {
                        let op = FusedLinear::new(&linear, epilogue.clone(), isa, format).unwrap();
                        match epilogue {
                            Epilogue::ResidualNorm(_) => x.apply_op2_no_bwd(&residual, &op),
                            _ => x.apply_op1_no_bwd(&op),
                        }
                        .unwrap()
                    };
                    let (got, want) = (run(format), run(LinearFormat::F32));
                    let (rms, max) = (rms_err(&got, &want), max_err(&got, &want));
                    assert!(
                        rms < rms_bound && max < max_bound,
                        "{isa:?} {format:?} {m}x{k}x{n} {epilogue:?}: rms {rms}, max {max}"
                    );
                }
            }
        }
    }

    #[test]
    fn int8_linear_with_each_epilogue_is_close_to_f32() {
        // Two 8-bit roundings (weights per column, inputs per row) of near-normal values: about
        // 1% of the output, never a gross error anywhere.
        close_to_f32(LinearFormat::Int8, &SHAPES, 0.03, 0.15);
    }

    #[test]
    fn bf16_linear_with_each_epilogue_is_close_to_f32() {
        if Amx::detect().is_none() {
            eprintln!("bf16_linear_with_each_epilogue_is_close_to_f32: skipped, no AMX here");
            let linear = Linear::new(randn(&[4, 3]), None);
            let err = FusedLinear::new(&linear, Epilogue::None, Isa::detect(), LinearFormat::Bf16)
                .unwrap_err()
                .to_string();
            assert!(err.contains("needs AMX"), "{err}");
            return;
        }
        // The model's widths with m = 1, 7, 33, 100 rows, and tails of k and n. Inputs and
        // weights rounded to 8-bit mantissas (2^-9 relative each), summed in f32: about 3e-3 of
        // the output, 1e-2 at most anywhere.
        let shapes = [
            (1, 384, 1152),
            (7, 384, 1536),
            (33, 1536, 384),
            (100, 384, 384),
            (17, 33, 19),
            (3, 5, 7),
        ];
        close_to_f32(LinearFormat::Bf16, &shapes, 1e-2, 2e-2);
    }

    #[test]
    fn linear_refuses_bad_inputs_with_errors() {
        let linear = Linear::new(randn(&[4, 3]), None);
        let op =
            FusedLinear::new(&linear, Epilogue::None, Isa::portable(), LinearFormat::F32).unwrap();
        let err = randn(&[2, 5])
            .apply_op1_no_bwd(&op)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected last dim 3"), "{err}");
        let transposed = randn(&[3, 2]).t().unwrap();
        let err = transposed.apply_op1_no_bwd(&op).unwrap_err().to_string();
        assert!(err.contains("contiguous"), "{err}");
    }

    /// The attention of the stock layer, op for op.
    fn stock_attention(qkv: &Tensor, bias: Option<&Tensor>, heads: usize, d: usize) -> Tensor {
        let (b, l, _) = qkv.dims3().unwrap();
        let qkv = qkv
            .reshape((b, l, 3, heads, d))
            .unwrap()
            .permute((2, 0, 3, 1, 4))
            .unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let q = (qkv.get(0).unwrap().contiguous().unwrap() * scale).unwrap();
        let k = qkv.get(1).unwrap().contiguous().unwrap();
        let v = qkv.get(2).unwrap().contiguous().unwrap();
        let mut scores = q.matmul(&k.t().unwrap()).unwrap();
        if let Some(bias) = bias {
            scores = scores.broadcast_add(bias).unwrap();
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores).unwrap();
        probs
            .matmul(&v)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .reshape((b, l, heads * d))
            .unwrap()
    }

    #[test]
    fn attention_matches_candle_with_and_without_mask() {
        let cases = [
            (1, 1, 1, 4),
            (2, 5, 3, 8),
            (3, 17, 2, 20),
            (2, 40, 12, 32),
            (1, 130, 4, 64),
            (4, 33, 1, 3),
        ];
        for (isa, tiles) in levels_and_tiles() {
            // bf16's rounding of Q, K, V and the softmax, 2^-9 of each, moves these outputs
            // (magnitude 2, from sharp softmaxes) by up to 0.06; the rounding itself is checked
            // exactly in `tile_attention_is_the_rounded_attention`.
            let tol = if tiles.is_some() { 0.15 } else { 1e-5 };
            for &(b, l, heads, d) in &cases {
                let qkv = (randn(&[b, l, 3 * heads * d]) * 2.0).unwrap();
                let op = FusedAttention::new(heads, d, isa, tiles);
                let want = stock_attention(&qkv, None, heads, d);
                let err = max_err(&qkv.apply_op1_no_bwd(&op).unwrap(), &want);
                assert!(
                    err < tol,
                    "{isa:?} {tiles:?} b{b} l{l} h{heads} d{d}: {err}"
                );
                // The tiles run, rounding: not the f32 sums.
                assert!(tiles.is_none() || l < 17 || err > 1e-5, "{l} {d}: {err}");

                // Padding at the end of every row but the first, as the batches have it.
                let mut mask = vec![0f32; b * l];
                for row in 1..b {
                    let n = 1 + (row * 7) % l;
                    mask[row * l + n..(row + 1) * l].fill(f32::MIN);
                }
                let mask = Tensor::from_vec(mask, (b, 1, 1, l), &Device::Cpu).unwrap();
                let want = stock_attention(&qkv, Some(&mask), heads, d);
                let err = max_err(&qkv.apply_op2_no_bwd(&mask, &op).unwrap(), &want);
                assert!(
                    err < tol,
                    "{isa:?} {tiles:?} masked b{b} l{l} h{heads} d{d}: {err}"
                );
            }
        }
    }

    /// The attention of bf16-rounded Q, K and V, with the softmax's weights rounded before
    /// they meet V, in f64: what the tiles compute, but for the order of f32 sums.
    fn rounded_attention(qkv: &[f32], l: usize, heads: usize, d: usize, mask: &[f32]) -> Vec<f32> {
        let r = |x: f32| super::super::amx::rounded(x) as f64;
        let (hidden, b) = (heads * d, qkv.len() / (3 * heads * d * l));
        let at = |s: usize, j: usize, part: usize, h: usize, t: usize| {
            qkv[(s * l + j) * 3 * hidden + part * hidden + h * d + t]
        };
        let mut out = vec![0f32; b * l * hidden];
        for s in 0..b {
            for h in 0..heads {
                for i in 0..l {
                    let scores: Vec<f64> = (0..l)
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|t| r(at(s, i, 0, h, t)) * r(at(s, j, 1, h, t)))
                                .sum();
                            dot / (d as f64).sqrt() + mask[s * l + j] as f64
                        })
                        .collect();
                    let m = scores.iter().fold(f64::MIN, |a, &b| a.max(b));
                    let p: Vec<f32> = scores.iter().map(|x| (x - m).exp() as f32).collect();
                    let sum: f64 = p.iter().map(|&x| x as f64).sum();
                    for t in 0..d {
                        let c: f64 = (0..l).map(|j| r(p[j]) * r(at(s, j, 2, h, t))).sum();
                        out[(s * l + i) * hidden + h * d + t] = (c / sum) as f32;
                    }
                }
            }
        }
        out
    }

    /// The tiles' attention is the attention of the rounded values, to f32 sums: with and
    /// without a mask, over lengths and head widths around the tiles' 32.
    #[test]
    fn tile_attention_is_the_rounded_attention() {
        let Some(amx) = Amx::detect() else {
            eprintln!("tile_attention_is_the_rounded_attention: skipped, this CPU has no AMX");
            return;
        };
        for &(b, l, heads, d) in &[
            (1, 1, 1, 4),
            (2, 17, 2, 20),
            (2, 40, 12, 32),
            (1, 70, 2, 64),
        ] {
            let qkv = (randn(&[b, l, 3 * heads * d]) * 2.0).unwrap();
            let values = qkv.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut mask = vec![0f32; b * l];
            mask[l - l / 3..l].fill(f32::MIN);
            let want = rounded_attention(&values, l, heads, d, &mask);
            let mask = Tensor::from_vec(mask, (b, 1, 1, l), &Device::Cpu).unwrap();
            let op = FusedAttention::new(heads, d, Isa::detect(), Some(amx));
            let got = qkv.apply_op2_no_bwd(&mask, &op).unwrap();
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |e, (g, w)| e.max((g - w).abs()));
            // A weight whose f32 and f64 exponentials round to neighbouring bf16 values moves
            // an output by up to 2^-9 of it times a value (up to 8 here): 0.004 has been seen.
            // Without the rounding the distance is 0.04 to 0.06.
            assert!(err < 1e-2, "b{b} l{l} h{heads} d{d}: {err}");
        }
    }

    #[test]
    fn packed_attention_equals_each_sequence_alone() {
        for (isa, tiles) in levels_and_tiles() {
            for (heads, d) in [(1, 3), (2, 8), (12, 32)] {
                let op = FusedAttention::new(heads, d, isa, tiles);
                // Lengths around the kernels' blocks, one of a single row.
                let lengths = [5usize, 1, 17, 40, 16];
                let seqs: Vec<Tensor> = lengths
                    .iter()
                    .map(|&l| (randn(&[1, l, 3 * heads * d]) * 2.0).unwrap())
                    .collect();
                let packed = Tensor::cat(&seqs, 1).unwrap();
                let mut segments = Vec::new();
                let mut at = 0;
                for &l in &lengths {
                    segments.push((at, l));
                    at += l;
                }
                let out = packed.apply_op1_no_bwd(&op.packed(&segments)).unwrap();
                for (seq, &(start, l)) in seqs.iter().zip(&segments) {
                    let alone = seq.apply_op1_no_bwd(&op).unwrap();
                    let err = max_err(&out.narrow(1, start, l).unwrap(), &alone);
                    assert!(err < 1e-6, "{isa:?} {tiles:?} h{heads} d{d} l{l}: {err}");
                }
                // Overlapping or out-of-range segments are errors, never out-of-bounds reads.
                for bad in [vec![(0, 5), (4, 2)], vec![(at - 1, 2)]] {
                    let err = packed.apply_op1_no_bwd(&op.packed(&bad)).unwrap_err();
                    assert!(err.to_string().contains("segment"), "{err}");
                }
            }
        }
    }

    #[test]
    fn embeddings_match_candle() {
        for isa in levels() {
            for (b, l, h) in [(1, 1, 8), (2, 7, 20), (3, 40, 384)] {
                let (vocab, types, positions) = (50usize, 2usize, 64usize);
                let words = Embedding::new(randn(&[vocab, h]), h);
                let ty = Embedding::new(randn(&[types, h]), h);
                let pos = Embedding::new(randn(&[positions, h]), h);
                let (ln, p) = norm(h);
                let ids: Vec<u32> = (0..b * l).map(|i| ((i * 13) % vocab) as u32).collect();
                let tys: Vec<u32> = (0..b * l).map(|i| (i % types) as u32).collect();
                let ps: Vec<u32> = (0..b * l).map(|i| (i % l) as u32).collect();
                let ids = Tensor::from_vec(ids, (b, l), &Device::Cpu).unwrap();
                let tys = Tensor::from_vec(tys, (b, l), &Device::Cpu).unwrap();
                let ps = Tensor::from_vec(ps, (b, l), &Device::Cpu).unwrap();
                let x = (words.forward(&ids).unwrap() + ty.forward(&tys).unwrap()).unwrap();
                let x = (x + pos.forward(&ps).unwrap()).unwrap();
                let want = ln.forward(&x).unwrap();
                let op = FusedEmbeddings::new(
                    words.embeddings(),
                    ty.embeddings(),
                    pos.embeddings(),
                    p.clone(),
                    isa,
                    LinearFormat::F32,
                )
                .unwrap();
                let got = ids.apply_op3_no_bwd(&tys, &ps, &op).unwrap();
                // The int8 word table: within the rounding of one 8-bit step per row.
                let int8 = FusedEmbeddings::new(
                    words.embeddings(),
                    ty.embeddings(),
                    pos.embeddings(),
                    p,
                    isa,
                    LinearFormat::Int8,
                )
                .unwrap();
                let q = ids.apply_op3_no_bwd(&tys, &ps, &int8).unwrap();
                let rms = rms_err(&q, &want);
                assert!(rms < 0.02, "{isa:?} int8 b{b} l{l} h{h}: rms {rms}");
                let err = max_err(&got, &want);
                assert!(err < 1e-5, "{isa:?} b{b} l{l} h{h}: {err}");
                assert_eq!(got.dim(D::Minus1).unwrap(), h);

                let bad = Tensor::new(&[[vocab as u32]], &Device::Cpu).unwrap();
                let zero = Tensor::new(&[[0u32]], &Device::Cpu).unwrap();
                let err = bad
                    .apply_op3_no_bwd(&zero, &zero, &op)
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("token id 50 is out of range"), "{err}");
            }
        }
    }

    #[test]
    fn levels_are_never_raised() {
        let portable = Isa::portable();
        assert_eq!(portable.capped(IsaCap::Best), portable);
        assert_eq!(portable.capped(IsaCap::Avx2), portable);
        assert_eq!(portable.capped(IsaCap::AvxVnni), portable);
        assert!(!Isa::detect().capped(IsaCap::Avx2).int8().is_vnni());
        assert_eq!(Isa::detect().capped(IsaCap::Portable).name(), "portable");
    }
}
