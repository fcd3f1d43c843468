//! Times the phases of one decision: `cargo run --release -p decide-engine --example timing`.

use std::time::Instant;

use decide_engine::Engine;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let engine = Engine::builder().build()?;
    println!("load: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    let tools: Vec<String> = (0..27)
        .map(|i| format!("tool_{i}: does task {i} for the user"))
        .collect();
    let refs: Vec<&str> = tools.iter().map(String::as_str).collect();
    let query = "user: what is the weather like in Paris today? ".repeat(6);
    for round in 0..3 {
        let t = Instant::now();
        let s = engine.score(&query, &refs)?;
        println!(
            "round {round}: {:.1} ms, {} tokens",
            t.elapsed().as_secs_f64() * 1e3,
            s.tokens
        );
    }
    for (batch, tokens) in [(1, 64), (1, 256), (8, 128), (32, 128)] {
        let t = Instant::now();
        engine.forward_synthetic(batch, tokens)?;
        println!(
            "forward {batch}x{tokens}: {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
