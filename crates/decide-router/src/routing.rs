//! The routing chat model and its builder.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use decide_chat::{
    Capabilities, ChatFuture, ChatMessage, ChatModel, ChatModelError, ChatRequest, ChatResponse,
};

use crate::error::RouterError;
use crate::route::{
    ChatModelRoute, ChatModelRouter, ChatModelRoutingRequest, ChatModelRoutingResult,
};

/// The response attribute that names the route a request took, as LangChain4j's `ROUTE_ATTRIBUTE`.
pub const ROUTE_ATTRIBUTE: &str = "chat_model_route";

/// How many tool calls the routing model remembers the route of, so that their results go back to the same model.
/// The oldest are forgotten first; a tool-calling loop only needs the calls of its last round.
pub const TOOL_CALL_MEMORY: usize = 10_000;

/// A [`ChatModel`] that sends each request to the model of one of its routes, chosen by a [`ChatModelRouter`].
/// See the [crate documentation](crate) for the rules.
///
/// Cloning is cheap and the clones share the routes, the router and the memory of tool calls.
#[derive(Clone)]
pub struct RoutingChatModel {
    inner: Arc<Inner>,
}

struct Inner {
    routes: Vec<ChatModelRoute>,
    models: Vec<Arc<dyn ChatModel>>,
    router: Arc<dyn ChatModelRouter>,
    default_route: usize,
    tool_calls: Mutex<ToolCallRoutes>,
}

/// Which route asked for each recent tool call, by call id, forgetting the oldest beyond [`TOOL_CALL_MEMORY`].
#[derive(Default)]
struct ToolCallRoutes {
    by_id: HashMap<String, usize>,
    order: VecDeque<String>,
}

impl ToolCallRoutes {
    fn record(&mut self, id: &str, route: usize) {
        if self.by_id.insert(id.to_owned(), route).is_none() {
            self.order.push_back(id.to_owned());
        }
        while self.order.len() > TOOL_CALL_MEMORY {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
    }
}

/// How a request is routed, decided before any router is asked.
enum Plan {
    /// A tool result of a call this routing model made: back to the route that asked for the tool.
    Sticky(usize),
    /// Ask the router to choose among these routes (indexes, in configured order).
    Ask(Vec<usize>),
}

impl RoutingChatModel {
    /// Starts a routing model; at least one route, a router and the default route are required.
    pub fn builder() -> RoutingChatModelBuilder {
        RoutingChatModelBuilder::default()
    }

    /// The routes, in configured order.
    pub fn routes(&self) -> &[ChatModelRoute] {
        &self.inner.routes
    }

    /// The name of the default route.
    pub fn default_route(&self) -> &str {
        self.inner.routes[self.inner.default_route].name()
    }

    /// The route `request` would take now, without calling any chat model: the route that asked for the tool when
    /// the request ends with tool results, else the router's choice among the routes that can handle the request.
    pub fn select_route(&self, request: &ChatRequest) -> Result<&str, RouterError> {
        let index = self.inner.select(request)?;
        Ok(self.inner.routes[index].name())
    }
}

impl Inner {
    fn select(&self, request: &ChatRequest) -> Result<usize, RouterError> {
        match self.plan(request) {
            Plan::Sticky(index) => Ok(index),
            Plan::Ask(candidates) => {
                let routing = self.routing_request(request, &candidates);
                let result = self.router.route(&routing)?;
                self.resolve(result, &candidates, request)
            }
        }
    }

    fn plan(&self, request: &ChatRequest) -> Plan {
        if let Some(index) = self.sticky_route(request.messages()) {
            return Plan::Sticky(index);
        }
        let required = request.required_capabilities();
        let capable: Vec<usize> = (0..self.routes.len())
            .filter(|&i| self.models[i].capabilities().contains(&required))
            .collect();
        if capable.is_empty() {
            // No route declares what the request needs: let the router choose among all, and the chosen model accept
            // or reject the request itself. Capabilities are often undeclared, so refusing here would refuse
            // requests that work.
            Plan::Ask((0..self.routes.len()).collect())
        } else {
            Plan::Ask(capable)
        }
    }

    /// The route that made the tool calls the trailing tool results answer, if this routing model made them. Results without a call id, or with ids this model never produced (a conversation from
    /// storage, a call forgotten after [`TOOL_CALL_MEMORY`] others), are routed by the router.
    fn sticky_route(&self, messages: &[ChatMessage]) -> Option<usize> {
        let remembered = self
            .tool_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        messages
            .iter()
            .rev()
            .map_while(|m| match m {
                ChatMessage::ToolResult(result) => Some(result),
                _ => None,
            })
            .filter_map(|result| result.tool_call_id.as_deref())
            .find_map(|id| remembered.by_id.get(id).copied())
    }

    fn routing_request<'a>(
        &self,
        request: &'a ChatRequest,
        candidates: &[usize],
    ) -> ChatModelRoutingRequest<'a> {
        ChatModelRoutingRequest::new(
            request,
            candidates.iter().map(|&i| self.routes[i].clone()).collect(),
        )
    }

    /// The index of the route the router's `result` names: the default route, or the first candidate when the
    /// default cannot handle the request.
    fn resolve(
        &self,
        result: ChatModelRoutingResult,
        candidates: &[usize],
        request: &ChatRequest,
    ) -> Result<usize, RouterError> {
        let index = match result {
            ChatModelRoutingResult::DefaultRoute => {
                return Ok(if candidates.contains(&self.default_route) {
                    self.default_route
                } else {
                    candidates[0]
                });
            }
            ChatModelRoutingResult::Route(name) => self
                .routes
                .iter()
                .position(|r| r.name() == name)
                .ok_or_else(|| RouterError::UnknownRoute {
                    route: name,
                    available: self.routes.iter().map(|r| r.name().to_owned()).collect(),
                })?,
        };
        if !candidates.contains(&index) {
            return Err(RouterError::MissingCapabilities {
                route: self.routes[index].name().to_owned(),
                required: request.required_capabilities(),
                capable: candidates
                    .iter()
                    .map(|&i| self.routes[i].name().to_owned())
                    .collect(),
            });
        }
        Ok(index)
    }

    /// Records the route on the response and remembers it for the tool calls the response makes.
    fn finish(&self, index: usize, mut response: ChatResponse) -> ChatResponse {
        let name = self.routes[index].name();
        tracing::debug!(route = name, "routed");
        // Inserted, not merged: when routing models are nested, the outer one's route is the one the caller chose
        // among, so it overwrites the inner one's.
        response
            .attributes
            .insert(ROUTE_ATTRIBUTE.to_owned(), name.into());
        let ids: Vec<&str> = response
            .message
            .tool_calls
            .iter()
            .filter_map(|call| call.id.as_deref())
            .collect();
        if !ids.is_empty() {
            let mut remembered = self
                .tool_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for id in ids {
                remembered.record(id, index);
            }
        }
        response
    }
}

impl ChatModel for RoutingChatModel {
    fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
        let index = self.inner.select(request)?;
        let response = self.inner.models[index].chat(request)?;
        Ok(self.inner.finish(index, response))
    }

    /// Routes with [`ChatModelRouter::route_async`], then calls the chosen model's `chat_async`. A router or a
    /// decision model without an asynchronous path makes this fail with [`ChatModelError::AsyncNotSupported`], and
    /// no chat model is called.
    fn chat_async(&self, request: ChatRequest) -> ChatFuture {
        let inner = self.inner.clone();
        match self.inner.plan(&request) {
            Plan::Sticky(index) => {
                let pending = inner.models[index].chat_async(request);
                Box::pin(
                    async move { Ok::<_, ChatModelError>(inner.finish(index, pending.await?)) },
                )
            }
            Plan::Ask(candidates) => {
                let routing = inner
                    .router
                    .route_async(&inner.routing_request(&request, &candidates));
                Box::pin(async move {
                    let result = routing.await?;
                    let index = inner.resolve(result, &candidates, &request)?;
                    let response = inner.models[index].chat_async(request).await?;
                    Ok::<_, ChatModelError>(inner.finish(index, response))
                })
            }
        }
    }

    /// The union of the routes' capabilities: a request that one route can handle is accepted.
    fn capabilities(&self) -> Capabilities {
        self.inner
            .models
            .iter()
            .fold(Capabilities::NONE, |all, model| {
                all.union(model.capabilities())
            })
    }
}

impl fmt::Debug for RoutingChatModel {
    // The models and the router are trait objects with nothing useful to print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutingChatModel")
            .field("routes", &self.inner.routes)
            .field("default_route", &self.default_route())
            .finish()
    }
}

/// Builds a [`RoutingChatModel`]; every check happens in [`build`](Self::build), and each error names its option.
#[derive(Clone, Default)]
pub struct RoutingChatModelBuilder {
    routes: Vec<(ChatModelRoute, Arc<dyn ChatModel>)>,
    router: Option<Arc<dyn ChatModelRouter>>,
    default_route: Option<String>,
}

impl RoutingChatModelBuilder {
    /// Adds a route with one description.
    pub fn route(
        self,
        name: impl Into<String>,
        description: impl Into<String>,
        model: Arc<dyn ChatModel>,
    ) -> Self {
        self.add_route(ChatModelRoute::new(name, description), model)
    }

    /// Adds a route with several descriptions, each offered to a decision model as an option of its own. Keep the
    /// number of descriptions of the routes balanced: a route with many descriptions has more chances to match.
    pub fn route_with_descriptions<I, S>(
        self,
        name: impl Into<String>,
        descriptions: I,
        model: Arc<dyn ChatModel>,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.add_route(ChatModelRoute::with_descriptions(name, descriptions), model)
    }

    /// Adds a route described by its name.
    pub fn route_without_description(
        self,
        name: impl Into<String>,
        model: Arc<dyn ChatModel>,
    ) -> Self {
        self.add_route(ChatModelRoute::without_description(name), model)
    }

    /// Adds a route.
    pub fn add_route(mut self, route: ChatModelRoute, model: Arc<dyn ChatModel>) -> Self {
        self.routes.push((route, model));
        self
    }

    /// The router that chooses the route of each request (required).
    pub fn router(mut self, router: Arc<dyn ChatModelRouter>) -> Self {
        self.router = Some(router);
        self
    }

    /// The route taken when the router chooses none (required); it must be one of the routes.
    pub fn default_route(mut self, name: impl Into<String>) -> Self {
        self.default_route = Some(name.into());
        self
    }

    /// Checks the routes (at least one, non-blank unique names, non-blank descriptions), the default route and the
    /// router, then lets the router [validate](ChatModelRouter::validate) the routes.
    pub fn build(self) -> Result<RoutingChatModel, RouterError> {
        if self.routes.is_empty() {
            return Err(RouterError::config(
                "routes",
                "at least one route is required",
            ));
        }
        let (routes, models): (Vec<ChatModelRoute>, Vec<Arc<dyn ChatModel>>) =
            self.routes.into_iter().unzip();
        let mut names = std::collections::HashSet::with_capacity(routes.len());
        for (i, route) in routes.iter().enumerate() {
            if route.name().trim().is_empty() {
                return Err(RouterError::config(
                    "routes",
                    format!("the name of route {} is blank", i + 1),
                ));
            }
            if route.descriptions().iter().any(|d| d.trim().is_empty()) {
                return Err(RouterError::config(
                    "routes",
                    format!(
                        "route '{}' has a blank description; leave the description out to describe the route by \
                         its name",
                        route.name()
                    ),
                ));
            }
            if !names.insert(route.name()) {
                return Err(RouterError::config(
                    "routes",
                    format!("there is more than one route named '{}'", route.name()),
                ));
            }
        }
        let default_name = self
            .default_route
            .ok_or_else(|| RouterError::config("default_route", "is required"))?;
        let default_route = routes
            .iter()
            .position(|r| r.name() == default_name)
            .ok_or_else(|| {
                let names: Vec<&str> = routes.iter().map(ChatModelRoute::name).collect();
                RouterError::config(
                    "default_route",
                    format!(
                        "the default route '{default_name}' is not one of the routes {}",
                        names.join(", ")
                    ),
                )
            })?;
        let router = self
            .router
            .ok_or_else(|| RouterError::config("router", "is required"))?;
        router.validate(&routes)?;
        Ok(RoutingChatModel {
            inner: Arc::new(Inner {
                routes,
                models,
                router,
                default_route,
                tool_calls: Mutex::new(ToolCallRoutes::default()),
            }),
        })
    }
}

impl fmt::Debug for RoutingChatModelBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: Vec<&ChatModelRoute> = self.routes.iter().map(|(r, _)| r).collect();
        f.debug_struct("RoutingChatModelBuilder")
            .field("routes", &routes)
            .field("router", &self.router.is_some())
            .field("default_route", &self.default_route)
            .finish()
    }
}
