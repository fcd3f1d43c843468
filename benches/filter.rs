//! One tool selection with the default model: a 10-message conversation against 10, 100 and
//! 1,000 tools, through `FilteringToolProvider` as an agent calls it. Tool embeddings are cached
//! after the first call, as they are in a running agent.
//!
//! `cargo bench -p decide-filter --bench filter` (after `models/fetch`).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use decide_chat::{ChatMessage, StaticToolProvider, ToolProviderRequest, ToolSpecification};
use decide_engine::Engine;
use decide_filter::FilteringToolProvider;

const TOPICS: &[&str] = &[
    "weather forecasts",
    "calendar events",
    "email messages",
    "files on disk",
    "GitHub issues",
    "Slack channels",
    "SQL databases",
    "web pages",
    "maps and directions",
    "music playback",
];

fn tools(n: usize) -> Vec<ToolSpecification> {
    (0..n)
        .map(|i| {
            let topic = TOPICS[i % TOPICS.len()];
            ToolSpecification::new(format!("tool_{i}")).with_description(format!(
                "Operation {i} on {topic}: lists, reads or updates {topic} for the user"
            ))
        })
        .collect()
}

fn conversation() -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::system(
        "You are a helpful assistant with tools.",
    )];
    for i in 0..4 {
        messages.push(ChatMessage::user(format!(
            "Question {i}: what is on my calendar this week?"
        )));
        messages.push(ChatMessage::assistant(format!(
            "Answer {i}: you have three meetings."
        )));
    }
    messages.push(ChatMessage::user("And will it rain in Paris on Friday?"));
    messages
}

fn selection(c: &mut Criterion) {
    let engine = Engine::builder()
        .build()
        .expect("the default model (run models/fetch)");
    let messages = conversation();
    let user = match messages.last() {
        Some(ChatMessage::User(u)) => u.clone(),
        _ => unreachable!("the conversation ends with a user message"),
    };
    let request = ToolProviderRequest::builder(user)
        .messages(messages.clone())
        .build();
    let mut group = c.benchmark_group("select");
    group.sample_size(20);
    for n in [10usize, 100, 1000] {
        let filter = FilteringToolProvider::builder()
            .tool_provider(Arc::new(StaticToolProvider::from_specifications(tools(n))))
            .decision_model(Arc::new(engine.clone()))
            .build()
            .expect("filter");
        // Warm the embedding cache, as the first call of an agent does.
        filter.select(&request).expect("selection");
        group.bench_with_input(BenchmarkId::new("tools", n), &n, |b, _| {
            b.iter(|| filter.select(&request).expect("selection"))
        });
    }
    group.finish();
}

criterion_group!(benches, selection);
criterion_main!(benches);
