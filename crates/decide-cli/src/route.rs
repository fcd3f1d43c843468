//! `decide route`: which route a conversation takes, through the same router a routing chat model uses.
//!
//! The chat models behind the routes are not needed to choose one, so the command asks the router directly and
//! reports every route's probability.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use decide_chat::{ChatMessage, ChatRequest};
use decide_router::{
    validate_option_names, ChatModelRoute, ChatModelRoutingRequest, DecisionModelChatModelRouter,
    Fallback, RouteDecision, RouteReason,
};
use serde_json::{Map, Value};

use crate::args::{Global, RouteArgs};
use crate::input::{read_json, read_messages};

/// A routes file: the routes, in order, and the default route.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    pub default: String,
    pub routes: Vec<ChatModelRoute>,
}

/// Reads a routes file; every error names the file and the JSON path, e.g. `routes.json: routes[2].name: missing`.
pub fn read_routes(path: &Path) -> anyhow::Result<Routes> {
    let json = read_json(path)?;
    let routes = parse_routes(&json).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    // The router would reject these at the first request; say so before the model is loaded.
    validate_option_names(&routes.routes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(routes)
}

/// `{"default": NAME, "routes": [{"name", "description"?, "descriptions"?}]}`; unknown fields are refused, because a
/// misspelt `"descriptions"` would otherwise silently describe a route by its name.
pub fn parse_routes(json: &Value) -> Result<Routes, String> {
    let Value::Object(top) = json else {
        return Err(format!(
            "expected an object {{\"default\", \"routes\"}}, got {}",
            type_name(json)
        ));
    };
    refuse_unknown(top, "", &["default", "routes"])?;
    let items = match top.get("routes") {
        None | Some(Value::Null) => return Err("routes: missing".into()),
        Some(Value::Array(items)) if items.is_empty() => return Err("routes: empty".into()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(format!(
                "routes: expected an array, got {}",
                type_name(other)
            ))
        }
    };
    let mut routes: Vec<ChatModelRoute> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("routes[{i}]");
        let Value::Object(route) = item else {
            return Err(format!("{at}: expected an object, got {}", type_name(item)));
        };
        refuse_unknown(
            route,
            &format!("{at}."),
            &["name", "description", "descriptions"],
        )?;
        let name = match route.get("name") {
            None | Some(Value::Null) => return Err(format!("{at}.name: missing")),
            Some(Value::String(name)) if name.trim().is_empty() => {
                return Err(format!("{at}.name: blank"))
            }
            Some(Value::String(name)) => name.clone(),
            Some(other) => {
                return Err(format!(
                    "{at}.name: expected a string, got {}",
                    type_name(other)
                ))
            }
        };
        if routes.iter().any(|r| r.name() == name) {
            return Err(format!("{at}.name: duplicate route name {name:?}"));
        }
        let description = optional_text(route.get("description"), &format!("{at}.description"))?;
        let descriptions = match route.get("descriptions") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(j, d)| {
                        optional_text(Some(d), &format!("{at}.descriptions[{j}]"))?.ok_or_else(
                            || format!("{at}.descriptions[{j}]: expected a string, got null"),
                        )
                    })
                    .collect::<Result<Vec<String>, String>>()?,
            ),
            Some(other) => {
                return Err(format!(
                    "{at}.descriptions: expected an array of strings, got {}",
                    type_name(other)
                ))
            }
        };
        routes.push(match (description, descriptions) {
            (Some(_), Some(_)) => {
                return Err(format!("{at}: give description or descriptions, not both"))
            }
            (Some(d), None) => ChatModelRoute::new(name, d),
            (None, Some(ds)) => ChatModelRoute::with_descriptions(name, ds),
            (None, None) => ChatModelRoute::without_description(name),
        });
    }
    let default = match top.get("default") {
        None | Some(Value::Null) => return Err("default: missing".into()),
        Some(Value::String(name)) => name.clone(),
        Some(other) => {
            return Err(format!(
                "default: expected a route name, got {}",
                type_name(other)
            ))
        }
    };
    if !routes.iter().any(|r| r.name() == default) {
        let names: Vec<&str> = routes.iter().map(ChatModelRoute::name).collect();
        return Err(format!(
            "default: {default:?} is not one of the routes {}",
            names.join(", ")
        ));
    }
    Ok(Routes { default, routes })
}

/// A string that must not be blank, or `None` when absent or null.
fn optional_text(value: Option<&Value>, at: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.trim().is_empty() => Err(format!("{at}: blank")),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(format!("{at}: expected a string, got {}", type_name(other))),
    }
}

fn refuse_unknown(object: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), String> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(format!(
            "{at}{key}: unknown field (expected {})",
            known.join(", ")
        )),
        None => Ok(()),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

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
    let messages = match (&args.messages, &args.text) {
        (Some(path), _) => read_messages(path)?,
        (None, Some(text)) if !text.trim().is_empty() => vec![ChatMessage::user(text.clone())],
        (None, Some(_)) => bail!("TEXT: empty message"),
        (None, None) => bail!("give the conversation with --messages FILE or as TEXT"),
    };
    let source = match &args.messages {
        Some(path) => path.display().to_string(),
        None => "TEXT".into(),
    };
    let request =
        ChatRequest::from_messages(messages).map_err(|_| anyhow!("{source}: no messages"))?;
    let engine = global.decider(false)?;
    let mut builder = DecisionModelChatModelRouter::builder()
        .decision_model(engine.decision_model())
        .max_messages(args.max_messages)
        // A command run to see the decision must show the model's error, not hide it behind the default route.
        .fallback(Fallback::Fail);
    if let Some(p) = args.min_probability {
        builder = builder.min_probability(p);
    }
    let router = builder
        .build()
        .map_err(|e| anyhow!("--{}", e.to_string().replace('_', "-")))?;
    let started = Instant::now();
    let decision = router
        .decide(&ChatModelRoutingRequest::new(
            &request,
            routes.routes.clone(),
        ))
        .with_context(|| source.clone())?;
    let elapsed = started.elapsed();
    let chosen = decision.result.route_name().unwrap_or(&routes.default);
    let mut out = std::io::stdout().lock();
    if args.json {
        let probabilities: Map<String, Value> = decision
            .probabilities
            .iter()
            .map(|(name, p)| (name.clone(), Value::from(*p)))
            .collect();
        let json = serde_json::json!({"route": chosen, "probabilities": probabilities});
        writeln!(out, "{json}")?;
        return Ok(());
    }
    writeln!(
        out,
        "route: {chosen} ({} on {}, {:.1} ms)",
        engine.name(),
        engine.device_name(),
        elapsed.as_secs_f64() * 1000.0
    )?;
    if let Some(note) = reason_note(&decision, args.min_probability) {
        writeln!(out, "{note}")?;
    }
    let width = routes
        .routes
        .iter()
        .map(|r| r.name().chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    writeln!(out, "  {:<width$}  probability", "route")?;
    let mut rows: Vec<(&str, Option<f64>)> = routes
        .routes
        .iter()
        .map(|r| (r.name(), decision.probability(r.name())))
        .collect();
    // Most probable first; routes without a probability keep the file's order after them.
    rows.sort_by(|a, b| b.1.unwrap_or(-1.0).total_cmp(&a.1.unwrap_or(-1.0)));
    for (name, probability) in rows {
        let mark = if name == chosen { '*' } else { ' ' };
        match probability {
            Some(p) => writeln!(out, "{mark} {name:<width$}  {p:.3}")?,
            None => writeln!(out, "{mark} {name:<width$}  -")?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn error(json: Value) -> String {
        parse_routes(&json).unwrap_err()
    }

    #[test]
    fn a_routes_file_is_read_in_order() {
        let routes = parse_routes(&json!({
            "default": "simple",
            "routes": [
                {"name": "simple", "description": "Small talk"},
                {"name": "code", "descriptions": ["Code", "Scripts"]},
                {"name": "bare"}
            ]
        }))
        .unwrap();
        assert_eq!(routes.default, "simple");
        assert_eq!(
            routes.routes,
            [
                ChatModelRoute::new("simple", "Small talk"),
                ChatModelRoute::with_descriptions("code", ["Code", "Scripts"]),
                ChatModelRoute::without_description("bare"),
            ]
        );
    }

    #[test]
    fn errors_name_the_field() {
        let route = |r: Value| json!({"default": "a", "routes": [{"name": "a"}, r]});
        assert_eq!(
            error(route(json!({"description": "x"}))),
            "routes[1].name: missing"
        );
        assert_eq!(
            error(route(json!({"name": 3}))),
            "routes[1].name: expected a string, got a number"
        );
        assert_eq!(error(route(json!({"name": " "}))), "routes[1].name: blank");
        assert_eq!(
            error(route(json!({"name": "a"}))),
            "routes[1].name: duplicate route name \"a\""
        );
        assert_eq!(
            error(route(json!({"name": "b", "descripton": "x"}))),
            "routes[1].descripton: unknown field (expected name, description, descriptions)"
        );
        assert_eq!(
            error(route(json!({"name": "b", "description": ""}))),
            "routes[1].description: blank"
        );
        assert_eq!(
            error(route(json!({"name": "b", "descriptions": "x"}))),
            "routes[1].descriptions: expected an array of strings, got a string"
        );
        assert_eq!(
            error(route(json!({"name": "b", "descriptions": ["x", 1]}))),
            "routes[1].descriptions[1]: expected a string, got a number"
        );
        assert_eq!(
            error(route(
                json!({"name": "b", "description": "x", "descriptions": ["y"]})
            )),
            "routes[1]: give description or descriptions, not both"
        );
        assert_eq!(
            error(route(json!("b"))),
            "routes[1]: expected an object, got a string"
        );
        assert_eq!(
            error(json!({"routes": [{"name": "a"}]})),
            "default: missing"
        );
        assert_eq!(
            error(json!({"default": "z", "routes": [{"name": "a"}, {"name": "b"}]})),
            "default: \"z\" is not one of the routes a, b"
        );
        assert_eq!(error(json!({"default": "a"})), "routes: missing");
        assert_eq!(
            error(json!({"default": "a", "routes": []})),
            "routes: empty"
        );
        assert_eq!(
            error(json!({"default": "a", "routes": [], "extra": 1})),
            "extra: unknown field (expected default, routes)"
        );
        assert!(error(json!([])).starts_with("expected an object"));
    }
}
