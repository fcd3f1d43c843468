//! The training loop: batches, hard-negative mining, loss, optimiser, the frozen layers'
//! cached states and evaluation by the current weights.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use decide_engine::{Bf16Tiles, EncoderConfig};
use tokenizers::Tokenizer;

use crate::config::{Hyper, TrainHead};
use crate::data::{Encoded, Example, ExampleSource, Row, Rows, Tokens, TrainData};
use crate::error::{Result, TrainError};
use crate::export::{write_folder, ModelMeta};
use crate::model::{Bert, Rng};

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

/// Rows per forward pass above the frozen layers: a step's rows run in groups of similar
/// length.
const BUCKET_ROWS: usize = 16;

/// The "positive" of a case that needs no tool, in the (example, positive) pairs.
const NO_TOOL: u32 = u32::MAX;

/// A text whose frozen-layer output is cached: a document, or a case's query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Text {
    Doc(u32),
    Query(u32),
}

/// A model being trained.
pub struct Trainer {
    bert: Bert,
    tokens: Tokens,
    optimizer: AdamW,
    hyper: Hyper,
    rng: Rng,
    step: usize,
    total_steps: usize,
    base: PathBuf,
    examples: Box<dyn ExampleSource>,
    /// The tools, tokenized without special tokens (the engine's own first step).
    documents: Vec<Encoded>,
    /// Per example, the pool its hard negatives are drawn from.
    hard: Vec<Vec<u32>>,
    /// Whether hard negatives were mined once (a cross-encoder mines only at the start).
    mined: bool,
    /// (example, positive) pairs.
    pairs: Vec<(u32, u32)>,
    /// With frozen layers: each text's hidden states (tokens, hidden) after them, computed
    /// once. Frozen layers run without dropout, so these never change.
    states: HashMap<Text, Tensor>,
}

impl Trainer {
    /// Runs the linear layers' products, forward and backward, in bf16 on `tiles` from here
    /// on (the frozen layers' cache included); the weights and the optimiser stay f32. The
    /// same seed then gives the same weights on this path, not the f32 path's.
    pub fn on_tiles(&mut self, tiles: Bf16Tiles) {
        self.bert.tiles = Some(tiles);
    }

    /// Loads the base model folder (config.json, tokenizer.json, model.safetensors) for
    /// training on `data`.
    pub fn new(base: &Path, data: TrainData, hyper: Hyper, device: &Device) -> Result<Self> {
        Self::from_source(base, data.documents, Box::new(data.examples), hyper, device)
    }

    /// Like [`new`](Self::new), with the cases read by index from `examples` (one pass here
    /// checks them and collects the pairs; each epoch reads them again).
    pub fn from_source(
        base: &Path,
        documents: Vec<String>,
        mut examples: Box<dyn ExampleSource>,
        hyper: Hyper,
        device: &Device,
    ) -> Result<Self> {
        hyper.check()?;
        let mut pairs = Vec::new();
        let no_tool = hyper.no_tool_margin.is_some();
        for i in 0..examples.len() {
            let e = examples.example(i)?;
            if (e.positives.is_empty() && !no_tool)
                || e.positives.iter().any(|&p| p >= documents.len())
            {
                return Err(TrainError::BadData(format!(
                    "example {i}: positives must be indexes of documents"
                )));
            }
            if e.positives.is_empty() {
                pairs.push((i as u32, NO_TOOL));
            }
            pairs.extend(e.positives.iter().map(|&p| (i as u32, p as u32)));
        }
        // Also true of no cases at all.
        if pairs.iter().all(|&(_, p)| p == NO_TOOL) {
            return Err(TrainError::BadData(
                "no case with a needed tool to train on".into(),
            ));
        }
        let config = EncoderConfig::from_file(&base.join("config.json"))?;
        let weights = base.join("model.safetensors");
        if !weights.is_file() {
            return Err(TrainError::bad_file(
                &weights,
                "missing (training reads safetensors weights)",
            ));
        }
        let mut rng = Rng::new(hyper.seed);
        if hyper.frozen_layers >= config.num_layers {
            return Err(TrainError::InvalidOption {
                option: "freeze-layers",
                message: format!(
                    "must be below the base model's {} layers (something must train)",
                    config.num_layers
                ),
            });
        }
        let bert = Bert::load(&weights, config, device, hyper.head, &mut rng)?;
        let max_length = hyper.max_length.min(bert.config.max_tokens());
        let tokens = Tokens::load(&base.join("tokenizer.json"), max_length)?;
        let documents = documents
            .iter()
            .map(|d| tokens.encode_document(d))
            .collect::<Result<Vec<_>>>()?;
        let steps_per_epoch = pairs.len().div_ceil(hyper.batch_size);
        let vars = bert
            .vars
            .iter()
            .filter(|(name, _)| Bert::is_trained(name, hyper.frozen_layers))
            .map(|(_, v)| v.clone())
            .collect();
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
            tokens,
            optimizer,
            rng,
            total_steps: steps_per_epoch * hyper.epochs,
            hyper,
            step: 0,
            base: base.to_path_buf(),
            hard: vec![Vec::new(); examples.len()],
            mined: false,
            examples,
            documents,
            pairs,
            states: HashMap::new(),
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
        self.tokens.tokenizer()
    }

    /// The head being trained.
    pub fn head(&self) -> TrainHead {
        self.hyper.head
    }

    fn batch(&self, rows: &[&Row]) -> Result<Rows> {
        Rows::pad(rows, self.bert.config.pad_token_id, &self.bert.device)
    }

    /// Embeddings of token rows without dropout or gradients, in chunks.
    fn embed_rows(&self, rows: &[&Row]) -> Result<Vec<Vec<f32>>> {
        // Sorting by length keeps padding, hence work, small.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| rows[i].0.len());
        let mut vecs = vec![Vec::new(); rows.len()];
        for chunk in order.chunks(64) {
            let refs: Vec<&Row> = chunk.iter().map(|&i| rows[i]).collect();
            let b = self.batch(&refs)?;
            let e = self
                .bert
                .embed(&b.ids, &b.mask, 0.0, None)?
                .detach()
                .to_vec2::<f32>()?;
            for (&i, v) in chunk.iter().zip(e) {
                vecs[i] = v;
            }
        }
        Ok(vecs)
    }

    /// The frozen layers' output (tokens, hidden) of each keyed row: cached, or computed in
    /// length-sorted chunks and cached.
    fn frozen_states(&mut self, rows: &[(Text, &Row)]) -> Result<Vec<Tensor>> {
        let mut seen = std::collections::HashSet::new();
        let mut missing: Vec<usize> = (0..rows.len())
            .filter(|&i| !self.states.contains_key(&rows[i].0) && seen.insert(rows[i].0))
            .collect();
        missing.sort_by_key(|&i| (rows[i].1 .0.len(), i));
        let frozen = self.hyper.frozen_layers;
        for chunk in missing.chunks(64) {
            let refs: Vec<&Row> = chunk.iter().map(|&i| rows[i].1).collect();
            let b = self.batch(&refs)?;
            let x = self.bert.frozen(&b.ids, None, &b.mask, frozen)?;
            for (j, &i) in chunk.iter().enumerate() {
                // A fresh tensor of the text's own tokens: a narrowed view (or candle's
                // `copy`, which clones the whole storage) would keep the padded batch alive.
                let n = rows[i].1 .0.len();
                let values = x.get(j)?.narrow(0, 0, n)?.to_vec2::<f32>()?;
                let state = Tensor::from_vec(values.concat(), (n, x.dim(2)?), x.device())?;
                self.states.insert(rows[i].0, state);
            }
        }
        Ok(rows.iter().map(|(k, _)| self.states[k].clone()).collect())
    }

    /// Per-row states (tokens, hidden) padded with zeros into (B, L, hidden), and their mask.
    fn stack_states(&self, states: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let h = self.bert.config.hidden_size;
        let d = &self.bert.device;
        let l = states
            .iter()
            .map(|s| s.dim(0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let longest = l.iter().copied().max().unwrap_or(1);
        let mut padded = Vec::with_capacity(states.len());
        let mut mask = Vec::with_capacity(states.len() * longest);
        for (s, &n) in states.iter().zip(&l) {
            padded.push(if n < longest {
                Tensor::cat(&[s, &Tensor::zeros((longest - n, h), DType::F32, d)?], 0)?
            } else {
                s.clone()
            });
            mask.extend(std::iter::repeat_n(1f32, n));
            mask.extend(std::iter::repeat_n(0f32, longest - n));
        }
        Ok((
            Tensor::stack(&padded, 0)?,
            Tensor::from_vec(mask, (states.len(), longest), d)?,
        ))
    }

    /// Embeddings (B, hidden) of keyed rows through the cached frozen layers and the trained
    /// ones above them; dropout on when `train`.
    fn embed_keyed(&mut self, rows: &[(Text, &Row)], train: bool) -> Result<Tensor> {
        let states = self.frozen_states(rows)?;
        let p = if train { self.hyper.dropout } else { 0.0 };
        // Rows of similar length run together: padding costs the attention its square.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| (rows[i].1 .0.len(), i));
        let mut parts = Vec::new();
        for chunk in order.chunks(BUCKET_ROWS) {
            let group: Vec<Tensor> = chunk.iter().map(|&i| states[i].clone()).collect();
            let (x, mask) = self.stack_states(&group)?;
            let mut rng = train.then_some(&mut self.rng);
            let y = self
                .bert
                .upper(&x, &mask, self.hyper.frozen_layers, p, &mut rng)?;
            parts.push(Bert::pool(&y, &mask)?);
        }
        let sorted = Tensor::cat(&parts, 0)?;
        // Back to the rows' own order.
        let mut back = vec![0u32; rows.len()];
        for (pos, &i) in order.iter().enumerate() {
            back[i] = pos as u32;
        }
        let back = Tensor::from_vec(back, rows.len(), &self.bert.device)?;
        Ok(sorted.index_select(&back, 0)?)
    }

    /// Embeddings of keyed rows without dropout or gradients, in length-sorted chunks:
    /// through the cache when layers are frozen.
    fn embed_all(&mut self, rows: &[(Text, Row)]) -> Result<Vec<Vec<f32>>> {
        if self.hyper.frozen_layers == 0 {
            let plain: Vec<&Row> = rows.iter().map(|(_, r)| r).collect();
            return self.embed_rows(&plain);
        }
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| rows[i].1 .0.len());
        let mut vecs = vec![Vec::new(); rows.len()];
        for chunk in order.chunks(64) {
            let keyed: Vec<(Text, &Row)> = chunk.iter().map(|&i| (rows[i].0, &rows[i].1)).collect();
            let e = self.embed_keyed(&keyed, false)?.detach().to_vec2::<f32>()?;
            for (&i, v) in chunk.iter().zip(e) {
                vecs[i] = v;
            }
        }
        Ok(vecs)
    }

    /// Sentence embeddings of `texts` by the current weights (no dropout), each read as the
    /// engine reads a tool: what the saved bi-encoder will compute.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let rows = texts
            .iter()
            .map(|t| {
                self.tokens
                    .single_row(&self.tokens.encode_document(t)?, false)
            })
            .collect::<Result<Vec<_>>>()?;
        self.embed_rows(&rows.iter().collect::<Vec<_>>())
    }

    /// The cross-encoder's logit for each (query, tool) pair by the current weights (no
    /// dropout): what the saved cross-encoder will compute.
    pub fn classify(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        let rows = pairs
            .iter()
            .map(|(q, d)| {
                self.tokens.pair_row(
                    &self.tokens.encode_query(q)?,
                    &self.tokens.encode_document(d)?,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Row> = rows.iter().collect();
        let b = self.batch(&refs)?;
        Ok(self
            .bert
            .classify(&b.ids, &b.types, &b.mask, 0.0, None)?
            .detach()
            .to_vec1::<f32>()?)
    }

    /// Ranks every document for every query with the current weights' embeddings and keeps,
    /// per case, the best-ranked unneeded ones as its hard-negative pool. The queries are read
    /// a chunk at a time.
    pub fn mine_hard_negatives(&mut self) -> Result<()> {
        let k = self.hyper.hard_negative_pool;
        if k == 0 {
            return Ok(());
        }
        let doc_rows = self
            .documents
            .iter()
            .enumerate()
            .map(|(j, d)| Ok((Text::Doc(j as u32), self.tokens.single_row(d, false)?)))
            .collect::<Result<Vec<_>>>()?;
        let docs = self.embed_all(&doc_rows)?;
        drop(doc_rows);
        let n = self.examples.len();
        for start in (0..n).step_by(256) {
            let end = (start + 256).min(n);
            let mut cases = Vec::with_capacity(end - start);
            for i in start..end {
                cases.push(self.examples.example(i)?);
            }
            let rows = cases
                .iter()
                .enumerate()
                .map(|(o, e)| {
                    let key = Text::Query((start + o) as u32);
                    Ok((
                        key,
                        self.tokens
                            .single_row(&self.tokens.encode_query(&e.query)?, true)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let queries = self.embed_all(&rows)?;
            for (offset, (q, case)) in queries.iter().zip(&cases).enumerate() {
                // Among the tools the case was offered, when it says which.
                let offered: Vec<usize> = if case.candidates.is_empty() {
                    (0..docs.len()).collect()
                } else {
                    case.candidates.clone()
                };
                let mut ranked: Vec<(f32, usize)> = offered
                    .into_iter()
                    .filter(|j| !case.positives.contains(j))
                    .map(|j| {
                        let d = &docs[j];
                        (q.iter().zip(d).map(|(a, b)| a * b).sum::<f32>(), j)
                    })
                    .collect();
                ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                self.hard[start + offset] =
                    ranked.into_iter().take(k).map(|(_, j)| j as u32).collect();
            }
        }
        self.mined = true;
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

    /// One epoch: hard negatives (re-)mined, pairs shuffled, one optimiser step per batch.
    /// A bi-encoder re-mines every epoch with its current embeddings; a cross-encoder mines
    /// once, with the base's, which is the shortlist it will rerank. `on_step` sees every step
    /// and may stop the epoch early ([`ControlFlow::Break`]), which returns `Ok(false)`; a
    /// complete epoch returns `Ok(true)`.
    pub fn run_epoch(
        &mut self,
        on_step: &mut dyn FnMut(&StepReport) -> ControlFlow<()>,
    ) -> Result<bool> {
        if self.hyper.head == TrainHead::BiEncoder || !self.mined {
            self.mine_hard_negatives()?;
        }
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

    /// The batch's cases, read once each.
    fn cases(&mut self, batch: &[(u32, u32)]) -> Result<HashMap<u32, Example>> {
        let mut cases = HashMap::new();
        for &(e, _) in batch {
            if let std::collections::hash_map::Entry::Vacant(slot) = cases.entry(e) {
                slot.insert(self.examples.example(e as usize)?);
            }
        }
        Ok(cases)
    }

    fn step(&mut self, batch: &[(u32, u32)]) -> Result<StepReport> {
        self.step += 1;
        let cases = self.cases(batch)?;
        let loss = match self.hyper.head {
            TrainHead::BiEncoder => self.contrastive_loss(batch, &cases)?,
            TrainHead::CrossEncoder => self.pair_loss(batch, &cases)?,
        };
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
            examples: batch.len(),
            learning_rate: lr,
        })
    }

    /// Case `e`'s hard negatives for one step: `negatives_per_pair` distinct tools of its pool
    /// (all of them when it holds fewer), one draw each, so that one negative a pair draws as
    /// a single pick from the pool does.
    fn draw_negatives(&mut self, e: u32) -> Vec<usize> {
        let mut left = self.hard[e as usize].clone();
        let n = self.hyper.negatives_per_pair.min(left.len());
        (0..n)
            .map(|_| left.swap_remove(self.rng.below(left.len())) as usize)
            .collect()
    }

    /// Multiple-negatives ranking: row i's needed tool against every other document of the
    /// batch and the hard negatives.
    fn contrastive_loss(
        &mut self,
        batch: &[(u32, u32)],
        cases: &HashMap<u32, Example>,
    ) -> Result<Tensor> {
        let n = batch.len();
        // Documents: each pair's needed tool, then each pair's hard negative. A no-tool pair has
        // no document of its own; its target is the margin's column after the documents.
        let mut docs: Vec<usize> = Vec::with_capacity(2 * n);
        let mut targets: Vec<Option<usize>> = Vec::with_capacity(n);
        for &(_, p) in batch {
            if p == NO_TOOL {
                targets.push(None);
            } else {
                targets.push(Some(docs.len()));
                docs.push(p as usize);
            }
        }
        for &(e, _) in batch {
            let drawn = self.draw_negatives(e);
            docs.extend(drawn);
        }
        // Another pair's tool that this query also needs is no negative: mask it out.
        let mut mask = Vec::with_capacity(n * docs.len());
        for (i, (e, _)) in batch.iter().enumerate() {
            let positives = &cases[e].positives;
            let own = targets[i].map(|t| docs[t]);
            for (j, d) in docs.iter().enumerate() {
                let hidden = Some(j) != targets[i] && (positives.contains(d) || Some(*d) == own);
                mask.push(if hidden { -1e4f32 } else { 0.0 });
            }
        }
        let q_rows = batch
            .iter()
            .map(|(e, _)| {
                self.tokens
                    .single_row(&self.tokens.encode_query(&cases[e].query)?, true)
            })
            .collect::<Result<Vec<_>>>()?;
        let d_rows = docs
            .iter()
            .map(|&d| self.tokens.single_row(&self.documents[d], false))
            .collect::<Result<Vec<_>>>()?;
        let (q, d) = if self.hyper.frozen_layers > 0 {
            let qk: Vec<(Text, &Row)> = batch
                .iter()
                .zip(&q_rows)
                .map(|(&(e, _), r)| (Text::Query(e), r))
                .collect();
            let dk: Vec<(Text, &Row)> = docs
                .iter()
                .zip(&d_rows)
                .map(|(&d, r)| (Text::Doc(d as u32), r))
                .collect();
            (self.embed_keyed(&qk, true)?, self.embed_keyed(&dk, true)?)
        } else {
            let qb = self.batch(&q_rows.iter().collect::<Vec<_>>())?;
            let db = self.batch(&d_rows.iter().collect::<Vec<_>>())?;
            let p = self.hyper.dropout;
            let q = self.bert.embed(&qb.ids, &qb.mask, p, Some(&mut self.rng))?;
            let d = self.bert.embed(&db.ids, &db.mask, p, Some(&mut self.rng))?;
            (q, d)
        };
        let device = &self.bert.device;
        let mask = Tensor::from_vec(mask, (n, docs.len()), device)?;
        let mut logits = ((q.matmul(&d.t()?)? * self.hyper.scale)? + mask)?;
        let mut columns = docs.len();
        if let Some(margin) = self.hyper.no_tool_margin {
            let fixed = Tensor::full((margin * self.hyper.scale) as f32, (n, 1), device)?;
            logits = Tensor::cat(&[&logits, &fixed], 1)?;
            columns += 1;
        }
        // Cross-entropy with each row's target column; |logits| <= scale, so no max shift is
        // needed.
        let lse = logits.exp()?.sum_keepdim(D::Minus1)?.log()?;
        let one_hot: Vec<f32> = targets
            .iter()
            .flat_map(|t| {
                let t = t.unwrap_or(docs.len());
                (0..columns).map(move |j| if j == t { 1.0 } else { 0.0 })
            })
            .collect();
        let one_hot = Tensor::from_vec(one_hot, (n, columns), device)?;
        let target = (logits * one_hot)?.sum_keepdim(D::Minus1)?;
        Ok((lse - target)?.mean_all()?)
    }

    /// Binary cross-entropy over (query, tool) pairs: each needed tool is a positive, one of
    /// the case's hard negatives and one random unneeded tool are negatives.
    fn pair_loss(&mut self, batch: &[(u32, u32)], cases: &HashMap<u32, Example>) -> Result<Tensor> {
        let mut items: Vec<(u32, usize, f32)> = Vec::with_capacity(3 * batch.len());
        for &(e, p) in batch {
            items.push((e, p as usize, 1.0));
            let positives = &cases[&e].positives;
            let pool = &self.hard[e as usize];
            if !pool.is_empty() {
                items.push((e, pool[self.rng.below(pool.len())] as usize, 0.0));
            }
            // A few draws find an unneeded tool unless nearly every tool is needed.
            for _ in 0..8 {
                let d = self.rng.below(self.documents.len());
                if !positives.contains(&d) {
                    items.push((e, d, 0.0));
                    break;
                }
            }
        }
        let mut queries: HashMap<u32, Encoded> = HashMap::new();
        for (e, case) in cases {
            queries.insert(*e, self.tokens.encode_query(&case.query)?);
        }
        let rows = items
            .iter()
            .map(|(e, d, _)| self.tokens.pair_row(&queries[e], &self.documents[*d]))
            .collect::<Result<Vec<_>>>()?;
        let b = self.batch(&rows.iter().collect::<Vec<_>>())?;
        let p = self.hyper.dropout;
        let frozen = self.hyper.frozen_layers;
        let z = if frozen > 0 {
            // Pairs rarely repeat, so the frozen layers' output is not cached here.
            let x = self.bert.frozen(&b.ids, Some(&b.types), &b.mask, frozen)?;
            let mut rng = Some(&mut self.rng);
            let y = self.bert.upper(&x, &b.mask, frozen, p, &mut rng)?;
            self.bert.logit(&y, p, rng)?
        } else {
            self.bert
                .classify(&b.ids, &b.types, &b.mask, p, Some(&mut self.rng))?
        };
        let labels: Vec<f32> = items.iter().map(|i| i.2).collect();
        let y = Tensor::from_vec(labels, items.len(), &self.bert.device)?;
        // BCE with logits, stably: max(z, 0) - z·y + log(1 + exp(-|z|)).
        let soft = ((z.abs()?.neg()?.exp()? + 1.0)?.log()? + z.relu()?)?;
        Ok((soft - (z * y)?)?.mean_all()?)
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
    /// weights, the base model's configuration and tokenizer files, the head's own files (the
    /// sentence-transformers modules of a bi-encoder, the one-label classifier configuration
    /// of a cross-encoder) and a manifest from `meta`.
    pub fn save(&self, dir: &Path, meta: &ModelMeta) -> Result<()> {
        write_folder(
            dir,
            &self.base,
            self.hyper.head,
            self.bert.config.hidden_size,
            &self.weights()?,
            meta,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ExampleSpool;
    use decide_engine::Calibration;

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
                    candidates: Vec::new(),
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

    /// Runs `epochs` complete epochs; the mean loss of each.
    fn run_epochs(t: &mut Trainer, epochs: usize) -> Vec<f32> {
        let mut losses = Vec::new();
        for _ in 0..epochs {
            let (mut sum, mut n) = (0.0, 0);
            assert!(t
                .run_epoch(&mut |r| {
                    sum += r.loss;
                    n += 1;
                    ControlFlow::Continue(())
                })
                .unwrap());
            losses.push(sum / n as f32);
        }
        losses
    }

    fn train(seed: u64, epochs: usize) -> (Trainer, Vec<f32>) {
        let mut t = Trainer::new(&fixture(), data(), hyper(seed, epochs), &Device::Cpu).unwrap();
        let losses = run_epochs(&mut t, epochs);
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
            head: TrainHead::BiEncoder,
            max_length: 32,
            license: None,
            lexical_weight: None,
            tool_parameters: false,
            tool_server: false,
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

    /// How many requests give their own tool the highest logit.
    fn top1_pairs(classify: impl Fn(&[(&str, &str)]) -> Vec<f32>) -> usize {
        let d = data();
        d.examples
            .iter()
            .filter(|e| {
                let pairs: Vec<(&str, &str)> = d
                    .documents
                    .iter()
                    .map(|doc| (e.query.as_str(), doc.as_str()))
                    .collect();
                let logits = classify(&pairs);
                let best = (0..logits.len())
                    .max_by(|&i, &j| logits[i].total_cmp(&logits[j]))
                    .unwrap();
                best == e.positives[0]
            })
            .count()
    }

    fn cross_hyper(seed: u64, epochs: usize) -> Hyper {
        Hyper {
            head: TrainHead::CrossEncoder,
            learning_rate: 1e-2,
            hard_negative_pool: 3,
            ..hyper(seed, epochs)
        }
    }

    /// tiny-bert-1 without its classifier and pooler, as a bi-encoder base would be.
    fn headless_base(dir: &Path) -> PathBuf {
        let base = dir.join("headless");
        std::fs::create_dir_all(&base).unwrap();
        for f in [
            "tokenizer.json",
            "special_tokens_map.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(fixture().join(f), base.join(f)).unwrap();
        }
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
                .unwrap();
        let obj = config.as_object_mut().unwrap();
        obj.remove("id2label");
        obj.remove("label2id");
        obj.insert("architectures".into(), serde_json::json!(["BertModel"]));
        std::fs::write(base.join("config.json"), config.to_string()).unwrap();
        let tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(fixture().join("model.safetensors"), &Device::Cpu)
                .unwrap()
                .into_iter()
                .filter(|(k, _)| !k.contains("classifier") && !k.contains("pooler"))
                .collect();
        candle_core::safetensors::save(&tensors, base.join("model.safetensors")).unwrap();
        base
    }

    #[test]
    fn a_cross_encoder_learns_and_the_engine_reads_it_back() {
        let dir = std::env::temp_dir().join(format!("decide-train-cross-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // From a base without a classifier: the pooler and the logit are initialised.
        let base = headless_base(&dir);
        let epochs = 40;
        let mut t = Trainer::new(&base, data(), cross_hyper(5, epochs), &Device::Cpu).unwrap();
        let before = top1_pairs(|p| t.classify(p).unwrap());
        let losses = run_epochs(&mut t, epochs);
        assert!(
            *losses.last().unwrap() < 0.5 * losses[0],
            "loss per epoch: {losses:?}"
        );
        let out = dir.join("trained");
        let meta = ModelMeta {
            name: "tiny-cross".into(),
            base_hf_id: "local/headless".into(),
            base: base.display().to_string(),
            head: TrainHead::CrossEncoder,
            max_length: 32,
            license: None,
            lexical_weight: None,
            tool_parameters: false,
            tool_server: false,
            calibration: None,
            training: cross_hyper(5, epochs).to_toml(),
        };
        t.save(&out, &meta).unwrap();
        assert!(!out.join("modules.json").exists());
        let engine = decide_engine::Engine::builder()
            .model(out.to_str().unwrap())
            .build()
            .unwrap();
        assert_eq!(engine.info().head, decide_engine::HeadName::CrossEncoder);
        // The engine's inference path computes the training path's logits.
        let pairs = [
            (
                "please help me with maps now",
                "maps: find a route between two places",
            ),
            (
                "please help me with music now",
                "weather: get the forecast for a city",
            ),
        ];
        let ours = t.classify(&pairs).unwrap();
        let theirs = engine.classify_pairs(&pairs).unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b[0]).abs() < 1e-4, "{a} vs {}", b[0]);
        }
        let after = top1_pairs(|p| {
            engine
                .classify_pairs(p)
                .unwrap()
                .into_iter()
                .map(|l| l[0])
                .collect()
        });
        assert!(
            after > before + 2 && after >= 6,
            "top-1 before {before}/8, after {after}/8"
        );
        let manifest = decide_engine::Manifest::read_from(&out).unwrap().unwrap();
        assert_eq!(manifest.head, decide_engine::HeadName::CrossEncoder);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cross_encoder_needs_a_one_label_base() {
        let base = fixture().join("../tiny-bert-3");
        let err = Trainer::new(&base, data(), cross_hyper(1, 1), &Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("classifier has 3 labels"), "{err}");
    }
    #[test]
    fn training_from_the_spool_equals_training_from_memory() {
        let path = std::env::temp_dir().join(format!("decide-spool-eq-{}", std::process::id()));
        let d = data();
        let mut spool = ExampleSpool::create(&path).unwrap();
        for e in &d.examples {
            spool.push(e).unwrap();
        }
        let mut spooled = Trainer::from_source(
            &fixture(),
            d.documents.clone(),
            Box::new(spool),
            hyper(9, 1),
            &Device::Cpu,
        )
        .unwrap();
        spooled
            .run_epoch(&mut |_| ControlFlow::Continue(()))
            .unwrap();
        let a = spooled.weights().unwrap();
        let b = train(9, 1).0.weights().unwrap();
        for (name, ta) in &a {
            let va = ta.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vb = b[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(va, vb, "{name}");
        }
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

    /// On AMX tiles: the loss falls as in f32, the same seed gives the same weights, and
    /// those are not f32's (the products really ran in bf16).
    #[test]
    fn training_on_tiles_learns_and_repeats_itself() {
        let Some(tiles) = Bf16Tiles::detect() else {
            eprintln!("training_on_tiles_learns_and_repeats_itself: skipped, this CPU has no AMX");
            return;
        };
        let tiled = |seed, epochs| {
            let mut t =
                Trainer::new(&fixture(), data(), hyper(seed, epochs), &Device::Cpu).unwrap();
            t.on_tiles(tiles);
            let losses = run_epochs(&mut t, epochs);
            (t, losses)
        };
        let (_, losses) = tiled(7, 20);
        assert!(
            *losses.last().unwrap() < 0.5 * losses[0],
            "loss per epoch: {losses:?}"
        );
        let a = tiled(3, 1).0.weights().unwrap();
        let b = tiled(3, 1).0.weights().unwrap();
        let f32_weights = train(3, 1).0.weights().unwrap();
        let mut differs = false;
        for (name, ta) in &a {
            let va = ta.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vb = b[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vf = f32_weights[name]
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(va, vb, "{name}");
            differs |= va != vf;
        }
        assert!(
            differs,
            "bf16 products should give other weights than f32's"
        );
    }

    #[test]
    fn frozen_layers_keep_the_base_and_train_the_rest() {
        let base = Trainer::new(&fixture(), data(), hyper(5, 1), &Device::Cpu)
            .unwrap()
            .weights()
            .unwrap();
        let frozen = |seed| {
            let mut h = hyper(seed, 6);
            h.frozen_layers = 1;
            let mut t = Trainer::new(&fixture(), data(), h, &Device::Cpu).unwrap();
            let losses = run_epochs(&mut t, 6);
            (t, losses)
        };
        let (mut t, losses) = frozen(5);
        assert!(
            losses.last().unwrap() < &(0.7 * losses[0]),
            "loss per epoch: {losses:?}"
        );
        let after = t.weights().unwrap();
        let same = |name: &str| {
            let a = base[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let b = after[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            a == b
        };
        for name in base.keys() {
            let trained = name.starts_with("encoder.layer.1.");
            assert_eq!(same(name), !trained, "{name}");
        }
        // The cached path (frozen states reused) computes what the whole encoder computes.
        let d = data();
        let rows: Vec<(Text, Row)> = d
            .documents
            .iter()
            .enumerate()
            .map(|(j, text)| {
                let row = t
                    .tokens
                    .single_row(&t.tokens.encode_document(text).unwrap(), false)
                    .unwrap();
                (Text::Doc(j as u32), row)
            })
            .collect();
        let cached = t.embed_all(&rows).unwrap();
        let docs: Vec<&str> = d.documents.iter().map(String::as_str).collect();
        let whole = t.embed(&docs).unwrap();
        for (a, b) in cached.iter().zip(&whole) {
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() < 1e-5, "{x} vs {y}");
            }
        }
        // The same seed gives the same weights with frozen layers too.
        let again = frozen(5).0.weights().unwrap();
        for (name, ta) in &after {
            let va = ta.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vb = again[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(va, vb, "{name}");
        }
        let mut h = hyper(5, 1);
        h.frozen_layers = 2;
        let err = Trainer::new(&fixture(), data(), h, &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("--freeze-layers"), "{err}");
    }

    #[test]
    fn hard_negatives_come_from_the_cases_own_tools() {
        let mut d = data();
        // Case 0 was offered its own tool and tools 5 and 6 only.
        d.examples[0].candidates = vec![0, 5, 6];
        let mut h = hyper(2, 1);
        h.hard_negative_pool = 8;
        let mut t = Trainer::new(&fixture(), d, h, &Device::Cpu).unwrap();
        t.mine_hard_negatives().unwrap();
        let mut pool = t.hard[0].clone();
        pool.sort_unstable();
        assert_eq!(pool, vec![5, 6]);
        assert_eq!(
            t.hard[1].len(),
            7,
            "a case without candidates ranks every tool"
        );
    }

    #[test]
    fn each_pair_draws_distinct_negatives_from_its_own_pool() {
        let draws = |per_pair: usize| {
            let mut h = hyper(2, 1);
            h.hard_negative_pool = 5;
            h.negatives_per_pair = per_pair;
            let mut t = Trainer::new(&fixture(), data(), h, &Device::Cpu).unwrap();
            t.mine_hard_negatives().unwrap();
            let pool = t.hard[0].clone();
            let drawn: Vec<Vec<usize>> = (0..4).map(|_| t.draw_negatives(0)).collect();
            (pool, drawn)
        };
        let (pool, drawn) = draws(3);
        assert_eq!(pool.len(), 5);
        for d in &drawn {
            let mut unique = d.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), 3, "{d:?}");
            assert!(
                d.iter().all(|j| pool.contains(&(*j as u32))),
                "{d:?} from {pool:?}"
            );
        }
        // More than the pool holds: the whole pool, once each.
        let (pool, drawn) = draws(9);
        let mut all = drawn[0].clone();
        all.sort_unstable();
        let mut want: Vec<usize> = pool.iter().map(|&j| j as usize).collect();
        want.sort_unstable();
        assert_eq!(all, want);
        // One a pair: a single pick from the pool, as the generator gives it.
        let mut h = hyper(2, 1);
        h.hard_negative_pool = 5;
        let mut t = Trainer::new(&fixture(), data(), h, &Device::Cpu).unwrap();
        t.mine_hard_negatives().unwrap();
        for _ in 0..4 {
            let mut rng = t.rng.clone();
            let pool = t.hard[0].clone();
            let single = pool[rng.below(pool.len())] as usize;
            assert_eq!(t.draw_negatives(0), vec![single]);
        }
        let mut bad = hyper(2, 1);
        bad.negatives_per_pair = 0;
        let err = Trainer::new(&fixture(), data(), bad, &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("--negatives-per-pair"), "{err}");
    }

    /// The best cosine of `query` over the fixture's tools.
    fn best_cosine(t: &Trainer, query: &str) -> f32 {
        let d = data();
        let docs: Vec<&str> = d.documents.iter().map(String::as_str).collect();
        let dv = t.embed(&docs).unwrap();
        let q = &t.embed(&[query]).unwrap()[0];
        dv.iter()
            .map(|v| v.iter().zip(q).map(|(a, b)| a * b).sum::<f32>())
            .fold(f32::NEG_INFINITY, f32::max)
    }

    #[test]
    fn no_tool_cases_train_against_the_margin() {
        let small_talk = "tell me a joke about penguins";
        let with_small_talk = || {
            let mut d = data();
            d.examples.push(Example {
                query: small_talk.into(),
                positives: Vec::new(),
                candidates: Vec::new(),
            });
            d
        };
        // Without a margin a case with no needed tool is refused, as before.
        let err = Trainer::new(&fixture(), with_small_talk(), hyper(3, 1), &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().contains("example 8"), "{err}");

        let mut h = hyper(3, 12);
        h.no_tool_margin = Some(0.5);
        let run = |h: Hyper| {
            let mut t = Trainer::new(&fixture(), with_small_talk(), h, &Device::Cpu).unwrap();
            assert_eq!(t.pairs_per_epoch(), 9);
            let before = best_cosine(&t, small_talk);
            let top1_before = top1(|texts| t.embed(texts).unwrap());
            run_epochs(&mut t, 12);
            (t, before, top1_before)
        };
        let (t, before, top1_before) = run(h.clone());
        let after = best_cosine(&t, small_talk);
        let top1_after = top1(|texts| t.embed(texts).unwrap());
        // The no-tool request ends below the margin and below where it started, while the
        // requests that need a tool still learn theirs.
        assert!(after < 0.5 && after < before, "{before} -> {after}");
        assert!(top1_after > top1_before, "{top1_before} -> {top1_after}");
        // The same seed gives the same weights with the margin too.
        let (again, _, _) = run(h);
        let (a, b) = (t.weights().unwrap(), again.weights().unwrap());
        for (name, w) in &a {
            let diff = (w - &b[name]).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{name}");
        }

        // A margin is a cosine, and a cross-encoder has none.
        let mut bad = hyper(3, 1);
        bad.no_tool_margin = Some(1.5);
        let err = Trainer::new(&fixture(), data(), bad.clone(), &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("--no-tool-margin"), "{err}");
        bad.no_tool_margin = Some(0.3);
        bad.head = TrainHead::CrossEncoder;
        let err = Trainer::new(&fixture(), data(), bad, &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("--no-tool-margin"), "{err}");
        // Only no-tool cases leave nothing to train on.
        let mut only = TrainData {
            documents: data().documents,
            examples: vec![],
        };
        only.examples
            .push(with_small_talk().examples.pop().unwrap());
        let mut h = hyper(3, 1);
        h.no_tool_margin = Some(0.5);
        let err = Trainer::new(&fixture(), only, h, &Device::Cpu)
            .err()
            .unwrap();
        assert!(err.to_string().contains("no case"), "{err}");
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
