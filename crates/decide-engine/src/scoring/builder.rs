//! Configuring and loading an [`Engine`]: resolving the model, reading its folder (head,
//! length, calibration, lexical weight, conformal table) and loading the backend.

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use decide_contract::Conformal;

use super::cache::EmbeddingCache;
use super::{Engine, Inner, ModelInfo, ScoreKind};
use crate::backend::config::{EncoderConfig, Family};
use crate::backend::device::{device_name, CpuKernels, DeviceSpec, Precision};
use crate::backend::TokenRow;
use crate::backend::{
    embedding_head, sentence_max_length, Backend, CandleBackend, HeadKind, Placement,
};
use crate::calibration::Calibration;
use crate::error::{require, EngineError, Result};
use crate::needs_tool::NeedsTool;
use crate::registry::{self, HeadName, ModelLocation, DEFAULT_MODEL};
use crate::tokenize::Tokenization;

/// The default token budget of one forward pass: rows × longest row.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 16_384;
/// The default number of candidate embeddings kept by a bi-encoder.
pub const DEFAULT_CACHE_CAPACITY: usize = 65_536;
/// The default memory of a bi-encoder's embedding cache, texts and vectors counted: 64 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Configures and loads an [`Engine`]. Produces an immutable engine; all options have defaults.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    model: String,
    device: DeviceSpec,
    precision: Precision,
    max_batch_tokens: usize,
    max_length: Option<usize>,
    cache_capacity: usize,
    cache_bytes: usize,
    calibration: Option<Calibration>,
    lexical_weight: Option<f64>,
    tool_parameters: Option<bool>,
    tool_server: Option<bool>,
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
            cache_bytes: DEFAULT_CACHE_BYTES,
            calibration: None,
            lexical_weight: None,
            tool_parameters: None,
            tool_server: None,
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

    /// The precision (default: f32; int8 on the CPU's fused kernels only; f16 and bf16 on GPUs
    /// only).
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

    /// The most memory the embedding cache takes, texts and vectors counted (default
    /// [`DEFAULT_CACHE_BYTES`]); the oldest embeddings go first.
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Replaces the model's calibration.
    pub fn calibration(mut self, calibration: Calibration) -> Self {
        self.calibration = Some(calibration);
        self
    }

    /// Replaces the weight of BM25 in hybrid scoring (the manifest's
    /// `[scoring] lexical_weight`, else 0): each document's raw score becomes
    /// `model score + weight · BM25 coverage` (see [`Bm25Index::coverage`](crate::Bm25Index::coverage)). The calibration is
    /// fitted for one weight: change both together.
    pub fn lexical_weight(mut self, weight: f64) -> Self {
        self.lexical_weight = Some(weight);
        self
    }

    /// Whether a tool's text carries its parameter names ([`crate::tool_text`]); default: the
    /// manifest's `[scoring] tool_parameters`, else no. A model reads best the texts it was
    /// chosen and calibrated with: change the calibration too.
    pub fn tool_parameters(mut self, on: bool) -> Self {
        self.tool_parameters = Some(on);
        self
    }

    /// Whether a tool's text carries the name of the server it comes from, when its candidate
    /// names one ([`crate::served_tool_text`]); default: the manifest's `[scoring]
    /// tool_server`, else no. As with [`Self::tool_parameters`], a model reads best the texts
    /// it was trained and calibrated with.
    pub fn tool_server(mut self, on: bool) -> Self {
        self.tool_server = Some(on);
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
    pub fn build(mut self) -> Result<Engine> {
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
        self.precision = self.precision.resolve(&device, self.cpu_kernels);
        let dtype = self.precision.dtype_for(&device)?;
        if self.precision == Precision::Int8 && self.cpu_kernels == CpuKernels::Stock {
            return Err(EngineError::InvalidOption {
                option: "dtype",
                message: "int8 runs on the fused CPU kernels, and --kernels stock has none \
                          (use auto, avx2 or portable)"
                    .into(),
            });
        }
        if self.precision == Precision::Bf16
            && matches!(device, Device::Cpu)
            && self.cpu_kernels == CpuKernels::Stock
        {
            return Err(EngineError::InvalidOption {
                option: "dtype",
                message: "bf16 on the cpu runs on the fused CPU kernels, and --kernels stock has \
                          none (use auto)"
                    .into(),
            });
        }
        Engine::load(location, device, dtype, self)
    }
}

impl Engine {
    /// A builder with the defaults: the default model on the CPU in f32.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Reads the model's folder step by step, in the order its problems are reported: the
    /// files a user is most likely to have left out first, the costly weights last.
    fn load(
        location: ModelLocation,
        device: Device,
        dtype: DType,
        options: EngineBuilder,
    ) -> Result<Engine> {
        let dir = location.dir.clone();
        let config = EncoderConfig::from_file(&require(&dir, "config.json")?)?;
        // Loaded before the head is known so that a missing tokenizer is reported first; its
        // length is set once the manifest and the model's limit are read.
        let tokens = Tokenization::from_dir(&dir, config.max_tokens())?;
        let head_name = head_name(&location, &config)?;
        let head = match head_name {
            HeadName::BiEncoder => embedding_head(&dir)?,
            HeadName::CrossEncoder => HeadKind::Classifier,
        };
        let (score_kind, entailment_index) = score_kind(&dir, head_name, &config)?;
        let calibration = calibration(&location, head_name, &options)?;
        let max_length = max_length(&location, &config, options.max_length)?;
        if let Some(manifest) = &location.manifest {
            registry::verify_files(&dir, manifest)?;
        }
        let placement = placement(&tokens, head_name, device, dtype, &options)?;
        let built_from = location
            .manifest
            .as_ref()
            .and_then(|m| m.build.as_ref())
            .map(|b| b.base.as_str());
        let backend = CandleBackend::load(&dir, config, &head, built_from, placement)?;
        let scoring = ScoringSettings::new(&location, &options);
        let needs_tool = needs_tool(&location, head_name, &backend)?;
        let info = ModelInfo {
            name: location.name.clone(),
            hf_id: location.manifest.as_ref().map(|m| m.hf_id.clone()),
            dir,
            architecture: match backend.config().family {
                Family::Bert => "bert".into(),
                Family::Roberta => "roberta".into(),
            },
            head: head_name,
            score_kind,
            max_length,
            device: device_name(backend.device()),
            dtype: match options.precision {
                Precision::Int8 => "int8".into(),
                Precision::Bf16 => "bf16".into(),
                _ => format!("{:?}", backend.dtype()).to_lowercase(),
            },
            calibration,
            lexical_weight: scoring.lexical_weight,
            tool_parameters: scoring.tool_parameters,
            tool_server: scoring.tool_server,
            conformal: scoring.conformal,
            needs_tool,
        };
        tracing::debug!(model = %info.name, dir = %info.dir.display(), head = info.head.as_str(), "model loaded");
        Engine::start(info, tokens, backend, entailment_index, &options)
    }

    /// The engine around a loaded backend, after one short row through the model: weights
    /// that compute NaN (and that no checksum covers) fail here, at load, rather than as a
    /// fallback on every request.
    fn start(
        info: ModelInfo,
        tokens: Tokenization,
        backend: CandleBackend,
        entailment_index: usize,
        options: &EngineBuilder,
    ) -> Result<Engine> {
        let engine = Engine {
            inner: Arc::new(Inner {
                tokens: tokens.with_max_length(info.max_length),
                info,
                backend: Box::new(backend),
                max_batch_tokens: options.max_batch_tokens,
                entailment_index,
                cache: Mutex::new(EmbeddingCache::new(
                    options.cache_capacity,
                    options.cache_bytes,
                )),
                lexical: Default::default(),
            }),
        };
        let probe = engine.inner.tokens.encode_document("probe")?;
        engine.run(&[probe])?;
        Ok(engine)
    }
}

/// The head the manifest names; without a manifest, the one the folder's shape implies, so
/// that a plain sentence-transformers or Hugging Face classifier folder loads as it is.
fn head_name(location: &ModelLocation, config: &EncoderConfig) -> Result<HeadName> {
    let dir = &location.dir;
    match location.manifest.as_ref().map(|m| m.head) {
        Some(h) => Ok(h),
        None if dir.join("modules.json").is_file() && config.labels.is_empty() => {
            Ok(HeadName::BiEncoder)
        }
        None if !config.labels.is_empty() => Ok(HeadName::CrossEncoder),
        None => Err(EngineError::Unsupported {
            dir: dir.clone(),
            message: "neither a sentence-transformers folder (modules.json) nor a \
                      sequence classifier (id2label in config.json)"
                .into(),
        }),
    }
}

/// What the head's output means, and which output is the score: a classifier with more than
/// two labels is only usable as an NLI model, whose entailment label says "relevant".
fn score_kind(dir: &Path, head: HeadName, config: &EncoderConfig) -> Result<(ScoreKind, usize)> {
    let labels = &config.labels;
    match head {
        HeadName::BiEncoder => Ok((ScoreKind::Cosine, 0)),
        HeadName::CrossEncoder => match labels.len() {
            0 | 1 => Ok((ScoreKind::Logit, 0)),
            2 => Ok((ScoreKind::Logit, 1)),
            _ => match labels
                .iter()
                .position(|l| l.eq_ignore_ascii_case("entailment"))
            {
                Some(i) => Ok((ScoreKind::Entailment, i)),
                None => Err(EngineError::Unsupported {
                    dir: dir.to_path_buf(),
                    message: format!(
                        "a classifier with {} labels needs an 'entailment' label (labels: {})",
                        labels.len(),
                        labels.join(", ")
                    ),
                }),
            },
        },
    }
}

/// The builder's calibration, else the manifest's, else the head's own; an error when that
/// leaves none and the caller did not ask for an uncalibrated engine, since nothing
/// uncalibrated may be called a probability.
fn calibration(
    location: &ModelLocation,
    head: HeadName,
    options: &EngineBuilder,
) -> Result<Option<Calibration>> {
    let calibration = options
        .calibration
        .or_else(|| location.manifest.as_ref().and_then(|m| m.calibration))
        .or(match head {
            // A cross-encoder is trained through a sigmoid or softmax: its own output is
            // already a probability until a fitted calibration replaces it.
            HeadName::CrossEncoder => Some(Calibration::IDENTITY),
            HeadName::BiEncoder => None,
        });
    if calibration.is_none() && !options.allow_uncalibrated {
        return Err(EngineError::Uncalibrated {
            model: location.name.clone(),
            hint: "a bi-encoder's cosine is not a probability; fit one with `decide calibrate` \
                   and add it as [calibration] to the model's manifest.toml"
                .into(),
        });
    }
    Ok(calibration)
}

/// The longest input: the caller's, else the manifest's, else sentence-transformers' own
/// setting, else what the position embeddings allow, and never more than they allow.
fn max_length(
    location: &ModelLocation,
    config: &EncoderConfig,
    requested: Option<usize>,
) -> Result<usize> {
    let model_limit = config.max_tokens();
    // Read even when the caller gives a length, so that a broken file is reported either way.
    let st_limit = sentence_max_length(&location.dir)?;
    let max_length = location
        .manifest
        .as_ref()
        .map(|m| m.max_length)
        .or(st_limit)
        .unwrap_or(model_limit)
        .min(model_limit);
    match requested {
        Some(requested) if requested < 8 || requested > model_limit => {
            Err(EngineError::InvalidOption {
                option: "max-length",
                message: format!("{requested} is out of range (8 to {model_limit})"),
            })
        }
        Some(requested) => Ok(requested),
        None => Ok(max_length),
    }
}

/// Where and how the weights run. The int8 path measures its layers on sample rows before
/// quantizing, so those are tokenized here, with the model's own tokenizer and head.
fn placement(
    tokens: &Tokenization,
    head: HeadName,
    device: Device,
    dtype: DType,
    options: &EngineBuilder,
) -> Result<Placement> {
    let int8_calibration = match options.precision {
        Precision::Int8 => int8_calibration(tokens, head)?,
        _ => Vec::new(),
    };
    // On other devices bf16 is candle's own dtype (see `Precision::dtype_for`).
    let bf16 = options.precision == Precision::Bf16 && matches!(device, Device::Cpu);
    Ok(Placement {
        device,
        dtype,
        kernels: options.cpu_kernels,
        int8: options.precision == Precision::Int8,
        bf16,
        int8_calibration,
        max_batch_tokens: options.max_batch_tokens,
    })
}

/// How documents are scored: the manifest's `[scoring]` unless the builder overrides it, and
/// the conformal table only while nothing it was measured with has changed.
struct ScoringSettings {
    lexical_weight: f64,
    tool_parameters: bool,
    tool_server: bool,
    conformal: Option<Conformal>,
}

impl ScoringSettings {
    fn new(location: &ModelLocation, options: &EngineBuilder) -> Self {
        let manifest_scoring = location.manifest.as_ref().and_then(|m| m.scoring);
        let manifest_weight = manifest_scoring.map(|s| s.lexical_weight).unwrap_or(0.0);
        let lexical_weight = options.lexical_weight.unwrap_or(manifest_weight);
        let manifest_parameters = manifest_scoring.is_some_and(|s| s.tool_parameters);
        let tool_parameters = options.tool_parameters.unwrap_or(manifest_parameters);
        let manifest_server = manifest_scoring.is_some_and(|s| s.tool_server);
        let tool_server = options.tool_server.unwrap_or(manifest_server);
        // The table holds the probabilities of the manifest's calibration over the manifest's
        // scores: another calibration or weight makes other probabilities, and its thresholds
        // would promise a recall nobody measured.
        let conformal = location
            .manifest
            .as_ref()
            .and_then(|m| m.conformal.clone())
            .filter(|_| {
                options.calibration.is_none()
                    && lexical_weight == manifest_weight
                    && tool_parameters == manifest_parameters
                    && tool_server == manifest_server
            });
        Self {
            lexical_weight,
            tool_parameters,
            tool_server,
            conformal,
        }
    }
}

/// The manifest's needs-tool head, for a bi-encoder only: it reads the conversation's
/// embedding, which a cross-encoder does not make. Its size is checked against the loaded
/// model's, since a head fitted on another model would read numbers of another meaning.
fn needs_tool(
    location: &ModelLocation,
    head: HeadName,
    backend: &CandleBackend,
) -> Result<Option<NeedsTool>> {
    match location
        .manifest
        .as_ref()
        .and_then(|m| m.needs_tool.clone())
    {
        Some(needs_tool) if head == HeadName::BiEncoder => {
            needs_tool
                .check(backend.config().hidden_size)
                .map_err(|m| EngineError::bad_file(location.dir.join("manifest.toml"), m))?;
            Ok(Some(needs_tool))
        }
        _ => Ok(None),
    }
}

/// The rows `--dtype int8` measures its layers' input ranges on before quantizing them: short
/// conversations and tool, route and criterion texts (`int8_calibration.txt`, a query and a
/// document a line), as the model will read them.
fn int8_calibration(tokens: &Tokenization, head: HeadName) -> Result<Vec<TokenRow>> {
    const TEXTS: &str = include_str!("../backend/int8_calibration.txt");
    let mut rows = Vec::new();
    for (query, document) in TEXTS.lines().filter_map(|l| l.split_once('\t')) {
        match head {
            HeadName::BiEncoder => {
                rows.push(tokens.encode_query(query)?);
                rows.push(tokens.encode_document(document)?);
            }
            HeadName::CrossEncoder => rows.push(tokens.encode_pair(query, document)?),
        }
    }
    Ok(rows)
}
