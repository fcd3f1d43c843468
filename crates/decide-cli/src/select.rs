//! `decide select`: which tools a conversation needs.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context};
use decide_chat::{
    decision_fields, decision_messages, ChatMessage, RenderOptions, ToolSpecification,
};
use decide_contract::{DecisionInput, DecisionModel, DecisionRequest, YesNoQuestion};
use decide_engine::Engine;
use serde::Serialize;

use crate::args::{Global, SelectArgs};
use crate::input::{read_messages, read_tools};

/// The question asked of each tool; the engine scores the tool itself, carried as the
/// question's candidate.
pub const TOOL_QUESTION: &str = "Would this tool help to handle the request?";
/// How many of the latest messages the decision sees (system messages come on top).
pub const MAX_MESSAGES: usize = 10;
/// Messages longer than this many characters are shortened (start and end kept).
pub const MAX_MESSAGE_LENGTH: usize = 2000;

/// A tool and its probability of being needed.
#[derive(Debug, Clone, Serialize)]
pub struct Scored {
    pub name: String,
    pub probability: f64,
}

/// The decision request for a conversation and its tools: the system messages and the latest
/// [`MAX_MESSAGES`] others, tool calls and results included, as the input; one yes/no question
/// per tool (`tool0`, `tool1`, …) carrying the tool as its candidate.
pub fn tool_request(
    messages: &[ChatMessage],
    tools: &[ToolSpecification],
) -> anyhow::Result<DecisionRequest> {
    let options = RenderOptions {
        include_system: true,
        include_tools: true,
        max_message_length: Some(MAX_MESSAGE_LENGTH),
    };
    let others = messages
        .iter()
        .filter(|m| !matches!(m, ChatMessage::System(_)))
        .count();
    let skip = others.saturating_sub(MAX_MESSAGES);
    let mut seen = 0;
    let window: Vec<ChatMessage> = messages
        .iter()
        .filter(|m| {
            if matches!(m, ChatMessage::System(_)) {
                return true;
            }
            seen += 1;
            seen > skip
        })
        .cloned()
        .collect();
    let rendered = decision_messages(&window, &options);
    if !rendered.iter().any(|m| m.role == "user") {
        bail!("the conversation has no user message with text");
    }
    let mut request =
        DecisionRequest::builder().input(DecisionInput::Fields(decision_fields(&rendered)));
    for (i, tool) in tools.iter().enumerate() {
        let question = YesNoQuestion::builder(TOOL_QUESTION)
            .candidate(
                tool.name.clone(),
                tool.description.clone().unwrap_or_default(),
            )
            .build()
            .with_context(|| format!("tool '{}'", tool.name))?;
        request = request.question(format!("tool{i}"), question);
    }
    Ok(request.build()?)
}

/// The probability of each tool (in the tools' order) for a conversation, answered by the
/// engine through the `DecisionModel` contract in one batched call.
pub fn score_tools(
    engine: &Engine,
    messages: &[ChatMessage],
    tools: &[ToolSpecification],
) -> anyhow::Result<Vec<Scored>> {
    let request = tool_request(messages, tools)?;
    let response = engine.decide(&request)?;
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            Ok(Scored {
                name: tool.name.clone(),
                probability: response.yes_no(&format!("tool{i}"))?.probability(),
            })
        })
        .collect()
}

/// The tools that pass: probability at least `min_probability`, the `max_results` most
/// probable, in the tools' own order.
pub fn selected(
    scores: &[Scored],
    min_probability: f64,
    max_results: Option<usize>,
) -> Vec<Scored> {
    let mut passing: Vec<(usize, &Scored)> = scores
        .iter()
        .enumerate()
        .filter(|(_, s)| s.probability >= min_probability)
        .collect();
    if let Some(k) = max_results {
        passing.sort_by(|a, b| {
            b.1.probability
                .total_cmp(&a.1.probability)
                .then(a.0.cmp(&b.0))
        });
        passing.truncate(k);
        passing.sort_by_key(|(i, _)| *i);
    }
    passing.into_iter().map(|(_, s)| s.clone()).collect()
}

pub fn run(global: &Global, args: SelectArgs) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.min_probability) {
        bail!(
            "--min-probability: {} is not between 0 and 1",
            args.min_probability
        );
    }
    if args.max_results == Some(0) {
        bail!("--max-results: must be at least 1");
    }
    let tools = read_tools(&args.tools)?;
    let messages = match (&args.messages, &args.text) {
        (Some(path), _) => read_messages(path)?,
        (None, Some(text)) if !text.trim().is_empty() => vec![ChatMessage::user(text.clone())],
        (None, Some(_)) => bail!("TEXT: empty message"),
        (None, None) => bail!("give the conversation with --messages FILE or as TEXT"),
    };
    let engine = global.engine(false)?;
    let started = Instant::now();
    let scores = score_tools(&engine, &messages, &tools).with_context(|| match &args.messages {
        Some(p) => p.display().to_string(),
        None => "TEXT".into(),
    })?;
    let elapsed = started.elapsed();
    let chosen = selected(&scores, args.min_probability, args.max_results);
    let mut out = std::io::stdout().lock();
    if args.json {
        let json = serde_json::json!({ "selected": chosen, "scores": scores });
        writeln!(out, "{json}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{} of {} tools selected (min probability {}, {} on {}, {:.1} ms)",
        chosen.len(),
        scores.len(),
        args.min_probability,
        engine.info().name,
        engine.info().device,
        elapsed.as_secs_f64() * 1000.0
    )?;
    let width = scores
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(out, "  {:<width$}  probability", "tool")?;
    let mut ranked: Vec<&Scored> = scores.iter().collect();
    ranked.sort_by(|a, b| b.probability.total_cmp(&a.probability));
    for s in ranked {
        let mark = if chosen.iter().any(|c| c.name == s.name) {
            '*'
        } else {
            ' '
        };
        writeln!(out, "{mark} {:<width$}  {:.3}", s.name, s.probability)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, p: f64) -> Scored {
        Scored {
            name: name.into(),
            probability: p,
        }
    }

    #[test]
    fn threshold_is_inclusive_and_order_is_kept() {
        let scores = [s("a", 0.2), s("b", 0.5), s("c", 0.9), s("d", 0.7)];
        let names: Vec<String> = selected(&scores, 0.5, None)
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["b", "c", "d"]);
    }

    #[test]
    fn max_results_keeps_the_most_probable_in_original_order() {
        let scores = [s("a", 0.6), s("b", 0.5), s("c", 0.9), s("d", 0.7)];
        let names: Vec<String> = selected(&scores, 0.5, Some(2))
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["c", "d"]);
    }
}
