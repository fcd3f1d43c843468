//! Times the phases of one decision, `decide bench`'s (a 10-message conversation against 100
//! and 1,000 tools whose embeddings are cached):
//! `cargo run --release -p decide-engine --example timing`. Staging (planning, tokenizing, cache lookups, BM25), the forward pass, finishing (cosines,
//! answers) and the whole `decide` call with the contract's validation.

use std::time::Instant;

use decide_contract::DecisionModel;
use decide_engine::{bench, Engine};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let engine = Engine::builder().build()?;
    println!(
        "load: {:.1} ms ({})",
        ms(started, Instant::now()),
        bench::kernels(&engine)
    );
    let input = bench::conversation(10);
    for tools in [100usize, 1000] {
        let request = bench::tool_request(tools, &input)?;
        // The first call embeds the tools; the timed ones find them cached.
        engine.decide(&request)?;
        for _ in 0..3 {
            let t0 = Instant::now();
            let mut staged = engine.stage_decision(&request)?;
            let t1 = Instant::now();
            let rows = staged.take_rows();
            let outputs = engine.forward_rows(&rows)?;
            let t2 = Instant::now();
            staged.finish(outputs)?;
            let t3 = Instant::now();
            engine.decide(&request)?;
            let t4 = Instant::now();
            println!(
                "{tools} tools: stage {:.2} ms, forward {:.2} ms ({} rows), finish {:.2} ms; \
                 decide {:.2} ms",
                ms(t0, t1),
                ms(t1, t2),
                rows.len(),
                ms(t2, t3),
                ms(t3, t4)
            );
        }
    }
    Ok(())
}

fn ms(from: Instant, to: Instant) -> f64 {
    (to - from).as_secs_f64() * 1e3
}
