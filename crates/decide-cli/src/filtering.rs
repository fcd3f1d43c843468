//! What the commands share: the tool filter as the command line sets it up, the conversation
//! it is asked about, and how names and progress show on a terminal. Commands import these, not
//! each other.

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::{bail, Context};
use decide_chat::{ChatMessage, StaticToolProvider, ToolProviderRequest, ToolSpecification};
use decide_filter::{FilterOptions, FilteringToolProvider, Selection};

use crate::args::FilterArgs;
use crate::decider::Decider;
use crate::input::Case;

/// The filter's options as the command line gives them.
pub fn options(args: &FilterArgs) -> FilterOptions {
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

/// Runs the filter on a conversation; the selection reports every tool, in the catalogue's order.
pub fn select(
    filter: &FilteringToolProvider,
    messages: &[ChatMessage],
) -> anyhow::Result<Selection> {
    Ok(filter.select(&provider_request(messages)?)?)
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

/// A progress bar on stderr when it is a terminal, hidden otherwise.
pub fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// The raw score of every tool of `case` and whether it is in `expected`, in catalogue order,
/// from the requests the filter would send, so a fit sees exactly the scores decisions are made
/// on. `at` names the case in errors.
pub fn case_pairs(
    model: &Decider,
    case: &Case,
    expected: &[String],
    filter: &FilterArgs,
    at: &str,
) -> anyhow::Result<Vec<(f64, bool)>> {
    let provider = build_filter(model, case.tools.clone(), filter)?;
    let request = provider_request(&case.messages).with_context(|| at.to_string())?;
    let Some(input) = provider.decision_input(&request) else {
        bail!("{at}: the user message has no text");
    };
    let tools: Vec<&ToolSpecification> = case.tools.iter().collect();
    let mut raw = Vec::with_capacity(tools.len());
    for decision in provider.decision_requests(&input, &tools)? {
        raw.extend(model.yes_no_scores(&decision)?.into_iter().map(|(_, s)| s));
    }
    Ok(case
        .tools
        .iter()
        .zip(raw)
        .map(|(tool, s)| (s, expected.contains(&tool.name)))
        .collect())
}
