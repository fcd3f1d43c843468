//! The router backed by a decision model, its builder, and what one routing decision found.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use decide_chat::{decision_fields, decision_messages, ChatMessage, ChatRequest, RenderOptions};
use decide_contract::{
    ChoiceQuestion, DecisionError, DecisionInput, DecisionModel, DecisionRequest, DecisionResponse,
};

use crate::error::RouterError;
use crate::route::{
    route_options, ChatModelRoute, ChatModelRouter, ChatModelRoutingRequest,
    ChatModelRoutingResult, RouteFuture, RouteOption,
};

/// The default [`question`](DecisionModelChatModelRouterBuilder::question), as LangChain4j's `DEFAULT_QUESTION`.
pub const DEFAULT_QUESTION: &str = "Which model should handle this request?";
/// The default [`max_messages`](DecisionModelChatModelRouterBuilder::max_messages): the last user message
/// alone. Read with the turns before it, a request's route is drawn toward theirs, and on route sets nobody
/// tuned on the last message alone routes more follow-ups right, not fewer (docs/models.md, Routing).
pub const DEFAULT_MAX_MESSAGES: usize = 1;
/// The name of the one choice question of a routing decision request.
pub const QUESTION_NAME: &str = "route";

/// The future of an asynchronous [`DecisionModelChatModelRouter::decide_async`].
pub type RouteDecisionFuture =
    Pin<Box<dyn Future<Output = Result<RouteDecision, RouterError>> + Send + 'static>>;

/// What the router does when the decision model fails or refuses to answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// Choose the default route and log a warning: the request is answered, perhaps by a costlier model.
    #[default]
    DefaultRoute,
    /// Return the decision model's error.
    Fail,
}

impl Fallback {
    /// The name used on the command line: `default-route` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::DefaultRoute => "default-route",
            Fallback::Fail => "fail",
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Fallback {
    type Err = RouterError;

    /// Reads `default-route` or `fail`, ignoring case, `-` and `_` (so LangChain4j's `DEFAULT_ROUTE` works too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key: String = s
            .trim()
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .flat_map(char::to_lowercase)
            .collect();
        match key.as_str() {
            "defaultroute" => Ok(Fallback::DefaultRoute),
            "fail" => Ok(Fallback::Fail),
            _ => Err(RouterError::config(
                "fallback",
                format!("{s:?} is not one of default-route, fail"),
            )),
        }
    }
}

/// Why a routing decision came out as it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteReason {
    /// Only one route could handle the request: chosen without asking the decision model.
    OnlyCandidate,
    /// The request has no user message, or only a blank one: the default route, without asking.
    NoUserMessage,
    /// The decision model chose it.
    Chosen,
    /// The decision model's best route had a probability below `min_probability`: the default route.
    BelowMinProbability,
    /// The decision model failed or refused, and [`Fallback::DefaultRoute`] chose the default route.
    Fallback {
        /// The decision model's error.
        error: String,
    },
}

/// One routing decision: the result, why, and the probability of each route when the model reported them.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteDecision {
    /// The route chosen, or the default route.
    pub result: ChatModelRoutingResult,
    /// Why.
    pub reason: RouteReason,
    /// Each candidate route with its probability, summed over its descriptions, in the order of the routes; empty
    /// when the decision model was not asked or reported no probabilities.
    pub probabilities: Vec<(String, f64)>,
}

impl RouteDecision {
    fn without_probabilities(result: ChatModelRoutingResult, reason: RouteReason) -> Self {
        Self {
            result,
            reason,
            probabilities: Vec::new(),
        }
    }

    /// The probability of the route `name`, if reported.
    pub fn probability(&self, name: &str) -> Option<f64> {
        self.probabilities
            .iter()
            .find(|(route, _)| route == name)
            .map(|(_, p)| *p)
    }
}

/// A [`ChatModelRouter`] that asks a [`DecisionModel`] which route's description fits the request best: LangChain4j's
/// `DecisionModelChatModelRouter`. See the [crate documentation](crate) for the rules.
#[derive(Clone)]
pub struct DecisionModelChatModelRouter {
    decision_model: Arc<dyn DecisionModel>,
    question: String,
    min_probability: Option<f64>,
    fallback: Fallback,
    max_messages: usize,
}

/// What a decision needs once the decision model has answered; owned, so that the asynchronous path can keep it.
struct Pending {
    options: Vec<RouteOption>,
    routes: Vec<String>,
    min_probability: Option<f64>,
    fallback: Fallback,
}

enum Plan {
    Decided(RouteDecision),
    Ask(DecisionRequest, Pending),
}

impl DecisionModelChatModelRouter {
    /// A router with every option at its default.
    pub fn new(decision_model: Arc<dyn DecisionModel>) -> Self {
        Self {
            decision_model,
            question: DEFAULT_QUESTION.to_owned(),
            min_probability: None,
            fallback: Fallback::default(),
            max_messages: DEFAULT_MAX_MESSAGES,
        }
    }

    /// Starts a router; the decision model is required.
    pub fn builder() -> DecisionModelChatModelRouterBuilder {
        DecisionModelChatModelRouterBuilder::default()
    }

    /// The text of the routing question.
    pub fn question(&self) -> &str {
        &self.question
    }

    /// The probability below which the default route is chosen instead; `None` when the best route is always taken.
    pub fn min_probability(&self) -> Option<f64> {
        self.min_probability
    }

    /// What happens when the decision model fails or refuses.
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// How many of the latest messages, up to and including the last user message, the decision sees.
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// The input the decision model receives for `request`, or `None` when the request has no user message with
    /// text (attachments count as text: `[attached image]`).
    ///
    /// The messages are the request's, as sent to the chat model, up to and including the last user message. User
    /// messages and assistant text count; system messages, tool calls and tool results are never sent and do not
    /// count. With `max_messages` 1 the input is the plain text of the last user message; otherwise it is
    /// `{"messages": [{"role", "text"}, ...]}` with the last `max_messages` of them.
    pub fn decision_input(&self, request: &ChatRequest) -> Option<DecisionInput> {
        let messages = request.messages();
        let last_user = messages
            .iter()
            .rposition(|m| matches!(m, ChatMessage::User(_)))?;
        let ChatMessage::User(user) = &messages[last_user] else {
            return None;
        };
        let text = user.text();
        if text.trim().is_empty() {
            return None;
        }
        if self.max_messages == 1 {
            return Some(DecisionInput::Text(text));
        }
        let rendered = decision_messages(&messages[..=last_user], &RenderOptions::default());
        let start = rendered.len().saturating_sub(self.max_messages);
        Some(DecisionInput::Fields(decision_fields(&rendered[start..])))
    }

    /// The decision request for `input` and `routes`: one choice question named [`QUESTION_NAME`] whose options are
    /// the routes, one per description (`<route>#<n>` for a route with several), a route without description being
    /// described by its name.
    pub fn decision_request(
        &self,
        input: DecisionInput,
        routes: &[ChatModelRoute],
    ) -> Result<DecisionRequest, RouterError> {
        let options = route_options(routes)?;
        self.request_for(input, &options)
    }

    fn request_for(
        &self,
        input: DecisionInput,
        options: &[RouteOption],
    ) -> Result<DecisionRequest, RouterError> {
        let question = options
            .iter()
            .fold(ChoiceQuestion::builder(self.question.clone()), |q, o| {
                q.option_with_description(o.name.clone(), o.description.clone())
            })
            .build()
            .map_err(RouterError::Decision)?;
        DecisionRequest::builder()
            .input(input)
            .question(QUESTION_NAME, question)
            .build()
            .map_err(RouterError::Decision)
    }

    /// Decides the route of `request`, and says why and with which probabilities. [`ChatModelRouter::route`] is this
    /// without the report.
    pub fn decide(
        &self,
        request: &ChatModelRoutingRequest<'_>,
    ) -> Result<RouteDecision, RouterError> {
        match self.plan(request)? {
            Plan::Decided(decision) => Ok(decision),
            Plan::Ask(decision_request, pending) => {
                pending.conclude(self.decision_model.decide(&decision_request))
            }
        }
    }

    /// The same as [`decide`](Self::decide) with the decision model's `decide_async`. A decision model without an
    /// asynchronous path makes it fail with [`DecisionError::AsyncNotSupported`] inside [`RouterError::Decision`],
    /// whatever the fallback: that is a configuration error, not a failed decision.
    pub fn decide_async(&self, request: &ChatModelRoutingRequest<'_>) -> RouteDecisionFuture {
        match self.plan(request) {
            Err(error) => Box::pin(std::future::ready(Err(error))),
            Ok(Plan::Decided(decision)) => Box::pin(std::future::ready(Ok(decision))),
            Ok(Plan::Ask(decision_request, pending)) => {
                let answer = self.decision_model.decide_async(&decision_request);
                Box::pin(async move { pending.conclude(answer.await) })
            }
        }
    }

    /// Everything before the decision model is called: the decisions that need no model, and the request.
    fn plan(&self, request: &ChatModelRoutingRequest<'_>) -> Result<Plan, RouterError> {
        let routes = request.routes();
        match routes {
            [] => {
                return Err(RouterError::config(
                    "routes",
                    "there is no route to choose from",
                ))
            }
            [only] => {
                return Ok(Plan::Decided(RouteDecision::without_probabilities(
                    ChatModelRoutingResult::route(only.name()),
                    RouteReason::OnlyCandidate,
                )))
            }
            _ => {}
        }
        let Some(input) = self.decision_input(request.chat_request()) else {
            return Ok(Plan::Decided(RouteDecision::without_probabilities(
                ChatModelRoutingResult::DefaultRoute,
                RouteReason::NoUserMessage,
            )));
        };
        let options = route_options(routes)?;
        let decision_request = self.request_for(input, &options)?;
        Ok(Plan::Ask(
            decision_request,
            Pending {
                options,
                routes: routes.iter().map(|r| r.name().to_owned()).collect(),
                min_probability: self.min_probability,
                fallback: self.fallback,
            },
        ))
    }
}

impl Pending {
    fn conclude(
        self,
        outcome: Result<DecisionResponse, DecisionError>,
    ) -> Result<RouteDecision, RouterError> {
        let response = match outcome {
            // Not a failed decision but a model that cannot be used this way: falling back would hide it forever.
            Err(error @ DecisionError::AsyncNotSupported { .. }) => {
                return Err(RouterError::Decision(error))
            }
            Err(error) => return self.fall_back(error),
            Ok(response) => response,
        };
        let answer = match response.choice(QUESTION_NAME) {
            Ok(answer) => answer,
            Err(error) => return self.fall_back(error),
        };
        let reported = answer.probabilities();
        if reported.is_empty() {
            if self.min_probability.is_some() {
                return Err(RouterError::NoProbabilities);
            }
            return match self.options.iter().find(|o| o.name == answer.value()) {
                Some(option) => Ok(RouteDecision::without_probabilities(
                    ChatModelRoutingResult::route(&self.routes[option.route]),
                    RouteReason::Chosen,
                )),
                // Validation makes this unreachable for models behind `decide`; a model that bypasses it must not
                // crash the router.
                None => self.fall_back(DecisionError::InvalidResponse(format!(
                    "the answer '{}' is not one of the options",
                    answer.value()
                ))),
            };
        }
        let mut sums = vec![0.0; self.routes.len()];
        for option in &self.options {
            sums[option.route] += reported.get(&option.name).copied().unwrap_or(0.0);
        }
        // The first route wins a tie, so the result does not depend on float noise in a stable order.
        let best = (1..sums.len()).fold(0, |best, i| if sums[i] > sums[best] { i } else { best });
        let probabilities: Vec<(String, f64)> = self
            .routes
            .iter()
            .cloned()
            .zip(sums.iter().copied())
            .collect();
        let (result, reason) = match self.min_probability {
            Some(min) if sums[best] < min => (
                ChatModelRoutingResult::DefaultRoute,
                RouteReason::BelowMinProbability,
            ),
            _ => (
                ChatModelRoutingResult::route(&self.routes[best]),
                RouteReason::Chosen,
            ),
        };
        Ok(RouteDecision {
            result,
            reason,
            probabilities,
        })
    }

    fn fall_back(self, error: DecisionError) -> Result<RouteDecision, RouterError> {
        match self.fallback {
            Fallback::Fail => Err(RouterError::Decision(error)),
            Fallback::DefaultRoute => {
                tracing::warn!(
                    routes = self.routes.len(),
                    "failed to select a route, the default route will be used: {error}"
                );
                Ok(RouteDecision::without_probabilities(
                    ChatModelRoutingResult::DefaultRoute,
                    RouteReason::Fallback {
                        error: error.to_string(),
                    },
                ))
            }
        }
    }
}

impl ChatModelRouter for DecisionModelChatModelRouter {
    fn route(
        &self,
        request: &ChatModelRoutingRequest<'_>,
    ) -> Result<ChatModelRoutingResult, RouterError> {
        self.decide(request).map(|decision| decision.result)
    }

    fn route_async(&self, request: &ChatModelRoutingRequest<'_>) -> RouteFuture {
        let decision = self.decide_async(request);
        Box::pin(async move { decision.await.map(|decision| decision.result) })
    }

    /// Rejects routes whose names and descriptions give the same option twice.
    fn validate(&self, routes: &[ChatModelRoute]) -> Result<(), RouterError> {
        crate::route::validate_option_names(routes)
    }
}

impl fmt::Debug for DecisionModelChatModelRouter {
    // The model is a trait object; its name is what identifies it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionModelChatModelRouter")
            .field("decision_model", &self.decision_model.model_name())
            .field("question", &self.question)
            .field("min_probability", &self.min_probability)
            .field("fallback", &self.fallback)
            .field("max_messages", &self.max_messages)
            .finish()
    }
}

/// Builds a [`DecisionModelChatModelRouter`]; every check happens in [`build`](Self::build), and each error names its
/// option.
#[derive(Clone)]
pub struct DecisionModelChatModelRouterBuilder {
    decision_model: Option<Arc<dyn DecisionModel>>,
    question: String,
    min_probability: Option<f64>,
    fallback: Fallback,
    max_messages: usize,
}

impl Default for DecisionModelChatModelRouterBuilder {
    fn default() -> Self {
        Self {
            decision_model: None,
            question: DEFAULT_QUESTION.to_owned(),
            min_probability: None,
            fallback: Fallback::default(),
            max_messages: DEFAULT_MAX_MESSAGES,
        }
    }
}

impl DecisionModelChatModelRouterBuilder {
    /// The model that decides (required).
    pub fn decision_model(mut self, model: Arc<dyn DecisionModel>) -> Self {
        self.decision_model = Some(model);
        self
    }

    /// The text of the routing question; not blank, default [`DEFAULT_QUESTION`]. It is a plain question, not a
    /// template: the routes are the options of one choice question.
    pub fn question(mut self, question: impl Into<String>) -> Self {
        self.question = question.into();
        self
    }

    /// Choose the default route when the best route's probability is below this (a probability equal to it is
    /// accepted); between 0 and 1, default unset (the best route is always taken). It needs a decision model that
    /// reports probabilities: otherwise routing fails with [`RouterError::NoProbabilities`], whatever the fallback.
    pub fn min_probability(mut self, min_probability: f64) -> Self {
        self.min_probability = Some(min_probability);
        self
    }

    /// What to do when the decision model fails or refuses; default [`Fallback::DefaultRoute`].
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// How many of the latest messages, up to and including the last user message, the decision sees; at least 1,
    /// default 1: the plain text of the last user message. More lets a bare "yes, go ahead" be read with the
    /// turn it answers, at the cost of drawing other requests toward the earlier turns' route.
    pub fn max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages;
        self
    }

    /// Checks every option and builds the router.
    pub fn build(self) -> Result<DecisionModelChatModelRouter, RouterError> {
        let decision_model = self
            .decision_model
            .ok_or_else(|| RouterError::config("decision_model", "is required"))?;
        if self.question.trim().is_empty() {
            return Err(RouterError::config("question", "must not be blank"));
        }
        if let Some(min) = self.min_probability {
            if !(0.0..=1.0).contains(&min) {
                return Err(RouterError::config(
                    "min_probability",
                    format!("must be between 0 and 1, but was {min}"),
                ));
            }
        }
        if self.max_messages == 0 {
            return Err(RouterError::config(
                "max_messages",
                "must be at least 1, but was 0",
            ));
        }
        Ok(DecisionModelChatModelRouter {
            decision_model,
            question: self.question,
            min_probability: self.min_probability,
            fallback: self.fallback,
            max_messages: self.max_messages,
        })
    }
}

impl fmt::Debug for DecisionModelChatModelRouterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionModelChatModelRouterBuilder")
            .field("decision_model", &self.decision_model.is_some())
            .field("question", &self.question)
            .field("min_probability", &self.min_probability)
            .field("fallback", &self.fallback)
            .field("max_messages", &self.max_messages)
            .finish()
    }
}
