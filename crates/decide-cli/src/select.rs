//! `decide select`: which tools a conversation needs, through the same filter an agent uses.

use std::io::Write;
use std::time::Instant;

use anyhow::anyhow;
use decide_chat::ParseError;
use decide_filter::{
    FilteringToolProvider, SelectRequest, SelectResponse, Selection, ToolDecision,
};

use crate::args::{Global, SelectArgs};
use crate::filtering::{build_filter, options, printable};
use crate::input::{read_conversation, read_tools};

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
    let request =
        SelectRequest::new(&messages, tools, options(&args.filter)).map_err(|e| match e {
            // The options are flags here, the conversation a file or TEXT.
            ParseError::Invalid { path, message } if path == "always_include" => {
                anyhow!("--always-include: {message}")
            }
            other => anyhow!("{source}: {other}"),
        })?;
    let engine = global.decider(false)?;
    let filter = build_filter(&engine, request.tools.clone(), &args.filter)?;
    let started = Instant::now();
    let selection = filter.select(&request.request)?;
    let elapsed = started.elapsed();
    let response = SelectResponse::from(&selection);
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&response)?)?;
        return Ok(());
    }
    let about = engine.about();
    let summary = format!(
        "{} of {} tools selected ({}, {} on {}, {:.1} ms)",
        response.selected.len(),
        response.scores.len(),
        rule(&filter),
        about.name,
        about.device,
        elapsed.as_secs_f64() * 1000.0
    );
    print_table(&mut out, &summary, &selection)
}

/// The selection rule in force, in words.
fn rule(filter: &FilteringToolProvider) -> String {
    match (filter.target_recall(), filter.companion_min_probability()) {
        (Some(r), _) => format!(
            "target recall {r}: min probability {}",
            filter.min_probability()
        ),
        (None, Some(companion)) => format!(
            "needs a tool at {}, then tools from {companion} or {} of the best among the first {}",
            filter.min_probability(),
            decide_contract::COMPANION_SHARE,
            decide_contract::COMPANION_RANKS
        ),
        (None, None) => format!("min probability {}", filter.min_probability()),
    }
}

/// The selection as a table: passed tools first, then by probability.
fn print_table(out: &mut impl Write, summary: &str, selection: &Selection) -> anyhow::Result<()> {
    writeln!(out, "{summary}")?;
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
    let width = selection
        .decisions
        .iter()
        .map(|s| printable(&s.name).chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(out, "  {:<width$}  probability", "tool")?;
    let mut ranked: Vec<&ToolDecision> = selection.decisions.iter().collect();
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
