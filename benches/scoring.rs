//! Scoring throughput of the default model: sequences per second at batch sizes 1, 8, 32, 128
//! and 64, 128, 256 tokens, the same grid as `benches/peer_sentence_transformers.py` measures
//! for sentence-transformers, so the two can be compared side by side in one run.
//!
//! `cargo bench -p decide-engine --bench scoring` (after `models/fetch`). Set
//! `DECIDE_BENCH_DEVICE=cuda` to measure a GPU build, `DECIDE_BENCH_KERNELS=stock` to measure
//! candle's own ops instead of the fused CPU kernels (`auto`, `avx2`, `portable`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use decide_engine::{bench, CpuKernels, DeviceSpec, Engine};

fn scoring(c: &mut Criterion) {
    let device: DeviceSpec = std::env::var("DECIDE_BENCH_DEVICE")
        .unwrap_or_else(|_| "cpu".into())
        .parse()
        .expect("DECIDE_BENCH_DEVICE");
    let kernels: CpuKernels = std::env::var("DECIDE_BENCH_KERNELS")
        .unwrap_or_else(|_| "auto".into())
        .parse()
        .expect("DECIDE_BENCH_KERNELS");
    let engine = Engine::builder()
        .device(device)
        .cpu_kernels(kernels)
        // The whole batch in one forward pass: the batch size is what is measured.
        .max_batch_tokens(1 << 20)
        .build()
        .expect("the default model (run models/fetch)");
    for tokens in [64usize, 128, 256] {
        let mut group = c.benchmark_group(format!("forward/{tokens}-tokens"));
        group.sample_size(10);
        group.warm_up_time(std::time::Duration::from_millis(500));
        group.measurement_time(std::time::Duration::from_secs(3));
        for batch in [1usize, 8, 32, 128] {
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &batch| {
                b.iter(|| bench::forward_synthetic(&engine, batch, tokens).unwrap())
            });
        }
        group.finish();
    }

    // A whole decision as an agent makes it: a 10-message conversation against 100 tools
    // whose embeddings are cached.
    let tools: Vec<String> = (0..100)
        .map(|i| format!("tool_{i}: Does task number {i} for the user, with care and detail"))
        .collect();
    let refs: Vec<&str> = tools.iter().map(String::as_str).collect();
    let conversation: String = (0..10)
        .map(|i| format!("user: message {i} about the weather and my calendar\n"))
        .collect();
    engine.score(&conversation, &refs).unwrap();
    let mut group = c.benchmark_group("decision");
    group.sample_size(20);
    group.bench_function("10-messages-100-cached-tools", |b| {
        b.iter(|| engine.score(&conversation, &refs).unwrap())
    });
    group.finish();
}

criterion_group!(benches, scoring);
criterion_main!(benches);
