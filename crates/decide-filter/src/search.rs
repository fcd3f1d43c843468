//! Tool search: the tools that fit a query, ranked by a decision model; and the answers the LLM providers expect from
//! a client-executed tool search (OpenAI Responses `tool_search` with `execution: "client"`, Anthropic's custom
//! tool search returning `tool_reference` blocks), so that an application answers the model's search locally.

use std::sync::Arc;

use decide_chat::{from_value, parse_tools_where};
use decide_chat::{
    ParseError, StaticToolProvider, ToolProviderRequest, ToolSpecification, UserMessage,
};
use decide_contract::{Conformal, DecisionModel};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::FilterError;
use crate::filter::FilteringToolProvider;
use crate::selection::{Fallback, Reason, Selection};

/// The number of tools a search returns when it does not say.
pub const DEFAULT_SEARCH_RESULTS: usize = 5;

/// A filter that ranks `tools` for a search: the best `max_results`, however low the model puts them, or with
/// `target_recall` the fewest (at most `max_results`) that keep that share of the needed ones. A search asks for a
/// ranking: the model is calibrated on what conversations need, and a bare query reads as less certain.
pub fn search_filter(
    tools: Vec<ToolSpecification>,
    decision_model: Arc<dyn DecisionModel>,
    max_results: usize,
    target_recall: Option<(f64, &Conformal)>,
) -> Result<FilteringToolProvider, FilterError> {
    let builder = FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::from_specifications(tools)))
        .decision_model(decision_model)
        .max_results(max_results)
        .fallback(Fallback::Fail);
    match target_recall {
        Some((recall, table)) => builder.target_recall(recall, table),
        None => builder.min_probability(0.0),
    }
    .build()
}

/// The tools a search found, best first, with their probabilities. Tools passed without asking (already called in
/// the conversation, always included) are left out: the caller has them.
pub fn ranked(selection: &Selection) -> Vec<(String, f64)> {
    let mut found: Vec<(String, f64)> = selection
        .decisions
        .iter()
        .filter(|d| d.passed && d.reason == Reason::Asked)
        .map(|d| (d.name.clone(), d.probability.unwrap_or(0.0)))
        .collect();
    found.sort_by(|a, b| b.1.total_cmp(&a.1));
    found
}

/// Whose tool search is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchProvider {
    /// OpenAI Responses: the model's `tool_search_call` item is answered with a `tool_search_output` item.
    OpenAi,
    /// Anthropic Messages: the model's `tool_use` of the application's search tool is answered with a
    /// `tool_result` block of `tool_reference` blocks.
    Anthropic,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchBody {
    provider: SearchProvider,
    #[serde(default)]
    call: Option<Value>,
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    max_results: Option<usize>,
    #[serde(default)]
    target_recall: Option<f64>,
}

/// A client-executed tool search as the model issued it: `{"provider": "openai" | "anthropic", "call": the model's
/// `tool_search_call` item or `tool_use` block (or "query": the text), "tools": the deferred tools (as sent to the
/// provider, or in any shape `parse_tools` reads; entries of hosted tool types are skipped), "max_results"?,
/// "target_recall"?}`.
#[derive(Debug, Clone)]
pub struct ToolSearchCall {
    /// Whose answer to give.
    pub provider: SearchProvider,
    /// The id the answer refers to: the `call_id` of OpenAI's `tool_search_call`, the `id` of Anthropic's
    /// `tool_use`.
    pub call_id: Option<String>,
    /// What the model searched for.
    pub query: String,
    /// The tool names the call asked to load, when it gave `paths` instead of a query (OpenAI's default client
    /// schema); empty otherwise. [`requested`](Self::requested) resolves them.
    pub paths: Vec<String>,
    /// The deferred function tools, as the request gave them (an OpenAI answer returns the matches unchanged); entries
    /// of other types are left out.
    pub tools: Vec<Value>,
    /// The same tools, read.
    pub specifications: Vec<ToolSpecification>,
    /// The most tools to return ([`DEFAULT_SEARCH_RESULTS`] when `None`).
    pub max_results: Option<usize>,
    /// The share of the needed tools the answer should hold (the decision model's conformal table).
    pub target_recall: Option<f64>,
}

/// The query of a call's arguments: their `query`, or else their text values joined; and the tool paths they name
/// when they have no `query` but `paths` (OpenAI's built-in client schema for `tool_search`, `{"paths": [...]}`,
/// names the tools to load rather than describing them).
fn query_of(arguments: &Value, path: &str) -> Result<(String, Vec<String>), ParseError> {
    let arguments = match arguments {
        // Responses items carry arguments as an object; function-call style JSON text is read too.
        Value::String(text) => serde_json::from_str(text)
            .map_err(|e| ParseError::invalid(path, format!("not JSON: {e}")))?,
        other => other.clone(),
    };
    let Value::Object(map) = &arguments else {
        return Err(ParseError::invalid(path, "expected an object"));
    };
    if let Some(query) = map.get("query").and_then(Value::as_str) {
        return Ok((query.to_owned(), Vec::new()));
    }
    let paths: Vec<String> = match map.get("paths") {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let words: Vec<String> = map
        .values()
        .flat_map(|v| match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(items) => items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    if words.is_empty() {
        return Err(ParseError::invalid(
            path,
            "no query (expected a \"query\" string)",
        ));
    }
    Ok((words.join(" "), paths))
}

/// Whether a `tools` entry is one the search reads: a function (`"type": "function"`, or no type, as Anthropic and MCP
/// write them). A real request's list also holds entries of the providers' other kinds: hosted tools such as OpenAI's
/// `{"type": "tool_search"}` or `{"type": "web_search"}`, Anthropic's `tool_search_tool_regex_20251119` or
/// `web_search_20250305`; they have no description to rank and cannot be loaded by a search, so they are skipped and
/// never returned. A namespace holds functions, and a custom tool is called by name like one: those are read (and
/// refused), rather than silently left out of every search.
fn searchable(entry: &Value) -> bool {
    match entry.get("type") {
        Some(Value::String(kind)) => matches!(kind.as_str(), "function" | "custom" | "namespace"),
        _ => true,
    }
}

fn string_field(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, ParseError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ParseError::invalid(
            format!("{path}.{key}"),
            "expected a string",
        )),
    }
}

impl ToolSearchCall {
    /// Reads a request body; unknown keys are refused and every error names its JSON path.
    pub fn from_value(json: Value) -> Result<Self, ParseError> {
        let body: SearchBody = from_value(json)?;
        let raw_tools = body
            .tools
            .ok_or_else(|| ParseError::invalid("tools", "missing"))?;
        let read = parse_tools_where(&raw_tools, searchable)?;
        let mut items = match raw_tools {
            Value::Array(items) => items,
            Value::Object(mut object) => match object.remove("tools") {
                Some(Value::Array(items)) => items,
                _ => return Err(ParseError::invalid("tools", "expected an array of tools")),
            },
            _ => return Err(ParseError::invalid("tools", "expected an array of tools")),
        };
        if read.is_empty() {
            let message = if items.is_empty() {
                "empty"
            } else {
                "no function tools (tools of other types are not searched)"
            };
            return Err(ParseError::invalid("tools", message));
        }
        // The raw entries stay beside the read ones, index for index: an OpenAI answer returns them unchanged.
        let (tools, specifications) = read
            .into_iter()
            .map(|(i, specification)| (std::mem::take(&mut items[i]), specification))
            .unzip();
        let (call_id, (query, paths)) = match (&body.call, body.query) {
            (Some(_), Some(_)) => {
                return Err(ParseError::invalid("query", "give call or query, not both"))
            }
            (None, None) => return Err(ParseError::invalid("call", "missing (or query)")),
            (None, Some(query)) => (None, (query, Vec::new())),
            (Some(Value::Object(call)), None) => match body.provider {
                SearchProvider::OpenAi => {
                    let arguments = call
                        .get("arguments")
                        .ok_or_else(|| ParseError::invalid("call.arguments", "missing"))?;
                    (
                        string_field(call, "call_id", "call")?,
                        query_of(arguments, "call.arguments")?,
                    )
                }
                SearchProvider::Anthropic => {
                    let input = call
                        .get("input")
                        .ok_or_else(|| ParseError::invalid("call.input", "missing"))?;
                    let id = string_field(call, "id", "call")?
                        .ok_or_else(|| ParseError::invalid("call.id", "missing"))?;
                    (Some(id), query_of(input, "call.input")?)
                }
            },
            (Some(_), None) => return Err(ParseError::invalid("call", "expected an object")),
        };
        if query.trim().is_empty() {
            return Err(ParseError::invalid(
                if body.call.is_some() { "call" } else { "query" },
                "empty query",
            ));
        }
        if body.provider == SearchProvider::Anthropic && call_id.is_none() {
            return Err(ParseError::invalid(
                "call",
                "missing: an Anthropic tool_result needs the tool_use block's id",
            ));
        }
        if body.max_results == Some(0) {
            return Err(ParseError::invalid("max_results", "must be at least 1"));
        }
        Ok(Self {
            provider: body.provider,
            call_id,
            query,
            paths,
            tools,
            specifications,
            max_results: body.max_results,
            target_recall: body.target_recall,
        })
    }

    /// The request a filter decides on: the query as the user's message.
    pub fn request(&self) -> ToolProviderRequest {
        ToolProviderRequest::builder(UserMessage::new(self.query.clone())).build()
    }

    /// The deferred tools the call named by path, in the call's order, each once: the tools to load as asked, with
    /// no ranking (as OpenAI's own client runner loads them). Empty for a query, or when no path names a deferred
    /// tool; [`search`](Self::search) then ranks the tools for the paths' text instead, so that a guessed name
    /// still finds its nearest tools.
    pub fn requested(&self) -> Vec<String> {
        let mut named: Vec<String> = Vec::new();
        for path in &self.paths {
            if self.specifications.iter().any(|s| &s.name == path) && !named.contains(path) {
                named.push(path.clone());
            }
        }
        named
    }

    /// Ranks the deferred tools for the query with `decision_model` (`conformal` is needed for a target recall)
    /// and returns the names found, best first, with their probabilities.
    pub fn search(
        &self,
        decision_model: Arc<dyn DecisionModel>,
        conformal: Option<&Conformal>,
    ) -> Result<Vec<(String, f64)>, FilterError> {
        let recall = match self.target_recall {
            None => None,
            Some(r) => Some((
                r,
                conformal.ok_or_else(|| FilterError::InvalidConfig {
                    option: "target_recall",
                    message: "the decision model has no conformal table".into(),
                })?,
            )),
        };
        let filter = search_filter(
            self.specifications.clone(),
            decision_model,
            self.max_results.unwrap_or(DEFAULT_SEARCH_RESULTS),
            recall,
        )?;
        Ok(ranked(&filter.select(&self.request())?))
    }

    /// The answer the provider expects for the tools `found` (names, best first): OpenAI's `tool_search_output`
    /// input item holding the matching tool definitions as the request gave them, or Anthropic's `tool_result`
    /// block holding one `tool_reference` per match.
    pub fn answer(&self, found: &[String]) -> Value {
        match self.provider {
            SearchProvider::OpenAi => {
                let tools: Vec<Value> = found
                    .iter()
                    .filter_map(|name| {
                        let i = self.specifications.iter().position(|s| &s.name == name)?;
                        self.tools.get(i).cloned()
                    })
                    .collect();
                let mut item = json!({
                    "type": "tool_search_output",
                    "execution": "client",
                    "status": "completed",
                    "tools": tools,
                });
                if let Some(id) = &self.call_id {
                    item["call_id"] = json!(id);
                }
                item
            }
            SearchProvider::Anthropic => json!({
                "type": "tool_result",
                "tool_use_id": self.call_id,
                "content": found
                    .iter()
                    .map(|name| json!({"type": "tool_reference", "tool_name": name}))
                    .collect::<Vec<_>>(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([
            {"type": "function", "name": "get_weather", "description": "Weather of a city", "defer_loading": true,
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
            {"type": "function", "name": "send_email", "description": "Sends an email", "defer_loading": true,
             "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}
        ])
    }

    #[test]
    fn an_openai_call_is_answered_with_the_matching_definitions_unchanged() {
        let call = ToolSearchCall::from_value(json!({
            "provider": "openai",
            "call": {"type": "tool_search_call", "call_id": "call_1", "execution": "client",
                     "arguments": {"query": "weather"}, "status": "completed", "id": "ts_1"},
            "tools": tools(),
        }))
        .unwrap();
        assert_eq!(call.query, "weather");
        let answer = call.answer(&["get_weather".into()]);
        assert_eq!(answer["type"], "tool_search_output");
        assert_eq!(answer["call_id"], "call_1");
        assert_eq!(answer["execution"], "client");
        assert_eq!(answer["tools"], json!([tools()[0]]));
    }

    #[test]
    fn openai_default_paths_load_the_named_tools_and_fall_back_to_search() {
        let call = |paths: Value| {
            ToolSearchCall::from_value(json!({
                "provider": "openai",
                "call": {"type": "tool_search_call", "call_id": "call_2", "execution": "client",
                         "arguments": {"paths": paths}, "status": "completed"},
                "tools": tools(),
            }))
            .unwrap()
        };
        let named = call(json!([
            "send_email",
            "get_weather",
            "send_email",
            "no_such_tool"
        ]));
        assert_eq!(named.requested(), ["send_email", "get_weather"]);
        let answer = named.answer(&named.requested());
        assert_eq!(answer["tools"], json!([tools()[1], tools()[0]]));
        // A path that names no deferred tool is read as the text to search for.
        let guessed = call(json!(["weather_lookup"]));
        assert!(guessed.requested().is_empty());
        assert_eq!(guessed.query, "weather_lookup");
        // A query wins over paths.
        let both = ToolSearchCall::from_value(json!({
            "provider": "openai", "tools": tools(),
            "call": {"call_id": "c", "arguments": {"query": "mail", "paths": ["get_weather"]}},
        }))
        .unwrap();
        assert!(both.requested().is_empty());
        assert_eq!(both.query, "mail");
    }

    #[test]
    fn an_anthropic_call_is_answered_with_tool_references() {
        let call = ToolSearchCall::from_value(json!({
            "provider": "anthropic",
            "call": {"type": "tool_use", "id": "toolu_1", "name": "tool_search", "input": {"query": "mail"}},
            "tools": [{"name": "send_email", "description": "Sends an email", "input_schema": {"type": "object"},
                       "defer_loading": true}],
        }))
        .unwrap();
        assert_eq!(
            call.answer(&["send_email".into()]),
            json!({"type": "tool_result", "tool_use_id": "toolu_1",
                   "content": [{"type": "tool_reference", "tool_name": "send_email"}]})
        );
    }

    #[test]
    fn hosted_tools_in_the_list_are_skipped_and_never_returned() {
        let mut listed = tools().as_array().unwrap().clone();
        listed.insert(0, json!({"type": "tool_search", "execution": "client"}));
        listed.insert(2, json!({"type": "web_search"}));
        listed.push(
            json!({"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}),
        );
        listed.push(json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 5}));
        let call = ToolSearchCall::from_value(json!({
            "provider": "openai", "query": "weather", "tools": listed,
        }))
        .unwrap();
        let names: Vec<&str> = call
            .specifications
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["get_weather", "send_email"]);
        assert_eq!(Value::Array(call.tools.clone()), tools());
        assert_eq!(
            call.answer(&["send_email".into()])["tools"],
            json!([tools()[1]])
        );
        // A name the skipped entries carry is no tool of the search.
        assert_eq!(call.answer(&["web_search".into()])["tools"], json!([]));

        let error = |listed: Value| {
            ToolSearchCall::from_value(json!({"provider": "openai", "query": "x", "tools": listed}))
                .unwrap_err()
                .to_string()
        };
        // A malformed function is still refused, named by its place in the list as sent.
        assert_eq!(
            error(json!([{"type": "web_search"}, {"type": "function", "description": "no name"}])),
            "tools[1].name: missing"
        );
        assert!(
            error(json!([{"type": "web_search"}, {"type": 3, "name": "x"}]))
                .starts_with("tools[1].type")
        );
        assert!(
            error(json!([{"type": "namespace", "name": "crm", "tools": []}])).contains("namespace")
        );
        assert_eq!(
            error(json!([{"type": "tool_search"}])),
            "tools: no function tools (tools of other types are not searched)"
        );
        assert_eq!(error(json!([])), "tools: empty");
    }

    #[test]
    fn mistakes_name_their_field() {
        let error = |body: Value| ToolSearchCall::from_value(body).unwrap_err().to_string();
        assert!(
            error(json!({"provider": "gemini", "query": "x", "tools": tools()}))
                .contains("provider")
        );
        assert!(error(json!({"provider": "openai", "tools": tools()})).contains("call"));
        assert!(error(json!({"provider": "openai", "query": "x"})).contains("tools"));
        assert!(
            error(json!({"provider": "anthropic", "query": "x", "tools": tools()}))
                .contains("call")
        );
        assert!(error(
            json!({"provider": "openai", "call": {"arguments": {"n": 1}}, "tools": tools()})
        )
        .contains("call.arguments"));
        assert!(error(
            json!({"provider": "openai", "query": "x", "tools": tools(), "max_result": 3})
        )
        .contains("max_result"));
    }
}
