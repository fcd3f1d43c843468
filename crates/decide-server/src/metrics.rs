//! Prometheus metrics, kept in atomics and written as text on `GET /metrics`: a handful of
//! fixed series do not need a metrics library.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Upper bounds of the batch-size buckets (requests or rows per forward call).
const SIZE_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, b) in bounds.iter().enumerate() {
            if value <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in bounds.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {c}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

/// The server's counters, gauges and histograms.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    batch_requests: Mutex<Histogram>,
    batch_rows: Mutex<Histogram>,
    batches: AtomicU64,
    rows_deduplicated: AtomicU64,
    rows_cancelled: AtomicU64,
    queue_depth: AtomicUsize,
    rejected: AtomicU64,
    largest_batch: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// No observations yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A request to `endpoint` answered with `status` after `elapsed`.
    pub fn observe_request(&self, endpoint: &str, status: u16, elapsed: Duration) {
        *lock(&self.requests)
            .entry((endpoint.to_string(), status))
            .or_default() += 1;
        lock(&self.latency)
            .entry(endpoint.to_string())
            .or_default()
            .observe(&LATENCY_BUCKETS, elapsed.as_secs_f64());
    }

    /// A forward call of `requests` requests and `rows` rows, `deduplicated` of them shared.
    pub fn observe_batch(&self, requests: usize, rows: usize, deduplicated: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.largest_batch.fetch_max(requests, Ordering::Relaxed);
        self.rows_deduplicated
            .fetch_add(deduplicated as u64, Ordering::Relaxed);
        lock(&self.batch_requests).observe(&SIZE_BUCKETS, requests as f64);
        lock(&self.batch_rows).observe(&SIZE_BUCKETS, rows as f64);
    }

    /// `rows` rows of a request whose caller was gone, dropped from the queue unrun.
    pub fn observe_cancelled(&self, rows: usize) {
        self.rows_cancelled
            .fetch_add(rows as u64, Ordering::Relaxed);
    }

    /// A request turned away because the server was at its limit.
    pub fn observe_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// The number of forward calls the queue has made.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// The largest number of requests one forward call has served.
    pub fn max_batch_requests(&self) -> usize {
        self.largest_batch.load(Ordering::Relaxed)
    }

    pub(crate) fn queue_depth(&self) -> &AtomicUsize {
        &self.queue_depth
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP decide_requests_total HTTP requests by endpoint and status.\n");
        out.push_str("# TYPE decide_requests_total counter\n");
        for ((endpoint, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "decide_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP decide_request_duration_seconds Request latency by endpoint.\n");
        out.push_str("# TYPE decide_request_duration_seconds histogram\n");
        for (endpoint, h) in lock(&self.latency).iter() {
            h.write(
                &mut out,
                "decide_request_duration_seconds",
                &format!("endpoint=\"{endpoint}\""),
                &LATENCY_BUCKETS,
            );
        }
        out.push_str("# HELP decide_batch_requests Requests served by one forward call.\n");
        out.push_str("# TYPE decide_batch_requests histogram\n");
        lock(&self.batch_requests).write(&mut out, "decide_batch_requests", "", &SIZE_BUCKETS);
        out.push_str("# HELP decide_batch_rows Rows (sequences) in one forward call.\n");
        out.push_str("# TYPE decide_batch_rows histogram\n");
        lock(&self.batch_rows).write(&mut out, "decide_batch_rows", "", &SIZE_BUCKETS);
        out.push_str("# HELP decide_batches_total Forward calls made by the queue.\n");
        out.push_str("# TYPE decide_batches_total counter\n");
        let _ = writeln!(out, "decide_batches_total {}", self.batches());
        out.push_str(
            "# HELP decide_rows_deduplicated_total Rows shared by several requests of one batch.\n",
        );
        out.push_str("# TYPE decide_rows_deduplicated_total counter\n");
        let _ = writeln!(
            out,
            "decide_rows_deduplicated_total {}",
            self.rows_deduplicated.load(Ordering::Relaxed)
        );
        out.push_str("# HELP decide_queue_depth Requests waiting for the model.\n");
        out.push_str("# TYPE decide_queue_depth gauge\n");
        let _ = writeln!(
            out,
            "decide_queue_depth {}",
            self.queue_depth.load(Ordering::Relaxed)
        );
        out.push_str(
            "# HELP decide_rows_cancelled_total Rows dropped unrun because their caller was gone.\n",
        );
        out.push_str("# TYPE decide_rows_cancelled_total counter\n");
        let _ = writeln!(
            out,
            "decide_rows_cancelled_total {}",
            self.rows_cancelled.load(Ordering::Relaxed)
        );
        out.push_str("# HELP decide_rejected_total Requests turned away with 503.\n");
        out.push_str("# TYPE decide_rejected_total counter\n");
        let _ = writeln!(
            out,
            "decide_rejected_total {}",
            self.rejected.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::new();
        m.observe_batch(1, 3, 0);
        m.observe_batch(5, 40, 2);
        let text = m.render();
        assert!(
            text.contains("decide_batch_requests_bucket{le=\"1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("decide_batch_requests_bucket{le=\"4\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("decide_batch_requests_bucket{le=\"8\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("decide_batch_requests_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("decide_batch_requests_sum 6\n"), "{text}");
        assert!(
            text.contains("decide_rows_deduplicated_total 2\n"),
            "{text}"
        );
        assert_eq!(m.batches(), 2);
        assert_eq!(m.max_batch_requests(), 5);
    }

    #[test]
    fn requests_by_endpoint_and_status() {
        let m = Metrics::new();
        m.observe_request("/v1/decisions", 200, Duration::from_millis(3));
        m.observe_request("/v1/decisions", 200, Duration::from_millis(30));
        m.observe_request("/v1/decisions", 400, Duration::from_millis(1));
        let text = m.render();
        assert!(
            text.contains("decide_requests_total{endpoint=\"/v1/decisions\",status=\"200\"} 2\n")
        );
        assert!(text.contains(
            "decide_request_duration_seconds_bucket{endpoint=\"/v1/decisions\",le=\"0.005\"} 2\n"
        ), "{text}");
        assert!(
            text.contains("decide_request_duration_seconds_count{endpoint=\"/v1/decisions\"} 3\n")
        );
    }
}
