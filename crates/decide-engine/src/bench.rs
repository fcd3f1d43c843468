//! What the benchmarks time and report (`decide bench`, `benches/`, `examples/timing.rs`), and
//! what the kernel tests check: forward passes of synthetic rows, their FLOPs, the device's
//! matrix-product rate, which kernels run, and the synthetic decision (a conversation of
//! alternating user and assistant turns, one yes/no question per tool), defined once so that
//! every benchmark measures the same work. Not part of the engine's API.

use decide_contract::{DecisionInput, DecisionRequest, YesNoQuestion};

use crate::backend::TokenRow;
use crate::{Engine, Result};

/// Runs `batch` sequences of exactly `tokens` tokens through the model once: the unit the
/// throughput benchmarks time.
pub fn forward_synthetic(engine: &Engine, batch: usize, tokens: usize) -> Result<()> {
    let vocab = engine.inner.backend.config().vocab_size;
    let id = 2000u32.min(vocab.saturating_sub(1) as u32);
    let row = TokenRow {
        ids: vec![id; tokens],
        type_ids: vec![0; tokens],
    };
    let rows = vec![row; batch];
    engine.run(&rows).map(|_| ())
}

/// Floating-point operations of one forward pass over `batch` rows of `tokens` tokens: the
/// matrix products of the encoder layers (two per multiply-add), for throughput reports.
pub fn forward_flops(engine: &Engine, batch: usize, tokens: usize) -> f64 {
    let c = engine.inner.backend.config();
    let (b, l) = (batch as f64, tokens as f64);
    let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    // QKV, attention output, FFN up and down; then QKᵀ and P·V.
    let per_layer = 2.0 * b * l * (4.0 * h * h + 2.0 * h * i) + 4.0 * b * l * l * h;
    per_layer * c.num_layers as f64
}

/// The device's measured matrix-product rate in GFLOP/s, in the engine's dtype: the best of a
/// few products of the FFN-up shape at 2048 tokens (2048×hidden by hidden×intermediate).
pub fn matmul_peak_gflops(engine: &Engine) -> Result<f64> {
    let backend = &engine.inner.backend;
    let c = backend.config();
    let (m, k, n) = (2048, c.hidden_size, c.intermediate_size);
    let (device, dtype) = (backend.device(), backend.dtype());
    let a = candle_core::Tensor::randn(0f32, 1.0, (m, k), device)?.to_dtype(dtype)?;
    let b = candle_core::Tensor::randn(0f32, 1.0, (k, n), device)?.to_dtype(dtype)?;
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        device.synchronize()?;
        let start = std::time::Instant::now();
        let p = a.matmul(&b)?;
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
        drop(p);
    }
    Ok(2.0 * (m * k * n) as f64 / best / 1e9)
}

/// Which code runs the encoder: `stock` (candle's ops) or `fused-<isa>-f32` (the fused CPU
/// kernels at the instruction set chosen at load time).
pub fn kernels(engine: &Engine) -> String {
    engine.inner.backend.kernels()
}

/// A conversation of `messages` turns (user first), each a short request on one of five topics.
pub fn conversation(messages: usize) -> DecisionInput {
    let topics = [
        "book a table for four tomorrow evening",
        "what is the weather in Lisbon this weekend",
        "send the quarterly report to Ana and cc the finance team",
        "find the cheapest flight from Berlin to Porto in March",
        "summarize the open issues in the decide repository",
    ];
    let messages: Vec<serde_json::Value> = (0..messages)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let text = format!("{} (message {i})", topics[i % topics.len()]);
            serde_json::json!({"role": role, "text": text})
        })
        .collect();
    let mut fields = serde_json::Map::new();
    fields.insert("messages".into(), serde_json::Value::Array(messages));
    DecisionInput::Fields(fields)
}

/// A request asking, for each of `tools` distinct tools, whether `input` needs it.
pub fn tool_request(
    tools: usize,
    input: &DecisionInput,
) -> decide_contract::Result<DecisionRequest> {
    let mut builder = DecisionRequest::builder().input(input.clone());
    for i in 0..tools {
        let question = YesNoQuestion::builder("Does the conversation need this tool?")
            .candidate(
                format!("tool_{i}"),
                format!(
                    "Performs operation {i} of service {} for the user: looks up, creates or \
                     updates records and returns them",
                    i % 37
                ),
            )
            .build()?;
        builder = builder.question(format!("tool{i}"), question);
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_and_request_have_the_requested_sizes() {
        let input = conversation(10);
        assert_eq!(input.render().lines().count(), 10);
        assert!(input.last_user_text().is_some());
        let request = tool_request(3, &input).unwrap();
        assert_eq!(request.questions().len(), 3);
    }
}
