//! Candidate embeddings kept between calls, and the cosine that compares them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A map from candidate text to embedding, bounded in entries and in bytes (texts and vectors
/// counted); the oldest entry goes first when either bound is reached. Each text is stored once,
/// shared by the map and the eviction order. One cache per engine, and an engine holds one
/// model, so the key is (model, text).
pub(crate) struct EmbeddingCache {
    capacity: usize,
    max_bytes: usize,
    bytes: usize,
    map: HashMap<Arc<str>, Arc<[f32]>>,
    order: VecDeque<Arc<str>>,
}

/// What an entry costs: its text, its vector and the bookkeeping around them.
fn cost(text: &str, vector: &[f32]) -> usize {
    text.len() + std::mem::size_of_val(vector) + 64
}

impl EmbeddingCache {
    /// An empty cache of at most `capacity` entries and `max_bytes` bytes (0: keeps nothing).
    pub(crate) fn new(capacity: usize, max_bytes: usize) -> Self {
        Self {
            capacity,
            max_bytes,
            bytes: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The number of embeddings held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The bytes the entries take, texts and vectors.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn get(&self, text: &str) -> Option<Arc<[f32]>> {
        self.map.get(text).cloned()
    }

    pub(crate) fn insert(&mut self, text: String, vector: Arc<[f32]>) {
        let size = cost(&text, &vector);
        if self.capacity == 0 || size > self.max_bytes || self.map.contains_key(text.as_str()) {
            return;
        }
        while self.map.len() >= self.capacity || self.bytes + size > self.max_bytes {
            match self.order.pop_front() {
                Some(old) => {
                    if let Some(v) = self.map.remove(&old) {
                        self.bytes -= cost(&old, &v);
                    }
                }
                None => break,
            }
        }
        let text: Arc<str> = Arc::from(text);
        self.order.push_back(text.clone());
        self.map.insert(text, vector);
        self.bytes += size;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_stays_within_its_bytes_and_keeps_the_newest() {
        let vector: Arc<[f32]> = Arc::from(vec![0.5f32; 384]);
        let mut cache = EmbeddingCache::new(1000, 100_000);
        for i in 0..50 {
            cache.insert(format!("{i}:{}", "x".repeat(10_000)), vector.clone());
            assert!(cache.bytes() <= 100_000, "{} bytes", cache.bytes());
        }
        assert!(cache.len() < 50 && cache.len() > 0);
        assert!(cache.get(&format!("49:{}", "x".repeat(10_000))).is_some());
        assert!(cache.get(&format!("0:{}", "x".repeat(10_000))).is_none());
        // A text larger than the whole budget is not kept, and evicts nothing.
        let before = cache.len();
        cache.insert("y".repeat(200_000), vector.clone());
        assert_eq!(cache.len(), before);
        // The entry bound still holds.
        let mut small = EmbeddingCache::new(3, usize::MAX);
        for i in 0..10 {
            small.insert(i.to_string(), vector.clone());
        }
        assert_eq!(small.len(), 3);
    }
}
