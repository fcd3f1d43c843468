//! The training loop: data, batches, loss, optimiser and the saved folder.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use decide_engine::{Calibration, EncoderConfig};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::error::{Result, TrainError};
use crate::model::{Bert, Rng};

/// The hyper-parameters of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Hyper {
    /// Passes over the training pairs.
    pub epochs: usize,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// (query, tool) pairs per step.
    pub batch_size: usize,
    /// Longest input in tokens; longer ones lose their end.
    pub max_length: usize,
    /// Seed of every random draw.
    pub seed: u64,
    /// Fraction of the steps spent warming the learning rate up from zero.
    pub warmup: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Inverse temperature of the contrastive softmax (20 as in sentence-transformers).
    pub scale: f64,
    /// Dropout probability (BERT's 0.1).
    pub dropout: f32,
    /// Gradients are scaled down when their global norm exceeds this.
    pub max_grad_norm: f64,
    /// How many of the top-ranked unneeded tools a case's hard negative is drawn from (0: none).
    pub hard_negative_pool: usize,
}

impl Default for Hyper {
    fn default() -> Self {
        Self {
            epochs: 4,
            learning_rate: 2e-5,
            batch_size: 16,
            max_length: 128,
            seed: 42,
            warmup: 0.1,
            weight_decay: 0.01,
            scale: 20.0,
            dropout: 0.1,
            max_grad_norm: 1.0,
            hard_negative_pool: 5,
        }
    }
}

impl Hyper {
    fn check(&self) -> Result<()> {
        let bad = |option, message: &str| {
            Err(TrainError::InvalidOption {
                option,
                message: message.to_string(),
            })
        };
        if self.epochs == 0 {
            return bad("epochs", "must be at least 1");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate < 1.0) {
            return bad("lr", "must be between 0 and 1");
        }
        if self.batch_size < 2 {
            return bad(
                "batch-size",
                "must be at least 2 (the other pairs are the negatives)",
            );
        }
        if self.max_length < 8 {
            return bad("max-length", "must be at least 8");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout", "must be in [0, 1)");
        }
        Ok(())
    }

    /// The hyper-parameters as a TOML table, for the manifest.
    pub fn to_toml(&self) -> toml::Table {
        let mut t = toml::Table::new();
        t.insert("epochs".into(), (self.epochs as i64).into());
        t.insert("learning_rate".into(), self.learning_rate.into());
        t.insert("batch_size".into(), (self.batch_size as i64).into());
        t.insert("max_length".into(), (self.max_length as i64).into());
        t.insert("seed".into(), (self.seed as i64).into());
        t.insert("warmup".into(), self.warmup.into());
        t.insert("weight_decay".into(), self.weight_decay.into());
        t.insert("scale".into(), self.scale.into());
        // Through its shortest decimal form, so that 0.1 reads 0.1 rather than 0.10000000149.
        let dropout = self
            .dropout
            .to_string()
            .parse()
            .unwrap_or(self.dropout as f64);
        t.insert("dropout".into(), dropout.into());
        t.insert("max_grad_norm".into(), self.max_grad_norm.into());
        t.insert(
            "hard_negative_pool".into(),
            (self.hard_negative_pool as i64).into(),
        );
        t
    }
}

/// One training case: a query and the documents (tool texts) it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// The conversation as the engine renders it.
    pub query: String,
    /// Indexes into [`TrainData::documents`] of the needed tools.
    pub positives: Vec<usize>,
}

/// What a run trains on.
#[derive(Debug, Clone, Default)]
pub struct TrainData {
    /// Every tool text (name and description as the engine sees it), each once; hard negatives
    /// are mined among them.
    pub documents: Vec<String>,
    /// The cases with at least one needed tool.
    pub examples: Vec<Example>,
}

/// What one step did.
#[derive(Debug, Clone, Copy)]
pub struct StepReport {
    /// The step, counted from 1 over the whole run.
    pub step: usize,
    /// The batch's loss.
    pub loss: f32,
    /// Pairs in the batch.
    pub examples: usize,
    /// The learning rate used.
    pub learning_rate: f64,
}

/// A model being trained.
pub struct Trainer {
    bert: Bert,
    tokenizer: Tokenizer,
    optimizer: AdamW,
    hyper: Hyper,
    rng: Rng,
    step: usize,
    total_steps: usize,
    base: PathBuf,
    data: TrainData,
    doc_tokens: Vec<Vec<u32>>,
    query_tokens: Vec<Vec<u32>>,
    /// Per example, the pool its hard negatives are drawn from.
    hard: Vec<Vec<usize>>,
    /// (example, positive) pairs.
    pairs: Vec<(usize, usize)>,
}

fn tokenizer_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::bad_file(path, e)
}

impl Trainer {
    /// Loads the base model folder (config.json, tokenizer.json, model.safetensors) for
    /// training on `data`.
    pub fn new(base: &Path, data: TrainData, hyper: Hyper, device: &Device) -> Result<Self> {
        hyper.check()?;
        if data.examples.is_empty() {
            return Err(TrainError::BadData(
                "no case with a needed tool to train on".into(),
            ));
        }
        for (i, e) in data.examples.iter().enumerate() {
            if e.positives.is_empty() || e.positives.iter().any(|&p| p >= data.documents.len()) {
                return Err(TrainError::BadData(format!(
                    "example {i}: positives must be indexes of documents"
                )));
            }
        }
        let config = EncoderConfig::from_file(&base.join("config.json"))?;
        let weights = base.join("model.safetensors");
        if !weights.is_file() {
            return Err(TrainError::bad_file(
                &weights,
                "missing (training reads safetensors weights)",
            ));
        }
        let bert = Bert::load(&weights, config, device)?;
        let tok_path = base.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|e| tokenizer_error(&tok_path, e))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| tokenizer_error(&tok_path, e))?;
        tokenizer.with_padding(None);
        let max_length = hyper.max_length.min(bert.config.max_tokens());
        let encode = |text: &String| -> Result<Vec<u32>> {
            let enc = tokenizer
                .encode(text.as_str(), true)
                .map_err(|e| tokenizer_error(&tok_path, e))?;
            let mut ids = enc.get_ids().to_vec();
            if ids.len() > max_length {
                // Keep the closing special token, as truncation in the tokenizer would.
                let last = ids[ids.len() - 1];
                ids.truncate(max_length - 1);
                ids.push(last);
            }
            Ok(ids)
        };
        let doc_tokens = data.documents.iter().map(encode).collect::<Result<_>>()?;
        let query_tokens = data
            .examples
            .iter()
            .map(|e| encode(&e.query))
            .collect::<Result<_>>()?;
        let pairs: Vec<(usize, usize)> = data
            .examples
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.positives.iter().map(move |&p| (i, p)))
            .collect();
        let steps_per_epoch = pairs.len().div_ceil(hyper.batch_size);
        let vars = bert.vars.values().cloned().collect();
        let optimizer = AdamW::new(
            vars,
            ParamsAdamW {
                lr: hyper.learning_rate,
                weight_decay: hyper.weight_decay,
                ..ParamsAdamW::default()
            },
        )?;
        Ok(Self {
            bert,
            tokenizer,
            optimizer,
            rng: Rng::new(hyper.seed),
            total_steps: steps_per_epoch * hyper.epochs,
            hyper,
            step: 0,
            base: base.to_path_buf(),
            hard: vec![Vec::new(); data.examples.len()],
            data,
            doc_tokens,
            query_tokens,
            pairs,
        })
    }

    /// (query, needed tool) pairs in one epoch.
    pub fn pairs_per_epoch(&self) -> usize {
        self.pairs.len()
    }

    /// Steps in the whole run.
    pub fn total_steps(&self) -> usize {
        self.total_steps
    }

    /// The tokenizer in use (for tests and reports).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn batch(&self, rows: &[&[u32]]) -> Result<(Tensor, Tensor)> {
        let l = rows.iter().map(|r| r.len()).max().unwrap_or(1);
        let pad = self.bert.config.pad_token_id;
        let mut ids = Vec::with_capacity(rows.len() * l);
        let mut mask = Vec::with_capacity(rows.len() * l);
        for r in rows {
            ids.extend_from_slice(r);
            ids.extend(std::iter::repeat_n(pad, l - r.len()));
            mask.extend(std::iter::repeat_n(1f32, r.len()));
            mask.extend(std::iter::repeat_n(0f32, l - r.len()));
        }
        let d = &self.bert.device;
        Ok((
            Tensor::from_vec(ids, (rows.len(), l), d)?,
            Tensor::from_vec(mask, (rows.len(), l), d)?,
        ))
    }

    /// Embeddings of token rows without dropout or gradients, in chunks.
    fn embed_rows(&self, rows: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(rows.len());
        // Sorting by length keeps padding, hence work, small.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| rows[i].len());
        let mut vecs = vec![Vec::new(); rows.len()];
        for chunk in order.chunks(64) {
            let refs: Vec<&[u32]> = chunk.iter().map(|&i| rows[i].as_slice()).collect();
            let (ids, mask) = self.batch(&refs)?;
            let e = self
                .bert
                .embed(&ids, &mask, 0.0, None)?
                .detach()
                .to_vec2::<f32>()?;
            for (&i, v) in chunk.iter().zip(e) {
                vecs[i] = v;
            }
        }
        out.extend(vecs);
        Ok(out)
    }

    /// Sentence embeddings of `texts` by the current weights (no dropout): what the saved model
    /// will compute.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let rows = texts
            .iter()
            .map(|t| {
                self.tokenizer
                    .encode(*t, true)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| TrainError::BadData(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        self.embed_rows(&rows)
    }

    /// Ranks every document for every query with the current weights and keeps, per case, the
    /// best-ranked unneeded ones as its hard-negative pool.
    pub fn mine_hard_negatives(&mut self) -> Result<()> {
        let k = self.hyper.hard_negative_pool;
        if k == 0 {
            return Ok(());
        }
        let docs = self.embed_rows(&self.doc_tokens)?;
        let queries = self.embed_rows(&self.query_tokens)?;
        for (i, q) in queries.iter().enumerate() {
            let positives = &self.data.examples[i].positives;
            let mut ranked: Vec<(f32, usize)> = docs
                .iter()
                .enumerate()
                .filter(|(j, _)| !positives.contains(j))
                .map(|(j, d)| (q.iter().zip(d).map(|(a, b)| a * b).sum::<f32>(), j))
                .collect();
            ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            self.hard[i] = ranked.into_iter().take(k).map(|(_, j)| j).collect();
        }
        Ok(())
    }

    fn learning_rate(&self, step: usize) -> f64 {
        let total = self.total_steps.max(1) as f64;
        let warm = (self.hyper.warmup * total).ceil().max(1.0);
        let s = step as f64;
        let factor = if s <= warm {
            s / warm
        } else {
            ((total - s) / (total - warm).max(1.0)).max(0.0)
        };
        self.hyper.learning_rate * factor
    }

    /// One epoch: hard negatives re-mined, pairs shuffled, one optimiser step per batch.
    /// `on_step` sees every step and may stop the epoch early ([`ControlFlow::Break`]), which
    /// returns `Ok(false)`; a complete epoch returns `Ok(true)`.
    pub fn run_epoch(
        &mut self,
        on_step: &mut dyn FnMut(&StepReport) -> ControlFlow<()>,
    ) -> Result<bool> {
        self.mine_hard_negatives()?;
        let mut order = self.pairs.clone();
        self.rng.shuffle(&mut order);
        for batch in order.chunks(self.hyper.batch_size) {
            let report = self.step(batch)?;
            if on_step(&report).is_break() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn step(&mut self, batch: &[(usize, usize)]) -> Result<StepReport> {
        self.step += 1;
        let n = batch.len();
        // Documents: each pair's needed tool, then each pair's hard negative.
        let mut docs: Vec<usize> = batch.iter().map(|&(_, p)| p).collect();
        for &(e, _) in batch {
            let pool = &self.hard[e];
            if !pool.is_empty() {
                docs.push(pool[self.rng.below(pool.len())]);
            }
        }
        // Another pair's tool that this query also needs is no negative: mask it out.
        let mut mask = Vec::with_capacity(n * docs.len());
        for (i, &(e, _)) in batch.iter().enumerate() {
            let positives = &self.data.examples[e].positives;
            for (j, d) in docs.iter().enumerate() {
                let hidden = j != i && (positives.contains(d) || *d == docs[i]);
                mask.push(if hidden { -1e4f32 } else { 0.0 });
            }
        }
        let q_rows: Vec<&[u32]> = batch
            .iter()
            .map(|&(e, _)| self.query_tokens[e].as_slice())
            .collect();
        let d_rows: Vec<&[u32]> = docs
            .iter()
            .map(|&d| self.doc_tokens[d].as_slice())
            .collect();
        let (qi, qm) = self.batch(&q_rows)?;
        let (di, dm) = self.batch(&d_rows)?;
        let p = self.hyper.dropout;
        let q = self.bert.embed(&qi, &qm, p, Some(&mut self.rng))?;
        let d = self.bert.embed(&di, &dm, p, Some(&mut self.rng))?;
        let device = &self.bert.device;
        let mask = Tensor::from_vec(mask, (n, docs.len()), device)?;
        let logits = ((q.matmul(&d.t()?)? * self.hyper.scale)? + mask)?;
        // Cross-entropy with target i for row i; |logits| <= scale, so no max shift is needed.
        let lse = logits.exp()?.sum_keepdim(D::Minus1)?.log()?;
        let eye: Vec<f32> = (0..n)
            .flat_map(|i| (0..docs.len()).map(move |j| if i == j { 1.0 } else { 0.0 }))
            .collect();
        let eye = Tensor::from_vec(eye, (n, docs.len()), device)?;
        let target = (logits * eye)?.sum_keepdim(D::Minus1)?;
        let loss = (lse - target)?.mean_all()?;
        let value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        if !value.is_finite() {
            return Err(TrainError::Diverged(value, self.step));
        }
        let mut grads = loss.backward()?;
        let mut sq = 0f64;
        for v in self.bert.vars.values() {
            if let Some(g) = grads.get(v.as_tensor()) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = sq.sqrt();
        if norm > self.hyper.max_grad_norm {
            let factor = self.hyper.max_grad_norm / (norm + 1e-6);
            for v in self.bert.vars.values() {
                if let Some(g) = grads.remove(v.as_tensor()) {
                    grads.insert(v.as_tensor(), (g * factor)?);
                }
            }
        }
        let lr = self.learning_rate(self.step);
        self.optimizer.set_learning_rate(lr);
        self.optimizer.step(&grads)?;
        Ok(StepReport {
            step: self.step,
            loss: value,
            examples: n,
            learning_rate: lr,
        })
    }

    /// The current weights under their bare names, as f32 on the CPU: what gets saved.
    pub fn weights(&self) -> Result<HashMap<String, Tensor>> {
        self.bert
            .vars
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_device(&Device::Cpu)?)))
            .collect()
    }

    /// Writes a complete model folder into `dir` (created; files in it are replaced): the
    /// weights, the base model's configuration and tokenizer files, the sentence-transformers
    /// head files (written when the base has none) and a manifest from `meta`.
    pub fn save(&self, dir: &Path, meta: &ModelMeta) -> Result<()> {
        let io = |p: &Path, e: std::io::Error| TrainError::bad_file(p, e);
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let weights = dir.join("model.safetensors");
        candle_core::safetensors::save(&self.weights()?, &weights)
            .map_err(|e| TrainError::bad_file(&weights, e))?;
        copy_base_files(&self.base, dir)?;
        if !dir.join("modules.json").is_file() {
            let modules = r#"[
  {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
  {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
]
"#;
            let pooling = format!(
                "{{\"word_embedding_dimension\": {}, \"pooling_mode_cls_token\": false, \"pooling_mode_mean_tokens\": true, \"pooling_mode_max_tokens\": false}}\n",
                self.bert.config.hidden_size
            );
            let p = dir.join("modules.json");
            std::fs::write(&p, modules).map_err(|e| io(&p, e))?;
            let pdir = dir.join("1_Pooling");
            std::fs::create_dir_all(&pdir).map_err(|e| io(&pdir, e))?;
            let p = pdir.join("config.json");
            std::fs::write(&p, pooling).map_err(|e| io(&p, e))?;
        }
        write_manifest(dir, meta)
    }
}

/// Files of the base folder that describe the model rather than its weights: copied as they are.
fn copy_base_files(base: &Path, dir: &Path) -> Result<()> {
    const SKIP: [&str; 4] = [
        "model.safetensors",
        "pytorch_model.bin",
        "manifest.toml",
        "reference.json",
    ];
    let io = |p: &Path, e: std::io::Error| TrainError::bad_file(p, e);
    for entry in std::fs::read_dir(base).map_err(|e| io(base, e))? {
        let entry = entry.map_err(|e| io(base, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if SKIP.contains(&name.as_str()) || name.starts_with('.') {
            continue;
        }
        if path.is_file() {
            std::fs::copy(&path, dir.join(&name)).map_err(|e| io(&path, e))?;
        } else if path.is_dir() && name.starts_with(|c: char| c.is_ascii_digit()) {
            // sentence-transformers module folders (1_Pooling, 2_Normalize).
            let target = dir.join(&name);
            std::fs::create_dir_all(&target).map_err(|e| io(&target, e))?;
            for f in std::fs::read_dir(&path).map_err(|e| io(&path, e))? {
                let f = f.map_err(|e| io(&path, e))?.path();
                if f.is_file() {
                    if let Some(n) = f.file_name() {
                        std::fs::copy(&f, target.join(n)).map_err(|e| io(&f, e))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// What the manifest of a trained model says besides its files.
#[derive(Debug, Clone)]
pub struct ModelMeta {
    /// The model's name.
    pub name: String,
    /// The base model's Hugging Face id (the trained model's `hf_id` names where it came from).
    pub base_hf_id: String,
    /// The base model as given (folder or name).
    pub base: String,
    /// The longest input in tokens.
    pub max_length: usize,
    /// The base model's licence, which the weights inherit.
    pub license: Option<String>,
    /// The base model's lexical weight (hybrid scoring), kept so that scores mean the same.
    pub lexical_weight: Option<f64>,
    /// The Platt scaling, once fitted.
    pub calibration: Option<Calibration>,
    /// The `[training]` table: data hashes, hyper-parameters, epochs, where the calibration
    /// was fitted.
    pub training: toml::Table,
}

/// The sha256 of a file, hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| TrainError::bad_file(path, e))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

fn files_of(dir: &Path, prefix: &str, out: &mut toml::Table) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| TrainError::bad_file(dir, e))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        let path = e.path();
        if path.is_dir() {
            files_of(&path, &format!("{name}/"), out)?;
        } else if name != "manifest.toml" {
            out.insert(name, file_sha256(&path)?.into());
        }
    }
    Ok(())
}

/// Writes `dir/manifest.toml` for `meta`, with the sha256 of every other file of the folder.
pub fn write_manifest(dir: &Path, meta: &ModelMeta) -> Result<()> {
    let mut t = toml::Table::new();
    t.insert("name".into(), meta.name.clone().into());
    t.insert("hf_id".into(), meta.base_hf_id.clone().into());
    t.insert("revision".into(), "trained".into());
    t.insert("architecture".into(), "bert".into());
    t.insert("head".into(), "bi-encoder".into());
    t.insert("max_length".into(), (meta.max_length as i64).into());
    if let Some(l) = &meta.license {
        t.insert("license".into(), l.clone().into());
    }
    if let Some(w) = meta.lexical_weight {
        let mut s = toml::Table::new();
        s.insert("lexical_weight".into(), w.into());
        t.insert("scoring".into(), s.into());
    }
    if let Some(c) = meta.calibration {
        let mut s = toml::Table::new();
        s.insert("a".into(), c.a.into());
        s.insert("b".into(), c.b.into());
        t.insert("calibration".into(), s.into());
    }
    let mut training = meta.training.clone();
    training.insert("base".into(), meta.base.clone().into());
    t.insert("training".into(), training.into());
    let mut files = toml::Table::new();
    files_of(dir, "", &mut files)?;
    t.insert("files".into(), files.into());
    let text = format!(
        "# Written by `decide train`: fine-tuned from {}.\n{}",
        meta.base,
        toml::to_string(&t).map_err(|e| TrainError::BadData(e.to_string()))?
    );
    let path = dir.join("manifest.toml");
    std::fs::write(&path, text).map_err(|e| TrainError::bad_file(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../decide-engine/fixtures/tiny-bert-1")
    }

    /// Eight requests, each needing one of eight tools; the words overlap enough that the
    /// untrained tiny model confuses them.
    fn data() -> TrainData {
        let topics = [
            ("weather", "get the forecast for a city"),
            ("email", "send a message to a person"),
            ("calendar", "create a meeting in the calendar"),
            ("search", "search the web for pages"),
            ("files", "read a file from the disk"),
            ("maps", "find a route between two places"),
            ("stocks", "look up the price of a share"),
            ("music", "play a song by an artist"),
        ];
        TrainData {
            documents: topics.iter().map(|(n, d)| format!("{n}: {d}")).collect(),
            examples: topics
                .iter()
                .enumerate()
                .map(|(i, (n, _))| Example {
                    query: format!("please help me with {n} now"),
                    positives: vec![i],
                })
                .collect(),
        }
    }

    fn hyper(seed: u64, epochs: usize) -> Hyper {
        Hyper {
            epochs,
            learning_rate: 1e-2,
            batch_size: 4,
            max_length: 32,
            seed,
            hard_negative_pool: 2,
            ..Hyper::default()
        }
    }

    /// How many requests rank their own tool first.
    fn top1(embed: impl Fn(&[&str]) -> Vec<Vec<f32>>) -> usize {
        let d = data();
        let docs: Vec<&str> = d.documents.iter().map(String::as_str).collect();
        let queries: Vec<&str> = d.examples.iter().map(|e| e.query.as_str()).collect();
        let (dv, qv) = (embed(&docs), embed(&queries));
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        qv.iter()
            .zip(&d.examples)
            .filter(|(q, e)| {
                let best = (0..dv.len())
                    .max_by(|&i, &j| dot(q, &dv[i]).total_cmp(&dot(q, &dv[j])))
                    .unwrap();
                best == e.positives[0]
            })
            .count()
    }

    fn train(seed: u64, epochs: usize) -> (Trainer, Vec<f32>) {
        let mut t = Trainer::new(&fixture(), data(), hyper(seed, epochs), &Device::Cpu).unwrap();
        let mut losses = Vec::new();
        for _ in 0..epochs {
            let mut sum = 0.0;
            let mut n = 0;
            assert!(t
                .run_epoch(&mut |r| {
                    sum += r.loss;
                    n += 1;
                    ControlFlow::Continue(())
                })
                .unwrap());
            losses.push(sum / n as f32);
        }
        (t, losses)
    }

    #[test]
    fn the_loss_falls_and_the_folder_loads_and_scores() {
        let (t, losses) = train(7, 20);
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(last < 0.5 * first, "loss per epoch: {losses:?}");

        let dir = std::env::temp_dir().join(format!("decide-train-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let meta = ModelMeta {
            name: "tiny-trained".into(),
            base_hf_id: "local/tiny-bert-1".into(),
            base: fixture().display().to_string(),
            max_length: 32,
            license: None,
            lexical_weight: None,
            calibration: Some(Calibration { a: 10.0, b: -5.0 }),
            training: hyper(7, 20).to_toml(),
        };
        t.save(&dir, &meta).unwrap();
        let engine = decide_engine::Engine::builder()
            .model(dir.to_str().unwrap())
            .build()
            .unwrap();
        assert_eq!(engine.info().name, "tiny-trained");
        // The engine's fast path computes what the training path computes.
        let texts = [
            "please help me with maps now",
            "maps: find a route between two places",
        ];
        let ours = t.embed(&texts).unwrap();
        let theirs = engine.embed(&texts).unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() < 1e-4, "{x} vs {y}");
            }
        }
        // The saved model ranks more requests' tools first than the base did.
        let before = top1(|texts| {
            Trainer::new(&fixture(), data(), hyper(7, 1), &Device::Cpu)
                .unwrap()
                .embed(texts)
                .unwrap()
        });
        let after = top1(|texts| engine.embed(texts).unwrap());
        assert!(
            after > before + 2,
            "top-1 before {before}/8, after {after}/8"
        );
        let manifest = decide_engine::Manifest::read_from(&dir).unwrap().unwrap();
        assert!(manifest.files.contains_key("model.safetensors"));
        assert!(manifest.training.unwrap().contains_key("learning_rate"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_same_seed_gives_the_same_weights() {
        let a = train(3, 1).0.weights().unwrap();
        let b = train(3, 1).0.weights().unwrap();
        let c = train(4, 1).0.weights().unwrap();
        let mut differs = false;
        for (name, ta) in &a {
            let va = ta.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vb = b[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vc = c[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(va, vb, "{name}");
            differs |= va != vc;
        }
        assert!(differs, "another seed should give other weights");
    }

    #[test]
    fn bad_options_and_data_are_errors() {
        let mut h = hyper(1, 1);
        h.batch_size = 1;
        let err = Trainer::new(&fixture(), data(), h, &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("--batch-size"), "{err}");
        let mut d = data();
        d.examples[0].positives = vec![99];
        let err = Trainer::new(&fixture(), d, hyper(1, 1), &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().contains("example 0"), "{err}");
        let err = Trainer::new(&fixture(), TrainData::default(), hyper(1, 1), &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().contains("no case"), "{err}");
        let err = Trainer::new(Path::new("/nonexistent"), data(), hyper(1, 1), &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}
