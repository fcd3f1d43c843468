//! int8 matrix products for the CPU: the linear layers of `--dtype int8`.
//!
//! * **Groups.** Inputs are split into groups of [`GROUP`]; each group has its own scales, on
//!   both sides, and its products are dequantized on their own. One scale over a whole row
//!   gives every input the steps the row's largest value needs; groups cut the error of a
//!   MiniLM embedding against f32 by about 2.5 times for one more epilogue per 128 products.
//! * **Weights** are quantized once at load, per output column and group, symmetrically:
//!   column `j` of group `g` is `s_gj · q` with `q ∈ [-127, 127]` and `s_gj = max|w| / 127`.
//!   They are stored packed in panels of [`PANEL`] columns, four consecutive `k` values of a
//!   column side by side, which is the layout `vpdpbusd` reads: one 64-byte load holds four `k`
//!   values of 16 columns. [`QuantizedMatrix::quantize_smoothed`] first moves each input's
//!   range between activations and weights (SmoothQuant).
//! * **Activations** are quantized per row and group at run time, asymmetrically to `u8`:
//!   `a_ig · (u - z_ig)` with `u ∈ [0, 255]`, the range widened to include 0 so that the zero
//!   point `z_ig` is an integer in range. Unsigned activations are what `vpdpbusd` (u8 × i8)
//!   takes, and the asymmetric range gives the mostly positive GELU outputs (FFN down) twice
//!   the resolution a symmetric one would.
//! * **Products** accumulate exactly in i32 per group: `Σ_k u·q`. The zero point comes out with
//!   the weights' column sums per group (`Σ_k (u - z)·q = Σ_k u·q - z·Σ_k q`), computed at
//!   load; each group adds `a_ig · s_gj · (acc - z_ig · colsum_gj)` onto f32 accumulators,
//!   which are added onto output rows that the row block's task first set to the bias (and
//!   residual) and then hands to the layer's epilogue ([`RowHooks`]).
//!
//! No overflow: a product is at most 255 · 127 and `k` is capped at 32,768 at load, so an
//! accumulator stays under 2^31 (`vpdpbusd` sums four products into i32 without saturating).
//!
//! Four kernels compute the same integers: AVX-512 VNNI (`vpdpbusd`, 8 rows × 32 columns of
//! i32 accumulators in registers, dequantized there group by group), AVX-VNNI (the same
//! instruction on 256-bit registers, as the client CPUs without AVX-512 have it: 2 rows × 32
//! columns), AVX2 (`vpmaddwd` on both sides widened to i16, 2 rows × 16 columns), and the
//! portable loop. They are tested against a scalar reference that reads the unpacked weights,
//! exactly.
//!
//! # Safety
//!
//! The `#[target_feature]` functions run only through [`QuantIsa`], whose level is private to
//! this module and is made only by [`QuantIsa::detect`] (after `is_x86_feature_detected!`
//! confirmed every feature the level's functions enable), as the portable level, or by lowering
//! a detected one. The VNNI and AVX2 kernels read through raw pointers; they assert at entry that
//! the activation rows and the weight panel hold everything their loops read.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::amx::{self, Amx};
use super::hooks::RowHooks;

/// Output columns of one packed weight panel: two AVX-512 registers of i32 accumulators.
const PANEL: usize = 32;
/// Rows whose accumulators a kernel call keeps in registers.
const MR: usize = 8;
/// The largest `k` quantized (see the module's note on overflow).
const MAX_K: usize = 32_768;
/// Inputs that share a scale: weights have one per group of `GROUP` inputs and output column,
/// activations one per group and row, and each group's products are dequantized on their own.
/// One scale over a whole row of 1,536 GELU outputs gives every group the steps its largest
/// value needs; groups of 128 cost one more epilogue per 128 products.
const GROUP: usize = 128;

/// Instruction-set levels of the int8 kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

/// The instruction set the int8 kernels run with; only ever as wide as the CPU supports. With
/// AMX (at the AVX-512 VNNI level only), products over whole tile steps of inputs run on tiles
/// ([`amx::int8_block`]) and give the same floats as the VNNI kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuantIsa(Level, Option<Amx>);

impl QuantIsa {
    /// The widest level this CPU runs.
    pub(crate) fn detect() -> QuantIsa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx2")
            {
                return QuantIsa(Level::Avx512Vnni, Amx::detect());
            }
            if has_avx_vnni() {
                return QuantIsa(Level::AvxVnni, None);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return QuantIsa(Level::Avx2, None);
            }
        }
        QuantIsa(Level::Portable, None)
    }

    /// Baseline code, valid on every CPU of the target.
    pub(crate) fn portable() -> QuantIsa {
        QuantIsa(Level::Portable, None)
    }

    /// This level with the products in registers, not on AMX tiles: what a CPU of the same
    /// vector instructions without AMX runs (Xeons before Sapphire Rapids, AMD Zen 4 and 5).
    pub(crate) fn without_amx(self) -> QuantIsa {
        QuantIsa(self.0, None)
    }

    /// This level, lowered to the 256-bit AVX-VNNI kernel if it is above it and the CPU has
    /// AVX-VNNI, else to AVX2 (never raised): what a CPU of this one's 256-bit instructions
    /// without AVX-512 runs.
    pub(crate) fn at_most_avx_vnni(self) -> QuantIsa {
        #[cfg(target_arch = "x86_64")]
        {
            if self.0 >= Level::AvxVnni && has_avx_vnni() {
                return QuantIsa(Level::AvxVnni, None);
            }
        }
        self.at_most_avx2()
    }

    /// This level, lowered to AVX2 if it is above it (never raised).
    pub(crate) fn at_most_avx2(self) -> QuantIsa {
        #[cfg(target_arch = "x86_64")]
        {
            QuantIsa(self.0.min(Level::Avx2), None)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self
        }
    }

    /// Whether the products run on VNNI (`vpdpbusd`, either width): the levels faster than
    /// f32.
    pub(crate) fn is_vnni(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            matches!(self.0, Level::Avx512Vnni | Level::AvxVnni)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The level's name, for reports.
    pub(crate) fn name(self) -> &'static str {
        if self.1.is_some() {
            return "amx";
        }
        match self.0 {
            Level::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::AvxVnni => "avxvnni",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512Vnni => "avx512vnni",
        }
    }
}

/// Whether the CPU runs the AVX-VNNI level: 256-bit `vpdpbusd` (VEX-encoded) and AVX2.
#[cfg(target_arch = "x86_64")]
fn has_avx_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni") && std::arch::is_x86_feature_detected!("avx2")
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// A weight matrix `k × n` quantized per column and packed for the kernels.
#[derive(Debug, Clone)]
pub(crate) struct QuantizedMatrix {
    k: usize,
    n: usize,
    /// `k` rounded up to whole groups of four.
    kp: usize,
    /// `n` rounded up to whole panels.
    np: usize,
    /// Groups of [`GROUP`] inputs (the last may be shorter).
    groups: usize,
    /// Panel `p`, group `g` of four `k` values, column `c`, value `t` at
    /// `((p·kp/4 + g)·PANEL + c)·4 + t`; zero past `k` and past `n`.
    packed: Vec<i8>,
    /// `s_gj` of group `g` and column `j` at `g·np + j` (zero past n).
    scales: Vec<f32>,
    /// `Σ_{k in g} q_kj`, laid out as `scales`.
    col_sums: Vec<i32>,
    /// `s_gj · Σ_{k in g} q_kj`, laid out as `scales`: the zero point's term in f32, for the
    /// VNNI kernel's epilogue.
    scaled_sums: Vec<f32>,
    /// `1 / f_k` per input when the matrix was quantized with smoothing factors `f` (see
    /// [`quantize_smoothed`](Self::quantize_smoothed)): activations are multiplied by it before
    /// they are quantized.
    input_scales: Option<Vec<f32>>,
}

impl QuantizedMatrix {
    /// Quantizes `w_t`, the weights transposed (`k × n`, row-major: row `kk` holds the `kk`-th
    /// input's weight for every output).
    pub(crate) fn quantize(w_t: &[f32], k: usize, n: usize) -> candle_core::Result<Self> {
        Self::quantize_inner(w_t, k, n, None)
    }

    /// Quantizes `w_t` as [`quantize`](Self::quantize) does, after moving each input's range
    /// between the activations and the weights (SmoothQuant): input `kk`'s weights are
    /// multiplied by `factors[kk]` and its activations divided by it at run time, which leaves
    /// the product unchanged. With `factors[kk] = amax(x_kk)^α / amax(w_kk)^(1-α)` an input
    /// whose activations reach ten times the others' no longer takes most of every row's 255
    /// steps (a LayerNorm's outlier channels, the long tail of GELU outputs).
    pub(crate) fn quantize_smoothed(
        w_t: &[f32],
        k: usize,
        n: usize,
        factors: &[f32],
    ) -> candle_core::Result<Self> {
        if factors.len() != k {
            candle_core::bail!("int8 smoothing: {} factors for {k} inputs", factors.len());
        }
        if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
            candle_core::bail!("int8 smoothing: a factor is {bad}");
        }
        Self::quantize_inner(w_t, k, n, Some(factors))
    }

    fn quantize_inner(
        w_t: &[f32],
        k: usize,
        n: usize,
        factors: Option<&[f32]>,
    ) -> candle_core::Result<Self> {
        if w_t.len() != k * n {
            candle_core::bail!("int8 weights: {} values for {k}×{n}", w_t.len());
        }
        if k > MAX_K {
            candle_core::bail!("int8 weights: {k} inputs, at most {MAX_K} are supported");
        }
        if let Some(bad) = w_t.iter().find(|v| !v.is_finite()) {
            candle_core::bail!("int8 weights: a weight is {bad}");
        }
        let smoothed: Vec<f32>;
        let w_t = match factors {
            Some(f) => {
                smoothed = w_t
                    .chunks_exact(n.max(1))
                    .zip(f)
                    .flat_map(|(row, &f)| row.iter().map(move |v| v * f))
                    .collect();
                &smoothed[..]
            }
            None => w_t,
        };
        let kp = round_up(k.max(1), 4);
        let np = round_up(n.max(1), PANEL);
        let groups = kp.div_ceil(GROUP);
        let mut amax = vec![0f32; groups * np];
        for (kk, row) in w_t.chunks_exact(n.max(1)).enumerate() {
            let g = kk / GROUP;
            for (m, v) in amax[g * np..].iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
        let scales: Vec<f32> = amax.iter().map(|&m| m / 127.0).collect();
        let inv: Vec<f32> = scales
            .iter()
            .map(|&s| if s > 0.0 { 1.0 / s } else { 0.0 })
            .collect();
        let fours = kp / 4;
        let mut packed = vec![0i8; np * kp];
        let mut col_sums = vec![0i32; groups * np];
        for kk in 0..k {
            let (f, t, g) = (kk / 4, kk % 4, kk / GROUP);
            for j in 0..n {
                let q = to_i8((w_t[kk * n + j] * inv[g * np + j]) as f64);
                let (p, c) = (j / PANEL, j % PANEL);
                packed[((p * fours + f) * PANEL + c) * 4 + t] = q;
                col_sums[g * np + j] += q as i32;
            }
        }
        Ok(Self {
            k,
            n,
            kp,
            np,
            groups,
            packed,
            scaled_sums: col_sums
                .iter()
                .zip(&scales)
                .map(|(&c, &s)| c as f32 * s)
                .collect(),
            scales,
            col_sums,
            input_scales: factors.map(|f| f.iter().map(|f| 1.0 / f).collect()),
        })
    }

    /// The quantized weight of input `kk` for output `j`.
    #[cfg(test)]
    fn weight(&self, kk: usize, j: usize) -> i8 {
        let fours = self.kp / 4;
        let (p, c) = (j / PANEL, j % PANEL);
        self.packed[((p * fours + kk / 4) * PANEL + c) * 4 + kk % 4]
    }

    fn panel(&self, p: usize) -> &[i8] {
        let len = self.kp * PANEL;
        &self.packed[p * len..(p + 1) * len]
    }
}

/// `x` rounded half to even into `[-127, 127]`, as `x.round_ties_even().clamp(-127.0, 127.0)`.
fn to_i8(x: f64) -> i8 {
    // Adding and taking away 1.5 · 2^52 rounds half to even (the FPU's default mode) on any
    // value under 2^51 without the library call `round_ties_even` compiles to on the baseline
    // target, where a sixth of the int8 load went; clamping first keeps the value that small
    // and gives the same integers.
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    let x = x.clamp(-127.0, 127.0);
    ((x + MAGIC) - MAGIC) as i8
}

/// Quantizes a table of rows of `width` (an embedding table) to int8 with one symmetric scale
/// per row: `row_i ≈ scales[i] · values[i]`.
pub(crate) fn quantize_table_rows(
    table: &[f32],
    width: usize,
) -> candle_core::Result<(Vec<i8>, Vec<f32>)> {
    if width == 0 || !table.len().is_multiple_of(width) {
        candle_core::bail!("int8 table: {} values in rows of {width}", table.len());
    }
    if let Some(bad) = table.iter().find(|v| !v.is_finite()) {
        candle_core::bail!("int8 table: a value is {bad}");
    }
    let mut values = vec![0i8; table.len()];
    let mut scales = Vec::with_capacity(table.len() / width);
    for (row, out) in table
        .chunks_exact(width)
        .zip(values.chunks_exact_mut(width))
    {
        let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (o, v) in out.iter_mut().zip(row) {
            *o = to_i8((v * inv) as f64);
        }
        scales.push(scale);
    }
    Ok((values, scales))
}

/// Rows of activations quantized to `u8`, each `kp` wide (zero-padded past `k`; the weights
/// there are zero, so the padding adds nothing), one scale and zero point per group of
/// [`GROUP`] inputs.
#[derive(Debug, Clone)]
struct QuantizedRows {
    kp: usize,
    groups: usize,
    data: Vec<u8>,
    /// `a_ig` of row `i` and group `g` at `i·groups + g`.
    scales: Vec<f32>,
    /// `z_ig`, laid out as `scales`.
    zeros: Vec<i32>,
}

impl QuantizedRows {
    #[cfg(test)]
    fn row(&self, i: usize) -> &[u8] {
        &self.data[i * self.kp..(i + 1) * self.kp]
    }
}

/// Lanes of the min/max scan (one AVX-512 register of f32).
const LANES: usize = 16;

/// `1.5 · 2^23`: adding and subtracting it rounds an f32 in [0, 2^22] to the nearest integer,
/// ties to even, in whatever code the compiler makes of it.
const ROUND: f32 = 12_582_912.0;

/// The scale, its inverse and the zero point of a row whose values span `[lo, hi]` (`lo <= 0 <=
/// hi`); `None` for an empty range. Every level's row quantization computes them here, so that
/// they agree to the bit.
#[inline(always)]
fn row_step(lo: f32, hi: f32) -> Option<(f32, f32, f32)> {
    let range = hi - lo;
    if range == 0.0 {
        return None;
    }
    let inv = 255.0 / range;
    let zero = ((-lo * inv).clamp(0.0, 255.0) + ROUND) - ROUND;
    Some((range / 255.0, inv, zero))
}

/// Quantizes one row; inlined into every level's compiled copy, which all give the same
/// integers: the rounding is the exact `x + 1.5·2^23 - 1.5·2^23` of IEEE round-to-nearest-even
/// (values lie in [0, 255] by then), not a library call, so it vectorizes everywhere.
#[inline(always)]
fn quantize_row(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    let mut lo = [0f32; LANES];
    let mut hi = [0f32; LANES];
    // NaN in a lane if the row holds a NaN or an infinity (0 · inf is NaN).
    let mut probe = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for t in 0..LANES {
            lo[t] = if c[t] < lo[t] { c[t] } else { lo[t] };
            hi[t] = if c[t] > hi[t] { c[t] } else { hi[t] };
            probe[t] += c[t] * 0.0;
        }
    }
    for &v in chunks.remainder() {
        lo[0] = lo[0].min(v);
        hi[0] = hi[0].max(v);
        probe[0] += v * 0.0;
    }
    let lo = lo.iter().fold(0f32, |a, &b| a.min(b));
    let hi = hi.iter().fold(0f32, |a, &b| a.max(b));
    if probe.iter().any(|p| p.is_nan()) {
        // A NaN or an infinity, which the f32 path would propagate: the row reads as zeros and
        // its NaN scale carries the NaN into the output.
        out.fill(0);
        return (f32::NAN, 0);
    }
    let Some((scale, inv, zero)) = row_step(lo, hi) else {
        out.fill(0);
        return (0.0, 0);
    };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (((v * inv + zero).clamp(0.0, 255.0) + ROUND) - ROUND) as u8;
    }
    out[x.len()..].fill(zero as u8);
    (scale, zero as i32)
}

/// One group of at most [`GROUP`] inputs at `isa`'s level, each multiplied by its factor
/// first when there are `factors`: the same integers as [`quantize_row`] of the products.
fn quantize_group_at(
    isa: QuantIsa,
    x: &[f32],
    factors: Option<&[f32]>,
    out: &mut [u8],
) -> (f32, i32) {
    debug_assert!(x.len() <= GROUP);
    match isa.0 {
        // SAFETY: as in `block`.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => unsafe { x86::quantize_group_avx512(x, factors, out) },
        // SAFETY: as in `block`.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::AvxVnni => unsafe {
            x86::quantize_row_avx2(scaled(x, factors, &mut [0f32; GROUP]), out)
        },
        Level::Portable => quantize_row(scaled(x, factors, &mut [0f32; GROUP]), out),
    }
}

/// `x` multiplied input by input by `factors` into `buffer`, or `x` itself without factors.
fn scaled<'a>(x: &'a [f32], factors: Option<&[f32]>, buffer: &'a mut [f32; GROUP]) -> &'a [f32] {
    let Some(f) = factors else {
        return x;
    };
    let buffer = &mut buffer[..x.len()];
    for ((o, v), f) in buffer.iter_mut().zip(x).zip(f) {
        *o = v * f;
    }
    buffer
}

/// Quantizes the rows of `x` (`m × k`) into rows of `kp`, each group of [`GROUP`] inputs on
/// its own, after multiplying input `kk` by `input_scales[kk]` when there are any (a smoothed
/// matrix's, see [`QuantizedMatrix::quantize_smoothed`]; a group at a time, so the scaled
/// activations never take a buffer of their own). No group is empty: `kp - k < 4`, and groups
/// start at multiples of four. The rows' bytes are followed by zero rows up to a multiple of
/// `whole` rows, which the AMX tiles read whole. Runs on the calling thread: each task of
/// [`gemm_int8_rows`] quantizes its own rows, which it then reads from its core's cache.
fn quantize_rows(
    isa: QuantIsa,
    x: &[f32],
    k: usize,
    kp: usize,
    input_scales: Option<&[f32]>,
    whole: usize,
) -> QuantizedRows {
    let m = x.len() / k.max(1);
    let groups = kp.div_ceil(GROUP);
    let mut data = vec![0u8; round_up(m, whole) * kp];
    let mut scales = vec![0f32; m * groups];
    let mut zeros = vec![0i32; m * groups];
    data.chunks_exact_mut(kp)
        .zip(
            scales
                .chunks_exact_mut(groups)
                .zip(zeros.chunks_exact_mut(groups)),
        )
        .enumerate()
        .for_each(|(i, (out, (s, z)))| {
            let row = &x[i * k..(i + 1) * k];
            for g in 0..groups {
                let (start, end) = (g * GROUP, ((g + 1) * GROUP).min(kp));
                let values = &row[start..end.min(k)];
                let factors = input_scales.map(|f| &f[start..end.min(k)]);
                (s[g], z[g]) = quantize_group_at(isa, values, factors, &mut out[start..end]);
            }
        });
    QuantizedRows {
        kp,
        groups,
        data,
        scales,
        zeros,
    }
}

/// One register block: `out[r][c] = Σ_kk a[r·stride + kk] · panel(kk, c)` for `rows` rows.
type Block = [[i32; PANEL]; MR];

/// The portable kernel, plain Rust.
#[inline(always)]
fn block_generic(a: &[u8], stride: usize, rows: usize, panel: &[i8], kp: usize, out: &mut Block) {
    for (r, acc) in out.iter_mut().enumerate().take(rows) {
        *acc = [0; PANEL];
        let row = &a[r * stride..r * stride + kp];
        for (a4, w) in row.chunks_exact(4).zip(panel.chunks_exact(4 * PANEL)) {
            for (c, w4) in w.chunks_exact(4).enumerate() {
                let mut s = 0i32;
                for t in 0..4 {
                    s += a4[t] as i32 * w4[t] as i32;
                }
                acc[c] += s;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Calls the `R`-row instance of a kernel for `rows` from 1 to [`MR`] (more run as `MR`).
    macro_rules! by_rows {
        ($rows:expr, $kernel:ident($($arg:expr),*)) => {
            match $rows {
                1 => $kernel::<1>($($arg),*),
                2 => $kernel::<2>($($arg),*),
                3 => $kernel::<3>($($arg),*),
                4 => $kernel::<4>($($arg),*),
                5 => $kernel::<5>($($arg),*),
                6 => $kernel::<6>($($arg),*),
                7 => $kernel::<7>($($arg),*),
                _ => $kernel::<8>($($arg),*),
            }
        };
    }

    use super::{Block, BlockScales, OutRows, GROUP, MR, PANEL, ROUND};

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn start_rows_avx512(
        out: &mut [std::mem::MaybeUninit<f32>],
        bias: &[f32],
        residual: Option<&[f32]>,
    ) {
        super::start_rows_generic(out, bias, residual)
    }

    /// [`super::quantize_row`] of one group (at most [`GROUP`] inputs, each multiplied by its
    /// factor first when there are `factors`), with the group held in eight registers between
    /// the range scan and the rounding: the same operations in the same order (a product, then
    /// `v · inv + zero` as a product and a sum, the clamp, the `ROUND` addition and
    /// subtraction), so the same integers. The compiled generic loop re-read the inputs and
    /// converted lane by lane, and took about 40% as long as the products of its matrix.
    ///
    /// # Safety
    /// AVX-512F and AVX-512BW must be available. The lengths are asserted.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize_group_avx512(
        x: &[f32],
        factors: Option<&[f32]>,
        out: &mut [u8],
    ) -> (f32, i32) {
        const REGS: usize = GROUP / 16;
        let n = x.len();
        assert!(n <= GROUP && out.len() >= n && factors.is_none_or(|f| f.len() >= n));
        let mask = |r: usize| -> __mmask16 {
            let left = n - 16 * r;
            if left >= 16 {
                0xffff
            } else {
                (1u16 << left) - 1
            }
        };
        let used = n.div_ceil(16);
        let zero_ps = _mm512_setzero_ps();
        let mut v = [zero_ps; REGS];
        let (mut lo, mut hi, mut probe) = (zero_ps, zero_ps, zero_ps);
        for (r, v) in v.iter_mut().enumerate().take(used) {
            // SAFETY: lanes past `n` are masked off, and masked lanes are neither read nor
            // fault; lane 16r + t < n of `x` (and of `factors`, asserted as long) is inside.
            let mut y = _mm512_maskz_loadu_ps(mask(r), x.as_ptr().add(16 * r));
            if let Some(f) = factors {
                y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(mask(r), f.as_ptr().add(16 * r)));
            }
            *v = y;
            // Masked lanes read 0, inside the range that always includes 0.
            lo = _mm512_min_ps(lo, y);
            hi = _mm512_max_ps(hi, y);
            // NaN in a lane if the group holds a NaN or an infinity (0 · inf is NaN).
            probe = _mm512_add_ps(probe, _mm512_mul_ps(y, zero_ps));
        }
        if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(probe, probe) != 0 {
            out.fill(0);
            return (f32::NAN, 0);
        }
        // Every lane started at 0, so these are the group's range widened to include 0.
        let lo = _mm512_reduce_min_ps(lo);
        let hi = _mm512_reduce_max_ps(hi);
        let Some((scale, inv, zero)) = super::row_step(lo, hi) else {
            out.fill(0);
            return (0.0, 0);
        };
        let (vinv, vzero) = (_mm512_set1_ps(inv), _mm512_set1_ps(zero));
        let (top, round) = (_mm512_set1_ps(255.0), _mm512_set1_ps(ROUND));
        for (r, v) in v.iter().enumerate().take(used) {
            let y = _mm512_add_ps(_mm512_mul_ps(*v, vinv), vzero);
            let y = _mm512_min_ps(_mm512_max_ps(y, zero_ps), top);
            let y = _mm512_sub_ps(_mm512_add_ps(y, round), round);
            // SAFETY: bytes 16r + t < n of `out` (asserted at least n long); the rest masked.
            _mm512_mask_cvtepi32_storeu_epi8(
                out.as_mut_ptr().add(16 * r) as *mut i8,
                mask(r),
                _mm512_cvttps_epi32(y),
            );
        }
        out[n..].fill(zero as u8);
        (scale, zero as i32)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_row_avx2(x: &[f32], out: &mut [u8]) -> (f32, i32) {
        super::quantize_row(x, out)
    }

    /// The AVX2 kernel for `R` rows (1 or 2) and half a panel (16 columns, `half` 0 or 1).
    /// AVX2 has no u8 × i8 product that sums into i32 without saturating (`vpmaddubsw` adds
    /// two products in i16), so both sides are widened to i16 (the rows beforehand by
    /// [`block_avx2`]: `rows` holds each group of four activations as four u16 in a u64,
    /// `groups` per row; the weights as they are loaded) and `vpmaddwd` sums pairs exactly into
    /// i32. Per group and four columns: one 16-byte weight load widened, and per row one
    /// broadcast load, one `vpmaddwd` and one add. Weights widened ahead of time, at two bytes
    /// each, measured no faster. Each accumulator lane holds one column's pair (`k` 0-1 or 2-3 of every group); the
    /// pairs are added at the end. Four accumulators per row and half a panel keep two rows in
    /// the sixteen registers.
    ///
    /// # Safety
    /// AVX2 must be available. The bounds are asserted.
    #[target_feature(enable = "avx2")]
    unsafe fn block_avx2_half<const R: usize>(
        rows: &[u64],
        groups: usize,
        panel: &[i8],
        half: usize,
        out: &mut [[i32; PANEL]],
    ) {
        assert!((1..=2).contains(&R) && half < 2 && out.len() >= R);
        assert!(rows.len() >= R * groups && panel.len() >= groups * 4 * PANEL);
        let mut acc = [[_mm256_setzero_si256(); 4]; R];
        for g in 0..groups {
            let mut av = [_mm256_setzero_si256(); R];
            for (r, av) in av.iter_mut().enumerate() {
                *av = _mm256_set1_epi64x(rows[r * groups + g] as i64);
            }
            // SAFETY: group g's half is panel[g·128 + half·64 .. + 64], inside the panel by
            // the assertion above.
            let w = panel.as_ptr().add(g * 4 * PANEL + half * 4 * PANEL / 2);
            for j in 0..4 {
                let wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16 * j) as *const __m128i));
                for (acc, av) in acc.iter_mut().zip(&av) {
                    acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(*av, wv));
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (j, acc) in acc.iter().enumerate() {
                let mut pairs = [0i32; 8];
                // SAFETY: `pairs` holds eight i32, one register's worth.
                _mm256_storeu_si256(pairs.as_mut_ptr() as *mut __m256i, *acc);
                for c in 0..4 {
                    out[r][half * PANEL / 2 + 4 * j + c] = pairs[2 * c] + pairs[2 * c + 1];
                }
            }
        }
    }

    /// [`block_avx2_half`] over `rows` (1 to [`MR`]) rows, two at a time, and both halves;
    /// each pair of rows is widened to u16 once for both.
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn block_avx2(
        a: &[u8],
        stride: usize,
        rows: usize,
        panel: &[i8],
        kp: usize,
        out: &mut Block,
    ) {
        assert!(
            kp <= GROUP,
            "the AVX2 kernel runs one group of inputs at a time"
        );
        let groups = kp / 4;
        let mut wide = [0u64; 2 * GROUP / 4];
        for r0 in (0..rows.min(MR)).step_by(2) {
            let pair = 2.min(rows - r0);
            for r in 0..pair {
                let row = &a[(r0 + r) * stride..(r0 + r) * stride + kp];
                let dst = &mut wide[r * groups..(r + 1) * groups];
                let mut g = 0;
                while g + 4 <= groups {
                    // SAFETY: 16 bytes of `row` from 4g and four u64 of `dst` from g, inside
                    // both since g + 4 <= groups = kp / 4.
                    let v = _mm_loadu_si128(row.as_ptr().add(4 * g) as *const __m128i);
                    let d = dst.as_mut_ptr().add(g) as *mut __m256i;
                    _mm256_storeu_si256(d, _mm256_cvtepu8_epi16(v));
                    g += 4;
                }
                for (g, d) in dst.iter_mut().enumerate().skip(g) {
                    let b = &row[4 * g..4 * g + 4];
                    *d = (0..4).fold(0u64, |w, t| w | (b[t] as u64) << (16 * t));
                }
            }
            let out = &mut out[r0..];
            for half in 0..2 {
                if pair == 2 {
                    block_avx2_half::<2>(&wide, groups, panel, half, out);
                } else {
                    block_avx2_half::<1>(&wide, groups, panel, half, out);
                }
            }
        }
    }

    /// `Σ_k u·q` over inputs `k0 .. k0 + len` of `R` rows (1 or 2) of `a` (`stride` apart) and
    /// a whole panel, on AVX-VNNI: per group of four inputs, four 32-byte weight loads (eight
    /// columns' four bytes each), one broadcast of four activation bytes per row, and 4·R
    /// `vpdpbusd`. Two rows take 8 of the 16 registers for accumulators and 4 for the weights;
    /// three would spill. The loop of both AVX-VNNI kernels, so the exact-integer tests of
    /// [`block_avx_vnni`] cover the dequantizing one too.
    ///
    /// # Safety
    /// AVX2 and AVX-VNNI must be available, and the caller must have checked that `a` holds
    /// `(R - 1)·stride + k0 + len` bytes and `panel` `(k0 + len)·PANEL`, with `k0` and `len`
    /// multiples of four.
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    unsafe fn accumulate_avx_vnni<const R: usize>(
        a: &[u8],
        stride: usize,
        panel: &[i8],
        k0: usize,
        len: usize,
    ) -> [[__m256i; 4]; R] {
        debug_assert!(a.len() >= (R - 1) * stride + k0 + len && panel.len() >= (k0 + len) * PANEL);
        let mut acc = [[_mm256_setzero_si256(); 4]; R];
        let mut w = panel.as_ptr().add(k0 * PANEL);
        let base = a.as_ptr();
        for q in 0..len / 4 {
            // SAFETY: step q reads 128 bytes of weights from (k0 + 4q)·PANEL and, in row r,
            // a[r·stride + k0 + 4q .. + 4], inside the slices by the caller's checks.
            let wv = [0, 1, 2, 3].map(|j| _mm256_loadu_si256(w.add(32 * j) as *const __m256i));
            for (r, acc) in acc.iter_mut().enumerate() {
                let at = base.add(r * stride + k0 + 4 * q) as *const i32;
                let av = _mm256_set1_epi32(at.read_unaligned());
                for (acc, wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm256_dpbusd_avx_epi32(*acc, av, *wv);
                }
            }
            w = w.add(4 * PANEL);
        }
        acc
    }

    /// [`accumulate_avx_vnni`] over all of `kp` for `rows` (1 to [`MR`]) rows, two at a time.
    ///
    /// # Safety
    /// AVX2 and AVX-VNNI must be available. The bounds are asserted.
    #[target_feature(enable = "avx2,avxvnni")]
    pub(super) unsafe fn block_avx_vnni(
        a: &[u8],
        stride: usize,
        rows: usize,
        panel: &[i8],
        kp: usize,
        out: &mut Block,
    ) {
        let rows = rows.min(MR);
        assert!(kp.is_multiple_of(4) && panel.len() >= kp * PANEL);
        assert!(rows == 0 || a.len() >= (rows - 1) * stride + kp);
        for r0 in (0..rows).step_by(2) {
            let a = &a[r0 * stride..];
            if rows - r0 >= 2 {
                let acc = accumulate_avx_vnni::<2>(a, stride, panel, 0, kp);
                store_avx_vnni(&acc, &mut out[r0..]);
            } else {
                let acc = accumulate_avx_vnni::<1>(a, stride, panel, 0, kp);
                store_avx_vnni(&acc, &mut out[r0..]);
            }
        }
    }

    /// Stores the accumulators of [`accumulate_avx_vnni`] into the first `R` rows of `out`.
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    unsafe fn store_avx_vnni<const R: usize>(acc: &[[__m256i; 4]; R], out: &mut [[i32; PANEL]]) {
        for (acc, out) in acc.iter().zip(out) {
            // SAFETY: a row of `out` holds PANEL = 32 i32, four registers' worth.
            let dst = out.as_mut_ptr() as *mut __m256i;
            for (j, acc) in acc.iter().enumerate() {
                _mm256_storeu_si256(dst.add(j), *acc);
            }
        }
    }

    /// The AVX-VNNI kernel for `R` rows (1 or 2) over every group of inputs, each group's i32
    /// accumulators dequantized in registers and added to `out`, as the AVX-512 one does.
    ///
    /// # Safety
    /// AVX2, FMA and AVX-VNNI must be available. The bounds are asserted.
    #[target_feature(enable = "avx2,fma,avxvnni")]
    unsafe fn block_dequant_avx_vnni_rows<const R: usize>(
        a: &[u8],
        stride: usize,
        panel: &[i8],
        s: &BlockScales<'_>,
        out: &mut OutRows<'_>,
    ) {
        let kp = stride;
        assert!(R <= 2);
        super::check_dequant_block(R, a, stride, panel, s, out);
        for g in 0..s.groups {
            let (k0, len) = (g * GROUP, GROUP.min(kp - g * GROUP));
            let acc = accumulate_avx_vnni::<R>(a, stride, panel, k0, len);
            // SAFETY: 32 scales and scaled sums from g·np, inside by `check_dequant_block`.
            let sw = s.cols_scales.as_ptr().add(g * s.np);
            let cs = s.cols_scaled_sums.as_ptr().add(g * s.np);
            for (r, acc) in acc.iter().enumerate() {
                let a = s.rows_scales[r * s.groups + g];
                let sa = _mm256_set1_ps(a);
                let za = _mm256_set1_ps(a * s.rows_zeros[r * s.groups + g] as f32);
                // SAFETY: row r's PANEL = 32 f32 from r·stride, inside `out.data` by
                // `check_dequant_block` (r < R); the scales' 32 from sw and cs as above.
                let o = out.data.as_mut_ptr().add(r * out.stride);
                for (j, acc) in acc.iter().enumerate() {
                    let f = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(*acc),
                        _mm256_mul_ps(sa, _mm256_loadu_ps(sw.add(8 * j))),
                        _mm256_loadu_ps(o.add(8 * j)),
                    );
                    let f = _mm256_fnmadd_ps(za, _mm256_loadu_ps(cs.add(8 * j)), f);
                    _mm256_storeu_ps(o.add(8 * j), f);
                }
            }
        }
    }

    /// [`block_dequant_avx_vnni_rows`] for `rows` (1 to [`MR`]) rows, two at a time.
    ///
    /// # Safety
    /// AVX2, FMA and AVX-VNNI must be available.
    #[target_feature(enable = "avx2,fma,avxvnni")]
    pub(super) unsafe fn block_dequant_avx_vnni(
        a: &[u8],
        stride: usize,
        rows: usize,
        panel: &[i8],
        s: &BlockScales<'_>,
        out: &mut OutRows<'_>,
    ) {
        for r0 in (0..rows.min(MR)).step_by(2) {
            let g = s.groups;
            let sub = BlockScales {
                rows_scales: &s.rows_scales[r0 * g..],
                rows_zeros: &s.rows_zeros[r0 * g..],
                ..*s
            };
            let mut o = OutRows {
                data: &mut out.data[r0 * out.stride..],
                stride: out.stride,
            };
            let a = &a[r0 * stride..];
            if rows - r0 >= 2 {
                block_dequant_avx_vnni_rows::<2>(a, stride, panel, &sub, &mut o);
            } else {
                block_dequant_avx_vnni_rows::<1>(a, stride, panel, &sub, &mut o);
            }
        }
    }

    /// The VNNI kernel for `R` rows: per group of four `k` values, two 64-byte weight loads, one
    /// broadcast of four activation bytes per row, and 2·R `vpdpbusd`.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 VNNI must be available. The bounds are asserted.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn block_vnni_rows<const R: usize>(
        a: &[u8],
        stride: usize,
        panel: &[i8],
        kp: usize,
        out: &mut Block,
    ) {
        assert!((1..=MR).contains(&R) && kp.is_multiple_of(4));
        assert!(a.len() >= (R - 1) * stride + kp && panel.len() >= kp * PANEL);
        let acc = accumulate_vnni::<R>(a, stride, panel, 0, kp);
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: out[r] holds PANEL = 32 i32, two registers' worth.
            let dst = out[r].as_mut_ptr() as *mut __m512i;
            _mm512_storeu_si512(dst, acc[0]);
            _mm512_storeu_si512(dst.add(1), acc[1]);
        }
    }

    /// `Σ_k u·q` over inputs `k0 .. k0 + len` of `R` rows of `a` (`stride` apart) and the panel:
    /// per group of four inputs, two 64-byte weight loads, one broadcast of four activation bytes
    /// per row, and 2·R `vpdpbusd`. The loop of both VNNI kernels, so the exact-integer tests of
    /// [`block_vnni`] cover the dequantizing one too.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 VNNI must be available, and the caller must have checked
    /// that `a` holds `(R - 1)·stride + k0 + len` bytes and `panel` `(k0 + len)·PANEL`, with `k0`
    /// and `len` multiples of four.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn accumulate_vnni<const R: usize>(
        a: &[u8],
        stride: usize,
        panel: &[i8],
        k0: usize,
        len: usize,
    ) -> [[__m512i; 2]; R] {
        debug_assert!(a.len() >= (R - 1) * stride + k0 + len && panel.len() >= (k0 + len) * PANEL);
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        let mut w = panel.as_ptr().add(k0 * PANEL);
        let base = a.as_ptr();
        for q in 0..len / 4 {
            // SAFETY: step q reads 128 bytes of weights from (k0 + 4q)·PANEL and, in row r,
            // a[r·stride + k0 + 4q .. + 4], inside the slices by the caller's checks.
            let w0 = _mm512_loadu_si512(w as *const __m512i);
            let w1 = _mm512_loadu_si512(w.add(64) as *const __m512i);
            for (r, acc) in acc.iter_mut().enumerate() {
                let at = base.add(r * stride + k0 + 4 * q) as *const i32;
                let av = _mm512_set1_epi32(at.read_unaligned());
                acc[0] = _mm512_dpbusd_epi32(acc[0], av, w0);
                acc[1] = _mm512_dpbusd_epi32(acc[1], av, w1);
            }
            w = w.add(4 * PANEL);
        }
        acc
    }

    /// The generic dequantizing block compiled for AVX2 and FMA, so that its epilogue is
    /// vectorized too.
    ///
    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block_dequant_avx2(
        a: &[u8],
        stride: usize,
        rows: usize,
        panel: &[i8],
        s: &BlockScales<'_>,
        out: &mut OutRows<'_>,
    ) {
        let isa = super::QuantIsa(super::Level::Avx2, None);
        super::block_dequant_generic(isa, a, stride, rows, panel, s, out);
    }

    /// The VNNI kernel for `R` rows over every group of inputs, each group's i32 accumulators
    /// dequantized in registers and added to `out`: `o += (a_rg · s_gc) · (acc - z_rg · Σq_gc)`.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 VNNI must be available. The bounds are asserted.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn block_dequant_vnni_rows<const R: usize>(
        a: &[u8],
        stride: usize,
        panel: &[i8],
        s: &BlockScales<'_>,
        out: &mut OutRows<'_>,
    ) {
        let kp = stride;
        assert!(R <= MR);
        super::check_dequant_block(R, a, stride, panel, s, out);
        // The f32 sums live in `out` (L1), not in registers: with the 2·R i32 accumulators
        // they would take all 32 and spill inside the inner loop.
        for g in 0..s.groups {
            let (k0, len) = (g * GROUP, GROUP.min(kp - g * GROUP));
            let acc = accumulate_vnni::<R>(a, stride, panel, k0, len);
            // SAFETY: 32 scales and scaled sums from g·np, inside by `check_dequant_block`.
            let sw = s.cols_scales.as_ptr().add(g * s.np);
            let cs = s.cols_scaled_sums.as_ptr().add(g * s.np);
            let (sw0, sw1) = (_mm512_loadu_ps(sw), _mm512_loadu_ps(sw.add(16)));
            let (cs0, cs1) = (_mm512_loadu_ps(cs), _mm512_loadu_ps(cs.add(16)));
            // `a · s · (acc - z · Σq) = acc · (a · s) - (a · z) · (s · Σq)`: no integer
            // multiply in the epilogue. The accumulators (at most 255 · 127 · 128 < 2^24)
            // convert to f32 exactly.
            for (r, acc) in acc.iter().enumerate() {
                let a = s.rows_scales[r * s.groups + g];
                let sa = _mm512_set1_ps(a);
                let za = _mm512_set1_ps(a * s.rows_zeros[r * s.groups + g] as f32);
                // SAFETY: row r's PANEL = 32 f32 from r·stride, two registers' worth, inside
                // `out.data` by `check_dequant_block` (r < R).
                let o0 = out.data.as_mut_ptr().add(r * out.stride);
                let o1 = o0.add(16);
                let f0 = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(acc[0]),
                    _mm512_mul_ps(sa, sw0),
                    _mm512_loadu_ps(o0),
                );
                let f1 = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(acc[1]),
                    _mm512_mul_ps(sa, sw1),
                    _mm512_loadu_ps(o1),
                );
                _mm512_storeu_ps(o0, _mm512_fnmadd_ps(za, cs0, f0));
                _mm512_storeu_ps(o1, _mm512_fnmadd_ps(za, cs1, f1));
            }
        }
    }

    /// Adds group `g`'s dequantized sums of `acc` (a row of sums per output row) to `out`, with
    /// the VNNI kernel's operations in its order ([`block_dequant_vnni_rows`]), so the same
    /// floats: the epilogue of the AMX products.
    ///
    /// # Safety
    /// AVX-512F must be available. Every access is through a bounds-checked slice.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dequant_rows_avx512(
        acc: &[[i32; PANEL]],
        g: usize,
        s: &BlockScales<'_>,
        out: &mut OutRows<'_>,
    ) {
        let sw = &s.cols_scales[g * s.np..g * s.np + PANEL];
        let cs = &s.cols_scaled_sums[g * s.np..g * s.np + PANEL];
        let (sw0, sw1) = (
            _mm512_loadu_ps(sw.as_ptr()),
            _mm512_loadu_ps(sw[16..].as_ptr()),
        );
        let (cs0, cs1) = (
            _mm512_loadu_ps(cs.as_ptr()),
            _mm512_loadu_ps(cs[16..].as_ptr()),
        );
        for (r, acc) in acc.iter().enumerate() {
            let a = s.rows_scales[r * s.groups + g];
            let sa = _mm512_set1_ps(a);
            let za = _mm512_set1_ps(a * s.rows_zeros[r * s.groups + g] as f32);
            let o = out.row(r);
            let f0 = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_loadu_epi32(acc.as_ptr())),
                _mm512_mul_ps(sa, sw0),
                _mm512_loadu_ps(o.as_ptr()),
            );
            let f1 = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_loadu_epi32(acc[16..].as_ptr())),
                _mm512_mul_ps(sa, sw1),
                _mm512_loadu_ps(o[16..].as_ptr()),
            );
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_fnmadd_ps(za, cs0, f0));
            _mm512_storeu_ps(o[16..].as_mut_ptr(), _mm512_fnmadd_ps(za, cs1, f1));
        }
    }

    /// [`block_dequant_vnni_rows`] for `rows` (1 to [`MR`]) rows.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 VNNI must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn block_dequant_vnni(
        a: &[u8],
        stride: usize,
        rows: usize,
        panel: &[i8],
        s: &BlockScales<'_>,
        out: &mut OutRows<'_>,
    ) {
        by_rows!(rows, block_dequant_vnni_rows(a, stride, panel, s, out))
    }

    /// [`block_vnni_rows`] for `rows` (1 to [`MR`]) rows.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 VNNI must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn block_vnni(
        a: &[u8],
        stride: usize,
        rows: usize,
        panel: &[i8],
        kp: usize,
        out: &mut Block,
    ) {
        by_rows!(rows, block_vnni_rows(a, stride, panel, kp, out))
    }
}

/// One register block at `isa`'s level.
fn block(
    isa: QuantIsa,
    a: &[u8],
    stride: usize,
    rows: usize,
    panel: &[i8],
    kp: usize,
    out: &mut Block,
) {
    debug_assert!((1..=MR).contains(&rows));
    match isa.0 {
        // SAFETY: a `QuantIsa` at these levels exists only where detection confirmed the
        // features (see the module's invariants).
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => unsafe { x86::block_vnni(a, stride, rows, panel, kp, out) },
        #[cfg(target_arch = "x86_64")]
        Level::AvxVnni => unsafe { x86::block_avx_vnni(a, stride, rows, panel, kp, out) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { x86::block_avx2(a, stride, rows, panel, kp, out) },
        Level::Portable => block_generic(a, stride, rows, panel, kp, out),
    }
}

/// The f32 rows a register block's dequantized products, `Σ_g a_rg · s_gc · (Σ_{k in g} u·q -
/// z_rg · Σ_{k in g} q)`, are added onto: [`PANEL`] values of row `r` from `r · stride`. These
/// are the output's own rows wherever the panel lies wholly inside it, so no block of sums is
/// zeroed and copied per panel.
struct OutRows<'a> {
    data: &'a mut [f32],
    stride: usize,
}

impl OutRows<'_> {
    fn row(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.stride..r * self.stride + PANEL]
    }
}

/// Where a block's scales are: the activations' of its rows (row-major, `groups` a row) and
/// the weights' of its panel (`groups` runs of [`PANEL`], `np` apart).
struct BlockScales<'a> {
    groups: usize,
    rows_scales: &'a [f32],
    rows_zeros: &'a [i32],
    np: usize,
    /// `w.scales`, `w.col_sums` and `w.scaled_sums` from the panel's first column.
    cols_scales: &'a [f32],
    cols_sums: &'a [i32],
    cols_scaled_sums: &'a [f32],
}

/// Asserts that a dequantizing kernel of `rows` rows (at least one) reads and writes only inside
/// its slices: every row of `a` (`stride` apart, `stride` inputs a multiple of four), the whole
/// panel, every group's scales of its rows and of the panel's columns, and `PANEL` values of
/// each output row. The register kernels' safety rests on it.
fn check_dequant_block(
    rows: usize,
    a: &[u8],
    stride: usize,
    panel: &[i8],
    s: &BlockScales<'_>,
    out: &OutRows<'_>,
) {
    let kp = stride;
    assert!(rows >= 1 && kp.is_multiple_of(4));
    assert!(a.len() >= (rows - 1) * stride + kp && panel.len() >= kp * PANEL);
    assert!(s.groups == kp.div_ceil(GROUP));
    assert!(s.rows_scales.len() >= rows * s.groups && s.rows_zeros.len() >= rows * s.groups);
    let last = (s.groups - 1) * s.np + PANEL;
    assert!(s.cols_scales.len() >= last && s.cols_scaled_sums.len() >= last);
    assert!(out.data.len() >= (rows - 1) * out.stride + PANEL);
}

/// Adds group `g`'s dequantized accumulators to `out`. Inlined into each level's compiled copy.
#[inline(always)]
fn dequant_group(acc: &Block, rows: usize, g: usize, s: &BlockScales<'_>, out: &mut OutRows<'_>) {
    let sw: &[f32; PANEL] = s.cols_scales[g * s.np..g * s.np + PANEL]
        .try_into()
        .expect("a whole panel of scales");
    let cs: &[i32; PANEL] = s.cols_sums[g * s.np..g * s.np + PANEL]
        .try_into()
        .expect("a whole panel of sums");
    for (r, acc) in acc.iter().enumerate().take(rows) {
        let o = out.row(r);
        let (sa, z) = (
            s.rows_scales[r * s.groups + g],
            s.rows_zeros[r * s.groups + g],
        );
        for c in 0..PANEL {
            o[c] += (sa * sw[c]) * (acc[c] - z * cs[c]) as f32;
        }
    }
}

/// The dequantized products of `rows` rows (`a` from the first row's group 0) and one panel,
/// at `isa`'s level: the integer kernel group by group, each group dequantized on its own.
#[inline(always)]
fn block_dequant_generic(
    isa: QuantIsa,
    a: &[u8],
    stride: usize,
    rows: usize,
    panel: &[i8],
    s: &BlockScales<'_>,
    out: &mut OutRows<'_>,
) {
    let mut acc: Block = [[0; PANEL]; MR];
    for g in 0..s.groups {
        // Group g is inputs g·GROUP.. of every row, and the panel's bytes from g·GROUP·PANEL
        // (four inputs of all PANEL columns take 4·PANEL bytes).
        let (k0, len) = (g * GROUP, GROUP.min(stride - g * GROUP));
        let sub = &panel[k0 * PANEL..(k0 + len) * PANEL];
        block(isa, &a[k0..], stride, rows, sub, len, &mut acc);
        dequant_group(&acc, rows, g, s, out);
    }
}

fn block_dequant(
    isa: QuantIsa,
    a: &[u8],
    stride: usize,
    rows: usize,
    panel: &[i8],
    s: &BlockScales<'_>,
    out: &mut OutRows<'_>,
) {
    match isa.0 {
        // SAFETY: a `QuantIsa` at these levels exists only where detection confirmed the
        // features (see the module's invariants).
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => unsafe { x86::block_dequant_vnni(a, stride, rows, panel, s, out) },
        #[cfg(target_arch = "x86_64")]
        Level::AvxVnni => unsafe { x86::block_dequant_avx_vnni(a, stride, rows, panel, s, out) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { x86::block_dequant_avx2(a, stride, rows, panel, s, out) },
        Level::Portable => block_dequant_generic(isa, a, stride, rows, panel, s, out),
    }
}

/// Sets each row of `out` (rows of `bias.len()`) to `bias`, plus its row of `residual` if any:
/// what the groups' products are then added onto.
fn start_rows(isa: QuantIsa, out: &mut [MaybeUninit<f32>], bias: &[f32], residual: Option<&[f32]>) {
    match isa.0 {
        // SAFETY: as in `block`. The loops are the portable ones, compiled for AVX-512: on the
        // baseline target they run four lanes at a time, and took 5% of an int8 forward pass.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => unsafe { x86::start_rows_avx512(out, bias, residual) },
        _ => start_rows_generic(out, bias, residual),
    }
}

#[inline(always)]
fn start_rows_generic(out: &mut [MaybeUninit<f32>], bias: &[f32], residual: Option<&[f32]>) {
    let n = bias.len();
    match residual {
        Some(res) => {
            assert_eq!(res.len(), out.len());
            for (row, res) in out.chunks_exact_mut(n).zip(res.chunks_exact(n)) {
                for ((o, b), r) in row.iter_mut().zip(bias).zip(res) {
                    o.write(b + r);
                }
            }
        }
        None => {
            for row in out.chunks_exact_mut(n) {
                for (o, b) in row.iter_mut().zip(bias) {
                    o.write(*b);
                }
            }
        }
    }
}

/// `finish(bias + residual + x (m × k) · W)` (`m × n`) row block by row block (see
/// [`RowHooks`]), with `x` quantized per row here and `W` quantized at load.
///
/// The kernels run over all rows of `x` and all panels, in parallel over blocks of output rows,
/// into a new output: each task quantizes its own rows of `x`, writes its
/// output rows' first values (bias and residual) into memory never zeroed, adds each register
/// block's dequantized products, and finishes them. One parallel pass per product, not one to
/// quantize and one to multiply: a decision's forward pass is short enough that waking the
/// threads twice per layer showed in its profile, as did zeroing every output first.
pub(crate) fn gemm_int8_rows<F>(
    isa: QuantIsa,
    x: &[f32],
    w: &QuantizedMatrix,
    hooks: &RowHooks<'_, F>,
) -> Vec<f32>
where
    F: Fn(&mut [f32]) + Sync,
{
    let (k, n) = (w.k, w.n);
    let m = hooks.rows(x, k, n);
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    if m == 0 || n == 0 {
        return out;
    }
    // The tiles take whole steps of 64 inputs; other widths (none of MiniLM's) stay on VNNI.
    let amx = isa.1.filter(|_| w.kp.is_multiple_of(amx::TK_INT8));
    // Enough tasks for every thread, each a whole number of register blocks and no more than
    // 64 rows (128 on the tiles, whose blocks are 32), so that a task's activations stay in L2
    // while every panel passes by.
    let threads = rayon::current_num_threads().max(1);
    let (block, most) = if amx.is_some() {
        (amx::MB, 128)
    } else {
        (MR, 64)
    };
    let rows_per_task = round_up(m.div_ceil(4 * threads), block).clamp(block, most);
    out.spare_capacity_mut()[..m * n]
        .par_chunks_mut(rows_per_task * n)
        .enumerate()
        .for_each(|(t, out)| {
            let first = t * rows_per_task;
            let rows = out.len() / n;
            let residual = hooks.residual.map(|r| &r[first * n..(first + rows) * n]);
            start_rows(isa, out, hooks.bias, residual);
            // SAFETY: `start_rows` wrote every element of this task's rows (each of them has
            // `n` elements and `bias` has `n`; `residual`'s rows too, asserted above), and
            // `MaybeUninit<f32>` has the layout of `f32`.
            let out: &mut [f32] = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
            let mine = &x[first * k..(first + rows) * k];
            let a = quantize_rows(isa, mine, k, w.kp, w.input_scales.as_deref(), block);
            match amx {
                Some(amx) => products_amx(amx, &a, w, rows, out),
                None => products_vnni(isa, &a, w, rows, out),
            }
            (hooks.finish)(out);
        });
    // SAFETY: the tasks' rows cover all `m · n` elements (the chunks of the first `m · n` of
    // the spare capacity), and each task wrote all of its own; a task that panicked would have
    // ended this call before this line.
    unsafe { out.set_len(m * n) };
    out
}

/// The scales of the register block of rows `r0 .. r0 + mr` and panel `p`.
fn block_scales<'a>(
    a: &'a QuantizedRows,
    w: &'a QuantizedMatrix,
    r0: usize,
    mr: usize,
    p: usize,
) -> BlockScales<'a> {
    BlockScales {
        groups: w.groups,
        rows_scales: &a.scales[r0 * a.groups..(r0 + mr) * a.groups],
        rows_zeros: &a.zeros[r0 * a.groups..(r0 + mr) * a.groups],
        np: w.np,
        cols_scales: &w.scales[p * PANEL..],
        cols_sums: &w.col_sums[p * PANEL..],
        cols_scaled_sums: &w.scaled_sums[p * PANEL..],
    }
}

/// Adds `f` (`rows` rows of [`PANEL`] sums) to the first `width` columns of `rows` rows of
/// `out`, `n` apart: the last panel, which reaches past the output's columns.
fn add_partial(f: &[f32], rows: usize, width: usize, out: &mut [f32], n: usize) {
    for (r, f) in f.chunks_exact(PANEL).enumerate().take(rows) {
        for (o, f) in out[r * n..r * n + width].iter_mut().zip(f) {
            *o += f;
        }
    }
}

/// Adds the dequantized products of the quantized rows `a` (`rows` of them) and every panel
/// of `w` to `out`, in the register kernels of `isa`'s level.
fn products_vnni(
    isa: QuantIsa,
    a: &QuantizedRows,
    w: &QuantizedMatrix,
    rows: usize,
    out: &mut [f32],
) {
    let n = w.n;
    for p in 0..w.np / PANEL {
        let panel = w.panel(p);
        for r0 in (0..rows).step_by(MR) {
            let mr = MR.min(rows - r0);
            let scales = block_scales(a, w, r0, mr, p);
            let src = &a.data[r0 * a.kp..(r0 + mr) * a.kp];
            let (j0, width) = (p * PANEL, PANEL.min(n - p * PANEL));
            if width == PANEL {
                let mut o = OutRows {
                    data: &mut out[r0 * n + j0..],
                    stride: n,
                };
                block_dequant(isa, src, a.kp, mr, panel, &scales, &mut o);
                continue;
            }
            let mut f = [0f32; PANEL * MR];
            let mut o = OutRows {
                data: &mut f,
                stride: PANEL,
            };
            block_dequant(isa, src, a.kp, mr, panel, &scales, &mut o);
            add_partial(&f, mr, width, &mut out[r0 * n + j0..], n);
        }
    }
}

/// [`products_vnni`] with the integer sums on AMX tiles, 32 rows at a time, and each group
/// dequantized by the VNNI kernel's operations in its order: the same floats. `a` holds whole
/// blocks of 32 rows ([`quantize_rows`]) and `w.kp` whole tile steps.
fn products_amx(amx: Amx, a: &QuantizedRows, w: &QuantizedMatrix, rows: usize, out: &mut [f32]) {
    let n = w.n;
    let mut acc: amx::Int8Block = [[0; PANEL]; amx::MB];
    amx::configure(amx);
    for r0 in (0..rows).step_by(amx::MB) {
        let mr = amx::MB.min(rows - r0);
        for p in 0..w.np / PANEL {
            let panel = w.panel(p);
            let scales = block_scales(a, w, r0, mr, p);
            let (j0, width) = (p * PANEL, PANEL.min(n - p * PANEL));
            let mut f = [0f32; PANEL * amx::MB];
            let mut o = if width == PANEL {
                OutRows {
                    data: &mut out[r0 * n + j0..],
                    stride: n,
                }
            } else {
                OutRows {
                    data: &mut f,
                    stride: PANEL,
                }
            };
            for g in 0..w.groups {
                let (k0, len) = (g * GROUP, GROUP.min(w.kp - g * GROUP));
                amx::int8_block(amx, &a.data, a.kp, r0, mr, panel, k0, len, &mut acc);
                // SAFETY: an `Amx` exists only where detection found AVX-512F.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    x86::dequant_rows_avx512(&acc[..mr], g, &scales, &mut o)
                };
            }
            if width < PANEL {
                add_partial(&f, mr, width, &mut out[r0 * n + j0..], n);
            }
        }
    }
}

/// `dst (m × n) += x (m × k) · W`, with `x` quantized per row here and `W` quantized at load.
#[cfg(test)]
pub(crate) fn gemm_int8(isa: QuantIsa, dst: &mut [f32], x: &[f32], w: &QuantizedMatrix) {
    let bias = vec![0f32; w.n];
    let hooks = RowHooks {
        bias: &bias,
        residual: Some(&*dst),
        finish: |_: &mut [f32]| {},
    };
    let out = gemm_int8_rows(isa, x, w, &hooks);
    dst.copy_from_slice(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level this CPU runs.
    fn levels() -> Vec<QuantIsa> {
        let best = QuantIsa::detect();
        let mut out = vec![best];
        for isa in [
            best.without_amx(),
            best.at_most_avx_vnni(),
            best.at_most_avx2(),
            QuantIsa::portable(),
        ] {
            if !out.contains(&isa) {
                out.push(isa);
            }
        }
        out
    }

    /// A deterministic pseudo-random stream (no rand dependency in the library's tests).
    fn values(seed: u64, len: usize, scale: f32) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Sum of four uniforms: roughly normal, as activations and weights are.
                let u: f32 = (0..4)
                    .map(|i| ((s >> (16 * i)) & 0xffff) as f32 / 65535.0 - 0.5)
                    .sum();
                u * scale
            })
            .collect()
    }

    /// On AMX the tiles give the VNNI kernel's floats to the bit: the same integer sums, and the
    /// same dequantization in the same order. The shapes: MiniLM's widths; rows on both sides
    /// of the 16- and 32-row tile blocks and of a task's rows; a last panel past the outputs;
    /// inputs whose last group is one tile step (320 = 2 · 128 + 64); and a width the tiles
    /// leave to the VNNI kernel (100 inputs).
    #[test]
    fn amx_products_are_the_vnni_products_to_the_bit() {
        let best = QuantIsa::detect();
        if best.1.is_none() {
            eprintln!(
                "amx_products_are_the_vnni_products_to_the_bit: skipped, this CPU has no AMX \
                 (or the OS refused the tiles)"
            );
            return;
        }
        assert_eq!(best.name(), "amx");
        let shapes = [
            (1, 384, 1152),
            (16, 384, 384),
            (17, 384, 1536),
            (33, 1536, 384),
            (200, 384, 100),
            (70, 320, 65),
            (5, 100, 40),
            (129, 64, 33),
        ];
        for (s, &(m, k, n)) in shapes.iter().enumerate() {
            let s = s as u64;
            let w_t = values(s + 7, k * n, 0.2);
            let factors: Vec<f32> = values(s + 8, k, 1.0)
                .iter()
                .map(|v| 1.0 + v.abs())
                .collect();
            let x = values(s + 9, m * k, 3.0);
            let bias = values(s + 10, n, 1.0);
            let residual = values(s + 11, m * n, 1.0);
            let hooks = RowHooks {
                bias: &bias,
                residual: Some(&residual),
                finish: |_: &mut [f32]| {},
            };
            for w in [
                QuantizedMatrix::quantize(&w_t, k, n).unwrap(),
                QuantizedMatrix::quantize_smoothed(&w_t, k, n, &factors).unwrap(),
            ] {
                let tiles = gemm_int8_rows(best, &x, &w, &hooks);
                let registers = gemm_int8_rows(best.without_amx(), &x, &w, &hooks);
                assert_eq!(tiles.len(), m * n);
                for (i, (t, r)) in tiles.iter().zip(&registers).enumerate() {
                    assert_eq!(
                        t.to_bits(),
                        r.to_bits(),
                        "{m}x{k}x{n}, output {i}: {t} != {r}"
                    );
                }
            }
        }
    }

    /// `Σ_kk u_ik · q_kj` from the unpacked weights: the exact integers every kernel must give.
    fn reference(a: &QuantizedRows, w: &QuantizedMatrix) -> Vec<i32> {
        let m = a.scales.len() / a.groups;
        let mut out = vec![0i32; m * w.n];
        for i in 0..m {
            for j in 0..w.n {
                out[i * w.n + j] = (0..w.k)
                    .map(|kk| a.row(i)[kk] as i32 * w.weight(kk, j) as i32)
                    .sum();
            }
        }
        out
    }

    /// The integer kernel's sums over every group, block by block.
    fn accumulate(isa: QuantIsa, a: &QuantizedRows, w: &QuantizedMatrix) -> Vec<i32> {
        let n = w.n;
        let m = a.scales.len() / a.groups;
        let mut out = vec![0i32; m * n];
        let mut acc: Block = [[0; PANEL]; MR];
        for p in 0..w.np / PANEL {
            for r0 in (0..m).step_by(MR) {
                let mr = MR.min(m - r0);
                for g in 0..w.groups {
                    let (k0, len) = (g * GROUP, GROUP.min(a.kp - g * GROUP));
                    let src = &a.data[r0 * a.kp + k0..(r0 + mr) * a.kp];
                    let sub = &w.panel(p)[k0 * PANEL..(k0 + len) * PANEL];
                    block(isa, src, a.kp, mr, sub, len, &mut acc);
                    for (r, acc) in acc.iter().enumerate().take(mr) {
                        for c in 0..PANEL.min(n - p * PANEL) {
                            out[(r0 + r) * n + p * PANEL + c] += acc[c];
                        }
                    }
                }
            }
        }
        out
    }

    /// Tails everywhere (rows not a multiple of the register block, inputs not a multiple of
    /// four, outputs not a multiple of the panel) crossed with each other, and the MiniLM
    /// widths.
    fn shapes() -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for m in [1, 3, 9, 17] {
            for k in [1, 5, 6, 33] {
                for n in [1, 7, 31, 65] {
                    out.push((m, k, n));
                }
            }
        }
        out.extend([
            (70, 384, 1152),
            (13, 1536, 384),
            (130, 384, 384),
            (9, 301, 40),
        ]);
        out
    }

    #[test]
    fn every_kernel_gives_the_exact_integers_of_the_reference() {
        for (s, &(m, k, n)) in shapes().iter().enumerate() {
            let w = QuantizedMatrix::quantize(&values(s as u64, k * n, 0.2), k, n).unwrap();
            let mut x = values(100 + s as u64, m * k, 3.0);
            // A row of zeros and a row of one sign: the zero point's two extremes.
            x[..k].fill(0.0);
            if m > 2 {
                for v in &mut x[k..2 * k] {
                    *v = v.abs() + 0.5;
                }
            }
            let a = quantize_rows(QuantIsa::portable(), &x, k, w.kp, None, 1);
            // The largest code occurs (the top of some row's range), so the products reach
            // their extreme.
            assert!(m == 1 || a.data.contains(&255));
            let want = reference(&a, &w);
            // A smoothed matrix's input factors, which every level applies as it quantizes.
            let factors: Vec<f32> = values(500 + s as u64, k, 1.0)
                .iter()
                .map(|v| 0.25 + v.abs())
                .collect();
            let smoothed = quantize_rows(QuantIsa::portable(), &x, k, w.kp, Some(&factors), 1);
            for isa in levels() {
                let again = quantize_rows(isa, &x, k, w.kp, None, 1);
                assert_eq!(again.data, a.data, "{} {m}x{k}", isa.name());
                assert_eq!(again.zeros, a.zeros);
                assert_eq!(again.scales, a.scales);
                let again = quantize_rows(isa, &x, k, w.kp, Some(&factors), 1);
                assert_eq!(again.data, smoothed.data, "{} {m}x{k} smoothed", isa.name());
                assert_eq!(again.zeros, smoothed.zeros);
                assert_eq!(again.scales, smoothed.scales);
                assert_eq!(accumulate(isa, &a, &w), want, "{} {m}x{k}x{n}", isa.name());
            }
        }
    }

    #[test]
    fn every_level_dequantizes_as_the_portable_one() {
        for (s, &(m, k, n)) in shapes().iter().enumerate() {
            let w = QuantizedMatrix::quantize(&values(s as u64, k * n, 0.2), k, n).unwrap();
            let x = values(300 + s as u64, m * k, 3.0);
            let run = |isa| {
                let mut out = vec![0f32; m * n];
                gemm_int8(isa, &mut out, &x, &w);
                out
            };
            let want = run(QuantIsa::portable());
            let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
            for isa in levels() {
                // The same integers; only the f32 epilogue's rounding may differ (the VNNI kernel
                // fuses it).
                for (g, w) in run(isa).iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-5 * rms.max(1.0),
                        "{} {m}x{k}x{n}",
                        isa.name()
                    );
                }
            }
        }
    }

    #[test]
    fn rows_quantize_within_half_a_step_and_carry_nan() {
        for k in [1, 15, 16, 17, 301, 384] {
            let mut x = values(k as u64, 3 * k, 2.0);
            x[k..2 * k].iter_mut().for_each(|v| *v = v.abs());
            for isa in levels() {
                let a = quantize_rows(isa, &x, k, round_up(k, 4), None, 1);
                assert_eq!(a.groups, k.div_ceil(GROUP));
                for i in 0..3 {
                    for (kk, &v) in x[i * k..(i + 1) * k].iter().enumerate() {
                        let at = i * a.groups + kk / GROUP;
                        let (s, z) = (a.scales[at], a.zeros[at]);
                        assert!((0..=255).contains(&z));
                        let back = s * (a.row(i)[kk] as i32 - z) as f32;
                        assert!((back - v).abs() <= 0.5 * s * 1.001, "{k}: {v} -> {back}");
                    }
                }
            }
        }
        let mut x = vec![1.0f32; 40];
        x[33] = f32::NAN;
        for isa in levels() {
            let a = quantize_rows(isa, &x, 40, 40, None, 1);
            assert!(a.scales[0].is_nan(), "{}", isa.name());
            let zeros = quantize_rows(isa, &[0.0; 8], 8, 8, None, 1);
            assert_eq!((zeros.scales[0], zeros.zeros[0]), (0.0, 0));
        }
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        // Every product at its largest (255 · 127 or 255 · -127) over the largest k.
        let (m, k, n) = (3, MAX_K, 33);
        let w_t: Vec<f32> = (0..k * n)
            .map(|i| if (i % n) % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let w = QuantizedMatrix::quantize(&w_t, k, n).unwrap();
        let a = QuantizedRows {
            kp: w.kp,
            groups: w.groups,
            data: vec![255; m * w.kp],
            scales: vec![1.0; m * w.groups],
            zeros: vec![0; m * w.groups],
        };
        let want = 255 * 127 * k as i32;
        for isa in levels() {
            let got = accumulate(isa, &a, &w);
            for (j, g) in got[..n].iter().enumerate() {
                assert_eq!(*g, if j % 2 == 0 { want } else { -want }, "{}", isa.name());
            }
        }
        let err = QuantizedMatrix::quantize(&vec![0.0; (MAX_K + 1) * 2], MAX_K + 1, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 32768"), "{err}");
    }

    #[test]
    fn the_dequantized_product_is_close_to_f32() {
        for (s, &(m, k, n)) in shapes().iter().enumerate() {
            let w_t = values(s as u64, k * n, 0.2);
            let x = values(200 + s as u64, m * k, 3.0);
            let mut want = vec![0f64; m * n];
            for i in 0..m {
                for kk in 0..k {
                    let xv = x[i * k + kk] as f64;
                    for j in 0..n {
                        want[i * n + j] += xv * w_t[kk * n + j] as f64;
                    }
                }
            }
            let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
            let w = QuantizedMatrix::quantize(&w_t, k, n).unwrap();
            for isa in levels() {
                // Preloaded output, as the bias and residual are.
                let mut got = vec![1.0f32; m * n];
                gemm_int8(isa, &mut got, &x, &w);
                let err = (got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (*g as f64 - 1.0 - w).powi(2))
                    .sum::<f64>()
                    / want.len() as f64)
                    .sqrt();
                // Two 8-bit roundings of near-normal values: about 1% of the output's RMS.
                assert!(
                    err < 0.03 * rms,
                    "{} {m}x{k}x{n}: rms error {err} of {rms}",
                    isa.name()
                );
            }
        }
    }

    /// The RMS error of `gemm_int8` over `w` against the exact product, relative to its RMS.
    fn relative_error(isa: QuantIsa, x: &[f32], w_t: &[f32], w: &QuantizedMatrix) -> f64 {
        let (k, n) = (w.k, w.n);
        let m = x.len() / k;
        let mut want = vec![0f64; m * n];
        for i in 0..m {
            for kk in 0..k {
                for j in 0..n {
                    want[i * n + j] += x[i * k + kk] as f64 * w_t[kk * n + j] as f64;
                }
            }
        }
        let mut got = vec![0f32; m * n];
        gemm_int8(isa, &mut got, x, w);
        let sq = |it: &mut dyn Iterator<Item = f64>| it.map(|v| v * v).sum::<f64>();
        let err = sq(&mut got.iter().zip(&want).map(|(g, w)| *g as f64 - w));
        (err / sq(&mut want.iter().copied())).sqrt()
    }

    #[test]
    fn smoothing_keeps_an_outlier_input_from_costing_the_others_their_resolution() {
        let (m, k, n) = (24, 96, 40);
        let w_t = values(7, k * n, 0.2);
        let mut x = values(8, m * k, 1.0);
        // Input 5 reaches 40 times the others, as a LayerNorm's outlier channel does.
        for row in x.chunks_exact_mut(k) {
            row[5] *= 40.0;
        }
        let mut amax = vec![0f32; k];
        for row in x.chunks_exact(k) {
            for (a, v) in amax.iter_mut().zip(row) {
                *a = a.max(v.abs());
            }
        }
        let factors: Vec<f32> = amax
            .iter()
            .zip(w_t.chunks_exact(n))
            .map(|(a, row)| {
                let wmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                a.sqrt() / wmax.sqrt()
            })
            .collect();
        let plain = QuantizedMatrix::quantize(&w_t, k, n).unwrap();
        let smoothed = QuantizedMatrix::quantize_smoothed(&w_t, k, n, &factors).unwrap();
        for isa in levels() {
            let before = relative_error(isa, &x, &w_t, &plain);
            let after = relative_error(isa, &x, &w_t, &smoothed);
            assert!(after < before / 2.0, "{}: {before} -> {after}", isa.name());
            // Smoothing only moves ranges: without an outlier it costs next to nothing.
            let x = values(9, m * k, 1.0);
            let ones = QuantizedMatrix::quantize_smoothed(&w_t, k, n, &vec![1.0; k]).unwrap();
            assert_eq!(
                relative_error(isa, &x, &w_t, &ones),
                relative_error(isa, &x, &w_t, &plain)
            );
        }
        let err = QuantizedMatrix::quantize_smoothed(&w_t, k, n, &vec![0.0; k]).unwrap_err();
        assert!(err.to_string().contains("a factor is 0"), "{err}");
        assert!(QuantizedMatrix::quantize_smoothed(&w_t, k, n, &[1.0]).is_err());
    }

    #[test]
    fn rounding_to_i8_is_round_half_to_even_clamped() {
        let mut xs = vec![
            0.0, -0.0, 1e-300, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5,
        ];
        xs.extend([
            127.4,
            127.5,
            128.0,
            1e30,
            -1e30,
            0.49999999999999994,
            -3.7,
            42.25,
        ]);
        xs.extend((0..20_000).map(|i| (i as f64 - 10_000.0) * 0.0137));
        for x in xs {
            let want = x.round_ties_even().clamp(-127.0, 127.0) as i8;
            assert_eq!(to_i8(x), want, "{x}");
        }
    }

    #[test]
    fn bad_weights_are_errors() {
        let err = QuantizedMatrix::quantize(&[1.0, f32::NAN], 1, 2).unwrap_err();
        assert!(err.to_string().contains("a weight is NaN"), "{err}");
        assert!(QuantizedMatrix::quantize(&[1.0; 3], 2, 2).is_err());
    }

    #[test]
    fn levels_are_never_raised() {
        assert_eq!(QuantIsa::portable().at_most_avx2(), QuantIsa::portable());
        assert_ne!(QuantIsa::detect().at_most_avx2().name(), "avx512vnni");
        assert_eq!(
            QuantIsa::portable().at_most_avx_vnni(),
            QuantIsa::portable()
        );
        let vnni = QuantIsa::detect().at_most_avx_vnni();
        assert!(["avxvnni", "avx2", "portable"].contains(&vnni.name()));
        assert_eq!(
            vnni.at_most_avx2().name() == "avx2",
            vnni.name() != "portable"
        );
    }
}
