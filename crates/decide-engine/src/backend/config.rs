//! The parts of a Hugging Face `config.json` that the encoder needs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{EngineError, Result};

/// How position ids are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// BERT and MiniLM: positions 0, 1, 2, … and two token types.
    Bert,
    /// RoBERTa and XLM-RoBERTa (the bge-reranker family): positions start after the padding id.
    Roberta,
}

/// The activation of the feed-forward layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// The exact, erf-based GELU (`gelu` in transformers).
    Gelu,
    /// The tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// ReLU.
    Relu,
}

/// An encoder configuration, read from `config.json`.
#[derive(Debug, Clone)]
pub struct EncoderConfig {
    /// The architecture family.
    pub family: Family,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Number of transformer layers.
    pub num_layers: usize,
    /// Number of attention heads.
    pub num_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Feed-forward activation.
    pub activation: Activation,
    /// Number of position embeddings.
    pub max_position_embeddings: usize,
    /// Number of token types (2 for BERT, 1 for XLM-RoBERTa).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Id of the padding token.
    pub pad_token_id: u32,
    /// Labels of a classification head, by index; empty for a bare encoder.
    pub labels: Vec<String>,
}

#[derive(Deserialize)]
struct Raw {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default)]
    hidden_act: Option<String>,
    max_position_embeddings: usize,
    #[serde(default)]
    type_vocab_size: Option<usize>,
    #[serde(default)]
    layer_norm_eps: Option<f64>,
    #[serde(default)]
    pad_token_id: Option<u32>,
    #[serde(default)]
    id2label: Option<BTreeMap<String, String>>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    position_embedding_type: Option<String>,
}

impl EncoderConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::bad_file(path, e))?;
        Self::from_json(&text).map_err(|message| EngineError::BadFile {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses a `config.json` text; the error names the field concerned.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let model_type = raw.model_type.unwrap_or_else(|| "bert".into());
        let family = match model_type.as_str() {
            "bert" => Family::Bert,
            "roberta" | "xlm-roberta" | "camembert" => Family::Roberta,
            other => {
                return Err(format!(
                    "model_type: '{other}' is not supported (expected bert, roberta or xlm-roberta)"
                ))
            }
        };
        let activation = match raw.hidden_act.as_deref().unwrap_or("gelu") {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            other => return Err(format!("hidden_act: '{other}' is not supported")),
        };
        if let Some(kind) = raw.position_embedding_type.as_deref() {
            if kind != "absolute" {
                return Err(format!(
                    "position_embedding_type: '{kind}' is not supported (only absolute)"
                ));
            }
        }
        if raw.num_attention_heads == 0 || !raw.hidden_size.is_multiple_of(raw.num_attention_heads)
        {
            return Err(format!(
                "num_attention_heads: {} does not divide hidden_size {}",
                raw.num_attention_heads, raw.hidden_size
            ));
        }
        let mut labels = Vec::new();
        if let Some(map) = raw.id2label {
            let mut pairs = Vec::with_capacity(map.len());
            for (k, v) in map {
                let idx: usize = k
                    .parse()
                    .map_err(|_| format!("id2label: key '{k}' is not an index"))?;
                pairs.push((idx, v));
            }
            pairs.sort();
            for (i, (idx, v)) in pairs.into_iter().enumerate() {
                if idx != i {
                    return Err(format!("id2label: index {i} is missing"));
                }
                labels.push(v);
            }
        }
        if let Some(n) = raw.num_labels {
            if labels.len() != n {
                labels = (0..n).map(|i| format!("LABEL_{i}")).collect();
            }
        }
        let (default_types, default_eps, default_pad) = match family {
            Family::Bert => (2, 1e-12, 0),
            Family::Roberta => (1, 1e-5, 1),
        };
        Ok(Self {
            family,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            intermediate_size: raw.intermediate_size,
            activation,
            max_position_embeddings: raw.max_position_embeddings,
            type_vocab_size: raw.type_vocab_size.unwrap_or(default_types),
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(default_eps),
            pad_token_id: raw.pad_token_id.unwrap_or(default_pad),
            labels,
        })
    }

    /// The longest input, in tokens, that the position embeddings allow.
    pub fn max_tokens(&self) -> usize {
        match self.family {
            Family::Bert => self.max_position_embeddings,
            // RoBERTa's positions start at pad_token_id + 1, which uses up those embeddings.
            Family::Roberta => self
                .max_position_embeddings
                .saturating_sub(self.pad_token_id as usize + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINILM: &str = r#"{"architectures":["BertModel"],"hidden_act":"gelu","hidden_size":384,
        "intermediate_size":1536,"max_position_embeddings":512,"model_type":"bert",
        "num_attention_heads":12,"num_hidden_layers":6,"pad_token_id":0,"type_vocab_size":2,
        "vocab_size":30522,"layer_norm_eps":1e-12}"#;

    #[test]
    fn reads_a_bert_config() {
        let c = EncoderConfig::from_json(MINILM).unwrap();
        assert_eq!(c.family, Family::Bert);
        assert_eq!((c.hidden_size, c.num_layers, c.num_heads), (384, 6, 12));
        assert!(c.labels.is_empty());
        assert_eq!(c.max_tokens(), 512);
    }

    #[test]
    fn reads_labels_in_index_order() {
        let text = MINILM.replace(
            "\"vocab_size\"",
            "\"id2label\":{\"2\":\"neutral\",\"0\":\"contradiction\",\"1\":\"entailment\"},\"vocab_size\"",
        );
        let c = EncoderConfig::from_json(&text).unwrap();
        assert_eq!(c.labels, ["contradiction", "entailment", "neutral"]);
    }

    #[test]
    fn xlm_roberta_positions_start_after_padding() {
        let text = MINILM
            .replace("\"model_type\":\"bert\"", "\"model_type\":\"xlm-roberta\"")
            .replace("\"pad_token_id\":0", "\"pad_token_id\":1");
        let c = EncoderConfig::from_json(&text).unwrap();
        assert_eq!(c.family, Family::Roberta);
        assert_eq!(c.max_tokens(), 510);
    }

    #[test]
    fn errors_name_the_field() {
        let text = MINILM.replace("\"model_type\":\"bert\"", "\"model_type\":\"gpt2\"");
        let err = EncoderConfig::from_json(&text).unwrap_err();
        assert!(err.starts_with("model_type: 'gpt2'"), "{err}");
        let err = EncoderConfig::from_json("{}").unwrap_err();
        assert!(err.contains("missing field"), "{err}");
        let text = MINILM.replace("\"num_attention_heads\":12", "\"num_attention_heads\":7");
        assert!(EncoderConfig::from_json(&text)
            .unwrap_err()
            .starts_with("num_attention_heads"));
    }
}
