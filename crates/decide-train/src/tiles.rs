//! Linear layers whose products run in bf16 on AMX tiles, forward and backward, with the
//! weights, their gradients and the optimizer's state kept in f32 (mixed precision, as
//! PyTorch's bf16 autocast trains).
//!
//! A linear layer is three products a step: `y = x · Wᵀ + b` forward (the bias is where the
//! sums start), then `∂x = ∂y · W` and `∂W = ∂yᵀ · x` backward. [`TileLinear`] is a candle op with its own backward, so the rest
//! of the graph (bias, activations, LayerNorm, attention) stays candle's f32 ops and autograd
//! is unchanged around it. Each product rounds its two factors to bf16 and sums in f32 in a
//! fixed order, so the same seed still gives the same weights on the same path.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use decide_engine::Bf16Tiles;

use crate::fused::{slice, with_values};

/// `x · Wᵀ + b` of activations `x` (…, k), a weight `W` (n, k) and a bias `b` (n), as
/// `(…, n)`, on AMX tiles: inputs `(x, W, b)`.
pub(crate) struct TileLinear(pub Bf16Tiles);

impl CustomOp3 for TileLinear {
    fn name(&self) -> &'static str {
        "bf16-linear"
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
        let (n, k) = l2.shape().dims2()?;
        let op = self.name();
        let (x, w, b) = (slice(op, s1, l1)?, slice(op, s2, l2)?, slice(op, s3, l3)?);
        let dims = l1.shape().dims();
        if dims.last() != Some(&k) || b.len() != n {
            candle_core::bail!(
                "bf16 linear: inputs {dims:?} for a weight {n}×{k} and {} biases",
                b.len()
            );
        }
        let y = self.0.product_t(x, k, w, n, Some(b))?;
        let mut out = dims.to_vec();
        *out.last_mut().expect("a last dimension, checked above") = n;
        Ok((CpuStorage::F32(y), Shape::from(out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, k) = w.dims2()?;
        let (grad_x, grad_w, grad_b) = with_values(grad, |g| {
            let grad_x = with_values(w, |ws| self.0.product(g, n, ws, k, None))?;
            let grad_w = with_values(x, |xs| self.0.product_tn(g, n, xs, k, None))?;
            // ∂b: each output's gradient summed over the rows, in row order.
            let mut grad_b = vec![0f32; n];
            for row in g.chunks_exact(n.max(1)) {
                grad_b.iter_mut().zip(row).for_each(|(b, g)| *b += g);
            }
            Ok((grad_x, grad_w, grad_b))
        })?;
        Ok((
            Some(Tensor::from_vec(grad_x, x.shape(), x.device())?),
            Some(Tensor::from_vec(grad_w, (n, k), w.device())?),
            Some(Tensor::from_vec(grad_b, n, b.device())?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::testing::{gap as largest_gap, values};
    use candle_core::{Device, Var};

    /// The op's output and its three gradients against candle's f32 matmul and its autograd, on a
    /// 3-d input with tails in every dimension: within bf16's rounding of the factors (about
    /// 2^-8 of each product, so a few thousandths of sums of 40-odd unit terms), and the same
    /// floats on a second run.
    #[test]
    fn tile_linear_is_the_f32_linear_within_bf16_rounding() {
        let Some(tiles) = Bf16Tiles::detect() else {
            eprintln!("tile_linear_is_the_f32_linear_within_bf16_rounding: skipped, this CPU has no AMX bf16");
            return;
        };
        let d = Device::Cpu;
        let (b, l, k, n) = (3, 17, 45, 70);
        let x = Var::from_vec(values(1, b * l * k, 1.0), (b, l, k), &d).unwrap();
        let w = Var::from_vec(values(2, n * k, 1.0), (n, k), &d).unwrap();
        let bias = Var::from_vec(values(4, n, 1.0), n, &d).unwrap();
        let up = Tensor::from_vec(values(3, b * l * n, 1.0), (b, l, n), &d).unwrap();
        let run = |tiled: bool| {
            let y = if tiled {
                x.apply_op3(&w, &bias, TileLinear(tiles)).unwrap()
            } else {
                x.broadcast_matmul(&w.t().unwrap())
                    .unwrap()
                    .broadcast_add(&bias)
                    .unwrap()
            };
            // A loss whose gradient at y is `up`, so both backward products get real values.
            let grads = (&y * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let gx = grads.get(x.as_tensor()).unwrap().clone();
            let gw = grads.get(w.as_tensor()).unwrap().clone();
            let gb = grads.get(bias.as_tensor()).unwrap().clone();
            (y, gx, gw, gb)
        };
        let (y, gx, gw, gb) = run(true);
        let (y32, gx32, gw32, gb32) = run(false);
        // ∂b is a sum of f32 gradients, not a product: f32's rounding only.
        assert!(
            largest_gap(&gb, &gb32) < 1e-4,
            "{}",
            largest_gap(&gb, &gb32)
        );
        assert_eq!(y.dims(), &[b, l, n]);
        assert!(largest_gap(&y, &y32) < 0.05, "{}", largest_gap(&y, &y32));
        assert!(
            largest_gap(&gx, &gx32) < 0.05,
            "{}",
            largest_gap(&gx, &gx32)
        );
        // ∂W sums over all 51 rows.
        assert!(largest_gap(&gw, &gw32) < 0.1, "{}", largest_gap(&gw, &gw32));
        // Not the f32 values: the factors were rounded.
        assert!(largest_gap(&y, &y32) > 0.0);
        let (y2, gx2, gw2, _) = run(true);
        assert_eq!(largest_gap(&y, &y2), 0.0);
        assert_eq!(largest_gap(&gx, &gx2), 0.0);
        assert_eq!(largest_gap(&gw, &gw2), 0.0);
    }
}
