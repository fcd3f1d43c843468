//! Matrix products on Intel AMX tiles: the linear layers of `--dtype bf16`, and the integer
//! sums of `--dtype int8` where the CPU has AMX.
//!
//! Sapphire Rapids and later Xeons multiply bf16 matrices in AMX tiles (`tdpbf16ps`: a 16×32
//! bf16 tile times a 32×16 one, accumulated into 16×16 f32) at several times the f32 FMA
//! rate of the same core. The AMX intrinsics are unstable in Rust, so the tile instructions are
//! written as inline assembly, as candle does for its AMX int8 kernel.
//!
//! * **Weights** are rounded to bf16 once at load and packed in the VNNI layout a B tile reads:
//!   [`PANEL`] output columns at a time (two tiles of 16), for each block of 32 inputs, each
//!   tile 16 lines of 64 bytes whose line `r` holds inputs `2r` and `2r + 1` of its 16 columns
//!   side by side. A tile is then 1 KiB of contiguous memory, loaded with a stride of 64 bytes.
//!   `k` and `n` are padded to multiples of 32 with zeros.
//! * **Activations** are rounded to bf16 (to nearest, ties to even, as PyTorch and oneDNN do)
//!   row by row when a task starts, into rows of `kp` values padded with zeros, and the rows to
//!   a multiple of [`MB`] with zero rows: every tile load reads real memory, and a padded row or
//!   input adds nothing. On x86 this rounding, and the weights', is AVX-512 BF16's
//!   `vcvtne2ps2bf16`, 32 values an instruction; it reads subnormal inputs as zero, which
//!   changes no product, since `tdpbf16ps` reads subnormal bf16 as zero.
//! * **Products** run in register blocks of 32 rows × 32 columns: two A tiles and two B tiles
//!   feed four accumulator tiles, which take all of `k` before they are stored, in f32, once;
//!   a block of at most 16 rows uses one A tile and two accumulators. The block's sums are then
//!   added to the bias (and residual) into the output rows, and the row block's task hands its
//!   rows to the layer's epilogue (GELU, LayerNorm) while they are in its core's cache, exactly
//!   as the int8 path does ([`RowHooks`]).
//! * **Attention** of a bf16 layer ([`super::kernels`] drives it): a head's keys and values are
//!   packed once a sequence as B tiles, read in place out of the QKV rows
//!   ([`Bf16Matrix::from_columns`] for `Kᵀ`, [`Bf16Matrix::from_rows`] for `V`), the queries
//!   and then the softmax's weights are rounded into A rows ([`pack_rows_for`]), and
//!   [`product_into`] writes the plain f32 sums of the same register blocks.
//! * **int8** ([`int8_block`]): `tdpbusd` multiplies a 16×64 `u8` tile by a 64×16 `i8` one into
//!   16×16 exact i32 sums, the same integers as `vpdpbusd`. The int8 path's weights are already
//!   packed as its B tiles read them, so [`super::quant`] runs the same quantization, sums and
//!   dequantization with the tiles in place of the VNNI register kernel, and gives the same
//!   floats to the bit.
//!
//! Accuracy: each product of two bf16 values is exact in f32 and the sums are f32, so the only
//! error is the rounding of the inputs to 8-bit mantissas (relative 2^-9 each): about 2e-3 of a
//! product's magnitude, the same as oneDNN's and PyTorch's bf16 linear layers.
//!
//! # Safety
//!
//! All of the crate's AMX code is in this module. The invariants it relies on:
//!
//! * **Detection before use.** No tile instruction and no `#[target_feature]` function of this
//!   module runs without an [`Amx`], which only [`Amx::detect`] makes, and only after CPUID
//!   reported AMX-TILE, AMX-BF16, AVX-512F, AVX-512BW and AVX-512 BF16, the OS enabled the
//!   tile state in XCR0 (bits 17 and 18, read with `xgetbv` after CPUID confirmed OSXSAVE),
//!   and Linux granted this process the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//!   XFEATURE_XTILEDATA)` returned 0; without it the first tile load is a fatal signal). The result is cached for the process:
//!   the permission is per process and is never withdrawn. Other operating systems get no
//!   `Amx`.
//! * **Tile configuration.** Tiles must be configured on each thread before use, and another
//!   kernel on the same thread (candle's own AMX int8 kernel configures tiles of other shapes)
//!   may change the configuration in between. Every task therefore loads this module's one
//!   configuration (`ldtilecfg`, about 60 ns here) before its first tile instruction, on the
//!   thread that runs it, and nothing else runs on that thread until the task's tile
//!   instructions are done. The thread-local state is the configuration itself, not a flag that
//!   could go stale.
//! * **Tile memory.** Every tile load reads 16 lines of 64 bytes: A tiles at
//!   `rows[r0 .. r0 + 16]`, `k` block `b`, of the packed activation rows (`kp / 32` lines a row,
//!   rows padded to a multiple of 32), B tiles inside the packed weight panel; accumulators are
//!   stored into a 32 × 32 f32 (or i32) scratch block. [`block`] and [`int8_block`] assert the
//!   extents of the activation rows and the weight panel before entering the assembly, so that
//!   no load reaches past them.
//!   The assembly touches no memory but those, no stack, and the registers it names.
//! * Everything else (packing, adding into the output, parallel tasks) is safe Rust on slices;
//!   tasks write disjoint output rows through `par_chunks_mut`.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::hooks::RowHooks;

/// Rows of one A or accumulator tile.
const TM: usize = 16;
/// Inputs (`k`) of one tile step: 32 bf16 values fill a 64-byte A-tile row.
const TK: usize = 32;
/// Columns of one B or accumulator tile: 16 f32 fill a 64-byte row.
const TN: usize = 16;
/// Output columns of a packed weight panel and of a register block: two B tiles.
pub(crate) const PANEL: usize = 2 * TN;
/// Rows of a register block: two A tiles.
pub(crate) const MB: usize = 2 * TM;
/// 16-bit lines of one tile: 16 rows of 64 bytes.
const TILE_LINES: usize = 16;

/// 64 bytes of bf16 values (32 of them), aligned as the cache lines tiles are loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub(crate) struct Line([u16; 32]);

const ZERO_LINE: Line = Line([0; 32]);

/// Proof that this process may run the AMX bf16 kernels: made only by [`Amx::detect`] (see the
/// module's invariants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amx(());

impl Amx {
    /// AMX bf16 on this CPU with the tile state granted to this process, or `None`; detected
    /// and requested once per process.
    pub(crate) fn detect() -> Option<Amx> {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        GRANTED.get_or_init(detect_and_request).then_some(Amx(()))
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect_and_request() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // AVX-512 BF16 (`vcvtne2ps2bf16`, which rounds activations to bf16) comes with every CPU
    // that has AMX; it is checked all the same, since the packing relies on it.
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16"))
    {
        return false;
    }
    // `is_x86_feature_detected!("amx-bf16")` is unstable: CPUID leaf 7, EDX bit 22
    // (AMX-BF16), 24 (AMX-TILE) and 25 (AMX-INT8, which the tile palette comes with).
    let amx = (1 << 22) | (1 << 24) | (1 << 25);
    if __cpuid_count(7, 0).edx & amx != amx {
        return false;
    }
    const OSXSAVE: u32 = 1 << 27;
    if __cpuid(1).ecx & OSXSAVE == 0 {
        return false;
    }
    let xcr0: u32;
    // SAFETY: `xgetbv` with ECX = 0 reads XCR0; it exists wherever CPUID reports OSXSAVE,
    // checked above. It touches no memory.
    unsafe {
        std::arch::asm!(
            "xgetbv",
            in("ecx") 0u32,
            out("eax") xcr0,
            out("edx") _,
            options(nomem, nostack, preserves_flags)
        );
    }
    // XTILECFG and XTILEDATA: the OS saves and restores tile state.
    const XTILE: u32 = (1 << 17) | (1 << 18);
    if xcr0 & XTILE != XTILE {
        return false;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
    const XFEATURE_XTILEDATA: u64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call with these arguments only asks the kernel for the
    // tile data state for this process; it reads and writes no memory of ours. `syscall`
    // clobbers RCX and R11, declared here. (The engine has no libc dependency for one call.)
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    if ret != 0 {
        tracing::debug!(
            errno = -ret,
            "the CPU has AMX but the kernel refused the tile state"
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect_and_request() -> bool {
    false
}

/// `x` rounded to bf16, to nearest with ties to even; NaN stays NaN (quiet).
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        ((b >> 16) | 0x40) as u16
    } else {
        // Adding 0x7FFF plus the lowest kept bit carries into the kept bits exactly when the
        // dropped half is above one half, or one half with an odd kept part.
        (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }
}

/// The f32 of a bf16 value (exact).
#[cfg(test)]
fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` rounded to bf16 and back: the value the tiles multiply.
#[cfg(test)]
pub(crate) fn rounded(x: f32) -> f32 {
    from_bf16(to_bf16(x))
}

/// A weight matrix `k × n` in bf16, packed into AMX B tiles (see the module's notes).
#[derive(Debug, Clone)]
pub(crate) struct Bf16Matrix {
    k: usize,
    n: usize,
    /// `k` rounded up to whole blocks of [`TK`] (at least one).
    kp: usize,
    /// `n` rounded up to whole panels.
    np: usize,
    /// Panel `p`, block `b`, tile `t`, line `r` at `((p·kp/32 + b)·2 + t)·16 + r`; in that
    /// line, input `b·32 + 2r + e` of column `p·32 + t·16 + c` at `2c + e`. Zero past `k`, `n`.
    packed: Vec<Line>,
}

impl Bf16Matrix {
    /// Rounds and packs `w_t`, the weights transposed (`k × n`, row-major: row `kk` holds the
    /// `kk`-th input's weight for every output).
    pub(crate) fn pack(w_t: &[f32], k: usize, n: usize) -> candle_core::Result<Self> {
        if w_t.len() != k * n {
            candle_core::bail!("bf16 weights: {} values for {k}×{n}", w_t.len());
        }
        if let Some(bad) = w_t.iter().find(|v| !v.is_finite()) {
            candle_core::bail!("bf16 weights: a weight is {bad}");
        }
        Ok(Self::pack_values(None, w_t, k, n))
    }

    /// [`Bf16Matrix::pack`] of a matrix of the right length, whatever its values; with `amx`,
    /// in the loops compiled for AVX-512 that its detection proved (the rounding vectorizes
    /// there).
    fn pack_values(amx: Option<Amx>, w_t: &[f32], k: usize, n: usize) -> Self {
        Self::strided(amx, w_t, n, (k, n), false)
    }

    /// The `k × n` matrix whose row `kk` is `src[kk · stride ..][.. n]` or, `by_columns`,
    /// whose column `j` is `src[j · stride ..][.. k]`, rounded and packed, with `amx` in the
    /// loops compiled for AVX-512.
    fn strided(
        amx: Option<Amx>,
        src: &[f32],
        stride: usize,
        (k, n): (usize, usize),
        by_columns: bool,
    ) -> Self {
        let mut m = Self::zeros(k, n);
        match amx {
            // SAFETY: an `Amx` exists only where detection found AVX-512F, AVX-512BW and
            // AVX-512 BF16.
            #[cfg(target_arch = "x86_64")]
            Some(_) => unsafe {
                x86::fill_lines_avx512(src, stride, (k, n), &mut m.packed, by_columns)
            },
            _ if by_columns => fill_columns_generic(src, stride, k, n, &mut m.packed),
            _ => fill_lines_generic(src, stride, k, n, &mut m.packed),
        }
        m
    }

    /// An empty matrix of `k × n` (lines zeroed).
    fn zeros(k: usize, n: usize) -> Self {
        let kp = k.max(1).div_ceil(TK) * TK;
        let np = n.max(1).div_ceil(PANEL) * PANEL;
        Self {
            k,
            n,
            kp,
            np,
            packed: vec![ZERO_LINE; np / PANEL * (kp / TK) * 2 * TILE_LINES],
        }
    }

    /// The `k × n` matrix whose row `kk` is `src[kk · stride ..][.. n]`: one head's values,
    /// read in place out of a sequence's QKV rows.
    pub(crate) fn from_rows(amx: Amx, src: &[f32], stride: usize, k: usize, n: usize) -> Self {
        assert!(k == 0 || (k - 1) * stride + n <= src.len());
        Self::strided(Some(amx), src, stride, (k, n), false)
    }

    /// The `k × n` matrix whose column `j` is `src[j · stride ..][.. k]`: one head's keys as
    /// the scores' `Kᵀ`, read in place out of a sequence's QKV rows.
    pub(crate) fn from_columns(amx: Amx, src: &[f32], stride: usize, k: usize, n: usize) -> Self {
        assert!(n == 0 || (n - 1) * stride + k <= src.len());
        Self::strided(Some(amx), src, stride, (k, n), true)
    }

    /// `n` rounded up to whole panels: the width of the sums [`product_into`] writes.
    pub(crate) fn padded_n(&self) -> usize {
        self.np
    }

    /// The lines of panel `p`: every block's two B tiles, in order.
    fn panel(&self, p: usize) -> &[Line] {
        let len = self.kp / TK * 2 * TILE_LINES;
        &self.packed[p * len..(p + 1) * len]
    }

    /// The rounded weight of input `kk` for output `j`.
    #[cfg(test)]
    fn weight(&self, kk: usize, j: usize) -> f32 {
        let blocks = self.kp / TK;
        let (b, r, e) = (kk / TK, (kk % TK) / 2, kk % 2);
        let (p, t, c) = (j / PANEL, (j % PANEL) / TN, j % TN);
        from_bf16(self.packed[((p * blocks + b) * 2 + t) * TILE_LINES + r].0[2 * c + e])
    }
}

/// The tile configuration every kernel here runs with: palette 1, all eight tiles 16 rows of
/// 64 bytes (tmm0-3 accumulators, tmm4-5 A, tmm6-7 B).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const TILE_CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row (u16, little-endian)
        c[48 + t] = TM as u8; // rows
        t += 1;
    }
    TileConfig(c)
};

/// Loads [`TILE_CONFIG`] on this thread: every task that runs tile instructions calls it first,
/// on the thread that runs it.
pub(crate) fn configure(_: Amx) {
    // SAFETY: an `Amx` exists only where detection and the permission request succeeded (see
    // the module's invariants); `ldtilecfg` reads the 64 bytes of a valid palette-1
    // configuration.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!(
            "ldtilecfg [{}]",
            in(reg) &TILE_CONFIG,
            options(nostack, readonly, preserves_flags)
        );
    }
}

/// Sums of one register block, 32 rows × 32 columns of f32, row-major.
type Block = [[f32; PANEL]; MB];

/// `c = a (rows r0.., all of k) · panel`, for `mr` rows (at most [`MB`]): 32×32 through four
/// accumulator tiles, or the first 16 rows only through two when `mr <= 16`.
///
/// `a` holds rows of `lines` lines each (the padded `k`), `panel` the weight panel; the tiles
/// must have been configured on this thread ([`configure`]).
fn block(_: Amx, a: &[Line], lines: usize, r0: usize, mr: usize, panel: &[Line], c: &mut Block) {
    // Every load below: A rows r0..r0 + (16 or 32), lines 0..lines of each; B lines
    // 0..lines·32 of the panel (two tiles of 16 lines per block of k).
    let tiles = if mr > TM { 2 } else { 1 };
    assert!(lines > 0 && (r0 + tiles * TM) * lines <= a.len());
    assert!(panel.len() >= lines * 2 * TILE_LINES);
    #[cfg(target_arch = "x86_64")]
    {
        let a = a[r0 * lines..].as_ptr();
        let b = panel.as_ptr();
        let c = c.as_mut_ptr() as *mut f32;
        let stride = lines * 64;
        // SAFETY: the extents were asserted above, `c` is 32 rows of 128 bytes (tiles stored at
        // row 0 or 16, byte 0 or 64), the tiles were configured by the caller, and an `Amx`
        // exists only where tiles may run. The loop count `lines` is at least 1.
        unsafe {
            if tiles == 2 {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm6, [{b} + {sb}*1]",
                    "tileloadd tmm7, [{b} + {sb}*1 + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a2} + {sa}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a}, 64",
                    "add {a2}, 64",
                    "add {b}, 2048",
                    "dec {n}",
                    "jnz 2b",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 64], tmm1",
                    "tilestored [{c} + {sc}*1 + 2048], tmm2",
                    "tilestored [{c} + {sc}*1 + 2112], tmm3",
                    a = inout(reg) a => _,
                    a2 = inout(reg) (a as *const u8).add(TM * stride) => _,
                    b = inout(reg) b => _,
                    n = inout(reg) lines => _,
                    sa = in(reg) stride,
                    sb = in(reg) 64usize,
                    sc = in(reg) PANEL * 4,
                    c = in(reg) c,
                    options(nostack),
                );
            } else {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "2:",
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm6, [{b} + {sb}*1]",
                    "tileloadd tmm7, [{b} + {sb}*1 + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "add {a}, 64",
                    "add {b}, 2048",
                    "dec {n}",
                    "jnz 2b",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 64], tmm1",
                    a = inout(reg) a => _,
                    b = inout(reg) b => _,
                    n = inout(reg) lines => _,
                    sa = in(reg) stride,
                    sb = in(reg) 64usize,
                    sc = in(reg) PANEL * 4,
                    c = in(reg) c,
                    options(nostack),
                );
            }
        }
    }
}

/// Inputs of one int8 tile step: 64 `u8` fill an A-tile row, and a B tile holds 16 lines of
/// four inputs of 16 columns.
pub(crate) const TK_INT8: usize = 64;

/// i32 sums of one int8 register block, 32 rows × 32 columns, row-major.
pub(crate) type Int8Block = [[i32; PANEL]; MB];

/// `c = Σ_k a · panel` over inputs `k0 .. k0 + len` (`len` a positive multiple of
/// [`TK_INT8`]), for `mr` rows (at most [`MB`]) from `r0` of the `u8` rows `a` (`stride` bytes
/// apart): `tdpbusd`, exact i32 sums, into four accumulator tiles (two when `mr <= 16`).
///
/// `panel` is one panel of the int8 kernels' weights (`i8`, for each four inputs 32 columns
/// × 4 bytes, see [`super::quant`]): the 16 columns of a B tile are then 16 lines of 64 bytes
/// 128 bytes apart, which is the layout `tdpbusd` reads, so the VNNI kernels' packing serves
/// the tiles unchanged. Rows of `a` past `mr` are read (up to the next 16 or 32) and their
/// sums dropped, so the caller pads `a` with whole rows. The tiles must have been configured
/// on this thread ([`configure`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn int8_block(
    _: Amx,
    a: &[u8],
    stride: usize,
    r0: usize,
    mr: usize,
    panel: &[i8],
    k0: usize,
    len: usize,
    c: &mut Int8Block,
) {
    // Every load below: A rows r0 .. r0 + (16 or 32), bytes k0 .. k0 + len of each; B bytes
    // k0·32 .. (k0 + len)·32 of the panel (each four inputs take 4 · 32 bytes).
    let tiles = if mr > TM { 2 } else { 1 };
    assert!(len > 0 && len.is_multiple_of(TK_INT8) && k0 + len <= stride);
    assert!((r0 + tiles * TM - 1) * stride + k0 + len <= a.len());
    assert!((k0 + len) * PANEL <= panel.len());
    #[cfg(target_arch = "x86_64")]
    {
        let steps = len / TK_INT8;
        let a = a[r0 * stride + k0..].as_ptr();
        let b = panel[k0 * PANEL..].as_ptr();
        let c = c.as_mut_ptr() as *mut i32;
        // SAFETY: the extents were asserted above (the last A tile's last line ends at
        // (r0 + 16·tiles - 1)·stride + k0 + len; step s's B tiles are the 2,048 bytes from
        // (k0 + 64s)·32), `c` is 32 rows of 128 bytes (tiles stored at row 0 or 16, byte 0 or
        // 64), the tiles were configured by the caller, and an `Amx` exists only where tiles
        // may run. The loop count `steps` is at least 1.
        unsafe {
            if tiles == 2 {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm6, [{b} + {sb}*1]",
                    "tileloadd tmm7, [{b} + {sb}*1 + 64]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a2} + {sa}*1]",
                    "tdpbusd tmm1, tmm4, tmm7",
                    "tdpbusd tmm2, tmm5, tmm6",
                    "tdpbusd tmm3, tmm5, tmm7",
                    "add {a}, 64",
                    "add {a2}, 64",
                    "add {b}, 2048",
                    "dec {n}",
                    "jnz 2b",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 64], tmm1",
                    "tilestored [{c} + {sc}*1 + 2048], tmm2",
                    "tilestored [{c} + {sc}*1 + 2112], tmm3",
                    a = inout(reg) a => _,
                    a2 = inout(reg) a.add(TM * stride) => _,
                    b = inout(reg) b => _,
                    n = inout(reg) steps => _,
                    sa = in(reg) stride,
                    sb = in(reg) 4 * PANEL,
                    sc = in(reg) PANEL * 4,
                    c = in(reg) c,
                    options(nostack),
                );
            } else {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "2:",
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm6, [{b} + {sb}*1]",
                    "tileloadd tmm7, [{b} + {sb}*1 + 64]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm1, tmm4, tmm7",
                    "add {a}, 64",
                    "add {b}, 2048",
                    "dec {n}",
                    "jnz 2b",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 64], tmm1",
                    a = inout(reg) a => _,
                    b = inout(reg) b => _,
                    n = inout(reg) steps => _,
                    sa = in(reg) stride,
                    sb = in(reg) 4 * PANEL,
                    sc = in(reg) PANEL * 4,
                    c = in(reg) c,
                    options(nostack),
                );
            }
        }
    }
}

/// Rounds the rows of `x` (`k` wide) into `a`: `kp / 32` lines a row, rows padded with zero
/// rows to a multiple of [`MB`].
fn pack_rows(amx: Amx, x: &[f32], k: usize, kp: usize, a: &mut Vec<Line>) {
    // SAFETY: an `Amx` exists only where detection found AVX-512F, AVX-512BW and AVX-512 BF16.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        let _ = amx;
        x86::pack_strided_avx512(x, k, x.len() / k, k, kp, a)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = amx;
        pack_strided_generic(x, k, x.len() / k, k, kp, a)
    }
}

/// Fills the zeroed lines of a [`Bf16Matrix`] from `w_t` (`k × n`, row `kk` at `kk · stride`),
/// in the order of the lines, so the writes are sequential. A line takes 16 columns of two
/// consecutive inputs; whole ones are fixed-width loops that vectorize, the edges go value by
/// value.
#[inline(always)]
fn fill_lines_generic(w_t: &[f32], stride: usize, k: usize, n: usize, packed: &mut [Line]) {
    let blocks = k.max(1).div_ceil(TK);
    let mut lines = packed.iter_mut();
    for p in 0..n.max(1).div_ceil(PANEL) {
        for b in 0..blocks {
            for t in 0..2 {
                let j0 = p * PANEL + t * TN;
                let width = TN.min(n.saturating_sub(j0));
                for r in 0..TILE_LINES {
                    let line = lines.next().expect("one line per (panel, block, tile, r)");
                    let kk = b * TK + 2 * r;
                    if width == TN && kk + 1 < k {
                        let x0: &[f32; TN] = w_t[kk * stride + j0..][..TN].try_into().unwrap();
                        let x1: &[f32; TN] =
                            w_t[(kk + 1) * stride + j0..][..TN].try_into().unwrap();
                        for c in 0..TN {
                            line.0[2 * c] = to_bf16(x0[c]);
                            line.0[2 * c + 1] = to_bf16(x1[c]);
                        }
                        continue;
                    }
                    for e in 0..2 {
                        if kk + e < k {
                            for c in 0..width {
                                line.0[2 * c + e] = to_bf16(w_t[(kk + e) * stride + j0 + c]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// [`fill_lines_generic`] of the matrix whose element `(kk, j)` is `src[j · stride + kk]`,
/// source row by source row so that the reads are sequential: each block of 32 of a row's
/// values is rounded at once, and its 16 pairs go to the same place in 16 lines.
#[inline(always)]
fn fill_columns_generic(src: &[f32], stride: usize, k: usize, n: usize, packed: &mut [Line]) {
    let blocks = k.max(1).div_ceil(TK);
    for j in 0..n {
        let (p, t, c) = (j / PANEL, (j % PANEL) / TN, j % TN);
        let row = &src[j * stride..j * stride + k];
        for b in 0..blocks {
            let mut values = [0u16; TK];
            for (v, x) in values.iter_mut().zip(&row[b * TK..k.min((b + 1) * TK)]) {
                *v = to_bf16(*x);
            }
            let tile = ((p * blocks + b) * 2 + t) * TILE_LINES;
            for (r, line) in packed[tile..tile + TILE_LINES].iter_mut().enumerate() {
                line.0[2 * c] = values[2 * r];
                line.0[2 * c + 1] = values[2 * r + 1];
            }
        }
    }
}

/// Rounds `rows` rows of `w`'s `k` inputs, row `i` at `x[i · stride ..]`, into `a` as A tiles
/// read them for products with `w` (see [`pack_rows`]).
pub(crate) fn pack_rows_for(
    amx: Amx,
    x: &[f32],
    stride: usize,
    rows: usize,
    w: &Bf16Matrix,
    a: &mut Vec<Line>,
) {
    assert!(rows == 0 || (rows - 1) * stride + w.k <= x.len());
    // SAFETY: an `Amx` exists only where detection found AVX-512F, AVX-512BW and AVX-512 BF16.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        let _ = amx;
        x86::pack_strided_avx512(x, stride, rows, w.k, w.kp, a)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = amx;
        pack_strided_generic(x, stride, rows, w.k, w.kp, a)
    }
}

/// `a · w` for the first `rows` packed rows of `a` ([`pack_rows_for`]), into `out` as
/// `rows × w.padded_n()` row-major f32 sums (zero in the padding columns), on the calling
/// thread. The tiles are configured here.
pub(crate) fn product_into(amx: Amx, a: &[Line], rows: usize, w: &Bf16Matrix, out: &mut [f32]) {
    assert!(out.len() >= rows * w.np);
    configure(amx);
    // SAFETY: an `Amx` exists only where detection found AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        x86::copy_blocks_avx512(amx, a, rows, w, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    copy_blocks_generic(amx, a, rows, w, out)
}

/// The loops of [`product_into`]; the tiles must have been configured on this thread.
#[inline(always)]
fn copy_blocks_generic(amx: Amx, a: &[Line], rows: usize, w: &Bf16Matrix, out: &mut [f32]) {
    let (lines, np) = (w.kp / TK, w.np);
    let mut c: Block = [[0.0; PANEL]; MB];
    for r0 in (0..rows).step_by(MB) {
        let mr = MB.min(rows - r0);
        for p in 0..np / PANEL {
            block(amx, a, lines, r0, mr, w.panel(p), &mut c);
            for (r, c) in c.iter().enumerate().take(mr) {
                out[(r0 + r) * np + p * PANEL..][..PANEL].copy_from_slice(c);
            }
        }
    }
}

/// `rows × cols` row-major, transposed (in blocks of 32 × 32, so that both the reads and the
/// writes stay within a few cache lines).
fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; a.len()];
    for r0 in (0..rows).step_by(32) {
        for c0 in (0..cols).step_by(32) {
            for r in r0..(r0 + 32).min(rows) {
                for c in c0..(c0 + 32).min(cols) {
                    t[c * rows + r] = a[r * cols + c];
                }
            }
        }
    }
    t
}

/// [`pack_rows`]' loops, for `rows` rows of `k` values, row `i` at `x[i · stride ..]`: the
/// portable code, and the reference of the x86 one in tests.
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline(always)]
fn pack_strided_generic(
    x: &[f32],
    stride: usize,
    rows: usize,
    k: usize,
    kp: usize,
    a: &mut Vec<Line>,
) {
    let lines = kp / TK;
    a.clear();
    a.resize(rows.div_ceil(MB) * MB * lines, ZERO_LINE);
    for (i, dst) in a.chunks_exact_mut(lines).take(rows).enumerate() {
        let src = &x[i * stride..i * stride + k];
        let mut chunks = src.chunks_exact(TK);
        for (c, l) in (&mut chunks).zip(dst.iter_mut()) {
            for (o, v) in l.0.iter_mut().zip(c) {
                *o = to_bf16(*v);
            }
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            for (o, v) in dst[k / TK].0.iter_mut().zip(tail) {
                *o = to_bf16(*v);
            }
        }
    }
}

/// `out[r][..width] = c[r][..width] + bias (+ residual[r])` for `mr` rows of `n` columns:
/// every one of those values written, none read, so the output needs no zeroing first.
#[inline(always)]
fn store_generic(
    c: &Block,
    mr: usize,
    width: usize,
    bias: &[f32],
    res: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    n: usize,
) {
    for (r, c) in c.iter().enumerate().take(mr) {
        let o = &mut out[r * n..r * n + width];
        match res {
            Some(res) => {
                let res = &res[r * n..r * n + width];
                for (((o, c), b), x) in o.iter_mut().zip(c).zip(bias).zip(res) {
                    o.write(c + b + x);
                }
            }
            None => {
                for ((o, c), b) in o.iter_mut().zip(c).zip(bias) {
                    o.write(c + b);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::mem::MaybeUninit;

    use super::Line;

    /// [`super::fill_lines_generic`], or [`super::fill_columns_generic`] where `by_columns`,
    /// with AVX-512 BF16's rounding.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 BF16 must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn fill_lines_avx512(
        src: &[f32],
        stride: usize,
        (k, n): (usize, usize),
        packed: &mut [Line],
        by_columns: bool,
    ) {
        if by_columns {
            fill_columns(src, stride, (k, n), packed)
        } else {
            fill_lines(src, stride, (k, n), packed)
        }
    }

    /// Lanes of the first `n` (at most 16) values.
    #[inline(always)]
    fn first(n: usize) -> u16 {
        ((1u32 << n.min(16)) - 1) as u16
    }

    /// [`super::fill_lines_generic`] with `vcvtne2ps2bf16`: a line is two inputs' 16 columns,
    /// each a masked load (nothing read past `n`, zeros past `k`), rounded together and
    /// interleaved by one permutation.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn fill_lines(src: &[f32], stride: usize, (k, n): (usize, usize), packed: &mut [Line]) {
        use super::{PANEL, TILE_LINES, TK, TN};
        use std::arch::x86_64::*;

        let blocks = k.max(1).div_ceil(TK);
        assert!(k == 0 || n == 0 || (k - 1) * stride + n <= src.len());
        assert!(packed.len() >= n.max(1).div_ceil(PANEL) * blocks * 2 * TILE_LINES);
        // Lane 2c takes column c of the first input (u16 lanes 0..16 of the rounding), lane
        // 2c + 1 the same column of the second (lanes 16..32).
        let interleave = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        let mut lines = packed.iter_mut();
        for p in 0..n.max(1).div_ceil(PANEL) {
            for b in 0..blocks {
                for t in 0..2 {
                    let j0 = p * PANEL + t * TN;
                    let columns = first(n.saturating_sub(j0));
                    for r in 0..TILE_LINES {
                        let line = lines.next().expect("one line per (panel, block, tile, r)");
                        let kk = b * TK + 2 * r;
                        let lanes = |kk: usize| if kk < k { columns } else { 0 };
                        let at = src.as_ptr().wrapping_add(kk * stride + j0);
                        // SAFETY: the lanes are columns j0.. below `n` of inputs below `k`
                        // (asserted within `src`); a masked lane is not read, and
                        // `wrapping_add` forms no out-of-bounds pointer.
                        let (x0, x1) = unsafe {
                            (
                                _mm512_maskz_loadu_ps(lanes(kk), at),
                                _mm512_maskz_loadu_ps(lanes(kk + 1), at.wrapping_add(stride)),
                            )
                        };
                        let pairs: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(x1, x0));
                        let pairs = _mm512_permutexvar_epi16(interleave, pairs);
                        // SAFETY: `line` is 64 aligned bytes.
                        unsafe { _mm512_store_si512(line.0.as_mut_ptr() as *mut __m512i, pairs) };
                    }
                }
            }
        }
    }

    /// [`super::fill_columns_generic`] with `vcvtne2ps2bf16`: a column's 32 inputs of a block,
    /// rounded together, are the 16 pairs its tile's 16 lines hold, scattered to them.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn fill_columns(
        src: &[f32],
        stride: usize,
        (k, n): (usize, usize),
        packed: &mut [Line],
    ) {
        use super::{PANEL, TILE_LINES, TK, TN};
        use std::arch::x86_64::*;

        let blocks = k.max(1).div_ceil(TK);
        assert!(k == 0 || n == 0 || (n - 1) * stride + k <= src.len());
        assert!(packed.len() >= n.max(1).div_ceil(PANEL) * blocks * 2 * TILE_LINES);
        // Line r of a tile starts 16 u32 after line r - 1.
        let lines = _mm512_set_epi32(
            240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0,
        );
        for j in 0..n {
            let (p, t, c) = (j / PANEL, (j % PANEL) / TN, j % TN);
            for b in 0..blocks {
                let left = k.saturating_sub(b * TK);
                let at = src.as_ptr().wrapping_add(j * stride + b * TK);
                // SAFETY: the lanes are inputs b·32.. below `k` of column j below `n`
                // (asserted within `src`); a masked lane is not read.
                let (lo, hi) = unsafe {
                    (
                        _mm512_maskz_loadu_ps(first(left), at),
                        _mm512_maskz_loadu_ps(first(left.saturating_sub(16)), at.wrapping_add(16)),
                    )
                };
                let pairs: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                let tile = ((p * blocks + b) * 2 + t) * TILE_LINES;
                let base = packed[tile..tile + TILE_LINES].as_mut_ptr() as *mut i32;
                // SAFETY: the 16 offsets are u32 c of each of the tile's 16 lines, within the
                // slice just taken.
                unsafe { _mm512_i32scatter_epi32::<4>(base.add(c), lines, pairs) };
            }
        }
    }

    /// [`super::pack_strided_generic`] with `vcvtne2ps2bf16`, which rounds 32 values to bf16
    /// in one instruction, to nearest with ties to even as [`super::to_bf16`] does (it reads
    /// subnormal inputs as zero, as `tdpbf16ps` reads subnormal bf16 anyway). Each line is
    /// written once: a row's last line through masked loads that read nothing past `k` and
    /// give zeros, the padding rows zeroed.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 BF16 must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_strided_avx512(
        x: &[f32],
        stride: usize,
        rows: usize,
        k: usize,
        kp: usize,
        a: &mut Vec<Line>,
    ) {
        use super::{MB, TK, ZERO_LINE};
        use std::arch::x86_64::*;

        let lines = kp / TK;
        assert!(k <= kp && kp.is_multiple_of(TK));
        assert!(rows == 0 || (rows - 1) * stride + k <= x.len());
        a.resize(rows.div_ceil(MB) * MB * lines, ZERO_LINE);
        a[rows * lines..].fill(ZERO_LINE);
        for (i, dst) in a.chunks_exact_mut(lines).take(rows).enumerate() {
            let src = x[i * stride..i * stride + k].as_ptr();
            for (c, line) in dst.iter_mut().enumerate() {
                let left = k.saturating_sub(c * TK);
                // SAFETY: the masks select the row's values `c·32 ..` up to `k` only (a masked
                // lane is neither read nor able to fault, and `wrapping_add` forms no
                // out-of-bounds pointer); `line` is 64 aligned bytes.
                unsafe {
                    let lo = _mm512_maskz_loadu_ps(first(left), src.wrapping_add(c * TK));
                    let hi = _mm512_maskz_loadu_ps(
                        first(left.saturating_sub(16)),
                        src.wrapping_add(c * TK + 16),
                    );
                    let bf: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                    _mm512_store_si512(line.0.as_mut_ptr() as *mut __m512i, bf);
                }
            }
        }
    }

    /// [`super::copy_blocks_generic`] compiled for AVX-512.
    ///
    /// # Safety
    /// AVX-512F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy_blocks_avx512(
        amx: super::Amx,
        a: &[Line],
        rows: usize,
        w: &super::Bf16Matrix,
        out: &mut [f32],
    ) {
        super::copy_blocks_generic(amx, a, rows, w, out)
    }

    /// [`super::products_generic`] compiled for AVX-512, where adding the sums vectorizes.
    ///
    /// # Safety
    /// AVX-512F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn products_avx512(
        amx: super::Amx,
        a: &[Line],
        w: &super::Bf16Matrix,
        bias: &[f32],
        residual: Option<&[f32]>,
        out: &mut [MaybeUninit<f32>],
    ) {
        super::products_generic(amx, a, w, bias, residual, out)
    }
}

/// `bias (+ residual) + a · W` into `out` (`rows × n`), for the packed rows `a`, writing
/// every value of `out`; the tiles must have been configured on this thread.
#[inline(always)]
fn products_generic(
    amx: Amx,
    a: &[Line],
    w: &Bf16Matrix,
    bias: &[f32],
    residual: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
) {
    let n = w.n;
    let rows = out.len() / n;
    let lines = w.kp / TK;
    let mut c: Block = [[0.0; PANEL]; MB];
    // Row blocks outside, panels inside: a block's activations (32 rows of k) stay in L1
    // while the weights stream from L2.
    for r0 in (0..rows).step_by(MB) {
        let mr = MB.min(rows - r0);
        for p in 0..w.np / PANEL {
            block(amx, a, lines, r0, mr, w.panel(p), &mut c);
            let j0 = p * PANEL;
            let width = PANEL.min(n - j0);
            let res = residual.map(|r| &r[r0 * n + j0..]);
            store_generic(&c, mr, width, &bias[j0..], res, &mut out[r0 * n + j0..], n);
        }
    }
}

thread_local! {
    /// Each worker's packed activation rows, kept between tasks so that a task neither
    /// allocates nor faults in fresh pages (up to 384 KiB a task).
    static ROWS: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// `bias (+ residual) + x · W` for the rows of `x` (`rows × k`) into `out` (`rows × n`), on
/// the calling thread, writing every value of `out`.
fn rows_task(
    amx: Amx,
    x: &[f32],
    w: &Bf16Matrix,
    bias: &[f32],
    residual: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
) {
    ROWS.with_borrow_mut(|a| {
        pack_rows(amx, x, w.k, w.kp, a);
        configure(amx);
        // SAFETY: an `Amx` exists only where detection found AVX-512F.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            x86::products_avx512(amx, a, w, bias, residual, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        products_generic(amx, a, w, bias, residual, out)
    });
}

/// `finish(bias + residual + x (m × k) · W)` (`m × n`) row block by row block, in parallel:
/// each task rounds its own rows of `x` to bf16, multiplies them on AMX and finishes them (see
/// [`RowHooks`]).
pub(crate) fn gemm_bf16_rows<F>(
    amx: Amx,
    x: &[f32],
    w: &Bf16Matrix,
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
    // Enough tasks for every thread, each whole register blocks and at most 128 rows (their
    // bf16 rows, 384 KiB at k = 1,536, stay in L2).
    let threads = rayon::current_num_threads().max(1);
    let rows_per_task = (m.div_ceil(4 * threads).div_ceil(MB) * MB).clamp(MB, 128);
    out.spare_capacity_mut()[..m * n]
        .par_chunks_mut(rows_per_task * n)
        .enumerate()
        .for_each(|(t, out)| {
            let first = t * rows_per_task;
            let rows = out.len() / n;
            let residual = hooks.residual.map(|r| &r[first * n..(first + rows) * n]);
            rows_task(
                amx,
                &x[first * k..(first + rows) * k],
                w,
                hooks.bias,
                residual,
                out,
            );
            // SAFETY: `rows_task` wrote every value of this task's rows (each panel's block
            // stores all of its rows and its columns within `n`, and the panels cover `n`), and
            // `MaybeUninit<f32>` has the layout of `f32`.
            let out: &mut [f32] = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
            (hooks.finish)(out);
        });
    // SAFETY: the tasks' rows cover all `m · n` values (the chunks of the first `m · n` of the
    // spare capacity), and each task wrote all of its own; a task that panicked would have
    // ended this call before this line.
    unsafe { out.set_len(m * n) };
    out
}

/// Matrix products in bf16 on AMX tiles for code outside the encoder: a trainer's linear
/// layers, forward and backward. Both factors are rounded to bf16 (to nearest, ties to even)
/// and the sums are f32, as PyTorch's bf16 autocast does; each output's sum runs in the same
/// order on every call, so the same inputs give the same floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bf16Tiles(Amx);

impl Bf16Tiles {
    /// The tiles, where the CPU has AMX and the OS grants this process their state; `None`
    /// elsewhere.
    pub fn detect() -> Option<Bf16Tiles> {
        Amx::detect().map(Bf16Tiles)
    }

    /// `a (m × k) · b (k × n)`, both row-major, as `m × n` row-major, plus `bias` (`n`) on
    /// every row when there is one. Values that are not finite go through as they would in
    /// f32 (a NaN anywhere in a row or column gives NaN).
    pub fn product(
        &self,
        a: &[f32],
        k: usize,
        b: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        Self::check(a, k, b, n, bias)?;
        self.run(a, &Bf16Matrix::pack_values(Some(self.0), b, k, n), bias)
    }

    /// `a (m × k) · wᵀ` for `w` (`n × k`, row-major: a linear layer's weight), plus `bias`:
    /// [`product`](Self::product) of the transpose, to the bit.
    pub fn product_t(
        &self,
        a: &[f32],
        k: usize,
        w: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        Self::check(a, k, w, n, bias)?;
        // The weight's rows are its transpose's columns: packed from them in place, with no
        // transposed copy.
        self.run(a, &Bf16Matrix::from_columns(self.0, w, k, k, n), bias)
    }

    /// `a_tᵀ · b` for `a_t` (`k × m`, row-major) and `b` (`k × n`), as `m × n`, plus `bias`:
    /// a weight's gradient, `∂yᵀ · x`, from the rows of both.
    pub fn product_tn(
        &self,
        a_t: &[f32],
        m: usize,
        b: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        if m == 0 || !a_t.len().is_multiple_of(m) {
            candle_core::bail!("bf16 product: {} values do not make k × {m}", a_t.len());
        }
        let k = a_t.len() / m;
        self.product(&transpose(a_t, k, m), k, b, n, bias)
    }

    fn check(
        a: &[f32],
        k: usize,
        b: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> candle_core::Result<()> {
        if k == 0
            || !a.len().is_multiple_of(k)
            || b.len() != k * n
            || bias.is_some_and(|v| v.len() != n)
        {
            candle_core::bail!(
                "bf16 product: {} and {} values (and a bias of {}) do not make m × {k} and {k} × {n}",
                a.len(),
                b.len(),
                bias.map_or(0, <[f32]>::len)
            );
        }
        Ok(())
    }

    fn run(
        &self,
        a: &[f32],
        w: &Bf16Matrix,
        bias: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        let zeros;
        let bias = match bias {
            Some(bias) => bias,
            None => {
                zeros = vec![0f32; w.n];
                &zeros
            }
        };
        let hooks = RowHooks {
            bias,
            residual: None,
            finish: |_: &mut [f32]| {},
        };
        Ok(gemm_bf16_rows(self.0, a, w, &hooks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u64, len: usize, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn amx_or_skip(test: &str) -> Option<Amx> {
        let amx = Amx::detect();
        if amx.is_none() {
            eprintln!("{test}: skipped, this CPU has no AMX bf16 (or the OS refused the tiles)");
        }
        amx
    }

    /// The public product: the same sums as the packed kernel (checked against f64 above),
    /// on shapes with tails in every dimension, the same floats on a second call, shapes that
    /// do not fit refused, and a NaN in a factor reaching its row and column only.
    #[test]
    fn tiles_product_is_the_rounded_product() {
        let Some(tiles) = Bf16Tiles::detect() else {
            eprintln!("tiles_product_is_the_rounded_product: skipped, this CPU has no AMX bf16");
            return;
        };
        for (m, k, n) in [(1, 1, 1), (3, 40, 5), (70, 130, 33), (256, 384, 1536)] {
            let a = values(11 + m as u64, m * k, 1.0);
            let b = values(12 + n as u64, k * n, 1.0);
            let got = tiles.product(&a, k, &b, n, None).unwrap();
            assert_eq!(got.len(), m * n);
            for i in (0..m).step_by(7) {
                for j in (0..n).step_by(5) {
                    let mut rounded = 0f64;
                    for kk in 0..k {
                        rounded += from_bf16(to_bf16(a[i * k + kk])) as f64
                            * from_bf16(to_bf16(b[kk * n + j])) as f64;
                    }
                    let size = 1.0 + k as f64;
                    assert!((got[i * n + j] as f64 - rounded).abs() / size < 1e-6);
                }
            }
            assert_eq!(got, tiles.product(&a, k, &b, n, None).unwrap());
            // A bias adds onto the same sums; a weight given as n × k packs the same values.
            let bias = values(13, n, 1.0);
            let with = tiles.product(&a, k, &b, n, Some(&bias)).unwrap();
            for (i, (w, g)) in with.iter().zip(&got).enumerate() {
                assert_eq!(*w, g + bias[i % n]);
            }
            let mut bt = vec![0f32; n * k];
            for kk in 0..k {
                for j in 0..n {
                    bt[j * k + kk] = b[kk * n + j];
                }
            }
            assert_eq!(tiles.product_t(&a, k, &bt, n, Some(&bias)).unwrap(), with);
            // So does a left factor given as k × m.
            let at = transpose(&a, m, k);
            assert_eq!(tiles.product_tn(&at, m, &b, n, Some(&bias)).unwrap(), with);
            // The vectorized packing is the portable one, line for line.
            let (fast, slow) = (
                Bf16Matrix::pack_values(Some(tiles.0), &b, k, n),
                Bf16Matrix::pack_values(None, &b, k, n),
            );
            assert!(fast
                .packed
                .iter()
                .zip(&slow.packed)
                .all(|(x, y)| x.0 == y.0));
        }
        assert!(tiles.product(&[1.0; 5], 2, &[1.0; 4], 2, None).is_err());
        assert!(tiles.product(&[1.0; 4], 2, &[1.0; 5], 2, None).is_err());
        assert!(tiles
            .product(&[1.0; 4], 2, &[1.0; 4], 2, Some(&[0.0]))
            .is_err());
        let mut a = vec![1.0f32; 3 * 4];
        a[4] = f32::NAN;
        let got = tiles.product(&a, 4, &[1.0; 8], 2, None).unwrap();
        assert!(got[2].is_nan() && got[3].is_nan());
        assert!(got[0] == 4.0 && got[5] == 4.0);
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3F80);
        assert_eq!(to_bf16(-2.0), 0xC000);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 1.5 / 256.0)), 1.0 + 2.0 / 256.0);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert!(from_bf16(to_bf16(-f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
        assert_eq!(from_bf16(to_bf16(f32::MAX)), f32::INFINITY);
        assert_eq!(to_bf16(-0.0), 0x8000);
        for x in values(3, 10_000, 100.0) {
            let r = from_bf16(to_bf16(x));
            assert!((r - x).abs() <= x.abs() / 256.0, "{x} -> {r}");
        }
    }

    /// The activations' packing with `vcvtne2ps2bf16` gives the portable loop's lines, bit for
    /// bit: ties to even both ways, NaN and infinities, rows with tails and strides wider than
    /// `k`, padding rows zero, and a buffer reused from a larger product.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn row_packing_rounds_as_the_portable_loop() {
        if amx_or_skip("row_packing_rounds_as_the_portable_loop").is_none() {
            return;
        }
        let mut fast = Vec::new();
        for (rows, k, stride) in [
            (40, 1536, 1536),
            (1, 1, 1),
            (3, 40, 45),
            (33, 384, 384),
            (5, 70, 100),
        ] {
            let mut x = values(rows as u64 + k as u64, (rows - 1) * stride + k, 4.0);
            // Halfway between two bf16 values, below and above an even one; NaN; infinities.
            let special = [
                0x3F80_8000,
                0x3F81_8000,
                0xBF80_8000,
                0x7FC0_0000,
                0x7F80_0000,
                0xFF80_0000,
            ];
            for (v, bits) in x.iter_mut().step_by(7).zip(special.iter().cycle()) {
                *v = f32::from_bits(*bits);
            }
            let kp = k.div_ceil(TK) * TK;
            let mut slow = Vec::new();
            pack_strided_generic(&x, stride, rows, k, kp, &mut slow);
            // SAFETY: an `Amx` exists only where detection found AVX-512F, AVX-512BW and
            // AVX-512 BF16.
            unsafe { x86::pack_strided_avx512(&x, stride, rows, k, kp, &mut fast) };
            assert_eq!(fast.len(), slow.len());
            for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
                assert_eq!(f.0, s.0, "rows {rows}, k {k}: line {i}");
            }
        }
    }

    #[test]
    fn packing_puts_every_weight_where_the_tiles_read_it() {
        for (k, n) in [(1, 1), (33, 17), (64, 64), (70, 100)] {
            let w_t = values(k as u64, k * n, 1.0);
            let m = Bf16Matrix::pack(&w_t, k, n).unwrap();
            for kk in 0..k {
                for j in 0..n {
                    assert_eq!(m.weight(kk, j), from_bf16(to_bf16(w_t[kk * n + j])));
                }
            }
            // Padding is zero.
            let nonzero = m
                .packed
                .iter()
                .flat_map(|l| l.0)
                .filter(|&v| v != 0)
                .count();
            assert!(nonzero <= k * n);
        }
        // A head's values and keys, read in place out of wider rows (stride 70).
        if let Some(amx) = Amx::detect() {
            for (k, n) in [(1, 1), (33, 17), (64, 32), (40, 70), (70, 33)] {
                let src = values(7 + k as u64, 70 * k.max(n), 1.0);
                let rows = Bf16Matrix::from_rows(amx, &src, 70, k, n);
                let columns = Bf16Matrix::from_columns(amx, &src, 70, k, n);
                for kk in 0..k {
                    for j in 0..n {
                        assert_eq!(rows.weight(kk, j), rounded(src[kk * 70 + j]));
                        assert_eq!(columns.weight(kk, j), rounded(src[j * 70 + kk]));
                    }
                }
                for m in [&rows, &columns] {
                    let nonzero = m.packed.iter().flat_map(|l| l.0).filter(|&v| v != 0);
                    assert!(nonzero.count() <= k * n);
                }
                // The vectorized packing is the portable one, line for line, either way.
                for by_columns in [false, true] {
                    let fast = Bf16Matrix::strided(Some(amx), &src, 70, (k, n), by_columns);
                    let slow = Bf16Matrix::strided(None, &src, 70, (k, n), by_columns);
                    assert!(
                        fast.packed == slow.packed,
                        "{k} × {n}, by columns {by_columns}"
                    );
                }
            }
        }
        let err = Bf16Matrix::pack(&[1.0, f32::NAN], 1, 2).unwrap_err();
        assert!(err.to_string().contains("a weight is NaN"), "{err}");
        assert!(Bf16Matrix::pack(&[1.0; 3], 2, 2).is_err());
    }

    /// The kernel against f64 sums of the same bf16-rounded inputs (only the f32 summation
    /// differs: 1e-6 of the magnitude) and of the f32 inputs (bf16's rounding: 1e-2 bound,
    /// 2e-3 measured), on the model's widths and on tails of every kind.
    #[test]
    fn amx_products_match_the_f32_products() {
        let Some(amx) = amx_or_skip("amx_products_match_the_f32_products") else {
            return;
        };
        let shapes = [
            (1, 384, 384),
            (7, 384, 1536),
            (33, 1536, 384),
            (100, 384, 1152),
            (16, 384, 384),
            (17, 64, 32),
            (5, 17, 9),
            (40, 70, 50),
            (130, 1, 33),
        ];
        for &(m, k, n) in &shapes {
            let x = values(1 + m as u64, m * k, 1.0);
            let w_t = values(2 + k as u64, k * n, 1.0 / (k as f32).sqrt());
            let bias = values(3, n, 1.0);
            let residual = values(4, m * n, 1.0);
            let w = Bf16Matrix::pack(&w_t, k, n).unwrap();
            for res in [None, Some(&residual[..])] {
                let hooks = RowHooks {
                    bias: &bias,
                    residual: res,
                    finish: |_: &mut [f32]| {},
                };
                let got = gemm_bf16_rows(amx, &x, &w, &hooks);
                let (mut worst_rounded, mut worst_f32) = (0f64, 0f64);
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut rounded, mut size) = (0f64, 0f64, 0f64);
                        for kk in 0..k {
                            let (a, b) = (x[i * k + kk], w_t[kk * n + j]);
                            exact += a as f64 * b as f64;
                            size += (a as f64 * b as f64).abs();
                            rounded += from_bf16(to_bf16(a)) as f64 * w.weight(kk, j) as f64;
                        }
                        let base = bias[j] as f64 + res.map_or(0.0, |r| r[i * n + j] as f64);
                        let g = got[i * n + j] as f64;
                        let scale = 1.0 + size + base.abs();
                        worst_rounded = worst_rounded.max((g - rounded - base).abs() / scale);
                        worst_f32 = worst_f32.max((g - exact - base).abs() / scale);
                    }
                }
                assert!(
                    worst_rounded < 1e-6,
                    "{m}x{k}x{n}: {worst_rounded:e} from bf16 sums"
                );
                assert!(worst_f32 < 1e-2, "{m}x{k}x{n}: {worst_f32:e} from f32 sums");
            }
        }
    }

    /// Each task finishes its own rows, and only after every panel's sums are on them.
    #[test]
    fn each_row_is_finished_once_after_its_products() {
        let Some(amx) = amx_or_skip("each_row_is_finished_once_after_its_products") else {
            return;
        };
        let (m, k, n) = (300, 64, 40);
        let x = values(5, m * k, 1.0);
        let w_t = values(6, k * n, 0.1);
        let w = Bf16Matrix::pack(&w_t, k, n).unwrap();
        let bias = vec![0.0; n];
        let plain = gemm_bf16_rows(
            amx,
            &x,
            &w,
            &RowHooks {
                bias: &bias,
                residual: None,
                finish: |_: &mut [f32]| {},
            },
        );
        let doubled = gemm_bf16_rows(
            amx,
            &x,
            &w,
            &RowHooks {
                bias: &bias,
                residual: None,
                finish: |rows: &mut [f32]| rows.iter_mut().for_each(|v| *v *= 2.0),
            },
        );
        for (p, d) in plain.iter().zip(&doubled) {
            assert_eq!(2.0 * p, *d);
        }
    }
}
