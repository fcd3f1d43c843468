//! Candidate embeddings kept between calls, and the cosine that compares them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A bounded map from candidate text to embedding; the oldest entry goes first when full.
/// One cache per engine, and an engine holds one model, so the key is (model, text).
pub(crate) struct EmbeddingCache {
    capacity: usize,
    map: HashMap<String, Arc<[f32]>>,
    order: VecDeque<String>,
}

impl EmbeddingCache {
    /// An empty cache of at most `capacity` entries (0: keeps nothing).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The number of embeddings held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn get(&self, text: &str) -> Option<Arc<[f32]>> {
        self.map.get(text).cloned()
    }

    pub(crate) fn insert(&mut self, text: String, vector: Arc<[f32]>) {
        if self.capacity == 0 || self.map.contains_key(&text) {
            return;
        }
        while self.map.len() >= self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.order.push_back(text.clone());
        self.map.insert(text, vector);
    }
}

/// The cosine of two vectors; 0 when either is all zeros.
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    // Eight independent f32 lanes (summed in f64 at the end) instead of one f64 chain: the
    // compiler vectorizes it, and a 1,000-tool decision scores 2,000 of these.
    const LANES: usize = 8;
    let (mut dot, mut na, mut nb) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut chunks_a = a.chunks_exact(LANES);
    let mut chunks_b = b.chunks_exact(LANES);
    for (x, y) in chunks_a.by_ref().zip(chunks_b.by_ref()) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
            na[i] += x[i] * x[i];
            nb[i] += y[i] * y[i];
        }
    }
    let (mut dot, mut na, mut nb) = (
        dot.iter().map(|&v| v as f64).sum::<f64>(),
        na.iter().map(|&v| v as f64).sum::<f64>(),
        nb.iter().map(|&v| v as f64).sum::<f64>(),
    );
    for (x, y) in chunks_a.remainder().iter().zip(chunks_b.remainder()) {
        dot += (*x as f64) * (*y as f64);
        na += (*x as f64) * (*x as f64);
        nb += (*y as f64) * (*y as f64);
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}
