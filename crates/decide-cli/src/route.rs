//! `decide route`: which route a conversation takes, through the same router a routing chat model uses.
//!
//! The chat models behind the routes are not needed to choose one, so the command asks the router directly and
//! reports every route's probability.

use std::io::Write;
use std::time::Instant;

use anyhow::{anyhow, Context};
use decide_router::{RouteDecision, RouteReason, RouteRequest};

use crate::args::{Global, RouteArgs};
use crate::filtering::printable;
use crate::input::{read_conversation, read_routes};

/// Why the route was taken, for the table; `None` when the model chose it.
fn reason_note(decision: &RouteDecision, min_probability: Option<f64>) -> Option<String> {
    match &decision.reason {
        RouteReason::Chosen => None,
        RouteReason::OnlyCandidate => Some("the only route".into()),
        RouteReason::NoUserMessage => Some("default route: no user message".into()),
        RouteReason::BelowMinProbability => Some(format!(
            "default route: no route reaches --min-probability {}",
            min_probability.unwrap_or_default()
        )),
        RouteReason::Fallback { error } => Some(format!("default route: {error}")),
    }
}

pub fn run(global: &Global, args: RouteArgs) -> anyhow::Result<()> {
    let routes = read_routes(&args.routes)?;
    let (messages, source) = read_conversation(args.messages.as_deref(), args.text.as_deref())?;
    let request = RouteRequest::new(
        messages,
        routes,
        Some(args.max_messages),
        args.min_probability,
    )
    .map_err(|e| anyhow!("{source}: {e}"))?;
    let engine = global.decider(false)?;
    let router = request
        .router(engine.decision_model())
        .map_err(|e| anyhow!("--{}", e.to_string().replace('_', "-")))?;
    let routes = request.routes.routes();
    let started = Instant::now();
    let decision = router
        .decide(&request.routing_request())
        .with_context(|| source.clone())?;
    let elapsed = started.elapsed();
    let response = request.response(&decision);
    let chosen = response.route.as_str();
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&response)?)?;
        return Ok(());
    }
    let about = engine.about();
    writeln!(
        out,
        "route: {} ({} on {}, {:.1} ms)",
        printable(chosen),
        about.name,
        about.device,
        elapsed.as_secs_f64() * 1000.0
    )?;
    if let Some(note) = reason_note(&decision, args.min_probability) {
        writeln!(out, "{note}")?;
    }
    let width = routes
        .iter()
        .map(|r| printable(r.name()).chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    writeln!(out, "  {:<width$}  probability", "route")?;
    let mut rows: Vec<(&str, Option<f64>)> = routes
        .iter()
        .map(|r| (r.name(), decision.probability(r.name())))
        .collect();
    // Most probable first; routes without a probability keep the file's order after them.
    rows.sort_by(|a, b| b.1.unwrap_or(-1.0).total_cmp(&a.1.unwrap_or(-1.0)));
    for (name, probability) in rows {
        let mark = if name == chosen { '*' } else { ' ' };
        let name = printable(name);
        match probability {
            Some(p) => writeln!(out, "{mark} {name:<width$}  {p:.3}")?,
            None => writeln!(out, "{mark} {name:<width$}  -")?,
        }
    }
    Ok(())
}
