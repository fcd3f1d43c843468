//! The router interface: routes, the routing request and result, and the [`ChatModelRouter`] trait.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use decide_chat::ChatRequest;

use crate::error::RouterError;

/// The future of an asynchronous routing decision. It is `'static`, so it can be spawned.
pub type RouteFuture =
    Pin<Box<dyn Future<Output = Result<ChatModelRoutingResult, RouterError>> + Send + 'static>>;

/// A named route and what it is for, as the router sees it (the chat model behind it stays with the routing
/// model).
///
/// A route may have no description (it is then described by its name), one, or several: a route that covers
/// unrelated topics ("code" and "data analysis") is chosen more reliably with one description per topic than with
/// one description listing them all, because each description is compared with the request on its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChatModelRoute {
    name: String,
    descriptions: Vec<String>,
}

impl ChatModelRoute {
    /// A route with one description.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self::with_descriptions(name, [description])
    }

    /// A route described by its name.
    pub fn without_description(name: impl Into<String>) -> Self {
        Self::with_descriptions(name, Vec::<String>::new())
    }

    /// A route with any number of descriptions, each offered to a decision model as an option of its own.
    pub fn with_descriptions<I, S>(name: impl Into<String>, descriptions: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            name: name.into(),
            descriptions: descriptions.into_iter().map(Into::into).collect(),
        }
    }

    /// The route's name, unique within a routing model.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The descriptions; empty when the route has none.
    pub fn descriptions(&self) -> &[String] {
        &self.descriptions
    }
}

/// What a router is asked: the chat request, and the routes it may choose from.
#[derive(Debug, Clone)]
pub struct ChatModelRoutingRequest<'a> {
    chat_request: &'a ChatRequest,
    routes: Vec<ChatModelRoute>,
}

impl<'a> ChatModelRoutingRequest<'a> {
    /// A request to route `chat_request` to one of `routes`.
    pub fn new(chat_request: &'a ChatRequest, routes: Vec<ChatModelRoute>) -> Self {
        Self {
            chat_request,
            routes,
        }
    }

    /// The request the chosen model will receive, unchanged.
    pub fn chat_request(&self) -> &'a ChatRequest {
        self.chat_request
    }

    /// The candidate routes, in configured order: all routes, or only those whose model supports what the request
    /// needs (a JSON-schema response format, say) when some do.
    pub fn routes(&self) -> &[ChatModelRoute] {
        &self.routes
    }
}

/// What a router chose.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ChatModelRoutingResult {
    /// The route with this name.
    Route(String),
    /// The routing model's default route, whatever its name: routers need not know it.
    DefaultRoute,
}

impl ChatModelRoutingResult {
    /// The route named `name`.
    pub fn route(name: impl Into<String>) -> Self {
        Self::Route(name.into())
    }

    /// The chosen route's name; `None` for the default route.
    pub fn route_name(&self) -> Option<&str> {
        match self {
            Self::Route(name) => Some(name),
            Self::DefaultRoute => None,
        }
    }

    /// Whether the default route was chosen.
    pub fn is_default_route(&self) -> bool {
        matches!(self, Self::DefaultRoute)
    }
}

impl fmt::Display for ChatModelRoutingResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Route(name) => write!(f, "route '{name}'"),
            Self::DefaultRoute => f.write_str("the default route"),
        }
    }
}

/// Chooses the route of a chat request, LangChain4j's `ChatModelRouter`.
///
/// Any `Fn(&ChatModelRoutingRequest) -> Result<ChatModelRoutingResult, RouterError>` closure is a router, with no
/// asynchronous path: as in LangChain4j, a closure router makes the routing model's `chat_async` fail rather than
/// block a runtime thread.
pub trait ChatModelRouter: Send + Sync {
    /// Chooses one of `request.routes()`, or the default route.
    fn route(
        &self,
        request: &ChatModelRoutingRequest<'_>,
    ) -> Result<ChatModelRoutingResult, RouterError>;

    /// The same as [`route`](Self::route), asynchronously. By default a future already failed with
    /// [`RouterError::AsyncNotSupported`]; a router whose `route` does not block can return a ready future of it.
    fn route_async(&self, _request: &ChatModelRoutingRequest<'_>) -> RouteFuture {
        Box::pin(std::future::ready(Err(RouterError::AsyncNotSupported {
            router: std::any::type_name::<Self>().to_owned(),
        })))
    }

    /// Checks the routes of a routing model when it is built, so that a configuration that cannot work fails then
    /// and not at the first request. Accepts every configuration by default.
    fn validate(&self, _routes: &[ChatModelRoute]) -> Result<(), RouterError> {
        Ok(())
    }
}

impl<F> ChatModelRouter for F
where
    F: Fn(&ChatModelRoutingRequest<'_>) -> Result<ChatModelRoutingResult, RouterError>
        + Send
        + Sync,
{
    fn route(
        &self,
        request: &ChatModelRoutingRequest<'_>,
    ) -> Result<ChatModelRoutingResult, RouterError> {
        self(request)
    }
}

/// Checks that no two options of a decision router's question get the same name, as
/// [`DecisionModelChatModelRouter`](crate::DecisionModelChatModelRouter)'s [`validate`](ChatModelRouter::validate)
/// does, without a decision model: a command line can check a routes file before loading one.
///
/// A route with no or one description gives one option named after the route; a route with n > 1 descriptions
/// gives options `<route>#1` … `<route>#n`; so a route literally named `complex#1` next to a route `complex` with two
/// descriptions is rejected.
pub fn validate_option_names(routes: &[ChatModelRoute]) -> Result<(), RouterError> {
    route_options(routes).map(|_| ())
}

/// One option of the routing question: its name, its description and the index of its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteOption {
    pub name: String,
    pub description: String,
    pub route: usize,
}

/// The options of the routing question: a route with no or one description is one option named after it (described
/// by its name when it has no description); a route with n > 1 descriptions gives options `<route>#1` … `<route>#n`.
/// Fails when two options get the same name, e.g. a route literally named `complex#1` next to a route `complex`
/// with two descriptions.
pub(crate) fn route_options(routes: &[ChatModelRoute]) -> Result<Vec<RouteOption>, RouterError> {
    let mut options: Vec<RouteOption> = Vec::new();
    // Option name to its position in `options`: a request may carry many routes, and a scan of the earlier options
    // per route made the check quadratic.
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (index, route) in routes.iter().enumerate() {
        let named: Vec<(String, String)> = match route.descriptions() {
            [] => vec![(route.name.clone(), route.name.clone())],
            [only] => vec![(route.name.clone(), only.clone())],
            several => several
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("{}#{}", route.name, i + 1), d.clone()))
                .collect(),
        };
        for (name, description) in named {
            if let Some(earlier) = seen.get(&name).map(|&at| &options[at]) {
                // The route to rename is the one literally named like the option; with duplicate route names (which
                // the routing model rejects first) there is none, and the later route is named.
                let culprit = [index, earlier.route]
                    .into_iter()
                    .find(|&r| routes[r].name == name)
                    .unwrap_or(index);
                return Err(RouterError::config(
                    "routes",
                    format!(
                        "the route names and descriptions give the option '{name}' twice; rename the route '{}'",
                        routes[culprit].name
                    ),
                ));
            }
            seen.insert(name.clone(), options.len());
            options.push(RouteOption {
                name,
                description,
                route: index,
            });
        }
    }
    Ok(options)
}
