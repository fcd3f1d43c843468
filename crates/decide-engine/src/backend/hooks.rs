//! The hooks a row-blocked product runs on its own rows: what they start as and what
//! finishes them, shared by the int8 kernels and the AMX tiles' products.

/// What the output rows of the int8 and AMX products start as (`bias` added to every row,
/// plus the same row of `residual`, `m × n`, when there is one), and what each task does to
/// its own rows once every panel's products are on them (`finish(rows)`: the activation or
/// LayerNorm). A task's rows are at most 128, so both happen while the rows are still in the
/// core's cache, instead of in passes of their own over the whole output.
pub(crate) struct RowHooks<'a, F> {
    pub bias: &'a [f32],
    pub residual: Option<&'a [f32]>,
    pub finish: F,
}

impl<F> RowHooks<'_, F> {
    /// The number of rows of `x` (`k` wide) for a product of `n` outputs, after checking that
    /// `x`, the bias and the residual have the shapes that product needs.
    pub(crate) fn rows(&self, x: &[f32], k: usize, n: usize) -> usize {
        assert!(k > 0 && x.len().is_multiple_of(k));
        let m = x.len() / k;
        assert!(self.bias.len() == n && self.residual.is_none_or(|r| r.len() == m * n));
        m
    }
}
