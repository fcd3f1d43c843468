//! `decide select`: which tools a conversation needs, through the same filter an agent uses.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use crate::decider::Decider;
use anyhow::{bail, Context};
use decide_chat::{ChatMessage, StaticToolProvider, ToolProviderRequest, ToolSpecification};
use decide_filter::{FilterOptions, FilteringToolProvider, Selection};
use serde::Serialize;

use crate::args::{FilterArgs, Global, SelectArgs};
use crate::input::{read_conversation, read_tools};

/// A tool, its probability of being needed (none when it passed without asking) and why it
/// passed or not.
#[derive(Debug, Clone, Serialize)]
pub struct Scored {
    pub name: String,
    pub probability: Option<f64>,
    pub reason: decide_filter::Reason,
    #[serde(skip)]
    pub passed: bool,
}

/// The filter's options as the command line gives them.
fn options(args: &FilterArgs) -> FilterOptions {
    FilterOptions {
        min_probability: args.min_probability,
        target_recall: args.target_recall,
        max_results: args.max_results,
        max_messages: Some(args.max_messages),
        max_message_length: Some(args.max_message_length),
        always_include: args.always_include.clone(),
        fallback: Some(args.fallback),
        needs_tool_gate: args.needs_tool_gate,
    }
}

/// The filter over a fixed list of tools, answered by `engine`.
pub fn build_filter(
    engine: &Decider,
    tools: Vec<ToolSpecification>,
    args: &FilterArgs,
) -> anyhow::Result<FilteringToolProvider> {
    build_filter_scoring(engine, tools, args, false)
}

/// [`build_filter`], with `score_called` asking the model about the tools the conversation
/// already called too (they pass either way): what `eval` measures.
pub fn build_filter_scoring(
    engine: &Decider,
    tools: Vec<ToolSpecification>,
    args: &FilterArgs,
    score_called: bool,
) -> anyhow::Result<FilteringToolProvider> {
    if args.min_probability.is_some() && args.target_recall.is_some() {
        bail!("--target-recall: replaces --min-probability: give one of them, not both")
    }
    let opts = options(args);
    opts.check_always_include(&tools).map_err(|e| match e {
        decide_filter::FilterError::InvalidConfig { message, .. } => {
            anyhow::anyhow!("--always-include: {message}")
        }
        other => other.into(),
    })?;
    let builder = FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::from_specifications(tools)))
        .decision_model(engine.decision_model())
        .score_called_tools(score_called);
    if args.needs_tool_gate == Some(true) && args.target_recall.is_some() {
        bail!("--needs-tool-gate: cannot be combined with --target-recall, whose recall is promised for one threshold")
    }
    opts.apply(builder)
        .and_then(|b| b.build())
        .map_err(option_error)
}

/// A filter option's error as the command line names the option (`--target-recall: ...`).
pub fn option_error(error: decide_filter::FilterError) -> anyhow::Error {
    match error {
        decide_filter::FilterError::InvalidConfig { option, message } => {
            anyhow::anyhow!("--{}: {message}", option.replace('_', "-"))
        }
        other => other.into(),
    }
}

/// The request an agent would make for this conversation: its last user message, with
/// everything before it (and any tool traffic after it) as the previous messages.
pub fn provider_request(messages: &[ChatMessage]) -> anyhow::Result<ToolProviderRequest> {
    let request = decide_filter::provider_request(messages)
        .ok_or_else(|| anyhow::anyhow!("the conversation has no user message"))?;
    // As a blank TEXT is: with nothing to decide on, the filter would pass every tool.
    if request.user_message().text().trim().is_empty() {
        bail!("the last user message is blank");
    }
    Ok(request)
}

/// Runs the filter and reports every tool, in the catalogue's order.
pub fn select(
    filter: &FilteringToolProvider,
    messages: &[ChatMessage],
) -> anyhow::Result<(Selection, Vec<Scored>)> {
    let selection = filter.select(&provider_request(messages)?)?;
    let scored = selection
        .decisions
        .iter()
        .map(|d| Scored {
            name: d.name.clone(),
            probability: d.probability,
            reason: d.reason,
            passed: d.passed,
        })
        .collect();
    Ok((selection, scored))
}

/// A name as a terminal shows it safely: control characters (escape sequences that could
/// recolour, move the cursor or retitle the window) are printed as `\u{1b}`-style escapes.
pub fn printable(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// How a reason reads in the table: the same words as in the JSON.
fn reason_label(reason: decide_filter::Reason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

pub fn run(global: &Global, args: SelectArgs) -> anyhow::Result<()> {
    let tools = read_tools(&args.tools)?;
    let (messages, source) = read_conversation(args.messages.as_deref(), args.text.as_deref())?;
    let engine = global.decider(false)?;
    let filter = build_filter(&engine, tools, &args.filter)?;
    let started = Instant::now();
    let (selection, scores) = select(&filter, &messages).context(source)?;
    let elapsed = started.elapsed();
    let chosen: Vec<&Scored> = scores.iter().filter(|s| s.passed).collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut json = serde_json::json!({ "selected": chosen, "scores": scores });
        if let Some(f) = &selection.fallback {
            json["fallback"] = serde_json::json!({ "strategy": f.strategy, "reason": f.reason });
        }
        if let Some(g) = &selection.gate {
            json["needs_tool"] = serde_json::to_value(g)?;
        }
        writeln!(out, "{json}")?;
        return Ok(());
    }
    let threshold = match (filter.target_recall(), filter.companion_min_probability()) {
        (Some(r), _) => format!(
            "target recall {r}: min probability {}",
            filter.min_probability()
        ),
        (None, Some(companion)) => format!(
            "needs a tool at {}, then tools from {companion}",
            filter.min_probability()
        ),
        (None, None) => format!("min probability {}", filter.min_probability()),
    };
    writeln!(
        out,
        "{} of {} tools selected ({threshold}, {} on {}, {:.1} ms)",
        chosen.len(),
        scores.len(),
        engine.name(),
        engine.device_name(),
        elapsed.as_secs_f64() * 1000.0
    )?;
    if let Some(f) = &selection.fallback {
        writeln!(out, "fallback {}: {}", f.strategy, f.reason)?;
    }
    if let Some(g) = &selection.gate {
        let head = match g.answer {
            Some(p) => format!("head {p:.3}"),
            None => "no needs-tool head".to_string(),
        };
        writeln!(
            out,
            "needs a tool: {:.3} ({head}, with the best tool), {}",
            g.probability,
            if g.open { "yes" } else { "no" }
        )?;
    }
    let width = scores
        .iter()
        .map(|s| printable(&s.name).chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(out, "  {:<width$}  probability", "tool")?;
    let mut ranked: Vec<&Scored> = scores.iter().collect();
    ranked.sort_by(|a, b| {
        b.passed.cmp(&a.passed).then(
            b.probability
                .unwrap_or(2.0)
                .total_cmp(&a.probability.unwrap_or(2.0)),
        )
    });
    for s in ranked {
        let mark = if s.passed { '*' } else { ' ' };
        match s.probability {
            Some(p) => writeln!(out, "{mark} {:<width$}  {p:.3}", printable(&s.name))?,
            None => writeln!(
                out,
                "{mark} {:<width$}  ({})",
                printable(&s.name),
                reason_label(s.reason)
            )?,
        }
    }
    Ok(())
}
