//! The transformer: BERT / MiniLM and (XLM-)RoBERTa encoders with a classification head
//! (cross-encoder) or a pooling head (bi-encoder).
//!
//! Written here rather than taken from candle-transformers because that crate's BERT has no
//! sequence-classification head, its XLM-RoBERTa counts positions from the ids at every call,
//! and the fast paths of later work (fused QKV, kernels per device) need the layers in reach.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};

use super::amx::Amx;
use super::config::{Activation, EncoderConfig, Family};
use super::kernels::{
    Epilogue, FusedAttention, FusedEmbeddings, FusedLinear, Isa, LinearFormat, NormParams,
};

/// Which code runs the encoder layers, chosen once at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuPath {
    /// candle's own ops (any device, any dtype): the reference path and the fallback.
    Stock,
    /// The fused CPU kernels of [`super::kernels`] at this instruction set (CPU, f32
    /// activations), with the linear layers' products in this format.
    Fused(Isa, LinearFormat),
}

impl CpuPath {
    /// The path for a model on `device` in `dtype` with the requested kernels: the fused
    /// kernels only run f32 on the CPU, at the detected instruction set capped by `kernels`;
    /// everything else is candle's own ops. `format` applies to the fused path only: int8
    /// needs it, which the caller checks (see [`EngineBuilder`](crate::EngineBuilder)).
    pub(crate) fn choose(
        kernels: super::device::CpuKernels,
        device: &Device,
        dtype: DType,
        detected: Isa,
        format: LinearFormat,
    ) -> CpuPath {
        use super::device::CpuKernels;
        use super::kernels::IsaCap;
        if !matches!(device, Device::Cpu) || dtype != DType::F32 {
            return CpuPath::Stock;
        }
        match kernels {
            CpuKernels::Stock => CpuPath::Stock,
            CpuKernels::Auto => CpuPath::Fused(detected.capped(IsaCap::Best), format),
            CpuKernels::Avx512 => CpuPath::Fused(detected.capped(IsaCap::NoAmx), format),
            CpuKernels::Avx2 => CpuPath::Fused(detected.capped(IsaCap::Avx2), format),
            CpuKernels::AvxVnni => CpuPath::Fused(detected.capped(IsaCap::AvxVnni), format),
            CpuKernels::Portable => CpuPath::Fused(detected.capped(IsaCap::Portable), format),
        }
    }
}

/// How a bi-encoder turns token states into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the non-padding tokens (sentence-transformers' default).
    Mean,
    /// The first token.
    Cls,
}

/// What sits on top of the encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadKind {
    /// Sequence classification: one logit per label.
    Classifier,
    /// Pooled, optionally normalized embeddings.
    Embedding {
        /// The pooling.
        pooling: Pooling,
        /// Whether vectors are scaled to unit length.
        normalize: bool,
    },
}

/// One padded batch, laid out for the encoder.
pub(crate) struct Batch {
    pub ids: Tensor,
    pub type_ids: Tensor,
    pub positions: Tensor,
    /// Additive attention mask (B, 1, 1, L); `None` when no row is padded.
    pub attention_bias: Option<Tensor>,
    /// 1.0 for real tokens, 0.0 for padding, (B, L, 1); for mean pooling.
    pub token_mask: Tensor,
}

impl Batch {
    /// Pads `rows` (token ids and type ids) to the longest one.
    pub fn new(
        rows: &[(&[u32], &[u32])],
        config: &EncoderConfig,
        device: &Device,
        dtype: DType,
    ) -> candle_core::Result<Self> {
        let b = rows.len();
        let l = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let pad = config.pad_token_id;
        let mut ids = Vec::with_capacity(b * l);
        let mut types = Vec::with_capacity(b * l);
        let mut positions = Vec::with_capacity(b * l);
        let mut mask = Vec::with_capacity(b * l);
        for (row_ids, row_types) in rows {
            let n = row_ids.len();
            ids.extend_from_slice(row_ids);
            ids.extend(std::iter::repeat_n(pad, l - n));
            types.extend_from_slice(row_types);
            types.extend(std::iter::repeat_n(0u32, l - n));
            match config.family {
                Family::Bert => positions.extend(0..l as u32),
                Family::Roberta => {
                    positions.extend((0..n as u32).map(|i| pad + 1 + i));
                    positions.extend(std::iter::repeat_n(pad, l - n));
                }
            }
            mask.extend(std::iter::repeat_n(1f32, n));
            mask.extend(std::iter::repeat_n(0f32, l - n));
        }
        let padded = rows.iter().any(|r| r.0.len() != l);
        let token_mask = Tensor::from_vec(mask, (b, l), device)?;
        let attention_bias = if padded {
            // Padding gets the most negative value rather than -inf so that softmax never sees
            // a row of infinities.
            let bias = ((token_mask.ones_like()? - &token_mask)? * f32::MIN as f64)?;
            Some(bias.reshape((b, 1, 1, l))?.to_dtype(dtype)?)
        } else {
            None
        };
        Ok(Self {
            ids: Tensor::from_vec(ids, (b, l), device)?,
            type_ids: Tensor::from_vec(types, (b, l), device)?,
            positions: Tensor::from_vec(positions, (b, l), device)?,
            attention_bias,
            token_mask: token_mask.unsqueeze(2)?.to_dtype(dtype)?,
        })
    }
}

/// Rows packed back to back with no padding, for the fused CPU path: token ids, type ids and
/// positions (1, T), and where each row's tokens begin and how many there are.
pub(crate) struct Packed {
    ids: Tensor,
    type_ids: Tensor,
    positions: Tensor,
    segments: Vec<(usize, usize)>,
}

impl Packed {
    /// Packs `rows` (token ids and type ids); every row keeps its own positions.
    pub fn new(
        rows: &[(&[u32], &[u32])],
        config: &EncoderConfig,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let t: usize = rows.iter().map(|r| r.0.len()).sum();
        let pad = config.pad_token_id;
        let mut ids = Vec::with_capacity(t);
        let mut types = Vec::with_capacity(t);
        let mut positions = Vec::with_capacity(t);
        let mut segments = Vec::with_capacity(rows.len());
        for (row_ids, row_types) in rows {
            let n = row_ids.len();
            if n == 0 || row_types.len() != n {
                candle_core::bail!("a packed row needs tokens, with one type id each");
            }
            segments.push((ids.len(), n));
            ids.extend_from_slice(row_ids);
            types.extend_from_slice(row_types);
            match config.family {
                Family::Bert => positions.extend(0..n as u32),
                Family::Roberta => positions.extend((0..n as u32).map(|i| pad + 1 + i)),
            }
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, (1, t), device)?,
            type_ids: Tensor::from_vec(types, (1, t), device)?,
            positions: Tensor::from_vec(positions, (1, t), device)?,
            segments,
        })
    }
}

/// Tokens the fused CPU path packs into one pass through the layers (a longer row goes alone):
/// the activations of a pass (1,024 × 1,536 floats in a MiniLM's FFN) stay in cache from one op
/// to the next, and 128 rows of 128 tokens ran at 57 sequences/s in one pass against 78 in
/// passes of 8 rows here. Rows are independent, so the result is the same.
pub(crate) const CPU_CHUNK_TOKENS: usize = 1024;

enum Embeddings {
    Stock(StockEmbeddings),
    Fused(FusedEmbeddings),
}

impl Embeddings {
    fn load(vb: VarBuilder, c: &EncoderConfig, path: CpuPath) -> candle_core::Result<Self> {
        let stock = StockEmbeddings::load(vb, c)?;
        Ok(match path {
            CpuPath::Stock => Embeddings::Stock(stock),
            CpuPath::Fused(isa, format) => Embeddings::Fused(FusedEmbeddings::new(
                stock.words.embeddings(),
                stock.types.embeddings(),
                stock.positions.embeddings(),
                NormParams::from_layer_norm(&stock.norm, c.layer_norm_eps)?,
                isa,
                format,
            )?),
        })
    }

    fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        match self {
            Embeddings::Stock(e) => e.forward(batch),
            Embeddings::Fused(op) => {
                batch
                    .ids
                    .apply_op3_no_bwd(&batch.type_ids, &batch.positions, op)
            }
        }
    }
}

struct StockEmbeddings {
    words: Embedding,
    positions: Embedding,
    types: Embedding,
    norm: LayerNorm,
}

impl StockEmbeddings {
    fn load(vb: VarBuilder, c: &EncoderConfig) -> candle_core::Result<Self> {
        Ok(Self {
            words: embedding(c.vocab_size, c.hidden_size, vb.pp("word_embeddings"))?,
            positions: embedding(
                c.max_position_embeddings,
                c.hidden_size,
                vb.pp("position_embeddings"),
            )?,
            types: embedding(
                c.type_vocab_size,
                c.hidden_size,
                vb.pp("token_type_embeddings"),
            )?,
            norm: layer_norm(c.hidden_size, c.layer_norm_eps, vb.pp("LayerNorm"))?,
        })
    }

    fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let x = self.words.forward(&batch.ids)?;
        let x = (x + self.types.forward(&batch.type_ids)?)?;
        let x = (x + self.positions.forward(&batch.positions)?)?;
        self.norm.forward(&x)
    }
}

enum Layer {
    Stock(StockLayer),
    Fused(Box<FusedLayer>),
}

impl Layer {
    fn load(vb: VarBuilder, c: &EncoderConfig, path: CpuPath) -> candle_core::Result<Self> {
        let stock = StockLayer::load(vb, c)?;
        Ok(match path {
            CpuPath::Stock => Layer::Stock(stock),
            CpuPath::Fused(isa, format) => {
                Layer::Fused(Box::new(FusedLayer::new(&stock, c, isa, format)?))
            }
        })
    }

    fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
        match self {
            Layer::Stock(l) => l.forward(x, bias),
            Layer::Fused(l) => l.forward(x, bias),
        }
    }
}

/// A layer as five fused ops (see [`super::kernels`]); the weights are copied out of the
/// candle layer at load time, which is then dropped.
struct FusedLayer {
    qkv: FusedLinear,
    attention: FusedAttention,
    attn_out: FusedLinear,
    up: FusedLinear,
    down: FusedLinear,
}

impl FusedLayer {
    fn new(
        l: &StockLayer,
        c: &EncoderConfig,
        isa: Isa,
        format: LinearFormat,
    ) -> candle_core::Result<Self> {
        let eps = c.layer_norm_eps;
        // A bf16 layer's attention runs its products on the tiles too: the linear layers below
        // refuse bf16 where there are none.
        let tiles = match format {
            LinearFormat::Bf16 => Amx::detect(),
            LinearFormat::F32 | LinearFormat::Int8 => None,
        };
        Ok(Self {
            qkv: FusedLinear::new(&l.qkv, Epilogue::None, isa, format)?,
            attention: FusedAttention::new(l.heads, l.head_dim, isa, tiles),
            attn_out: FusedLinear::new(
                &l.attn_out,
                Epilogue::ResidualNorm(NormParams::from_layer_norm(&l.attn_norm, eps)?),
                isa,
                format,
            )?,
            up: FusedLinear::new(&l.up, Epilogue::Activation(l.activation), isa, format)?,
            down: FusedLinear::new(
                &l.down,
                Epilogue::ResidualNorm(NormParams::from_layer_norm(&l.out_norm, eps)?),
                isa,
                format,
            )?,
        })
    }

    fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let x = x.contiguous()?;
        let qkv = x.apply_op1_no_bwd(&self.qkv)?;
        let ctx = match bias {
            Some(bias) => qkv.apply_op2_no_bwd(&bias.contiguous()?, &self.attention)?,
            None => qkv.apply_op1_no_bwd(&self.attention)?,
        };
        self.feed_forward(&ctx, &x, None)
    }

    /// The layer over packed rows: the same ops, with attention kept within each segment.
    /// With `ranges`, each input of the four linear layers raises its largest magnitudes there
    /// (the int8 load's calibration pass).
    fn forward_packed(
        &self,
        x: &Tensor,
        segments: &[(usize, usize)],
        mut ranges: Option<&mut InputRanges>,
    ) -> candle_core::Result<Tensor> {
        let x = x.contiguous()?;
        if let Some(r) = ranges.as_deref_mut() {
            raise(&mut r.qkv, &x)?;
        }
        let qkv = x.apply_op1_no_bwd(&self.qkv)?;
        let ctx = qkv.apply_op1_no_bwd(&self.attention.packed(segments))?;
        self.feed_forward(&ctx, &x, ranges)
    }

    fn feed_forward(
        &self,
        ctx: &Tensor,
        x: &Tensor,
        mut ranges: Option<&mut InputRanges>,
    ) -> candle_core::Result<Tensor> {
        if let Some(r) = ranges.as_deref_mut() {
            raise(&mut r.attn_out, ctx)?;
        }
        let x = ctx.apply_op2_no_bwd(x, &self.attn_out)?;
        if let Some(r) = ranges.as_deref_mut() {
            raise(&mut r.up, &x)?;
        }
        let up = x.apply_op1_no_bwd(&self.up)?;
        if let Some(r) = ranges {
            raise(&mut r.down, &up)?;
        }
        up.apply_op2_no_bwd(&x, &self.down)
    }

    /// This f32 layer with its linear layers in int8, smoothed for the measured `ranges`.
    fn smoothed_int8(&self, ranges: &InputRanges) -> candle_core::Result<Self> {
        Ok(Self {
            qkv: self.qkv.smoothed_int8(&ranges.qkv, SMOOTHING_ALPHA)?,
            attention: self.attention.clone(),
            attn_out: self
                .attn_out
                .smoothed_int8(&ranges.attn_out, SMOOTHING_ALPHA)?,
            up: self.up.smoothed_int8(&ranges.up, SMOOTHING_ALPHA)?,
            down: self.down.smoothed_int8(&ranges.down, SMOOTHING_ALPHA)?,
        })
    }
}

/// How much of an input's range smoothing moves into the weights (SmoothQuant's α), chosen
/// among 0.4, 0.5 and 0.6 on the tuning and calibration cases (see docs/benchmarks.md).
const SMOOTHING_ALPHA: f32 = 0.4;

/// The largest magnitude each input of a layer's four linear layers reached.
#[derive(Default)]
struct InputRanges {
    qkv: Vec<f32>,
    attn_out: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// Raises `amax` to the largest magnitude of each column of `x` (rows × columns).
fn raise(amax: &mut Vec<f32>, x: &Tensor) -> candle_core::Result<()> {
    let width = *x.dims().last().unwrap_or(&0);
    let values = x.flatten_all()?.to_vec1::<f32>()?;
    amax.resize(width, 0.0);
    for row in values.chunks_exact(width.max(1)) {
        for (a, v) in amax.iter_mut().zip(row) {
            *a = a.max(v.abs());
        }
    }
    Ok(())
}

struct StockLayer {
    /// Query, key and value projections fused into one matrix: one GEMM instead of three.
    qkv: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
    heads: usize,
    head_dim: usize,
    activation: Activation,
}

impl StockLayer {
    fn load(vb: VarBuilder, c: &EncoderConfig) -> candle_core::Result<Self> {
        let h = c.hidden_size;
        let attn = vb.pp("attention");
        let s = attn.pp("self");
        let q = linear(h, h, s.pp("query"))?;
        let k = linear(h, h, s.pp("key"))?;
        let v = linear(h, h, s.pp("value"))?;
        let w = Tensor::cat(&[q.weight(), k.weight(), v.weight()], 0)?;
        let bias = |l: &Linear| {
            l.bias()
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg("bias".into()))
        };
        let b = Tensor::cat(&[bias(&q)?, bias(&k)?, bias(&v)?], 0)?;
        Ok(Self {
            qkv: Linear::new(w, Some(b)),
            attn_out: linear(h, h, attn.pp("output").pp("dense"))?,
            attn_norm: layer_norm(h, c.layer_norm_eps, attn.pp("output").pp("LayerNorm"))?,
            up: linear(h, c.intermediate_size, vb.pp("intermediate").pp("dense"))?,
            down: linear(c.intermediate_size, h, vb.pp("output").pp("dense"))?,
            out_norm: layer_norm(h, c.layer_norm_eps, vb.pp("output").pp("LayerNorm"))?,
            heads: c.num_heads,
            head_dim: h / c.num_heads,
            activation: c.activation,
        })
    }

    fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let (b, l, h) = x.dims3()?;
        let qkv = self
            .qkv
            .forward(x)?
            .reshape((b, l, 3, self.heads, self.head_dim))?
            .permute((2, 0, 3, 1, 4))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let q = (qkv.get(0)?.contiguous()? * scale)?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        let mut scores = q.matmul(&k.t()?)?;
        if let Some(bias) = bias {
            scores = scores.broadcast_add(bias)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let ctx = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, l, h))?;
        let x = self
            .attn_norm
            .forward(&(self.attn_out.forward(&ctx)? + x)?)?;
        let up = self.up.forward(&x)?;
        let up = match self.activation {
            Activation::Gelu => up.gelu_erf()?,
            Activation::GeluTanh => up.gelu()?,
            Activation::Relu => up.relu()?,
        };
        self.out_norm.forward(&(self.down.forward(&up)? + x)?)
    }
}

/// The f32 fused `layers` in int8, each linear layer smoothed for the ranges its inputs reach
/// over the `calibration` rows.
fn smoothed_int8(
    embeddings: &Embeddings,
    layers: &[Layer],
    calibration: &[(&[u32], &[u32])],
    c: &EncoderConfig,
    device: &Device,
) -> candle_core::Result<Vec<Layer>> {
    let Embeddings::Fused(op) = embeddings else {
        candle_core::bail!("int8 needs the fused CPU kernels");
    };
    let packed = Packed::new(calibration, c, device)?;
    let mut x = packed
        .ids
        .apply_op3_no_bwd(&packed.type_ids, &packed.positions, op)?;
    let mut out = Vec::with_capacity(layers.len());
    for layer in layers {
        let Layer::Fused(layer) = layer else {
            candle_core::bail!("int8 needs the fused CPU kernels");
        };
        let mut ranges = InputRanges::default();
        x = layer.forward_packed(&x, &packed.segments, Some(&mut ranges))?;
        out.push(Layer::Fused(Box::new(layer.smoothed_int8(&ranges)?)));
    }
    Ok(out)
}

enum Head {
    /// BERT: pooler (dense + tanh on the first token), then `classifier`.
    BertClassifier {
        pooler: Linear,
        classifier: Linear,
    },
    /// RoBERTa: `classifier.dense` + tanh on the first token, then `classifier.out_proj`.
    RobertaClassifier {
        dense: Linear,
        out_proj: Linear,
    },
    Embedding {
        pooling: Pooling,
        normalize: bool,
    },
}

/// An encoder with its head, ready to run batches.
pub(crate) struct Model {
    embeddings: Embeddings,
    layers: Vec<Layer>,
    head: Head,
    path: CpuPath,
}

/// Finds the weight-name prefix: checkpoints saved from `*ForSequenceClassification` put the
/// encoder under `bert.` or `roberta.`, bare sentence-transformers checkpoints use no prefix.
fn encoder_prefix(vb: &VarBuilder) -> Option<&'static str> {
    ["bert", "roberta", "xlm-roberta", "model"]
        .into_iter()
        .find(|p| vb.contains_tensor(&format!("{p}.embeddings.word_embeddings.weight")))
}

impl Model {
    /// Loads the model for `path`. On the int8 path, `calibration` (token ids and type ids of
    /// representative rows) is run through the f32 layers first, and each linear layer is
    /// quantized smoothed for the ranges its inputs reached there; without rows it is quantized
    /// as it is.
    pub fn load(
        vb: VarBuilder,
        c: &EncoderConfig,
        head: &HeadKind,
        path: CpuPath,
        calibration: &[(&[u32], &[u32])],
    ) -> candle_core::Result<Self> {
        let prefix = encoder_prefix(&vb);
        let enc = match prefix {
            Some(p) => vb.pp(p),
            None => vb.clone(),
        };
        let embeddings = Embeddings::load(enc.pp("embeddings"), c, path)?;
        let layer_path = match path {
            CpuPath::Fused(isa, LinearFormat::Int8) if !calibration.is_empty() => {
                CpuPath::Fused(isa, LinearFormat::F32)
            }
            other => other,
        };
        let mut layers = (0..c.num_layers)
            .map(|i| Layer::load(enc.pp("encoder").pp("layer").pp(i), c, layer_path))
            .collect::<candle_core::Result<Vec<_>>>()?;
        if layer_path != path {
            layers = smoothed_int8(&embeddings, &layers, calibration, c, vb.device())?;
        }
        let h = c.hidden_size;
        let head = match head {
            HeadKind::Embedding { pooling, normalize } => Head::Embedding {
                pooling: *pooling,
                normalize: *normalize,
            },
            HeadKind::Classifier => {
                let n = c.labels.len().max(1);
                match c.family {
                    Family::Bert => Head::BertClassifier {
                        pooler: linear(h, h, enc.pp("pooler").pp("dense"))?,
                        classifier: linear(h, n, vb.pp("classifier"))?,
                    },
                    Family::Roberta => Head::RobertaClassifier {
                        dense: linear(h, h, vb.pp("classifier").pp("dense"))?,
                        out_proj: linear(h, n, vb.pp("classifier").pp("out_proj"))?,
                    },
                }
            }
        };
        Ok(Self {
            embeddings,
            layers,
            head,
            path,
        })
    }

    /// Which code runs the layers, for reports: `stock`, `fused-<instruction set>-f32`,
    /// `fused-<instruction set>-int8-<int8 kernels' instruction set>`, or
    /// `fused-<instruction set>-bf16-amx`.
    pub fn kernels(&self) -> String {
        match self.path {
            CpuPath::Stock => "stock".into(),
            CpuPath::Fused(isa, LinearFormat::F32) => format!("fused-{}-f32", isa.name()),
            CpuPath::Fused(isa, LinearFormat::Int8) => {
                format!("fused-{}-int8-{}", isa.name(), isa.int8().name())
            }
            CpuPath::Fused(isa, LinearFormat::Bf16) => format!("fused-{}-bf16-amx", isa.name()),
        }
    }

    /// Runs a padded batch: logits (B, labels) for a classifier, vectors (B, hidden) for an
    /// embedder. The path for candle's own ops (any device); the fused CPU path packs instead.
    pub fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let mut x = self.embeddings.forward(batch)?;
        for (index, layer) in self.layers.iter().enumerate() {
            // A disabled span costs one cached check, nothing next to a layer's GEMMs.
            let _span = tracing::trace_span!("layer", index).entered();
            x = layer.forward(&x, batch.attention_bias.as_ref())?;
        }
        self.head(
            || x.narrow(1, 0, 1)?.squeeze(1),
            || {
                let summed = x.broadcast_mul(&batch.token_mask)?.sum(1)?;
                let counts = batch.token_mask.sum(1)?;
                summed.broadcast_div(&counts)
            },
        )
    }

    /// Whether [`forward_packed`](Self::forward_packed) can run: only the fused CPU kernels
    /// have an attention over packed rows.
    pub fn packs(&self) -> bool {
        matches!(self.path, CpuPath::Fused(..))
            && matches!(self.embeddings, Embeddings::Fused(_))
            && self.layers.iter().all(|l| matches!(l, Layer::Fused(_)))
    }

    /// Runs packed rows: the same outputs as [`forward`](Self::forward) of the rows padded into
    /// a batch, without computing a single padding token. Fused CPU path only.
    pub fn forward_packed(&self, packed: &Packed) -> candle_core::Result<Tensor> {
        let Embeddings::Fused(embeddings) = &self.embeddings else {
            candle_core::bail!("packed rows need the fused CPU kernels");
        };
        let mut x = packed
            .ids
            .apply_op3_no_bwd(&packed.type_ids, &packed.positions, embeddings)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let Layer::Fused(layer) = layer else {
                candle_core::bail!("packed rows need the fused CPU kernels");
            };
            let _span = tracing::trace_span!("layer", index).entered();
            x = layer.forward_packed(&x, &packed.segments, None)?;
        }
        let x = x.squeeze(0)?;
        let segments = &packed.segments;
        self.head(
            || {
                let firsts: Vec<u32> = segments.iter().map(|&(s, _)| s as u32).collect();
                let firsts = Tensor::from_vec(firsts, segments.len(), x.device())?;
                x.index_select(&firsts, 0)
            },
            || {
                let means = segments
                    .iter()
                    .map(|&(s, n)| x.narrow(0, s, n)?.mean_keepdim(0))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&means, 0)
            },
        )
    }

    /// The head over the batch's first tokens or mean token states (each (B, hidden)),
    /// computed only if the head needs them.
    fn head(
        &self,
        first: impl FnOnce() -> candle_core::Result<Tensor>,
        mean: impl FnOnce() -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        match &self.head {
            Head::BertClassifier { pooler, classifier } => {
                classifier.forward(&pooler.forward(&first()?)?.tanh()?)
            }
            Head::RobertaClassifier { dense, out_proj } => {
                out_proj.forward(&dense.forward(&first()?)?.tanh()?)
            }
            Head::Embedding { pooling, normalize } => {
                let pooled = match pooling {
                    Pooling::Cls => first()?,
                    Pooling::Mean => mean()?,
                };
                if *normalize {
                    let norm = pooled.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
                    // sentence-transformers divides by max(norm, 1e-12); the floor keeps an
                    // all-zero vector from turning into NaN.
                    pooled.broadcast_div(&norm.maximum(1e-12)?)
                } else {
                    Ok(pooled)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::device::CpuKernels;
    use crate::backend::kernels::IsaCap;

    const F32: LinearFormat = LinearFormat::F32;

    #[test]
    fn the_fused_path_falls_back_where_it_cannot_run() {
        let cpu = Device::Cpu;
        let best = Isa::detect();
        let portable = best.capped(IsaCap::Portable);
        // Half-precision tensors (as on GPUs) always run candle's own ops.
        for dtype in [DType::BF16, DType::F16] {
            assert_eq!(
                CpuPath::choose(CpuKernels::Auto, &cpu, dtype, best, F32),
                CpuPath::Stock
            );
        }
        assert_eq!(
            CpuPath::choose(CpuKernels::Stock, &cpu, DType::F32, best, F32),
            CpuPath::Stock
        );
        assert_eq!(
            CpuPath::choose(CpuKernels::Auto, &cpu, DType::F32, best, F32),
            CpuPath::Fused(best, F32)
        );
        // A CPU where detection found neither AVX2 nor AVX-512 runs the portable kernels,
        // whatever was asked for: a request never raises the level.
        for kernels in [CpuKernels::Auto, CpuKernels::Avx2, CpuKernels::Portable] {
            assert_eq!(
                CpuPath::choose(kernels, &cpu, DType::F32, portable, LinearFormat::Int8),
                CpuPath::Fused(portable, LinearFormat::Int8)
            );
        }
        assert_eq!(
            CpuPath::choose(CpuKernels::Portable, &cpu, DType::F32, best, F32),
            CpuPath::Fused(portable, F32)
        );
    }
}
