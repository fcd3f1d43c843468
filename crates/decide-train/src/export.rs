//! The trained model's folder: weights, the base model's files, the head's own files and the
//! manifest.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use decide_engine::Calibration;
use sha2::{Digest, Sha256};

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
    t.insert("head".into(), meta.head.name().into());
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
