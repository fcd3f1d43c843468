//! The trainer's LayerNorm and GELU as single CPU ops with their own backward.
//!
//! Spelled out in candle's basic ops, a LayerNorm is nine passes over its input forward and
//! about twenty backward, each allocating a tensor, and GELU's backward half a dozen with a
//! library `erf` per value; on the CPU those passes, not the matrix products, took most of a
//! training step. These ops make one pass a row forward and one backward, over rows in
//! parallel. Their sums run in a fixed order (a row's in order, and the LayerNorm's weight
//! gradients chunk by chunk, the chunks added in order), so the same seed still gives the same
//! weights. Other devices keep the basic ops, which these are tested against. The attention,
//! softmax included, is one op of its own (module `attention`).

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape, Storage, Tensor};
use rayon::prelude::*;

/// Rows a task of the LayerNorm's backward takes: its weight gradients are summed a chunk at
/// a time, then the chunks in order.
const CHUNK_ROWS: usize = 64;

/// The values of a contiguous f32 tensor's storage.
pub(crate) fn slice<'a>(op: &str, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("{op}: the trainer's tensors are f32");
    };
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&v[start..end]),
        None => candle_core::bail!("{op}: an input is not contiguous"),
    }
}

/// Runs `f` on a tensor's values in row-major order: read in place when the tensor is a
/// contiguous f32 tensor on the CPU (a backward's inputs and gradients mostly are), from a
/// copy otherwise.
pub(crate) fn with_values<R>(
    t: &Tensor,
    f: impl FnOnce(&[f32]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return f(&v[start..end]);
        }
    }
    f(&t.contiguous()?.flatten_all()?.to_vec1::<f32>()?)
}

/// A row's mean and `1 / sqrt(variance + eps)`, the variance taken about the mean.
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// LayerNorm over the last dimension of `x` (…, h) with weight and bias (h): inputs
/// `(x, weight, bias)`.
pub(crate) struct LayerNorm {
    pub eps: f32,
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "fused-layer-norm"
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
        let x = slice(self.name(), s1, l1)?;
        let (w, b) = (slice(self.name(), s2, l2)?, slice(self.name(), s3, l3)?);
        let h = w.len();
        if h == 0 || b.len() != h || l1.shape().dims().last() != Some(&h) {
            candle_core::bail!("{}: inputs {:?} for {h} weights", self.name(), l1.shape());
        }
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(h).zip(x.par_chunks(h)).for_each(|(y, x)| {
            let (mean, rstd) = moments(x, self.eps);
            for (((y, x), w), b) in y.iter_mut().zip(x).zip(w).zip(b) {
                *y = (x - mean) * rstd * w + b;
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let h = w.elem_count();
        let (dx, dw, db) = with_values(x, |xs| {
            with_values(w, |ws| with_values(grad, |g| Ok(self.backward(xs, ws, g))))
        })?;
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, h, w.device())?),
            Some(Tensor::from_vec(db, h, w.device())?),
        ))
    }
}

impl LayerNorm {
    /// `(∂x, ∂weight, ∂bias)` of rows `xs` with weights `ws` and the output's gradient `g`.
    fn backward(&self, xs: &[f32], ws: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let h = ws.len();
        let mut dx = vec![0f32; xs.len()];
        // Each chunk's rows: ∂x, and the chunk's share of ∂weight and ∂bias.
        let partial: Vec<(Vec<f32>, Vec<f32>)> = dx
            .par_chunks_mut(CHUNK_ROWS * h)
            .zip(xs.par_chunks(CHUNK_ROWS * h))
            .zip(g.par_chunks(CHUNK_ROWS * h))
            .map(|((dx, x), g)| {
                let (mut dw, mut db) = (vec![0f32; h], vec![0f32; h]);
                let mut normed = vec![0f32; h];
                for ((dx, x), g) in dx.chunks_mut(h).zip(x.chunks(h)).zip(g.chunks(h)) {
                    let (mean, rstd) = moments(x, self.eps);
                    let (mut sum_gw, mut sum_gwn) = (0f32, 0f32);
                    for i in 0..h {
                        normed[i] = (x[i] - mean) * rstd;
                        let gw = g[i] * ws[i];
                        sum_gw += gw;
                        sum_gwn += gw * normed[i];
                        dw[i] += g[i] * normed[i];
                        db[i] += g[i];
                    }
                    let (mean_gw, mean_gwn) = (sum_gw / h as f32, sum_gwn / h as f32);
                    for i in 0..h {
                        dx[i] = rstd * (g[i] * ws[i] - mean_gw - normed[i] * mean_gwn);
                    }
                }
                (dw, db)
            })
            .collect();
        let (mut dw, mut db) = (vec![0f32; h], vec![0f32; h]);
        for (pw, pb) in &partial {
            dw.iter_mut().zip(pw).for_each(|(d, p)| *d += p);
            db.iter_mut().zip(pb).for_each(|(d, p)| *d += p);
        }
        (dx, dw, db)
    }
}

/// Rows of this many values are one task of the element-wise ops.
const CHUNK: usize = 16 * 1024;

/// `erf(x / √2)` and `exp(-x² / 2)`, sharing the exponential (Abramowitz and Stegun 7.1.26:
/// absolute error below 1.5e-7, under f32's rounding of the GELU it feeds).
#[inline(always)]
fn erf_and_gauss(x: f32) -> (f32, f32) {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let gauss = (-0.5 * x * x).exp();
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152 + t * 1.061_405_4))));
    let erf = 1.0 - poly * gauss;
    (if x < 0.0 { -erf } else { erf }, gauss)
}

/// BERT's GELU, `x · Φ(x)` with the exact normal CDF (`0.5 · x · (1 + erf(x / √2))`), with
/// its derivative `Φ(x) + x · φ(x)` as the backward.
pub(crate) struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "fused-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = slice(self.name(), s, l)?;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(y, x)| {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = 0.5 * x * (1.0 + erf_and_gauss(x).0);
                }
            });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        const INV_SQRT_2PI: f32 = 0.398_942_3;
        let dx = with_values(x, |xs| {
            with_values(grad, |g| {
                let mut dx = vec![0f32; xs.len()];
                dx.par_chunks_mut(CHUNK)
                    .zip(xs.par_chunks(CHUNK))
                    .zip(g.par_chunks(CHUNK))
                    .for_each(|((dx, x), g)| {
                        for ((d, &x), g) in dx.iter_mut().zip(x).zip(g) {
                            let (erf, gauss) = erf_and_gauss(x);
                            *d = g * (0.5 * (1.0 + erf) + x * gauss * INV_SQRT_2PI);
                        }
                    });
                Ok(dx)
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// What the tests of the trainer's ops share: seeded values and the largest gap between two
/// tensors.
#[cfg(test)]
pub(crate) mod testing {
    use candle_core::Tensor;

    /// `len` values in `[-scale, scale)` from `seed` (xorshift).
    pub(crate) fn values(seed: u64, len: usize, scale: f32) -> Vec<f32> {
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

    pub(crate) fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// The largest absolute difference between two tensors of the same shape.
    pub(crate) fn gap(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        let (a, b) = (flat(a), flat(b));
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{gap, values};
    use super::*;
    use candle_core::{Device, Var, D};

    /// The fused LayerNorm and its three gradients against the same LayerNorm in basic ops
    /// under candle's autograd (as the trainer spells it on other devices), over more rows
    /// than one chunk and a tail.
    #[test]
    fn fused_layer_norm_is_the_basic_ops_layer_norm() {
        let d = Device::Cpu;
        let (rows, h, eps) = (2 * CHUNK_ROWS + 7, 48, 1e-12f32);
        let x = Var::from_vec(values(1, rows * h, 3.0), (rows / 3, 3, h), &d).unwrap();
        let w = Var::from_vec(values(2, h, 1.0), h, &d).unwrap();
        let b = Var::from_vec(values(3, h, 1.0), h, &d).unwrap();
        let up = Tensor::from_vec(values(4, rows * h, 1.0), (rows / 3, 3, h), &d).unwrap();
        let run = |fused: bool| {
            let y = if fused {
                x.apply_op3(&w, &b, LayerNorm { eps }).unwrap()
            } else {
                let mean = x.mean_keepdim(D::Minus1).unwrap();
                let c = x.broadcast_sub(&mean).unwrap();
                let var = c.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
                let n = c
                    .broadcast_div(&(var + eps as f64).unwrap().sqrt().unwrap())
                    .unwrap();
                n.broadcast_mul(&w).unwrap().broadcast_add(&b).unwrap()
            };
            let grads = (&y * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let g = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
            (y, g(&x), g(&w), g(&b))
        };
        let fused = run(true);
        let basic = run(false);
        assert!(
            gap(&fused.0, &basic.0) < 1e-5,
            "y {}",
            gap(&fused.0, &basic.0)
        );
        assert!(
            gap(&fused.1, &basic.1) < 1e-4,
            "dx {}",
            gap(&fused.1, &basic.1)
        );
        assert!(
            gap(&fused.2, &basic.2) < 1e-3,
            "dw {}",
            gap(&fused.2, &basic.2)
        );
        assert!(
            gap(&fused.3, &basic.3) < 1e-3,
            "db {}",
            gap(&fused.3, &basic.3)
        );
        let again = run(true);
        assert_eq!(gap(&fused.1, &again.1) + gap(&fused.2, &again.2), 0.0);
    }

    /// The fused GELU and its gradient against candle's `gelu_erf` and its autograd, over
    /// the range a layer's sums take, across several tasks.
    #[test]
    fn fused_gelu_is_candles_gelu_erf() {
        let d = Device::Cpu;
        let n = 3 * CHUNK + 11;
        let x = Var::from_vec(values(7, n, 6.0), n, &d).unwrap();
        let up = Tensor::from_vec(values(8, n, 1.0), n, &d).unwrap();
        let run = |fused: bool| {
            let y = if fused {
                x.apply_op1(Gelu).unwrap()
            } else {
                x.gelu_erf().unwrap()
            };
            let grads = (&y * &up).unwrap().sum_all().unwrap().backward().unwrap();
            (y, grads.get(x.as_tensor()).unwrap().clone())
        };
        let (y, dx) = run(true);
        let (y0, dx0) = run(false);
        assert!(gap(&y, &y0) < 2e-6, "y {}", gap(&y, &y0));
        assert!(gap(&dx, &dx0) < 2e-6, "dx {}", gap(&dx, &dx0));
    }
}
