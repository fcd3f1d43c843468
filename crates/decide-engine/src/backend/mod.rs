//! The model behind a small forward interface: token rows in, one output vector per row out.
//!
//! Everything about tensors stays below [`Backend`]: reading `config.json` and the weights,
//! the device and dtype, the encoder and its fused CPU kernels, and forming batches under the
//! token budget (padded, or packed back to back on the fused CPU path). The layers above see
//! rows of token ids and get vectors back, in the rows' order.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::error::{require, EngineError, Result};

mod amx;
mod batching;
pub(crate) mod config;
pub(crate) mod device;
mod encoder;
mod hooks;
mod kernels;
mod quant;

pub use amx::Bf16Tiles;
use batching::{plan_batches, plan_packs};
use config::EncoderConfig;
use device::CpuKernels;
use encoder::{Batch, CpuPath, Model, Packed, CPU_CHUNK_TOKENS};
pub(crate) use encoder::{HeadKind, Pooling};

/// One row's input: its token ids and their token type ids.
pub(crate) type RowRef<'a> = (&'a [u32], &'a [u32]);

/// One row as the model reads it: token ids with special tokens, and their token type ids.
/// Defined with the backend that runs it, so that the tokenizer above produces it and the
/// backend keeps rows of its own (the int8 path's calibration rows) without knowing the
/// tokenizer.
// No `Debug`: token ids decode back to the user's text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TokenRow {
    /// The token ids, special tokens included.
    pub ids: Vec<u32>,
    /// The token type of each id (0 for the query, 1 for the document of a BERT pair).
    pub type_ids: Vec<u32>,
}

impl TokenRow {
    /// Its length in tokens, special tokens included.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it has no token.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The row as [`Backend::forward`] takes it.
    pub(crate) fn as_row(&self) -> RowRef<'_> {
        (&self.ids, &self.type_ids)
    }
}

/// A loaded model that runs rows.
pub(crate) trait Backend: Send + Sync {
    /// One output vector per row, in the rows' order: logits for a classifier, an embedding for
    /// an embedder. Rows go through in batches of at most the token budget.
    fn forward(&self, rows: &[RowRef<'_>]) -> Result<Vec<Vec<f32>>>;
    /// The model's configuration.
    fn config(&self) -> &EncoderConfig;
    /// The device it runs on.
    fn device(&self) -> &Device;
    /// The dtype of its weights and activations.
    fn dtype(&self) -> DType;
    /// Which code runs the layers: `stock`, `fused-<instruction set>-f32`,
    /// `fused-<instruction set>-int8-<int8 kernels>` or `fused-<instruction set>-bf16-amx`.
    fn kernels(&self) -> String;
}

/// The candle encoder of [`encoder`].
pub(crate) struct CandleBackend {
    config: EncoderConfig,
    model: Model,
    device: Device,
    dtype: DType,
    max_batch_tokens: usize,
}

/// Where a backend runs and how it batches.
pub(crate) struct Placement {
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) kernels: CpuKernels,
    /// The linear layers in int8 (fused CPU path only).
    pub(crate) int8: bool,
    /// The linear layers in bf16 on AMX (fused CPU path only; the caller checked for AMX).
    pub(crate) bf16: bool,
    /// Rows the int8 path measures its layers' input ranges on (see [`Model::load`]).
    pub(crate) int8_calibration: Vec<TokenRow>,
    pub(crate) max_batch_tokens: usize,
}

impl CandleBackend {
    /// Loads the weights of the model in `dir` (`model.safetensors`, else
    /// `pytorch_model.bin`) with `head` on top. `built_from` is the base model of a model that
    /// `models/fetch` builds (from the base and the trained layers committed with it), which
    /// the error then names, since such a model has no weights to download.
    pub(crate) fn load(
        dir: &Path,
        config: EncoderConfig,
        head: &HeadKind,
        built_from: Option<&str>,
        placement: Placement,
    ) -> Result<Self> {
        let Placement {
            device,
            dtype,
            kernels,
            int8,
            bf16,
            int8_calibration,
            max_batch_tokens,
        } = placement;
        let weights = ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .ok_or_else(|| EngineError::MissingFile {
                dir: dir.to_path_buf(),
                file: match built_from {
                    Some(base) => format!(
                        "model.safetensors (built from {base} by models/fetch: run models/fetch)"
                    ),
                    None => "model.safetensors (or pytorch_model.bin)".into(),
                },
            })?;
        let vb = if weights.extension().is_some_and(|e| e == "safetensors") {
            // SAFETY: the file is memory-mapped read-only; like every mmap-based loader this
            // assumes nobody truncates it while the engine runs.
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], dtype, &device) }
                .map_err(|e| EngineError::unreadable(&weights, e))?
        } else {
            VarBuilder::from_pth(&weights, dtype, &device)
                .map_err(|e| EngineError::unreadable(&weights, e))?
        };
        let format = if int8 {
            kernels::LinearFormat::Int8
        } else if bf16 {
            kernels::LinearFormat::Bf16
        } else {
            kernels::LinearFormat::F32
        };
        let path = CpuPath::choose(kernels, &device, dtype, kernels::Isa::detect(), format);
        if let CpuPath::Fused(isa, kernels::LinearFormat::Int8) = path {
            if !isa.int8().is_vnni() {
                // Measured here: the AVX2 build of the portable int8 loop ran at 0.3-0.5x the f32
                // kernels; int8 then only saves memory.
                tracing::warn!(
                    kernels = isa.int8().name(),
                    "int8 without VNNI (AVX-512 VNNI or AVX-VNNI) is slower than f32 on this CPU; it only saves memory"
                );
            }
        }
        let calibration: Vec<RowRef<'_>> = int8_calibration.iter().map(TokenRow::as_row).collect();
        let model = Model::load(vb, &config, head, path, &calibration)
            .map_err(|e| EngineError::unreadable(&weights, e))?;
        Ok(Self {
            config,
            model,
            device,
            dtype,
            max_batch_tokens,
        })
    }
}

/// How long a kept-warm worker goes on looking for work that does not come.
const KEEP_WARM_IDLE: Duration = Duration::from_micros(500);

/// Runs the pool's pending work on this worker until `done`, or until none has come for
/// [`KEEP_WARM_IDLE`].
///
/// A worker that finds no work soon goes to sleep, and waking it takes a system call and, on a
/// virtual machine, the host scheduling its CPU again: tens of microseconds, paid at each of a
/// forward pass's thirty-odd loops. Spinning through the short serial stretches between them
/// keeps the worker ready, which halved a decision's context switches and gave 1.03-1.08x on
/// int8 forward passes (docs/benchmarks.md). The idle limit is what keeps this safe when passes
/// run concurrently in one pool: a worker spinning for one pass may sit on the stack above
/// another pass's unfinished work, which needs it back; it returns within the limit.
fn keep_warm(done: &AtomicBool) {
    let mut idle_since: Option<Instant> = None;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = None,
            Some(rayon::Yield::Idle) => {
                if idle_since.get_or_insert_with(Instant::now).elapsed() > KEEP_WARM_IDLE {
                    return;
                }
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
            None => return,
        }
    }
}

impl Backend for CandleBackend {
    /// The fused CPU path packs each batch's rows back to back; every other path pads them,
    /// in length-sorted batches.
    fn forward(&self, rows: &[RowRef<'_>]) -> Result<Vec<Vec<f32>>> {
        if self.model.packs() {
            // The fused kernels run a parallel loop per op, five per layer. From a thread
            // outside rayon's pool each loop is handed to the pool and the caller sleeps until
            // it is done: two wake-ups per op. Inside the pool, the thread that runs the pass
            // takes part in every loop: a 10-message decision made 6-8 times fewer context
            // switches (`perf stat`). The other workers are kept from sleeping between loops
            // too (see `keep_warm`): half as many again.
            let done = AtomicBool::new(false);
            return rayon::scope(|s| {
                let runner = rayon::current_thread_index();
                let done = &done;
                s.spawn_broadcast(move |_, worker| {
                    if Some(worker.index()) != runner {
                        keep_warm(done);
                    }
                });
                let out = self.forward_rows(rows);
                done.store(true, Ordering::Release);
                out
            });
        }
        self.forward_rows(rows)
    }

    fn config(&self) -> &EncoderConfig {
        &self.config
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn kernels(&self) -> String {
        self.model.kernels()
    }
}

impl CandleBackend {
    /// [`Backend::forward`] on the calling thread.
    fn forward_rows(&self, rows: &[RowRef<'_>]) -> Result<Vec<Vec<f32>>> {
        let lengths: Vec<usize> = rows.iter().map(|r| r.0.len()).collect();
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        let packs = self.model.packs();
        let plan = if packs {
            plan_packs(&lengths, CPU_CHUNK_TOKENS.min(self.max_batch_tokens))
        } else {
            plan_batches(&lengths, self.max_batch_tokens)
        };
        for batch in plan {
            let slices: Vec<RowRef<'_>> = batch.iter().map(|&i| rows[i]).collect();
            let output = if packs {
                self.model
                    .forward_packed(&Packed::new(&slices, &self.config, &self.device)?)?
            } else {
                let input = Batch::new(&slices, &self.config, &self.device, self.dtype)?;
                self.model.forward(&input)?
            };
            let output: Vec<Vec<f32>> = output.to_dtype(DType::F32)?.to_vec2()?;
            for (&i, v) in batch.iter().zip(output) {
                out[i] = v;
            }
        }
        Ok(out)
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

/// The sentence-transformers layout: `modules.json` names the pooling folder and whether a
/// Normalize module follows.
pub(crate) fn embedding_head(dir: &Path) -> Result<HeadKind> {
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

/// The longest input a sentence-transformers folder declares (`sentence_bert_config.json`'s
/// `max_seq_length`), if it has one.
pub(crate) fn sentence_max_length(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join("sentence_bert_config.json");
    Ok(path
        .is_file()
        .then(|| read_json::<serde_json::Value>(&path))
        .transpose()?
        .and_then(|v| v.get("max_seq_length").and_then(|n| n.as_u64()))
        .map(|n| n as usize))
}
