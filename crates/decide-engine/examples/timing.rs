//! Times the phases of one decision (a 10-message conversation against 100 and 1,000 tools
//! whose embeddings are cached): `cargo run --release -p decide-engine --example timing`.
//! Staging (planning, tokenizing, cache lookups, BM25), the forward pass, finishing (cosines,
//! answers) and the whole `decide` call with the contract's validation.

use std::time::Instant;

use decide_contract::{DecisionInput, DecisionModel, DecisionRequest, YesNoQuestion};
use decide_engine::Engine;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let engine = Engine::builder().build()?;
    println!(
        "load: {:.1} ms ({})",
        ms(started, Instant::now()),
        engine.kernels()
    );
    let topics = [
        "book a table for four tomorrow evening",
        "what is the weather in Lisbon this weekend",
        "send the quarterly report to Ana and cc the finance team",
        "find the cheapest flight from Berlin to Porto in March",
        "summarize the open issues in the decide repository",
    ];
    let messages: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            serde_json::json!({"role": role, "text": format!("{} (message {i})", topics[i % 5])})
        })
        .collect();
    let mut fields = serde_json::Map::new();
    fields.insert("messages".into(), serde_json::Value::Array(messages));
    let input = DecisionInput::Fields(fields);
    for tools in [100usize, 1000] {
        let mut builder = DecisionRequest::builder().input(input.clone());
        for i in 0..tools {
            let question = YesNoQuestion::builder("Does the conversation need this tool?")
                .candidate(
                    format!("tool_{i}"),
                    format!("Performs operation {i} of service {} for the user", i % 37),
                )
                .build()?;
            builder = builder.question(format!("tool{i}"), question);
        }
        let request = builder.build()?;
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
