//! An agent whose tools and model are chosen per call by the local decision model: the tool filter in front of a
//! tool provider, the model router in front of two OpenAI-compatible models.
//!
//! ```text
//! DECIDE_BASE_URL=http://localhost:11434/v1 DECIDE_MODEL=qwen2.5:7b \
//!   cargo run --release -p decide-llm --example agent -- 'How many words are in "the quick brown fox"?'
//! ```
//!
//! * `DECIDE_BASE_URL`: an OpenAI-compatible base URL (OpenAI, vLLM, llama.cpp, Ollama's `/v1`); required.
//! * `DECIDE_MODEL`: the model; `DECIDE_SMALL_MODEL` / `DECIDE_LARGE_MODEL` route simple and complex requests to
//!   different models (both default to `DECIDE_MODEL`).
//! * `DECIDE_API_KEY`: the API key, if the server wants one.
//! * `DECIDE_DECISION_MODEL`: the local decision model (default: the engine's default, `decide-tools-minilm`).
//!
//! It prints, for every LLM call, the route the router chose and the tools the call received.

use std::error::Error;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use decide_agent::{tool, tools, Agent, AgentRequest, Tool};
use decide_chat::{ChatModel, ProvidedTool, StaticToolProvider};
use decide_contract::DecisionModel;
use decide_engine::Engine;
use decide_filter::FilteringToolProvider;
use decide_llm::OpenAiChatModel;
use decide_router::{DecisionModelChatModelRouter, RoutingChatModel, ROUTE_ATTRIBUTE};

/// Always sent: configured on the agent, never filtered.
struct Calculator;

#[tools]
impl Calculator {
    #[tool("Calculates the sum of two numbers")]
    fn add(&self, a: f64, b: f64) -> f64 {
        a + b
    }

    #[tool("Calculates the square root of a number")]
    fn sqrt(&self, x: f64) -> Result<f64, String> {
        if x < 0.0 {
            return Err(format!("{x} is negative"));
        }
        Ok(x.sqrt())
    }
}

/// Counts the words of a text.
#[tool]
fn word_count(
    /** The text */
    text: String,
) -> usize {
    text.split_whitespace().count()
}

/// Reverses a text, character by character.
#[tool]
fn reverse_text(
    /** The text */
    text: String,
) -> String {
    text.chars().rev().collect()
}

/// The current time as seconds since the Unix epoch.
#[tool]
fn unix_time() -> Result<u64, String> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|e| e.to_string())
}

fn provided(tool: Tool) -> ProvidedTool {
    tool.into_provided().expect("a synchronous tool")
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn client(base_url: &str, model: &str) -> Result<Arc<dyn ChatModel>, Box<dyn Error>> {
    let mut builder = OpenAiChatModel::builder(base_url, model);
    if let Some(key) = env("DECIDE_API_KEY") {
        builder = builder.api_key(key);
    }
    Ok(Arc::new(builder.build()?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let base_url =
        env("DECIDE_BASE_URL").ok_or("set DECIDE_BASE_URL to an OpenAI-compatible base URL")?;
    let default_model = env("DECIDE_MODEL");
    let small = env("DECIDE_SMALL_MODEL")
        .or_else(|| default_model.clone())
        .ok_or("set DECIDE_MODEL")?;
    let large = env("DECIDE_LARGE_MODEL")
        .or(default_model)
        .unwrap_or_else(|| small.clone());
    let question = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let question = if question.trim().is_empty() {
        "What is the square root of the number of words in \"the quick brown fox jumps\"?"
            .to_owned()
    } else {
        question
    };

    let mut engine = Engine::builder();
    if let Some(model) = env("DECIDE_DECISION_MODEL") {
        engine = engine.model(model);
    }
    let decisions: Arc<dyn DecisionModel> = Arc::new(engine.build()?);

    let tools = StaticToolProvider::new(vec![
        provided(word_count_tool()),
        provided(reverse_text_tool()),
        provided(unix_time_tool()),
    ]);
    let filter = FilteringToolProvider::builder()
        .tool_provider(Arc::new(tools))
        .decision_model(Arc::clone(&decisions))
        .build()?;
    let router = RoutingChatModel::builder()
        .route(
            "simple",
            "Greetings, small talk, short factual questions",
            client(&base_url, &small)?,
        )
        .route(
            "complex",
            "Calculations, multi-step reasoning, using tools",
            client(&base_url, &large)?,
        )
        .router(Arc::new(DecisionModelChatModelRouter::new(decisions)))
        .default_route("complex")
        .build()?;
    let agent = Agent::builder(Arc::new(router))
        .system_message("You are a helpful assistant. Use the tools for every calculation.")
        .tool_box(Arc::new(Calculator))
        .tool_provider(Arc::new(filter))
        .temperature(0.0)
        .build()?;

    println!("> {question}");
    let response = agent.chat(AgentRequest::new(question)).await?;
    for (i, round) in response.rounds.iter().enumerate() {
        let route = round
            .response
            .attribute(ROUTE_ATTRIBUTE)
            .and_then(|v| v.as_str())
            .unwrap_or("?");
        println!(
            "call {}: route {route}, tools [{}]",
            i + 1,
            round.tools.join(", ")
        );
        for execution in &round.executions {
            println!(
                "  {}({}) = {}",
                execution.call.name, execution.call.arguments, execution.outcome.text
            );
        }
    }
    println!("{}", response.text);
    Ok(())
}
