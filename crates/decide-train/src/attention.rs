//! The trainer's multi-head attention as one CPU op with its own backward.
//!
//! Spelled out in candle's ops, the attention of one layer is about fifteen tensors a step:
//! the three heads' splits and their copies, the scores, the probabilities, the dropout mask and
//! the dropped probabilities (each batch × heads × length² values, the largest tensors of a
//! step), the context and its transposed copy. candle's backward then creates a zeroed tensor
//! and a sum for every gradient each of them receives. This op reads the queries, keys and
//! values where the linear layers wrote them, (batch, length, hidden) with each head's columns
//! side by side, and writes the context the same way; a text's heads run as one task, their
//! scores and probabilities in a scratch row block of the task's own. The backward computes the
//! probabilities again rather than keeping them between the passes (the products of one head are
//! length² × head size, small next to the linear layers). Every sum runs in a fixed order, so the
//! same inputs give the same floats. Other devices keep candle's ops, which this is tested
//! against.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::fused::{slice, with_values};

/// `softmax(scale · q·kᵀ + mask) ⊙ dropout · v` for each text and head: inputs `(q, k, v)`,
/// each (batch, length, hidden) with `heads` heads of `hidden / heads` columns side by side.
pub(crate) struct Attention {
    pub heads: usize,
    pub scale: f32,
    /// The additive mask of each text's keys (batch × length): 0, or a large negative number
    /// for padding.
    pub mask: Vec<f32>,
    /// Inverted dropout's multipliers on the probabilities (batch × heads × length × length,
    /// each 0 or `1 / (1 - p)`), or `None` without dropout.
    pub dropout: Option<Vec<f32>>,
}

/// A strided matrix in a slice: element `(i, j)` is `data[at + i·rs + j·cs]`.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    at: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    fn new(
        data: &'a [f32],
        at: usize,
        (rows, cols): (usize, usize),
        (rs, cs): (usize, usize),
    ) -> Self {
        Self {
            data,
            at,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// The same elements read as the transpose.
    fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// Whether every element of a `rows × cols` matrix at `at` with strides `rs`, `cs` lies
/// within `len` values.
fn inside(len: usize, at: usize, (rows, cols): (usize, usize), (rs, cs): (usize, usize)) -> bool {
    rows == 0 || cols == 0 || at + (rows - 1) * rs + (cols - 1) * cs < len
}

/// `a · b` into the `a.rows × b.cols` matrix of `out` at `at` with strides `(rs, cs)`, whose
/// previous values are not read; on the calling thread.
fn product(out: &mut [f32], at: usize, (rs, cs): (usize, usize), a: View, b: View) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "the factors' inner sizes");
    assert!(
        inside(a.data.len(), a.at, (m, k), (a.rs, a.cs))
            && inside(b.data.len(), b.at, (k, n), (b.rs, b.cs))
            && inside(out.len(), at, (m, n), (rs, cs)),
        "a product's matrices reach past their slices"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        (0..m).for_each(|i| (0..n).for_each(|j| out[at + i * rs + j * cs] = 0.0));
        return;
    }
    // SAFETY: the assertion above keeps every element gemm reads (of `a` and `b`) or writes
    // (of `out`) inside its slice, with non-negative strides, and `out`, a unique borrow,
    // overlaps neither factor. With `read_dst` false, gemm writes `beta · a · b` to each
    // element of the destination and reads none of them.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr().add(at),
            cs as isize,
            rs as isize,
            false,
            a.data.as_ptr().add(a.at),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr().add(b.at),
            b.cs as isize,
            b.rs as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// One text's view of the op: its sizes and its rows of queries, keys and values.
struct Text<'a> {
    len: usize,
    hidden: usize,
    head: usize,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: &'a [f32],
}

impl Text<'_> {
    /// Head `h`'s columns of `x` (one of the text's (length, hidden) blocks), length × head.
    fn head<'s>(&self, x: &'s [f32], h: usize) -> View<'s> {
        View::new(x, h * self.head, (self.len, self.head), (self.hidden, 1))
    }

    /// Head `h`'s probabilities (length × length) into `p`, before dropout.
    fn probabilities(&self, h: usize, scale: f32, p: &mut [f32]) {
        let n = self.len;
        product(p, 0, (n, 1), self.head(self.q, h), self.head(self.k, h).t());
        for p in p.chunks_exact_mut(n) {
            let mut top = f32::NEG_INFINITY;
            for (p, m) in p.iter_mut().zip(self.mask) {
                *p = *p * scale + m;
                top = top.max(*p);
            }
            let mut sum = 0f32;
            for p in p.iter_mut() {
                *p = (*p - top).exp();
                sum += *p;
            }
            let inv = 1.0 / sum;
            p.iter_mut().for_each(|p| *p *= inv);
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

impl Attention {
    /// The sizes of inputs of `shape`, checked against each other and the mask.
    fn sizes(&self, shapes: [&Shape; 3]) -> candle_core::Result<(usize, usize, usize)> {
        let (b, l, hidden) = shapes[0].dims3()?;
        if shapes[1] != shapes[0] || shapes[2] != shapes[0] {
            candle_core::bail!(
                "attention: q {:?}, k {:?}, v {:?}",
                shapes[0],
                shapes[1],
                shapes[2]
            );
        }
        if self.heads == 0 || hidden % self.heads != 0 || self.mask.len() != b * l {
            candle_core::bail!(
                "attention: {} heads over {hidden} columns, a mask of {} for {b} × {l}",
                self.heads,
                self.mask.len()
            );
        }
        if let Some(d) = &self.dropout {
            if d.len() != b * self.heads * l * l {
                candle_core::bail!(
                    "attention: {} dropout multipliers for {b} × {} × {l}²",
                    d.len(),
                    self.heads
                );
            }
        }
        Ok((b, l, hidden))
    }

    /// Text `t` of queries, keys and values `[q, k, v]`, each (batch, `l`, `hidden`).
    fn text<'a>(
        &'a self,
        t: usize,
        l: usize,
        hidden: usize,
        [q, k, v]: [&'a [f32]; 3],
    ) -> Text<'a> {
        let rows = t * l * hidden..(t + 1) * l * hidden;
        let (q, k, v) = (&q[rows.clone()], &k[rows.clone()], &v[rows]);
        let (mask, head) = (&self.mask[t * l..(t + 1) * l], hidden / self.heads);
        Text {
            len: l,
            hidden,
            head,
            q,
            k,
            v,
            mask,
        }
    }

    /// Head `h` of text `t`'s dropout multipliers (length × length), if any.
    fn kept(&self, t: usize, h: usize, l: usize) -> Option<&[f32]> {
        let at = (t * self.heads + h) * l * l;
        self.dropout.as_deref().map(|d| &d[at..at + l * l])
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "fused-attention"
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
        let (_, l, hidden) = self.sizes([l1.shape(), l2.shape(), l3.shape()])?;
        let op = self.name();
        let (q, k, v) = (slice(op, s1, l1)?, slice(op, s2, l2)?, slice(op, s3, l3)?);
        let mut ctx = vec![0f32; q.len()];
        if l * hidden > 0 {
            ctx.par_chunks_mut(l * hidden)
                .enumerate()
                .for_each(|(t, ctx)| {
                    let text = self.text(t, l, hidden, [q, k, v]);
                    let mut p = vec![0f32; l * l];
                    for h in 0..self.heads {
                        text.probabilities(h, self.scale, &mut p);
                        if let Some(keep) = self.kept(t, h, l) {
                            p.iter_mut().zip(keep).for_each(|(p, k)| *p *= k);
                        }
                        let p = View::new(&p, 0, (l, l), (l, 1));
                        product(ctx, h * text.head, (hidden, 1), p, text.head(text.v, h));
                    }
                });
        }
        Ok((CpuStorage::F32(ctx), l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _ctx: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (_, l, hidden) = self.sizes([q.shape(), k.shape(), v.shape()])?;
        let n = q.elem_count();
        let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        with_values(q, |qs| {
            with_values(k, |ks| {
                with_values(v, |vs| {
                    with_values(grad, |g| {
                        if l * hidden == 0 {
                            return Ok(());
                        }
                        let block = l * hidden;
                        dq.par_chunks_mut(block)
                            .zip(dk.par_chunks_mut(block))
                            .zip(dv.par_chunks_mut(block))
                            .enumerate()
                            .for_each(|(t, ((dq, dk), dv))| {
                                let text = self.text(t, l, hidden, [qs, ks, vs]);
                                let g = &g[t * block..(t + 1) * block];
                                self.text_backward(&text, t, g, dq, dk, dv);
                            });
                        Ok(())
                    })
                })
            })
        })?;
        let back = |values: Vec<f32>| Tensor::from_vec(values, q.shape(), q.device());
        Ok((Some(back(dq)?), Some(back(dk)?), Some(back(dv)?)))
    }
}

impl Attention {
    /// One text's gradients, head by head: its probabilities computed again, then
    /// `∂v = (p ⊙ d)ᵀ·g`, `∂p = (g·vᵀ) ⊙ d`, the softmax's `∂s = scale · p ⊙ (∂p − Σ p ∂p)`,
    /// `∂q = ∂s·k` and `∂k = ∂sᵀ·q`, for the context's gradient `g` and dropout `d`.
    fn text_backward(
        &self,
        text: &Text,
        t: usize,
        g: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let (l, hidden, head) = (text.len, text.hidden, text.head);
        let (mut p, mut kept, mut dp) = (vec![0f32; l * l], vec![0f32; l * l], vec![0f32; l * l]);
        for h in 0..self.heads {
            text.probabilities(h, self.scale, &mut p);
            let keep = self.kept(t, h, l);
            kept.copy_from_slice(&p);
            if let Some(keep) = keep {
                kept.iter_mut().zip(keep).for_each(|(p, k)| *p *= k);
            }
            let (gh, at) = (text.head(g, h), h * head);
            product(
                dv,
                at,
                (hidden, 1),
                View::new(&kept, 0, (l, l), (l, 1)).t(),
                gh,
            );
            product(&mut dp, 0, (l, 1), gh, text.head(text.v, h).t());
            for (i, (dp, p)) in dp.chunks_exact_mut(l).zip(p.chunks_exact(l)).enumerate() {
                if let Some(keep) = keep {
                    dp.iter_mut().zip(&keep[i * l..]).for_each(|(d, k)| *d *= k);
                }
                let along = dot(p, dp);
                for (d, p) in dp.iter_mut().zip(p) {
                    *d = self.scale * p * (*d - along);
                }
            }
            let ds = View::new(&dp, 0, (l, l), (l, 1));
            product(dq, at, (hidden, 1), ds, text.head(text.k, h));
            product(dk, at, (hidden, 1), ds.t(), text.head(text.q, h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::testing::{gap, values};
    use candle_core::{Device, Var};

    /// The op and its three gradients against the same attention in the basic ops other devices
    /// run (heads split and transposed, `matmul`, scale, mask and softmax, a dropout mask
    /// multiplied in, `matmul`), with padding in two of the three texts: within f32 rounding,
    /// padded keys getting no gradient, and the same floats on a second run.
    #[test]
    fn fused_attention_is_the_attention_in_candles_ops() {
        let d = Device::Cpu;
        let (b, l, heads, hd) = (3, 7, 2, 5);
        let hidden = heads * hd;
        let var =
            |seed| Var::from_vec(values(seed, b * l * hidden, 1.0), (b, l, hidden), &d).unwrap();
        let (q, k, v) = (var(1), var(2), var(3));
        let lengths = [7, 4, 1];
        let mask: Vec<f32> = lengths
            .iter()
            .flat_map(|&n| (0..l).map(move |j| if j < n { 0.0 } else { -1e4 }))
            .collect();
        let keep: Vec<f32> = values(5, b * heads * l * l, 1.0)
            .iter()
            .map(|x| if *x < -0.6 { 0.0 } else { 1.25 })
            .collect();
        let up = Tensor::from_vec(values(4, b * l * hidden, 1.0), (b, l, hidden), &d).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let run = |fused: bool| {
            let ctx = if fused {
                let op = Attention {
                    heads,
                    scale,
                    mask: mask.clone(),
                    dropout: Some(keep.clone()),
                };
                q.apply_op3(&k, &v, op).unwrap()
            } else {
                let split = |t: &Var| {
                    t.reshape((b, l, heads, hd))
                        .unwrap()
                        .transpose(1, 2)
                        .unwrap()
                        .contiguous()
                        .unwrap()
                };
                let (qh, kh, vh) = (split(&q), split(&k), split(&v));
                let bias = Tensor::from_vec(mask.clone(), (b, 1, 1, l), &d).unwrap();
                let keep = Tensor::from_vec(keep.clone(), (b, heads, l, l), &d).unwrap();
                let scores = (qh.matmul(&kh.t().unwrap()).unwrap() * scale as f64)
                    .unwrap()
                    .broadcast_add(&bias)
                    .unwrap();
                let probs = candle_nn::ops::softmax(&scores, candle_core::D::Minus1).unwrap();
                (probs * keep)
                    .unwrap()
                    .matmul(&vh)
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
                    .reshape((b, l, hidden))
                    .unwrap()
            };
            let grads = (&ctx * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let g = |x: &Var| grads.get(x.as_tensor()).unwrap().clone();
            (ctx.clone(), g(&q), g(&k), g(&v))
        };
        let fused = run(true);
        let basic = run(false);
        for (name, a, b) in [
            ("ctx", &fused.0, &basic.0),
            ("∂q", &fused.1, &basic.1),
            ("∂k", &fused.2, &basic.2),
            ("∂v", &fused.3, &basic.3),
        ] {
            assert!(gap(a, b) < 1e-5, "{name}: {}", gap(a, b));
        }
        // The last text has one token: its six padded keys and values are read by no query.
        let padded = |t: &Tensor| t.get(2).unwrap().narrow(0, 1, l - 1).unwrap();
        for (name, grad) in [("∂k", &fused.2), ("∂v", &fused.3)] {
            let most = padded(grad).abs().unwrap().max_all().unwrap();
            assert!(most.to_scalar::<f32>().unwrap() < 1e-30, "{name}: {most}");
        }
        let again = run(true);
        for (a, b) in [
            (&fused.0, &again.0),
            (&fused.1, &again.1),
            (&fused.2, &again.2),
            (&fused.3, &again.3),
        ] {
            assert_eq!(gap(a, b), 0.0);
        }
    }

    #[test]
    fn mismatched_inputs_are_errors() {
        let d = Device::Cpu;
        let x = Tensor::zeros((2, 3, 4), candle_core::DType::F32, &d).unwrap();
        let y = Tensor::zeros((2, 3, 6), candle_core::DType::F32, &d).unwrap();
        let op = |heads, mask: usize| Attention {
            heads,
            scale: 1.0,
            mask: vec![0.0; mask],
            dropout: None,
        };
        assert!(x.apply_op3(&x, &y, op(2, 6)).is_err());
        assert!(x.apply_op3(&x, &x, op(3, 6)).is_err());
        assert!(x.apply_op3(&x, &x, op(2, 5)).is_err());
        assert!(x.apply_op3(&x, &x, op(2, 6)).is_ok());
    }
}
