//! A BERT encoder that candle can differentiate: every op here has a backward.
//!
//! The engine's inference path uses candle's fused `layer_norm` and `softmax_last_dim` (and, on
//! the CPU, its own fused kernels), none of which has a backward; this path spells LayerNorm and
//! softmax out in basic ops, adds real dropout, and keeps the weights as [`Var`]s under the bare
//! sentence-transformers names, which the engine loads unchanged. One trunk serves both heads:
//! mean pooling for a bi-encoder, BERT's pooler and a one-logit classifier for a cross-encoder.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var, D};
use decide_engine::{Activation, Bf16Tiles, EncoderConfig, Family};

use crate::attention::Attention;
use crate::config::TrainHead;
use crate::error::{Result, TrainError};
use crate::fused::{Gelu, LayerNorm};
use crate::tiles::TileLinear;

/// A seeded generator (SplitMix64): the same seed gives the same shuffles, hard negatives and
/// dropout masks, hence the same weights. candle's own `rand` draws from the thread's RNG,
/// which cannot be seeded.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Standard normal (Box-Muller), for initialising new weights.
    pub fn normal(&mut self) -> f32 {
        let u1 = self.next_f32().max(f32::MIN_POSITIVE);
        let u2 = self.next_f32();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The trainable encoder: weights by bare name (`embeddings.…`, `encoder.layer.N.…`).
pub(crate) struct Bert {
    pub vars: BTreeMap<String, Var>,
    pub config: EncoderConfig,
    pub device: Device,
    /// Where the linear layers' products run in bf16 on AMX tiles (`None`: candle's f32).
    pub tiles: Option<Bf16Tiles>,
}

/// Prefixes under which checkpoints keep the encoder; stripped on load.
const PREFIXES: [&str; 2] = ["bert.", "model."];

impl Bert {
    /// Loads the encoder weights of `weights` (safetensors) as f32 variables. For a
    /// cross-encoder the pooler and a one-logit `classifier` come too; a base without them
    /// (a bi-encoder) gets them freshly initialised from `rng`, as BERT initialises them.
    pub fn load(
        weights: &Path,
        config: EncoderConfig,
        device: &Device,
        head: TrainHead,
        rng: &mut Rng,
    ) -> Result<Self> {
        if config.family != Family::Bert {
            return Err(TrainError::Unsupported(
                "only BERT-family encoders (BERT, MiniLM) can be trained so far".into(),
            ));
        }
        let tensors = candle_core::safetensors::load(weights, device).map_err(|e| {
            TrainError::bad_file(weights, e.to_string().lines().next().unwrap_or_default())
        })?;
        let cross = head == TrainHead::CrossEncoder;
        let mut vars = BTreeMap::new();
        for (name, t) in tensors {
            let bare = PREFIXES
                .iter()
                .find_map(|p| name.strip_prefix(p))
                .unwrap_or(&name);
            // The pooler and any classifier are not part of a bi-encoder.
            let keep = bare.starts_with("embeddings.")
                || bare.starts_with("encoder.")
                || (cross && (bare.starts_with("pooler.") || bare.starts_with("classifier.")));
            if keep {
                vars.insert(
                    bare.to_string(),
                    Var::from_tensor(&t.to_dtype(DType::F32)?)?,
                );
            }
        }
        let h = config.hidden_size;
        if cross {
            if let Some(w) = vars.get("classifier.weight") {
                let labels = w.as_tensor().dim(0)?;
                if labels != 1 {
                    return Err(TrainError::Unsupported(format!(
                        "the base model's classifier has {labels} labels; a cross-encoder is trained with one logit (start from a bi-encoder or a one-label cross-encoder)"
                    )));
                }
            }
            let mut init = |name: &str, shape: &[usize], random: bool| -> Result<()> {
                if !vars.contains_key(name) {
                    let values: Vec<f32> = (0..shape.iter().product())
                        .map(|_| if random { 0.02 * rng.normal() } else { 0.0 })
                        .collect();
                    let t = Tensor::from_vec(values, shape, device)?;
                    vars.insert(name.to_string(), Var::from_tensor(&t)?);
                }
                Ok(())
            };
            init("pooler.dense.weight", &[h, h], true)?;
            init("pooler.dense.bias", &[h], false)?;
            init("classifier.weight", &[1, h], true)?;
            init("classifier.bias", &[1], false)?;
        }
        let bert = Self {
            vars,
            config,
            device: device.clone(),
            tiles: None,
        };
        // Fail at load time, naming the tensor, rather than in the first step.
        bert.t("embeddings.word_embeddings.weight")?;
        for i in 0..bert.config.num_layers {
            bert.t(&format!("encoder.layer.{i}.output.LayerNorm.bias"))?;
        }
        Ok(bert)
    }

    /// Whether the weight `name` is trained when the embeddings and the lowest `frozen` layers
    /// are frozen (`frozen` 0: every weight is).
    pub fn is_trained(name: &str, frozen: usize) -> bool {
        if frozen == 0 {
            return true;
        }
        if name.starts_with("embeddings.") {
            return false;
        }
        let layer = name
            .strip_prefix("encoder.layer.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        layer.is_none_or(|i| i >= frozen)
    }

    fn t(&self, name: &str) -> Result<&Tensor> {
        self.vars
            .get(name)
            .map(|v| v.as_tensor())
            .ok_or_else(|| TrainError::MissingTensor(name.to_string()))
    }

    fn linear(&self, x: &Tensor, prefix: &str) -> Result<Tensor> {
        let w = self.t(&format!("{prefix}.weight"))?;
        let b = self.t(&format!("{prefix}.bias"))?;
        Ok(match self.tiles {
            Some(tiles) => x.contiguous()?.apply_op3(w, b, TileLinear(tiles))?,
            None => x.broadcast_matmul(&w.t()?)?.broadcast_add(b)?,
        })
    }

    /// LayerNorm: one op with its own backward on the CPU; elsewhere mean, variance and an
    /// affine map, since candle's fused op has no backward.
    fn layer_norm(&self, x: &Tensor, prefix: &str) -> Result<Tensor> {
        if self.device.is_cpu() {
            let w = self.t(&format!("{prefix}.weight"))?;
            let b = self.t(&format!("{prefix}.bias"))?;
            let eps = self.config.layer_norm_eps as f32;
            return Ok(x.contiguous()?.apply_op3(w, b, LayerNorm { eps })?);
        }
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred.broadcast_div(&(var + self.config.layer_norm_eps)?.sqrt()?)?;
        Ok(normed
            .broadcast_mul(self.t(&format!("{prefix}.weight"))?)?
            .broadcast_add(self.t(&format!("{prefix}.bias"))?)?)
    }

    /// Inverted dropout with a mask from the seeded generator; the identity when `rng` is
    /// `None` (evaluation) or `p` is 0.
    fn dropout(&self, x: &Tensor, p: f32, rng: &mut Option<&mut Rng>) -> Result<Tensor> {
        match Self::dropout_multipliers(x.elem_count(), p, rng) {
            Some(mask) => Ok(x.mul(&Tensor::from_vec(mask, x.shape(), &self.device)?)?),
            None => Ok(x.clone()),
        }
    }

    /// Inverted dropout's multipliers for `n` values (each 0 or `1 / (1 - p)`), drawn in order
    /// from the seeded generator; `None` when `rng` is `None` or `p` is 0.
    fn dropout_multipliers(n: usize, p: f32, rng: &mut Option<&mut Rng>) -> Option<Vec<f32>> {
        let rng = rng.as_deref_mut()?;
        if p <= 0.0 {
            return None;
        }
        let keep = 1.0 / (1.0 - p);
        Some(
            (0..n)
                .map(|_| if rng.next_f32() < p { 0.0 } else { keep })
                .collect(),
        )
    }

    /// The embedding layer's output (B, L, hidden) of padded `ids` (B, L) with, for pairs,
    /// token `types` (B, L). With `rng`, dropout `p` is on.
    fn embeddings(
        &self,
        ids: &Tensor,
        types: Option<&Tensor>,
        p: f32,
        rng: &mut Option<&mut Rng>,
    ) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let h = self.config.hidden_size;
        let words = self
            .t("embeddings.word_embeddings.weight")?
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, l, h))?;
        let positions = self
            .t("embeddings.position_embeddings.weight")?
            .narrow(0, 0, l)?;
        let type_table = self.t("embeddings.token_type_embeddings.weight")?;
        let x = match types {
            Some(types) => {
                let types = type_table
                    .index_select(&types.flatten_all()?, 0)?
                    .reshape((b, l, h))?;
                words.broadcast_add(&positions)?.add(&types)?
            }
            None => words
                .broadcast_add(&positions)?
                .broadcast_add(&type_table.get(0)?)?,
        };
        let x = self.layer_norm(&x, "embeddings.LayerNorm")?;
        self.dropout(&x, p, rng)
    }

    /// The attention bias of a padding `mask` (B, L): padding gets a large negative bias (not
    /// -inf, so a softmax row never sees only infinities).
    fn attention_bias(mask: &Tensor) -> Result<Tensor> {
        let (b, l) = mask.dims2()?;
        Ok(((mask.ones_like()? - mask)? * -1e4)?.reshape((b, 1, 1, l))?)
    }

    /// Encoder layer `i` on hidden states `x` (B, L, hidden) with the attention `bias` of
    /// [`attention_bias`](Self::attention_bias).
    fn layer(
        &self,
        i: usize,
        x: &Tensor,
        bias: &Tensor,
        p: f32,
        rng: &mut Option<&mut Rng>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, l, h) = x.dims3()?;
        let heads = c.num_heads;
        let hd = h / heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let pre = format!("encoder.layer.{i}");
        let q = self.linear(x, &format!("{pre}.attention.self.query"))?;
        let k = self.linear(x, &format!("{pre}.attention.self.key"))?;
        let v = self.linear(x, &format!("{pre}.attention.self.value"))?;
        let ctx = if self.device.is_cpu() {
            let op = Attention {
                heads,
                scale: scale as f32,
                mask: bias.flatten_all()?.to_vec1::<f32>()?,
                dropout: Self::dropout_multipliers(b * heads * l * l, p, rng),
            };
            q.contiguous()?
                .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?
        } else {
            let split = |t: Tensor| -> Result<Tensor> {
                Ok(t.reshape((b, l, heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()?)
            };
            let (q, k, v) = (split(q)?, split(k)?, split(v)?);
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(bias)?;
            // The generic softmax is built from basic ops; `softmax_last_dim` has no backward.
            let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let probs = self.dropout(&probs, p, rng)?;
            probs.matmul(&v)?.transpose(1, 2)?.reshape((b, l, h))?
        };
        let attn = self.linear(&ctx, &format!("{pre}.attention.output.dense"))?;
        let attn = self.dropout(&attn, p, rng)?;
        let x1 = self.layer_norm(&(attn + x)?, &format!("{pre}.attention.output.LayerNorm"))?;
        let up = self.linear(&x1, &format!("{pre}.intermediate.dense"))?;
        let up = match c.activation {
            Activation::Gelu if self.device.is_cpu() => up.apply_op1(Gelu)?,
            Activation::Gelu => up.gelu_erf()?,
            Activation::GeluTanh => up.gelu()?,
            Activation::Relu => up.relu()?,
        };
        let down = self.linear(&up, &format!("{pre}.output.dense"))?;
        let down = self.dropout(&down, p, rng)?;
        self.layer_norm(&(down + x1)?, &format!("{pre}.output.LayerNorm"))
    }

    /// The last layer's hidden states (B, L, hidden) of padded `ids` (B, L) with `mask`
    /// (B, L; 1 for tokens, 0 for padding) and, for pairs, token `types` (B, L). With `rng`,
    /// dropout `p` is on.
    fn trunk(
        &self,
        ids: &Tensor,
        types: Option<&Tensor>,
        mask: &Tensor,
        p: f32,
        rng: &mut Option<&mut Rng>,
    ) -> Result<Tensor> {
        let x = self.embeddings(ids, types, p, rng)?;
        self.upper(&x, mask, 0, p, rng)
    }

    /// The hidden states after the embeddings and the lowest `frozen` layers, computed as at
    /// inference (no dropout) and cut from the graph: frozen weights get no gradient, and the
    /// result can be cached and reused from one step to the next.
    pub fn frozen(
        &self,
        ids: &Tensor,
        types: Option<&Tensor>,
        mask: &Tensor,
        frozen: usize,
    ) -> Result<Tensor> {
        let mut none = None;
        let mut x = self.embeddings(ids, types, 0.0, &mut none)?;
        let bias = Self::attention_bias(mask)?;
        for i in 0..frozen.min(self.config.num_layers) {
            x = self.layer(i, &x, &bias, 0.0, &mut none)?;
        }
        Ok(x.detach())
    }

    /// Layers `from..` on hidden states `x` (B, L, hidden) with padding `mask` (B, L).
    pub fn upper(
        &self,
        x: &Tensor,
        mask: &Tensor,
        from: usize,
        p: f32,
        rng: &mut Option<&mut Rng>,
    ) -> Result<Tensor> {
        let bias = Self::attention_bias(mask)?;
        let mut x = x.clone();
        for i in from..self.config.num_layers {
            x = self.layer(i, &x, &bias, p, rng)?;
        }
        Ok(x)
    }

    /// Unit-length mean-pooled embeddings (B, hidden) of hidden states `x` (B, L, hidden).
    pub fn pool(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let m = mask.unsqueeze(2)?;
        let pooled = x.broadcast_mul(&m)?.sum(1)?.broadcast_div(&m.sum(1)?)?;
        let norm = (pooled.sqr()?.sum_keepdim(D::Minus1)? + 1e-12)?.sqrt()?;
        Ok(pooled.broadcast_div(&norm)?)
    }

    /// Unit-length mean-pooled sentence embeddings (B, hidden) of padded `ids` (B, L) with
    /// `mask` (B, L; 1 for tokens, 0 for padding). With `rng`, dropout `p` is on.
    pub fn embed(
        &self,
        ids: &Tensor,
        mask: &Tensor,
        p: f32,
        mut rng: Option<&mut Rng>,
    ) -> Result<Tensor> {
        let x = self.trunk(ids, None, mask, p, &mut rng)?;
        Self::pool(&x, mask)
    }

    /// The cross-encoder's logit (B,) for each padded pair: BERT's sequence classifier, the
    /// pooler (dense + tanh on the first token), dropout, then the one-logit `classifier`.
    pub fn classify(
        &self,
        ids: &Tensor,
        types: &Tensor,
        mask: &Tensor,
        p: f32,
        mut rng: Option<&mut Rng>,
    ) -> Result<Tensor> {
        let x = self.trunk(ids, Some(types), mask, p, &mut rng)?;
        self.logit(&x, p, rng)
    }

    /// The cross-encoder's logit (B,) from the last layer's hidden states (B, L, hidden).
    pub fn logit(&self, x: &Tensor, p: f32, mut rng: Option<&mut Rng>) -> Result<Tensor> {
        let first = x.narrow(1, 0, 1)?.squeeze(1)?;
        let pooled = self.linear(&first, "pooler.dense")?.tanh()?;
        let pooled = self.dropout(&pooled, p, &mut rng)?;
        Ok(self.linear(&pooled, "classifier")?.squeeze(1)?)
    }
}
