//! `decide models pull`: downloading a model from the Hugging Face hub into its cache, for
//! users who are online. The only code in the engine that touches the network.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};
use crate::registry::{self, Manifest, ModelLocation};

/// The files tried for a model without a manifest; the optional ones may be absent.
const REQUIRED: &[&str] = &["config.json", "tokenizer.json"];
const OPTIONAL: &[&str] = &[
    "modules.json",
    "1_Pooling/config.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
];

/// Downloads a model (a known name or any hub id) with a progress bar, checks each file against
/// the manifest's sha256, and returns where it now is. Files already in the cache are not
/// downloaded again.
pub fn pull(spec: &str) -> Result<ModelLocation> {
    let manifest = Manifest::find_builtin(spec);
    if let Some(build) = manifest.as_ref().and_then(|m| m.build.as_ref()) {
        return Err(EngineError::Download {
            model: spec.to_string(),
            message: format!(
                "it is not on the hub: `models/fetch` builds it from {} and the trained layers committed in models/",
                build.base
            ),
        });
    }
    let (hf_id, revision) = match &manifest {
        Some(m) => (m.hf_id.clone(), m.revision.clone()),
        None => (spec.to_string(), "main".to_string()),
    };
    let fail = |message: String| EngineError::Download {
        model: spec.to_string(),
        message,
    };
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let repo = api.repo(hf_hub::Repo::with_revision(
        hf_id.clone(),
        hf_hub::RepoType::Model,
        revision,
    ));
    match &manifest {
        Some(m) => {
            for (file, digest) in &m.files {
                if file == "LICENSE" || file == "NOTICE" {
                    // The hub repository keeps its license in the model card, not in files.
                    continue;
                }
                let path = repo.get(file).map_err(|e| fail(format!("{file}: {e}")))?;
                verify(&path, digest)?;
            }
        }
        None => {
            for file in REQUIRED {
                repo.get(file).map_err(|e| fail(format!("{file}: {e}")))?;
            }
            if repo.get("model.safetensors").is_err() {
                repo.get("pytorch_model.bin")
                    .map_err(|e| fail(format!("model.safetensors or pytorch_model.bin: {e}")))?;
            }
            for file in OPTIONAL {
                let _ = repo.get(file);
            }
        }
    }
    registry::resolve(spec)
}

/// Checks a file's sha256.
pub fn verify(path: &Path, expected: &str) -> Result<()> {
    let mut file = std::fs::File::open(path).map_err(|e| EngineError::bad_file(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| EngineError::bad_file(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let actual = format!("{:x}", hasher.finalize());
    if actual == expected {
        Ok(())
    } else {
        Err(EngineError::bad_file(
            path,
            format!("sha256 {actual} does not match the manifest's {expected}"),
        ))
    }
}
