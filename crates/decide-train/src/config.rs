//! What a run is configured with: the hyper-parameters and the head trained.

use crate::error::{Result, TrainError};

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
    /// How many distinct hard negatives each pair draws from its pool a step (at least 1). More
    /// contrast a request with more of its own catalogue's near tools, at the cost of encoding
    /// them.
    pub negatives_per_pair: usize,
    /// The head trained on the encoder.
    pub head: TrainHead,
    /// Layers frozen at the bottom of the encoder, with the embeddings (0: every weight
    /// trains). Their outputs are computed once per text, without dropout, and reused: a step
    /// runs forward and backward only through the layers above.
    pub frozen_layers: usize,
    /// With a value, cases that need no tool train too: every row's softmax gains a column of
    /// this fixed cosine, which a needed tool must beat and which a no-tool case's row must
    /// win against every tool of the batch. `None`: no-tool cases are skipped (bi-encoder only).
    pub no_tool_margin: Option<f64>,
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
            negatives_per_pair: 1,
            head: TrainHead::BiEncoder,
            frozen_layers: 0,
            no_tool_margin: None,
        }
    }
}

impl Hyper {
    pub(crate) fn check(&self) -> Result<()> {
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
        if self.negatives_per_pair == 0 {
            return bad("negatives-per-pair", "must be at least 1");
        }
        if self.negatives_per_pair > 1 && self.head != TrainHead::BiEncoder {
            return bad("negatives-per-pair", "trains a bi-encoder only");
        }
        if let Some(m) = self.no_tool_margin {
            if !(-1.0..=1.0).contains(&m) {
                return bad("no-tool-margin", "must be a cosine, between -1 and 1");
            }
            if self.head != TrainHead::BiEncoder {
                return bad("no-tool-margin", "trains a bi-encoder only");
            }
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
        // Written only when it is not the default, so that manifests of runs from before the
        // option read as they did.
        if self.negatives_per_pair != 1 {
            t.insert(
                "negatives_per_pair".into(),
                (self.negatives_per_pair as i64).into(),
            );
        }
        t.insert("head".into(), self.head.name().into());
        t.insert("frozen_layers".into(), (self.frozen_layers as i64).into());
        if let Some(m) = self.no_tool_margin {
            t.insert("no_tool_margin".into(), m.into());
        }
        t
    }
}

/// Which head is trained on the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrainHead {
    /// Mean-pooled embeddings compared by cosine; contrastive loss over in-batch and hard
    /// negatives. Fast at decision time: tool embeddings are cached.
    #[default]
    BiEncoder,
    /// The conversation and one tool read together, one logit per pair; binary cross-entropy
    /// on each needed tool against a hard and a random negative. More accurate per pair, but a
    /// forward pass per pair: use it to rerank a bi-encoder's shortlist (`--rerank`).
    CrossEncoder,
}

impl TrainHead {
    /// The name the command line and the manifest use.
    pub fn name(self) -> &'static str {
        match self {
            TrainHead::BiEncoder => "bi-encoder",
            TrainHead::CrossEncoder => "cross-encoder",
        }
    }
}
