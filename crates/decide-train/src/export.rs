//! The trained model's folder: weights, the base model's files, the head's own files and the
//! manifest.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use decide_engine::{Calibration, HeadName, Manifest, Scoring};

use crate::config::TrainHead;
use crate::error::{Result, TrainError};

/// Writes a complete model folder into `dir` (created; files in it are replaced): `weights`,
/// the configuration and tokenizer files of the `base` folder, the head's own files (the
/// sentence-transformers modules of a bi-encoder with `hidden_size`-wide embeddings, the
/// one-label classifier configuration of a cross-encoder) and a manifest from `meta`.
pub(crate) fn write_folder(
    dir: &Path,
    base: &Path,
    head: TrainHead,
    hidden_size: usize,
    weights: &HashMap<String, Tensor>,
    meta: &ModelMeta,
) -> Result<()> {
    let io = |p: &Path, e: std::io::Error| TrainError::bad_file(p, e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let weights_path = dir.join("model.safetensors");
    candle_core::safetensors::save(weights, &weights_path)
        .map_err(|e| TrainError::bad_file(&weights_path, e))?;
    copy_base_files(base, dir, head)?;
    match head {
        TrainHead::BiEncoder if !dir.join("modules.json").is_file() => {
            let modules = r#"[
  {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
  {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
]
"#;
            let pooling = format!(
                "{{\"word_embedding_dimension\": {}, \"pooling_mode_cls_token\": false, \"pooling_mode_mean_tokens\": true, \"pooling_mode_max_tokens\": false}}\n",
                hidden_size
            );
            let p = dir.join("modules.json");
            std::fs::write(&p, modules).map_err(|e| io(&p, e))?;
            let pdir = dir.join("1_Pooling");
            std::fs::create_dir_all(&pdir).map_err(|e| io(&pdir, e))?;
            let p = pdir.join("config.json");
            std::fs::write(&p, pooling).map_err(|e| io(&p, e))?;
        }
        TrainHead::BiEncoder => {}
        TrainHead::CrossEncoder => {
            // The base's config with one label: what transformers and the engine read as a
            // one-logit sequence classifier.
            let path = base.join("config.json");
            let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
            let mut config: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| TrainError::bad_file(&path, e))?;
            if let Some(obj) = config.as_object_mut() {
                obj.insert(
                    "architectures".into(),
                    serde_json::json!(["BertForSequenceClassification"]),
                );
                obj.insert("id2label".into(), serde_json::json!({"0": "LABEL_0"}));
                obj.insert("label2id".into(), serde_json::json!({"LABEL_0": 0}));
                obj.remove("num_labels");
            }
            let p = dir.join("config.json");
            let text =
                serde_json::to_string_pretty(&config).map_err(|e| TrainError::bad_file(&p, e))?;
            std::fs::write(&p, text + "\n").map_err(|e| io(&p, e))?;
        }
    }
    write_manifest(dir, meta)
}

/// sentence-transformers' files, which describe a bi-encoder's pooling.
const SENTENCE_TRANSFORMERS: [&str; 3] = [
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
];

/// Files of the base folder that describe the model rather than its weights: copied as they
/// are, but for a cross-encoder, which gets its own config.json and no pooling modules.
fn copy_base_files(base: &Path, dir: &Path, head: TrainHead) -> Result<()> {
    const SKIP: [&str; 4] = [
        "model.safetensors",
        "pytorch_model.bin",
        "manifest.toml",
        "reference.json",
    ];
    let cross = head == TrainHead::CrossEncoder;
    let io = |p: &Path, e: std::io::Error| TrainError::bad_file(p, e);
    for entry in std::fs::read_dir(base).map_err(|e| io(base, e))? {
        let entry = entry.map_err(|e| io(base, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if SKIP.contains(&name.as_str()) || name.starts_with('.') {
            continue;
        }
        if cross && (SENTENCE_TRANSFORMERS.contains(&name.as_str()) || name == "config.json") {
            continue;
        }
        if path.is_file() {
            std::fs::copy(&path, dir.join(&name)).map_err(|e| io(&path, e))?;
        } else if !cross && path.is_dir() && name.starts_with(|c: char| c.is_ascii_digit()) {
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
    /// The head the weights were trained for.
    pub head: TrainHead,
    /// The longest input in tokens.
    pub max_length: usize,
    /// The base model's licence, which the weights inherit.
    pub license: Option<String>,
    /// The base model's lexical weight (hybrid scoring), kept so that scores mean the same.
    pub lexical_weight: Option<f64>,
    /// Whether the training texts carried the tools' parameter names, as the model's texts
    /// must then do too.
    pub tool_parameters: bool,
    /// Whether the training texts carried the tools' servers, as the model's texts must then
    /// do too.
    pub tool_server: bool,
    /// The Platt scaling, once fitted.
    pub calibration: Option<Calibration>,
    /// The `[training]` table: data hashes, hyper-parameters, epochs, where the calibration
    /// was fitted.
    pub training: toml::Table,
}

/// Writes `dir/manifest.toml` for `meta`, with the sha256 of every other file of the folder.
pub fn write_manifest(dir: &Path, meta: &ModelMeta) -> Result<()> {
    let mut training = meta.training.clone();
    training.insert("base".into(), meta.base.clone().into());
    let manifest = Manifest {
        name: meta.name.clone(),
        hf_id: meta.base_hf_id.clone(),
        revision: "trained".into(),
        architecture: "bert".into(),
        head: match meta.head {
            TrainHead::BiEncoder => HeadName::BiEncoder,
            TrainHead::CrossEncoder => HeadName::CrossEncoder,
        },
        max_length: meta.max_length,
        license: meta.license.clone(),
        calibration: meta.calibration,
        scoring: (meta.lexical_weight.is_some() || meta.tool_parameters || meta.tool_server).then(
            || Scoring {
                lexical_weight: meta.lexical_weight.unwrap_or(0.0),
                tool_parameters: meta.tool_parameters,
                tool_server: meta.tool_server,
            },
        ),
        training: Some(training),
        build: None,
        conformal: None,
        needs_tool: None,
        files: Manifest::hash_files(dir)?,
    };
    let comment = format!("{WRITTEN_BY}: fine-tuned from {}.", meta.base);
    Ok(manifest.write_to(dir, &comment)?)
}

/// How the manifest of every folder `decide train` writes begins (after `# `).
const WRITTEN_BY: &str = "Written by `decide train`";

/// Whether `dir` holds a model folder `decide train` wrote (its manifest says so on its first
/// line): the only kind of existing folder a new run may write over.
pub fn written_by_train(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("manifest.toml"))
        .map(|m| m.starts_with(&format!("# {WRITTEN_BY}")))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Hyper;

    /// A trained model's manifest, byte for byte: `decide train` recognises its own folders
    /// by the first line, and the tables come with their keys sorted.
    #[test]
    fn the_manifest_is_written_byte_for_byte() {
        let dir = std::env::temp_dir().join(format!("decide-manifest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        std::fs::write(dir.join("1_Pooling/config.json"), "{\"a\": 1}").unwrap();
        std::fs::write(dir.join("manifest.toml"), "old").unwrap();
        let mut training = Hyper::default().to_toml();
        training.insert("data".into(), "cases.jsonl".into());
        let meta = ModelMeta {
            name: "tiny".into(),
            base_hf_id: "local/tiny".into(),
            base: "models/tiny".into(),
            head: TrainHead::BiEncoder,
            max_length: 256,
            license: Some("apache-2.0".into()),
            lexical_weight: Some(0.6),
            tool_parameters: false,
            tool_server: false,
            calibration: Some(Calibration { a: 10.5, b: -5.25 }),
            training,
        };
        let written = |meta: &ModelMeta| {
            write_manifest(&dir, meta).unwrap();
            std::fs::read_to_string(dir.join("manifest.toml")).unwrap()
        };
        assert_eq!(
            written(&meta),
            expected(
                "bi-encoder",
                "license = \"apache-2.0\"\n",
                "[calibration]\na = 10.5\nb = -5.25\n\n",
                "[scoring]\nlexical_weight = 0.6\n\n",
            )
        );
        let meta = ModelMeta {
            license: None,
            lexical_weight: None,
            calibration: None,
            head: TrainHead::CrossEncoder,
            ..meta
        };
        assert_eq!(written(&meta), expected("cross-encoder", "", "", ""));
        // Texts with parameters are a scoring setting of their own, with or without a weight.
        let meta = ModelMeta {
            tool_parameters: true,
            tool_server: false,
            ..meta
        };
        assert_eq!(
            written(&meta),
            expected(
                "cross-encoder",
                "",
                "",
                "[scoring]\nlexical_weight = 0.0\ntool_parameters = true\n\n"
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The expected manifest: `license` and the tables that come before and after `[files]`
    /// vary, the rest is that of the test's folder and hyper-parameters.
    fn expected(head: &str, license: &str, before_files: &str, after_files: &str) -> String {
        format!(
            r#"# Written by `decide train`: fine-tuned from models/tiny.
architecture = "bert"
head = "{head}"
hf_id = "local/tiny"
{license}max_length = 256
name = "tiny"
revision = "trained"

{before_files}{FILES}
{after_files}{TRAINING}"#
        )
    }

    const FILES: &str = r#"[files]
"1_Pooling/config.json" = "f9d86028c6e0d64e225186f96acb69338b2c59764df79162107f5c4bb34d1310"
"config.json" = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
"#;

    const TRAINING: &str = r#"[training]
base = "models/tiny"
batch_size = 16
data = "cases.jsonl"
dropout = 0.1
epochs = 4
frozen_layers = 0
hard_negative_pool = 5
head = "bi-encoder"
learning_rate = 0.00002
max_grad_norm = 1.0
max_length = 128
scale = 20.0
seed = 42
warmup = 0.1
weight_decay = 0.01
"#;
}
