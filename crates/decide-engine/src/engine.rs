//! The engine: a loaded model, its tokenizer and the batched scoring of (query, candidate)
//! pairs.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use decide_contract::{Conformal, DecisionInput};
use serde::Deserialize;
use tokenizers::{Encoding, PostProcessor, Tokenizer, TruncationDirection};

use crate::batching::{plan_batches, plan_packs};
use crate::calibration::Calibration;
use crate::config::EncoderConfig;
use crate::device::{device_name, CpuKernels, DeviceSpec, Precision};
use crate::encoder::{Batch, CpuPath, HeadKind, Model, Packed, Pooling, CPU_CHUNK_TOKENS};
use crate::error::{EngineError, Result};
use crate::registry::{self, HeadName, ModelLocation, DEFAULT_MODEL};

/// The default token budget of one forward pass: rows × longest row.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 16_384;
/// The default number of candidate embeddings kept by a bi-encoder.
pub const DEFAULT_CACHE_CAPACITY: usize = 65_536;

/// Configures and loads an [`Engine`]. Produces an immutable engine; all options have defaults.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    model: String,
    device: DeviceSpec,
    precision: Precision,
    max_batch_tokens: usize,
    max_length: Option<usize>,
    cache_capacity: usize,
    calibration: Option<Calibration>,
    lexical_weight: Option<f64>,
    allow_uncalibrated: bool,
    cpu_kernels: CpuKernels,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            model: DEFAULT_MODEL.to_string(),
            device: DeviceSpec::Cpu,
            precision: Precision::F32,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            max_length: None,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
            calibration: None,
            lexical_weight: None,
            allow_uncalibrated: false,
            cpu_kernels: CpuKernels::Auto,
        }
    }
}

impl EngineBuilder {
    /// The model: a folder, a short name from `models/` or a Hugging Face id in the local cache.
    pub fn model(mut self, spec: impl Into<String>) -> Self {
        self.model = spec.into();
        self
    }

    /// The device (default: cpu).
    pub fn device(mut self, device: DeviceSpec) -> Self {
        self.device = device;
        self
    }

    /// The precision (default: f32; f16 and bf16 on GPUs only).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The token budget of one forward pass (rows × longest row; default 16384).
    pub fn max_batch_tokens(mut self, tokens: usize) -> Self {
        self.max_batch_tokens = tokens;
        self
    }

    /// The longest input in tokens; capped at what the model's positions allow.
    pub fn max_length(mut self, tokens: usize) -> Self {
        self.max_length = Some(tokens);
        self
    }

    /// How many candidate embeddings a bi-encoder keeps (default 65536; 0 disables the cache).
    pub fn cache_capacity(mut self, entries: usize) -> Self {
        self.cache_capacity = entries;
        self
    }

    /// Replaces the model's calibration.
    pub fn calibration(mut self, calibration: Calibration) -> Self {
        self.calibration = Some(calibration);
        self
    }

    /// Replaces the weight of BM25 in hybrid scoring (the manifest's
    /// `[scoring] lexical_weight`, else 0): each document's raw score becomes
    /// `model score + weight · BM25 coverage` (see [`crate::lexical`]). The calibration is
    /// fitted for one weight: change both together.
    pub fn lexical_weight(mut self, weight: f64) -> Self {
        self.lexical_weight = Some(weight);
        self
    }

    /// Loads a bi-encoder without a calibration, for fitting one: its decisions then fail,
    /// raw scores still work.
    pub fn allow_uncalibrated(mut self, allow: bool) -> Self {
        self.allow_uncalibrated = allow;
        self
    }

    /// Which code runs the encoder on the CPU (default: the fused kernels at the widest
    /// instruction set the CPU has; [`CpuKernels::Stock`] for candle's own ops).
    pub fn cpu_kernels(mut self, kernels: CpuKernels) -> Self {
        self.cpu_kernels = kernels;
        self
    }

    /// Resolves the model offline and loads it.
    pub fn build(self) -> Result<Engine> {
        if self.max_batch_tokens == 0 || self.max_batch_tokens > 1 << 24 {
            return Err(EngineError::InvalidOption {
                option: "max-batch-tokens",
                message: format!(
                    "{} is out of range (1 to {})",
                    self.max_batch_tokens,
                    1usize << 24
                ),
            });
        }
        if let Some(w) = self.lexical_weight {
            if !(0.0..=100.0).contains(&w) {
                return Err(EngineError::InvalidOption {
                    option: "lexical-weight",
                    message: format!("{w} is out of range (0 to 100)"),
                });
            }
        }
        let location = registry::resolve(&self.model)?;
        let device = self.device.open()?;
        let dtype = self.precision.dtype_for(&device)?;
        Engine::load(location, device, dtype, self)
    }
}

/// What kind of number a model's raw score is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreKind {
    /// Cosine similarity of two embeddings (bi-encoder).
    Cosine,
    /// The logit of a one-label cross-encoder (or label 1 against label 0 of a two-label one).
    Logit,
    /// The log-odds of the `entailment` label of an NLI cross-encoder.
    Entailment,
}

/// What was loaded, for reports.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The model's name.
    pub name: String,
    /// Its Hugging Face id, when its manifest names one.
    pub hf_id: Option<String>,
    /// Its folder.
    pub dir: PathBuf,
    /// `bert` or `roberta`.
    pub architecture: String,
    /// The head.
    pub head: HeadName,
    /// What the raw scores are.
    pub score_kind: ScoreKind,
    /// The longest input in tokens.
    pub max_length: usize,
    /// The device it runs on.
    pub device: String,
    /// The precision.
    pub dtype: String,
    /// The calibration, if any.
    pub calibration: Option<Calibration>,
    /// The weight of BM25 in hybrid scoring; 0 for the model alone.
    pub lexical_weight: f64,
    /// The manifest's conformal table (see [`Engine::conformal`]), if it has one and it holds
    /// for the calibration and lexical weight in use.
    pub conformal: Option<Conformal>,
}

/// Raw scores of candidates against one query, in the candidates' order.
#[derive(Debug, Clone)]
pub struct Scores {
    /// One raw score per candidate.
    pub raw: Vec<f64>,
    /// Tokens that went through the model for them (cached embeddings cost none).
    pub tokens: usize,
}

/// A loaded model that scores (query, candidate) pairs in batched forward passes.
///
/// Cheap to clone (the model is shared) and safe to use from many threads.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.info.name)
            .field("head", &self.inner.info.head)
            .field("device", &self.inner.info.device)
            .finish()
    }
}

pub(crate) struct Inner {
    pub(crate) info: ModelInfo,
    config: EncoderConfig,
    tokenizer: Tokenizer,
    model: Model,
    device: Device,
    dtype: DType,
    pub(crate) max_batch_tokens: usize,
    entailment_index: usize,
    pub(crate) cache: Mutex<EmbeddingCache>,
    pub(crate) lexical: crate::lexical::RecentIndexes,
}

/// A bounded map from candidate text to embedding; the oldest entry goes first when full.
/// One cache per engine, and an engine holds one model, so the key is (model, text).
pub(crate) struct EmbeddingCache {
    capacity: usize,
    map: HashMap<String, Arc<[f32]>>,
    order: VecDeque<String>,
}

impl EmbeddingCache {
    pub(crate) fn get(&self, text: &str) -> Option<Arc<[f32]>> {
        self.map.get(text).cloned()
    }

    pub(crate) fn insert(&mut self, text: String, vector: Arc<[f32]>) {
        if self.capacity == 0 || self.map.contains_key(&text) {
            return;
        }
        while self.map.len() >= self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.order.push_back(text.clone());
        self.map.insert(text, vector);
    }
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
}

#[derive(Deserialize)]
struct StModule {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::bad_file(path, e))?;
    serde_json::from_str(&text).map_err(|e| EngineError::bad_file(path, e))
}

fn require(dir: &Path, file: &str) -> Result<PathBuf> {
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EngineError::MissingFile {
            dir: dir.to_path_buf(),
            file: file.to_string(),
        })
    }
}

/// The sentence-transformers layout: `modules.json` names the pooling folder and whether a
/// Normalize module follows.
fn bi_encoder_head(dir: &Path) -> Result<HeadKind> {
    let modules: Vec<StModule> = read_json(&require(dir, "modules.json")?)?;
    let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
    let pooling_dir = modules
        .iter()
        .find(|m| m.kind.ends_with(".Pooling"))
        .map(|m| m.path.clone())
        .unwrap_or_else(|| "1_Pooling".into());
    let pooling_path = dir.join(&pooling_dir).join("config.json");
    let pooling = if pooling_path.is_file() {
        let p: PoolingConfig = read_json(&pooling_path)?;
        if p.pooling_mode_max_tokens {
            return Err(EngineError::Unsupported {
                dir: dir.to_path_buf(),
                message: "max pooling (only mean and cls pooling are supported)".into(),
            });
        }
        if p.pooling_mode_cls_token && !p.pooling_mode_mean_tokens {
            Pooling::Cls
        } else {
            Pooling::Mean
        }
    } else {
        Pooling::Mean
    };
    Ok(HeadKind::Embedding { pooling, normalize })
}

fn tokenizer_error(path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::bad_file(path, crate::device::first_line(&e.to_string()))
}

impl Engine {
    /// A builder with the defaults: the default model on the CPU in f32.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    fn load(
        location: ModelLocation,
        device: Device,
        dtype: DType,
        options: EngineBuilder,
    ) -> Result<Engine> {
        let dir = location.dir.clone();
        let config = EncoderConfig::from_file(&require(&dir, "config.json")?)?;
        let tokenizer_path = require(&dir, "tokenizer.json")?;
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| tokenizer_error(&tokenizer_path, e))?;
        // Tokenizer files often carry a fixed truncation and padding for another runtime; the
        // engine trims and pads itself, per pair.
        tokenizer
            .with_truncation(None)
            .map_err(|e| tokenizer_error(&tokenizer_path, e))?;
        tokenizer.with_padding(None);

        let head_name = match location.manifest.as_ref().map(|m| m.head) {
            Some(h) => h,
            None if dir.join("modules.json").is_file() && config.labels.is_empty() => {
                HeadName::BiEncoder
            }
            None if !config.labels.is_empty() => HeadName::CrossEncoder,
            None => {
                return Err(EngineError::Unsupported {
                    dir,
                    message: "neither a sentence-transformers folder (modules.json) nor a \
                              sequence classifier (id2label in config.json)"
                        .into(),
                })
            }
        };
        let head = match head_name {
            HeadName::BiEncoder => bi_encoder_head(&dir)?,
            HeadName::CrossEncoder => HeadKind::Classifier,
        };
        let (score_kind, entailment_index) = match head_name {
            HeadName::BiEncoder => (ScoreKind::Cosine, 0),
            HeadName::CrossEncoder => match config.labels.len() {
                0 | 1 => (ScoreKind::Logit, 0),
                2 => (ScoreKind::Logit, 1),
                _ => match config
                    .labels
                    .iter()
                    .position(|l| l.eq_ignore_ascii_case("entailment"))
                {
                    Some(i) => (ScoreKind::Entailment, i),
                    None => {
                        return Err(EngineError::Unsupported {
                            dir,
                            message: format!(
                            "a classifier with {} labels needs an 'entailment' label (labels: {})",
                            config.labels.len(),
                            config.labels.join(", ")
                        ),
                        })
                    }
                },
            },
        };

        let calibration = options
            .calibration
            .or_else(|| location.manifest.as_ref().and_then(|m| m.calibration))
            .or(match head_name {
                // A cross-encoder is trained through a sigmoid or softmax: its own output is
                // already a probability until a fitted calibration replaces it.
                HeadName::CrossEncoder => Some(Calibration::IDENTITY),
                HeadName::BiEncoder => None,
            });
        if calibration.is_none() && !options.allow_uncalibrated {
            return Err(EngineError::Uncalibrated {
                model: location.name.clone(),
                hint:
                    "a bi-encoder's cosine is not a probability; fit one with `decide calibrate` \
                       and add it as [calibration] to the model's manifest.toml"
                        .into(),
            });
        }

        let model_limit = config.max_tokens();
        let st_limit = dir
            .join("sentence_bert_config.json")
            .is_file()
            .then(|| read_json::<serde_json::Value>(&dir.join("sentence_bert_config.json")))
            .transpose()?
            .and_then(|v| v.get("max_seq_length").and_then(|n| n.as_u64()))
            .map(|n| n as usize);
        let mut max_length = location
            .manifest
            .as_ref()
            .map(|m| m.max_length)
            .or(st_limit)
            .unwrap_or(model_limit)
            .min(model_limit);
        if let Some(requested) = options.max_length {
            if requested < 8 || requested > model_limit {
                return Err(EngineError::InvalidOption {
                    option: "max-length",
                    message: format!("{requested} is out of range (8 to {model_limit})"),
                });
            }
            max_length = requested;
        }

        let weights = ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .ok_or_else(|| EngineError::MissingFile {
                dir: dir.clone(),
                file: match location.manifest.as_ref().and_then(|m| m.build.as_ref()) {
                    // A model built from its base and committed trained layers has no file to
                    // download: say which command builds it.
                    Some(build) => format!(
                        "model.safetensors (built from {} by models/fetch: run models/fetch)",
                        build.base
                    ),
                    None => "model.safetensors (or pytorch_model.bin)".into(),
                },
            })?;
        let vb = if weights.extension().is_some_and(|e| e == "safetensors") {
            // SAFETY: the file is memory-mapped read-only; like every mmap-based loader this
            // assumes nobody truncates it while the engine runs.
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], dtype, &device) }.map_err(
                |e| EngineError::bad_file(&weights, crate::device::first_line(&e.to_string())),
            )?
        } else {
            VarBuilder::from_pth(&weights, dtype, &device).map_err(|e| {
                EngineError::bad_file(&weights, crate::device::first_line(&e.to_string()))
            })?
        };
        let path = CpuPath::choose(
            options.cpu_kernels,
            &device,
            dtype,
            crate::kernels::Isa::detect(),
        );
        let model = Model::load(vb, &config, &head, path).map_err(|e| {
            EngineError::bad_file(&weights, crate::device::first_line(&e.to_string()))
        })?;

        let manifest_weight = location
            .manifest
            .as_ref()
            .and_then(|m| m.scoring.as_ref())
            .map(|s| s.lexical_weight)
            .unwrap_or(0.0);
        let lexical_weight = options.lexical_weight.unwrap_or(manifest_weight);
        // The table holds the probabilities of the manifest's calibration over the manifest's
        // scores: another calibration or weight makes other probabilities, and its thresholds
        // would promise a recall nobody measured.
        let conformal = location
            .manifest
            .as_ref()
            .and_then(|m| m.conformal.clone())
            .filter(|_| options.calibration.is_none() && lexical_weight == manifest_weight);
        let info = ModelInfo {
            name: location.name.clone(),
            hf_id: location.manifest.as_ref().map(|m| m.hf_id.clone()),
            dir: dir.clone(),
            architecture: match config.family {
                crate::config::Family::Bert => "bert".into(),
                crate::config::Family::Roberta => "roberta".into(),
            },
            head: head_name,
            score_kind,
            max_length,
            device: device_name(&device),
            dtype: format!("{dtype:?}").to_lowercase(),
            calibration,
            lexical_weight,
            conformal,
        };
        tracing::debug!(model = %info.name, dir = %dir.display(), head = info.head.as_str(), "model loaded");
        Ok(Engine {
            inner: Arc::new(Inner {
                info,
                config,
                tokenizer,
                model,
                device,
                dtype,
                max_batch_tokens: options.max_batch_tokens,
                entailment_index,
                cache: Mutex::new(EmbeddingCache {
                    capacity: options.cache_capacity,
                    map: HashMap::new(),
                    order: VecDeque::new(),
                }),
                lexical: Default::default(),
            }),
        })
    }

    /// What was loaded.
    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    /// The tokenizer's token count of a text (no special tokens), for usage reports.
    pub fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.encode(text)?.len())
    }

    pub(crate) fn encode(&self, text: &str) -> Result<Encoding> {
        self.inner
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    fn specials(&self, pair: bool) -> usize {
        self.inner
            .tokenizer
            .get_post_processor()
            .map(|p| p.added_tokens(pair))
            .unwrap_or(0)
    }

    fn finish(&self, first: Encoding, second: Option<Encoding>) -> Result<Row> {
        let enc = self
            .inner
            .tokenizer
            .post_process(first, second, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(Row {
            ids: enc.get_ids().to_vec(),
            types: enc.get_type_ids().to_vec(),
        })
    }

    /// One text as the model reads it alone, trimmed to the model's length from `side`.
    pub(crate) fn single_row(&self, text: &str, keep_end: bool) -> Result<Row> {
        let mut enc = self.encode(text)?;
        let budget = self
            .inner
            .info
            .max_length
            .saturating_sub(self.specials(false));
        trim_single(&mut enc, budget, keep_end);
        self.finish(enc, None)
    }

    /// A (query, candidate) pair as a cross-encoder reads it, trimmed by [`trim_pair`].
    pub(crate) fn pair_row(&self, query: &Encoding, candidate: &str) -> Result<Row> {
        let mut cand = self.encode(candidate)?;
        let budget = self
            .inner
            .info
            .max_length
            .saturating_sub(self.specials(true));
        let mut query = query.clone();
        trim_pair(&mut query, &mut cand, budget);
        self.finish(query, Some(cand))
    }

    /// Runs rows through the model in token-budgeted, length-sorted batches and returns one
    /// output vector per row, in the rows' order. The fused CPU path packs each batch's rows
    /// back to back; every other path pads them.
    pub(crate) fn run<R: std::borrow::Borrow<Row>>(&self, rows: &[R]) -> Result<Vec<Vec<f32>>> {
        let rows: Vec<&Row> = rows.iter().map(|r| r.borrow()).collect();
        let lengths: Vec<usize> = rows.iter().map(|r| r.ids.len()).collect();
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        let (model, inner) = (&self.inner.model, &self.inner);
        let packs = model.packs();
        let plan = if packs {
            plan_packs(&lengths, CPU_CHUNK_TOKENS.min(inner.max_batch_tokens))
        } else {
            plan_batches(&lengths, inner.max_batch_tokens)
        };
        for batch in plan {
            let slices: Vec<(&[u32], &[u32])> = batch
                .iter()
                .map(|&i| (rows[i].ids.as_slice(), rows[i].types.as_slice()))
                .collect();
            let output = if packs {
                model.forward_packed(&Packed::new(&slices, &inner.config, &inner.device)?)?
            } else {
                let input = Batch::new(&slices, &inner.config, &inner.device, inner.dtype)?;
                model.forward(&input)?
            };
            let output: Vec<Vec<f32>> = output.to_dtype(DType::F32)?.to_vec2()?;
            for (&i, v) in batch.iter().zip(output) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// The raw score of each candidate against `query`, in the candidates' order: all pairs in
    /// batched forward passes, the query tokenized once.
    ///
    /// For a bi-encoder the score is the cosine of the embeddings (the query trimmed from its
    /// oldest end, the candidates' embeddings cached); for a cross-encoder, the logit (or the
    /// entailment log-odds of an NLI model).
    pub fn score(&self, query: &str, candidates: &[&str]) -> Result<Scores> {
        let staged = self.stage_query(query, candidates)?;
        self.complete(staged)
    }

    pub(crate) fn logit_score(&self, logits: &[f32]) -> f64 {
        let l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
        match (self.inner.info.score_kind, l.len()) {
            (ScoreKind::Logit, 1) => l[0],
            (ScoreKind::Logit, _) => l[1] - l[0],
            (_, _) => {
                // log p_e - log(1 - p_e) = l_e - logsumexp(l_j, j ≠ e)
                let e = self.inner.entailment_index;
                let others: Vec<f64> = l
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != e)
                    .map(|(_, &x)| x)
                    .collect();
                let max = others.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + others.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                l[e] - lse
            }
        }
    }

    /// Raw scores of candidates against a decision input: what [`DecisionModel`] answers use.
    ///
    /// A bi-encoder embeds two views of a conversation, the whole (trimmed from its oldest end)
    /// and the last user message alone, and takes the better cosine of the two: one vector for
    /// a long history dilutes the request ("email it to Anna") with the earlier turns, while the
    /// last message alone misses what a follow-up ("do the same for Berlin") refers to.
    ///
    /// [`DecisionModel`]: decide_contract::DecisionModel
    pub fn score_input(&self, input: &DecisionInput, candidates: &[&str]) -> Result<Scores> {
        let full = input.render();
        match (self.inner.info.head, input.last_user_text()) {
            (HeadName::BiEncoder, Some(last))
                if last.trim() != full.trim() && !candidates.is_empty() =>
            {
                self.score_bi(&[&full, last], candidates)
            }
            _ => self.score(&full, candidates),
        }
    }

    fn score_bi(&self, views: &[&str], candidates: &[&str]) -> Result<Scores> {
        let staged = self.stage_bi(views, candidates)?;
        self.complete(staged)
    }

    /// Sentence embeddings of `texts`, as sentence-transformers computes them (inputs longer
    /// than the model's length lose their end). Bi-encoders only.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if self.inner.info.head != HeadName::BiEncoder {
            return Err(self.wrong_head("embeddings need a bi-encoder"));
        }
        let rows = texts
            .iter()
            .map(|t| self.single_row(t, false))
            .collect::<Result<Vec<_>>>()?;
        self.run(&rows)
    }

    /// The classifier's logits for each (query, document) pair. Cross-encoders only.
    pub fn classify_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Vec<f32>>> {
        if self.inner.info.head != HeadName::CrossEncoder {
            return Err(self.wrong_head("pair logits need a cross-encoder"));
        }
        let rows = pairs
            .iter()
            .map(|(q, d)| self.pair_row(&self.encode(q)?, d))
            .collect::<Result<Vec<_>>>()?;
        self.run(&rows)
    }

    /// The token ids of a (query, candidate) pair after trimming, as the model sees them.
    pub fn pair_token_ids(&self, query: &str, candidate: &str) -> Result<Vec<u32>> {
        Ok(self.pair_row(&self.encode(query)?, candidate)?.ids)
    }

    /// Decodes token ids back to text (special tokens dropped), for inspecting trimming.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .tokenizer
            .decode(ids, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The number of candidate embeddings in the cache.
    pub fn cached_embeddings(&self) -> usize {
        self.inner
            .cache
            .lock()
            .map(|c| c.map.len())
            .unwrap_or_default()
    }

    /// Runs `batch` sequences of exactly `tokens` tokens through the model once: the unit the
    /// throughput benchmarks time.
    pub fn forward_synthetic(&self, batch: usize, tokens: usize) -> Result<()> {
        let id = 2000u32.min(self.inner.config.vocab_size.saturating_sub(1) as u32);
        let row = Row {
            ids: vec![id; tokens],
            types: vec![0; tokens],
        };
        let rows = vec![row; batch];
        self.run(&rows).map(|_| ())
    }

    fn wrong_head(&self, message: &str) -> EngineError {
        EngineError::WrongHead {
            model: self.inner.info.name.clone(),
            head: self.inner.info.head.as_str().into(),
            message: message.into(),
        }
    }

    /// The weight of BM25 in hybrid scoring (0: the model alone).
    pub fn lexical_weight(&self) -> f64 {
        self.inner.info.lexical_weight
    }

    /// The conformal table of the manifest (`[conformal]`, written by `decide calibrate`): the
    /// probabilities of the needed tools of held-out cases, which turn a target recall into a
    /// threshold ([`Conformal::threshold`]). `None` when the manifest has none, or when
    /// [`EngineBuilder::calibration`] or [`EngineBuilder::lexical_weight`] changed the
    /// probabilities it was computed for.
    pub fn conformal(&self) -> Option<&Conformal> {
        self.inner.info.conformal.as_ref()
    }

    /// The conformal table ([`conformal`](Self::conformal)), or an error naming the model and
    /// the command that adds one.
    pub fn require_conformal(&self) -> Result<&Conformal> {
        self.conformal().ok_or_else(|| EngineError::NoConformal {
            model: self.inner.info.name.clone(),
        })
    }

    /// The calibration, or an error naming the model when it has none.
    pub fn calibration(&self) -> Result<Calibration> {
        self.inner
            .info
            .calibration
            .ok_or_else(|| EngineError::Uncalibrated {
                model: self.inner.info.name.clone(),
                hint: "fit one with `decide calibrate`".into(),
            })
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Floating-point operations of one forward pass over `batch` rows of `tokens` tokens: the
    /// matrix products of the encoder layers (two per multiply-add), for throughput reports.
    pub fn forward_flops(&self, batch: usize, tokens: usize) -> f64 {
        let c = &self.inner.config;
        let (b, l) = (batch as f64, tokens as f64);
        let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
        // QKV, attention output, FFN up and down; then QKᵀ and P·V.
        let per_layer = 2.0 * b * l * (4.0 * h * h + 2.0 * h * i) + 4.0 * b * l * l * h;
        per_layer * c.num_layers as f64
    }

    /// The device's measured matrix-product rate in GFLOP/s, in the engine's dtype: the best of
    /// a few products of the FFN-up shape at 2048 tokens (2048×hidden by hidden×intermediate).
    pub fn matmul_peak_gflops(&self) -> Result<f64> {
        let c = &self.inner.config;
        let (m, k, n) = (2048, c.hidden_size, c.intermediate_size);
        let device = &self.inner.device;
        let a =
            candle_core::Tensor::randn(0f32, 1.0, (m, k), device)?.to_dtype(self.inner.dtype)?;
        let b =
            candle_core::Tensor::randn(0f32, 1.0, (k, n), device)?.to_dtype(self.inner.dtype)?;
        let mut best = f64::INFINITY;
        for _ in 0..7 {
            device.synchronize()?;
            let start = std::time::Instant::now();
            let p = a.matmul(&b)?;
            device.synchronize()?;
            best = best.min(start.elapsed().as_secs_f64());
            drop(p);
        }
        Ok(2.0 * (m * k * n) as f64 / best / 1e9)
    }

    /// Which code runs the encoder: `stock` (candle's ops) or `fused-<isa>-f32` (the fused
    /// CPU kernels at the instruction set chosen at load time).
    pub fn kernels(&self) -> String {
        self.inner.model.kernels()
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Row {
    pub(crate) ids: Vec<u32>,
    pub(crate) types: Vec<u32>,
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    // Eight independent f32 lanes (summed in f64 at the end) instead of one f64 chain: the
    // compiler vectorizes it, and a 1,000-tool decision scores 2,000 of these.
    const LANES: usize = 8;
    let (mut dot, mut na, mut nb) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut chunks_a = a.chunks_exact(LANES);
    let mut chunks_b = b.chunks_exact(LANES);
    for (x, y) in chunks_a.by_ref().zip(chunks_b.by_ref()) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
            na[i] += x[i] * x[i];
            nb[i] += y[i] * y[i];
        }
    }
    let (mut dot, mut na, mut nb) = (
        dot.iter().map(|&v| v as f64).sum::<f64>(),
        na.iter().map(|&v| v as f64).sum::<f64>(),
        nb.iter().map(|&v| v as f64).sum::<f64>(),
    );
    for (x, y) in chunks_a.remainder().iter().zip(chunks_b.remainder()) {
        dot += (*x as f64) * (*y as f64);
        na += (*x as f64) * (*x as f64);
        nb += (*y as f64) * (*y as f64);
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

/// Trims one text's tokens (special tokens not yet added) to `budget`: a query keeps its end
/// (the latest turns), a tool its start. The engine and `decide-train` both trim through this,
/// so a trained model sees what it will be asked.
pub fn trim_single(enc: &mut Encoding, budget: usize, keep_end: bool) {
    if enc.len() > budget {
        let direction = if keep_end {
            TruncationDirection::Left
        } else {
            TruncationDirection::Right
        };
        enc.truncate(budget, 0, direction);
        enc.take_overflowing();
    }
}

/// Trims a (query, candidate) pair (special tokens not yet added) to `budget` tokens as a
/// cross-encoder reads it: the query loses its oldest tokens first; the candidate is cut only
/// when it alone would crowd the query out of its reserved quarter of the budget.
pub fn trim_pair(query: &mut Encoding, candidate: &mut Encoding, budget: usize) {
    if query.len() + candidate.len() <= budget {
        return;
    }
    let reserve = query.len().min(budget / 4);
    let cand_keep = candidate.len().min(budget - reserve);
    let query_keep = query.len().min(budget - cand_keep);
    if candidate.len() > cand_keep {
        candidate.truncate(cand_keep, 0, TruncationDirection::Right);
        candidate.take_overflowing();
    }
    query.truncate(query_keep, 0, TruncationDirection::Left);
    query.take_overflowing();
}
