//! What a run trains on: the cases, in memory or spooled to disk, and the texts as token rows.
//!
//! Tokenizing and trimming are here only: the loop asks [`Tokens`] for a text's encoding and
//! for the finished row of one text or of a pair, and never calls the tokenizer itself.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use decide_engine::Tokenization;
use tokenizers::{Encoding, Tokenizer};

use crate::error::{Result, TrainError};

/// One training case: a query and the documents (tool texts) it needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Example {
    /// The conversation as the engine renders it.
    pub query: String,
    /// Indexes into the documents of the needed tools.
    pub positives: Vec<usize>,
    /// Indexes of the documents the case was offered (its own catalogue); its hard negatives
    /// are mined among them. Empty: among every document.
    pub candidates: Vec<usize>,
}

/// The training cases, read by index: held in memory (`Vec<Example>`), or spooled to disk
/// ([`ExampleSpool`]) so that a file larger than memory can be trained on.
pub trait ExampleSource: Send {
    /// How many cases there are.
    fn len(&self) -> usize;
    /// Whether there is no case.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Case `index` (below [`len`](Self::len)).
    fn example(&mut self, index: usize) -> Result<Example>;
}

impl ExampleSource for Vec<Example> {
    fn len(&self) -> usize {
        <[Example]>::len(self)
    }

    fn example(&mut self, index: usize) -> Result<Example> {
        self.get(index)
            .cloned()
            .ok_or_else(|| TrainError::BadData(format!("no example {index}")))
    }
}

/// Cases written to a scratch file as the data is read, then read back by index: training
/// keeps an offset per case in memory, not the case's text. The file is removed when the
/// spool is dropped.
pub struct ExampleSpool {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    reader: Option<File>,
    offsets: Vec<u64>,
    written: u64,
}

impl ExampleSpool {
    /// Creates the scratch file at `path`; a file already there is an error, never truncated.
    pub fn create(path: &Path) -> Result<Self> {
        // Never truncates a file that is there already: the spool deletes its file when dropped,
        // so it must be one it created.
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| TrainError::bad_file(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            writer: Some(BufWriter::new(file)),
            reader: None,
            offsets: Vec::new(),
            written: 0,
        })
    }

    /// Appends a case.
    pub fn push(&mut self, example: &Example) -> Result<()> {
        let Some(w) = self.writer.as_mut() else {
            return Err(TrainError::BadData(
                "the spool is already being read".into(),
            ));
        };
        // Record: positives count, positives, candidates count, candidates, query length,
        // query bytes (all little-endian u32).
        let indexes = example.positives.len() + example.candidates.len();
        let mut record = Vec::with_capacity(12 + 4 * indexes + example.query.len());
        for list in [&example.positives, &example.candidates] {
            record.extend((list.len() as u32).to_le_bytes());
            for &p in list {
                record.extend((p as u32).to_le_bytes());
            }
        }
        record.extend((example.query.len() as u32).to_le_bytes());
        record.extend(example.query.as_bytes());
        w.write_all(&record)
            .map_err(|e| TrainError::bad_file(&self.path, e))?;
        self.offsets.push(self.written);
        self.written += record.len() as u64;
        Ok(())
    }
}

impl ExampleSource for ExampleSpool {
    fn len(&self) -> usize {
        self.offsets.len()
    }

    fn example(&mut self, index: usize) -> Result<Example> {
        let path = &self.path;
        let bad = |e: std::io::Error| TrainError::bad_file(path, e);
        if let Some(mut w) = self.writer.take() {
            w.flush().map_err(bad)?;
        }
        let Some(&start) = self.offsets.get(index) else {
            return Err(TrainError::BadData(format!("no example {index}")));
        };
        let end = self.offsets.get(index + 1).copied().unwrap_or(self.written);
        let reader = match &mut self.reader {
            Some(r) => r,
            slot => slot.insert(File::open(path).map_err(bad)?),
        };
        // The whole record in one read, then parsed from memory.
        let mut record = vec![0u8; (end - start) as usize];
        reader.seek(SeekFrom::Start(start)).map_err(bad)?;
        reader.read_exact(&mut record).map_err(bad)?;
        let corrupt = || TrainError::bad_file(path, "corrupt spool");
        let mut words = record.chunks_exact(4);
        let mut next = || -> Result<usize> {
            let w = words.next().ok_or_else(corrupt)?;
            Ok(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
        };
        let n = next()?;
        let positives = (0..n).map(|_| next()).collect::<Result<Vec<_>>>()?;
        let m = next()?;
        let candidates = (0..m).map(|_| next()).collect::<Result<Vec<_>>>()?;
        let len = next()?;
        let text = record
            .get(4 * (n + m + 3)..)
            .filter(|t| t.len() == len)
            .ok_or_else(corrupt)?;
        let query = String::from_utf8(text.to_vec())
            .map_err(|_| TrainError::bad_file(path, "corrupt spool (not UTF-8)"))?;
        Ok(Example {
            query,
            positives,
            candidates,
        })
    }
}

impl Drop for ExampleSpool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a run trains on, held in memory.
#[derive(Debug, Clone, Default)]
pub struct TrainData {
    /// Every tool text (name and description as the engine sees it), each once; hard negatives
    /// are mined among them.
    pub documents: Vec<String>,
    /// The cases with at least one needed tool.
    pub examples: Vec<Example>,
}

/// Token rows of one batch, padded: ids, token types and mask.
pub(crate) struct Rows {
    pub ids: Tensor,
    pub types: Tensor,
    pub mask: Tensor,
}

/// One tokenized input: ids and token types.
pub(crate) type Row = (Vec<u32>, Vec<u32>);

impl Rows {
    /// Pads `rows` with `pad` (and type 0) to the longest of them, on `device`.
    pub fn pad(rows: &[&Row], pad: u32, device: &Device) -> Result<Self> {
        let l = rows.iter().map(|r| r.0.len()).max().unwrap_or(1);
        let mut ids = Vec::with_capacity(rows.len() * l);
        let mut types = Vec::with_capacity(rows.len() * l);
        let mut mask = Vec::with_capacity(rows.len() * l);
        for (r, t) in rows {
            ids.extend_from_slice(r);
            ids.extend(std::iter::repeat_n(pad, l - r.len()));
            types.extend_from_slice(t);
            types.extend(std::iter::repeat_n(0, l - t.len()));
            mask.extend(std::iter::repeat_n(1f32, r.len()));
            mask.extend(std::iter::repeat_n(0f32, l - r.len()));
        }
        let d = device;
        let shape = (rows.len(), l);
        Ok(Rows {
            ids: Tensor::from_vec(ids, shape, d)?,
            types: Tensor::from_vec(types, shape, d)?,
            mask: Tensor::from_vec(mask, shape, d)?,
        })
    }
}

/// A text as the tokenizer first reads it, without special tokens and untrimmed: what is kept
/// of each tool, and what [`Tokens::single_row`] and [`Tokens::pair_row`] finish.
pub(crate) type Encoded = Encoding;

/// The base model's tokenizer, reading texts through the engine's own [`Tokenization`], so a
/// trained model sees exactly the rows it will be asked about: tokenized without special
/// tokens, trimmed to the longest input, then given the special tokens.
pub(crate) struct Tokens(Tokenization);

impl Tokens {
    /// Loads the tokenizer file at `path` (a `tokenizer.json`), for inputs of at most
    /// `max_length` tokens.
    pub fn load(path: &Path, max_length: usize) -> Result<Self> {
        Ok(Self(Tokenization::from_file(path, max_length)?))
    }

    /// The tokenizer in use.
    pub fn tokenizer(&self) -> &Tokenizer {
        self.0.tokenizer()
    }

    /// A query tokenized without special tokens, as much of its end as a row can keep.
    pub fn encode_query(&self, text: &str) -> Result<Encoded> {
        Ok(self.0.encode_end(text)?)
    }

    /// A tool's text tokenized without special tokens, as much of its start as a row can keep.
    pub fn encode_document(&self, text: &str) -> Result<Encoded> {
        Ok(self.0.encode_start(text)?)
    }

    /// One text as the engine's bi-encoder reads it: a query keeps its end (the latest
    /// turns), a tool its start.
    pub fn single_row(&self, enc: &Encoded, keep_end: bool) -> Result<Row> {
        let row = if keep_end {
            self.0.query_row(enc.clone())?
        } else {
            self.0.document_row(enc.clone())?
        };
        Ok((row.ids, row.type_ids))
    }

    /// A (query, tool) pair trimmed exactly as the engine's cross-encoder trims it.
    pub fn pair_row(&self, query: &Encoded, candidate: &Encoded) -> Result<Row> {
        let row = self.0.pair_row(query.clone(), candidate.clone())?;
        Ok((row.ids, row.type_ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spool_reads_back_what_was_written_and_cleans_up() {
        let path = std::env::temp_dir().join(format!("decide-spool-{}", std::process::id()));
        let examples = vec![
            Example {
                query: "user: météo à Zürich ✓".into(),
                positives: vec![3, 1],
                candidates: vec![1, 3, 4, 6],
            },
            Example {
                query: String::new(),
                positives: vec![0],
                candidates: Vec::new(),
            },
            Example {
                query: "x\ny".into(),
                positives: vec![7, 8, 9],
                candidates: vec![9, 8, 7, 0],
            },
        ];
        let mut spool = ExampleSpool::create(&path).unwrap();
        for e in &examples {
            spool.push(e).unwrap();
        }
        assert_eq!(ExampleSource::len(&spool), 3);
        for i in [2, 0, 1, 2] {
            assert_eq!(spool.example(i).unwrap(), examples[i]);
        }
        assert!(spool.example(3).is_err());
        assert!(spool.push(&examples[0]).is_err(), "no writes once reading");
        drop(spool);
        assert!(!path.exists());
    }
}
