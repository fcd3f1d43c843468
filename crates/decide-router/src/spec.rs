//! The routes and the routing request as users write them (a routes file, a `/v1/route` body): read once with serde,
//! unknown keys refused, and checked on the way in, so that the command line and the server accept and reject the
//! same input with the same words.

use std::collections::HashSet;
use std::sync::Arc;

use decide_chat::{conversation, from_slice, from_value, messages_field};
use decide_chat::{ChatMessage, ChatRequest, ParseError};
use decide_contract::DecisionModel;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{DecisionModelChatModelRouter, Fallback, RouteDecision};
use crate::error::RouterError;
use crate::route::{validate_option_names, ChatModelRoute, ChatModelRoutingRequest};

/// One route as written: a misspelt `"descriptions"` is refused rather than leaving the route described by its name.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a route {\"name\", \"description\"?, \"descriptions\"?}"
)]
struct RouteEntry {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    descriptions: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesFile {
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    routes: Option<Vec<RouteEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteBody {
    #[serde(default, deserialize_with = "messages_field")]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    routes: Option<Vec<RouteEntry>>,
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    max_messages: Option<usize>,
    #[serde(default)]
    min_probability: Option<f64>,
}

/// A set of routes and the route taken when the router chooses none: what a routes file holds.
///
/// Every way of building one checks, naming the JSON path: at least one route; names present, not blank and unique;
/// `description` or `descriptions`, not both, none of them blank; a default route that is one of the routes; and
/// route names and descriptions that give a decision router distinct options ([`validate_option_names`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RoutesSpec {
    default: String,
    routes: Vec<ChatModelRoute>,
}

impl RoutesSpec {
    /// Reads `{"default": NAME, "routes": [{"name", "description"?, "descriptions"?}]}`; unknown keys are refused.
    pub fn from_value(json: Value) -> Result<Self, ParseError> {
        let file: RoutesFile = from_value(json)?;
        Self::check(file.routes, file.default)
    }

    /// [`from_value`](Self::from_value) of JSON text; a syntax error names the line and column.
    pub fn from_slice(json: &[u8]) -> Result<Self, ParseError> {
        Self::from_value(from_slice(json)?)
    }

    /// The route taken when the router chooses none.
    pub fn default_route(&self) -> &str {
        &self.default
    }

    /// The routes, in the order given.
    pub fn routes(&self) -> &[ChatModelRoute] {
        &self.routes
    }

    fn check(
        entries: Option<Vec<RouteEntry>>,
        default: Option<String>,
    ) -> Result<Self, ParseError> {
        let entries = match entries {
            None => return Err(ParseError::invalid("routes", "missing")),
            Some(entries) if entries.is_empty() => {
                return Err(ParseError::invalid("routes", "empty"))
            }
            Some(entries) => entries,
        };
        let mut names = HashSet::with_capacity(entries.len());
        let mut routes = Vec::with_capacity(entries.len());
        for (i, entry) in entries.into_iter().enumerate() {
            let at = format!("routes[{i}]");
            let name = match entry.name {
                None => return Err(ParseError::invalid(format!("{at}.name"), "missing")),
                Some(name) if name.trim().is_empty() => {
                    return Err(ParseError::invalid(format!("{at}.name"), "blank"))
                }
                Some(name) => name,
            };
            if !names.insert(name.clone()) {
                return Err(ParseError::invalid(
                    format!("{at}.name"),
                    format!("duplicate route name {name:?}"),
                ));
            }
            let text = |path: String, text: String| {
                if text.trim().is_empty() {
                    Err(ParseError::invalid(path, "blank"))
                } else {
                    Ok(text)
                }
            };
            routes.push(match (entry.description, entry.descriptions) {
                (Some(_), Some(_)) => {
                    return Err(ParseError::invalid(
                        at,
                        "give description or descriptions, not both",
                    ))
                }
                (Some(d), None) => ChatModelRoute::new(name, text(format!("{at}.description"), d)?),
                (None, Some(ds)) => ChatModelRoute::with_descriptions(
                    name,
                    ds.into_iter()
                        .enumerate()
                        .map(|(j, d)| text(format!("{at}.descriptions[{j}]"), d))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                (None, None) => ChatModelRoute::without_description(name),
            });
        }
        let Some(default) = default else {
            return Err(ParseError::invalid("default", "missing"));
        };
        if !names.contains(&default) {
            let names: Vec<&str> = routes.iter().map(ChatModelRoute::name).collect();
            return Err(ParseError::invalid(
                "default",
                format!("{default:?} is not one of the routes {}", names.join(", ")),
            ));
        }
        // The router would reject these at the first request; the input is the place to say so.
        validate_option_names(&routes).map_err(|e| match e {
            RouterError::InvalidConfig { option, message } => ParseError::invalid(option, message),
            other => ParseError::invalid("routes", other.to_string()),
        })?;
        Ok(Self { default, routes })
    }
}

/// Which route a conversation takes: the conversation, the routes and the router's options, as a `/v1/route` body
/// gives them (`{"messages" | "text", "routes", "default", "max_messages"?, "min_probability"?}`) or a command line
/// assembles them.
#[derive(Debug, Clone)]
pub struct RouteRequest {
    /// The conversation to route.
    pub chat: ChatRequest,
    /// The routes and the default route.
    pub routes: RoutesSpec,
    /// How many of the latest messages the decision sees; the router's default when `None`.
    pub max_messages: Option<usize>,
    /// Below this probability the default route is taken; unset when `None`.
    pub min_probability: Option<f64>,
}

impl RouteRequest {
    /// Reads a request body; unknown keys are refused and every error names its JSON path.
    pub fn from_value(json: Value) -> Result<Self, ParseError> {
        let body: RouteBody = from_value(json)?;
        let messages = conversation(body.messages, body.text)?;
        let routes = RoutesSpec::check(body.routes, body.default)?;
        Self::new(messages, routes, body.max_messages, body.min_probability)
    }

    /// The request of a conversation and its routes however a front end read them (the command
    /// line from its files and flags): the conversation's rules are here, so each front end
    /// accepts and refuses the same things in the same words.
    pub fn new(
        messages: Vec<ChatMessage>,
        routes: RoutesSpec,
        max_messages: Option<usize>,
        min_probability: Option<f64>,
    ) -> Result<Self, ParseError> {
        let chat = ChatRequest::from_messages(messages)
            .map_err(|e| ParseError::invalid("messages", e.to_string()))?;
        Ok(Self {
            chat,
            routes,
            max_messages,
            min_probability,
        })
    }

    /// The answer to this request from the router's `decision`: the route taken (the default
    /// route when the router chose none) and every route's probability.
    pub fn response(&self, decision: &RouteDecision) -> RouteResponse {
        RouteResponse {
            route: decision
                .result
                .route_name()
                .unwrap_or(self.routes.default_route())
                .to_owned(),
            probabilities: decision.probabilities.clone(),
        }
    }

    /// [`from_value`](Self::from_value) of JSON text; a syntax error names the line and column.
    pub fn from_slice(json: &[u8]) -> Result<Self, ParseError> {
        Self::from_value(from_slice(json)?)
    }

    /// What the router is asked: the conversation and every route as a candidate.
    pub fn routing_request(&self) -> ChatModelRoutingRequest<'_> {
        ChatModelRoutingRequest::new(&self.chat, self.routes.routes.clone())
    }

    /// The router this request asks for, over `decision_model`. A failed decision is the caller's to see
    /// ([`Fallback::Fail`]), not a silent default route: whoever asks which route a conversation takes wants the
    /// answer or the reason there is none.
    pub fn router(
        &self,
        decision_model: Arc<dyn DecisionModel>,
    ) -> Result<DecisionModelChatModelRouter, RouterError> {
        let mut builder = DecisionModelChatModelRouter::builder()
            .decision_model(decision_model)
            .fallback(Fallback::Fail);
        if let Some(n) = self.max_messages {
            builder = builder.max_messages(n);
        }
        if let Some(p) = self.min_probability {
            builder = builder.min_probability(p);
        }
        builder.build()
    }
}

/// What routing answers, as `decide route --json` prints it and `POST /v1/route` returns it:
/// `{"route", "probabilities": {route: probability, ...}}`, serialized here once so that every
/// front end answers alike.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteResponse {
    /// The route taken.
    pub route: String,
    /// Each route the model was asked about with its probability, in the routes' order.
    #[serde(serialize_with = "as_map")]
    pub probabilities: Vec<(String, f64)>,
}

/// Route probabilities as a JSON object, in the routes' order.
fn as_map<S: serde::Serializer>(pairs: &[(String, f64)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn error(json: Value) -> String {
        RoutesSpec::from_value(json).unwrap_err().to_string()
    }

    #[test]
    fn a_routes_file_is_read_in_order() {
        let routes = RoutesSpec::from_value(json!({
            "default": "simple",
            "routes": [
                {"name": "simple", "description": "Small talk"},
                {"name": "code", "descriptions": ["Code", "Scripts"]},
                {"name": "bare", "description": null}
            ]
        }))
        .unwrap();
        assert_eq!(routes.default_route(), "simple");
        assert_eq!(
            routes.routes(),
            [
                ChatModelRoute::new("simple", "Small talk"),
                ChatModelRoute::with_descriptions("code", ["Code", "Scripts"]),
                ChatModelRoute::without_description("bare"),
            ]
        );
    }

    #[test]
    fn errors_name_the_path() {
        let route = |r: Value| json!({"default": "a", "routes": [{"name": "a"}, r]});
        let cases = [
            (
                route(json!({"description": "x"})),
                "routes[1].name: missing",
            ),
            (
                route(json!({"name": 3})),
                "routes[1].name: expected a string, got a number",
            ),
            (route(json!({"name": " "})), "routes[1].name: blank"),
            (
                route(json!({"name": "a"})),
                "routes[1].name: duplicate route name \"a\"",
            ),
            (
                route(json!({"name": "b", "descripton": "x"})),
                "routes[1].descripton: unknown field (expected name, description, descriptions)",
            ),
            (
                route(json!({"name": "b", "description": ""})),
                "routes[1].description: blank",
            ),
            (
                route(json!({"name": "b", "descriptions": ["x", " "]})),
                "routes[1].descriptions[1]: blank",
            ),
            (
                route(json!({"name": "b", "descriptions": ["x", 1]})),
                "routes[1].descriptions[1]: expected a string, got a number",
            ),
            (
                route(json!({"name": "b", "description": "x", "descriptions": ["y"]})),
                "routes[1]: give description or descriptions, not both",
            ),
            (
                route(json!("b")),
                r#"routes[1]: expected a route {"name", "description"?, "descriptions"?}, got a string"#,
            ),
            (json!({"routes": [{"name": "a"}]}), "default: missing"),
            (
                json!({"default": "z", "routes": [{"name": "a"}, {"name": "b"}]}),
                "default: \"z\" is not one of the routes a, b",
            ),
            (json!({"default": "a"}), "routes: missing"),
            (json!({"default": "a", "routes": []}), "routes: empty"),
            (
                json!({"default": "a", "routes": [], "extra": 1}),
                "extra: unknown field (expected default, routes)",
            ),
            (json!([]), "expected an object, got an array"),
        ];
        for (json, expected) in cases {
            assert_eq!(error(json), expected);
        }
        assert!(error(
            json!({"default": "a", "routes": [{"name": "a", "descriptions": ["x", "y"]}, {"name": "a#1"}]})
        )
        .starts_with("routes: the route names and descriptions give the option 'a#1' twice"));
    }

    #[test]
    fn a_request_reads_the_conversation_and_refuses_unknown_keys() {
        let request = RouteRequest::from_value(json!({
            "text": "hi", "routes": [{"name": "a"}], "default": "a", "max_messages": 2
        }))
        .unwrap();
        assert_eq!(request.chat.messages(), [ChatMessage::user("hi")]);
        assert_eq!(request.max_messages, Some(2));
        let error = RouteRequest::from_value(json!({
            "text": "hi", "routes": [{"name": "a", "descriptons": ["x"]}], "default": "a"
        }))
        .unwrap_err();
        assert_eq!(error.path(), Some("routes[0].descriptons"));
        assert_eq!(
            RouteRequest::from_value(json!({"routes": [{"name": "a"}], "default": "a"}))
                .unwrap_err()
                .to_string(),
            "messages: missing (give messages or text)"
        );
    }
}
