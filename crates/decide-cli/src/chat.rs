//! `decide chat`: an interactive agent in the terminal, with the local decision model choosing the tools (`--filter`)
//! and the model (`--routes`) of every LLM call.
//!
//! One user message per line of standard input. For every LLM call it prints the route the router chose (with
//! `--routes`) and the tools the call received, then each tool call with its result, then the answer. The
//! conversation is kept (a window of the latest messages), so follow-ups work.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use decide_agent::{Agent, AgentRequest, AgentResponse, MessageWindowChatMemory};
use decide_chat::{
    ChatModel, ProvidedTool, StaticToolProvider, ToolProvider, ToolProviderRequest, UserMessage,
};
use decide_contract::DecisionModel;
use decide_filter::{FilterOptions, FilteringToolProvider};
use decide_llm::OpenAiChatModel;
use decide_mcp::{McpOptions, McpToolProvider};
use decide_router::{DecisionModelChatModelRouter, RoutingChatModel, ROUTE_ATTRIBUTE};

use crate::args::{ChatArgs, Global};
use crate::input::read_routes;

/// `--filter`'s share of needed tools kept when neither --target-recall nor --min-probability
/// is given and the model has a conformal table.
const DEFAULT_TARGET_RECALL: f64 = 0.9;

/// Messages kept per conversation: several tool rounds of several turns.
const MEMORY_MESSAGES: usize = 60;

pub fn run(global: &Global, args: ChatArgs) -> anyhow::Result<()> {
    if args.chat_model.is_none() && args.routes.is_none() {
        bail!("--chat-model: required (or --routes, whose route names are the models)");
    }
    if args.filter && args.mcp.is_empty() {
        bail!("--filter: needs tools to filter; add --mcp COMMAND");
    }
    let timeout = Duration::from_secs(args.timeout);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let servers = start_servers(&runtime, &args, timeout)?;
    let empty = ToolProviderRequest::builder(UserMessage::new("")).build();
    let mut tools = Vec::new();
    for server in &servers {
        tools.extend(server.provide_tools(&empty)?.tools);
    }
    let engine = if args.filter || args.routes.is_some() {
        Some(global.engine(false)?)
    } else {
        None
    };
    let decisions: Option<Arc<dyn DecisionModel>> =
        engine.map(|e| Arc::new(e) as Arc<dyn DecisionModel>);
    let provider = tool_provider(&args, tools, decisions.as_ref())?;
    let chat_model = chat_model(&args, decisions.as_ref(), timeout)?;
    let mut builder = Agent::builder(chat_model)
        .max_rounds(args.max_rounds)
        .chat_memory(MessageWindowChatMemory::new(MEMORY_MESSAGES).expect("at least 3"));
    if let Some(system) = &args.system {
        builder = builder.system_message(system);
    }
    if let Some(provider) = provider {
        builder = builder.tool_provider(provider);
    }
    let agent = builder.build()?;
    converse(&runtime, &agent)?;
    drop(servers);
    Ok(())
}

/// The MCP servers of `--mcp`: started once, their tools listed once.
fn start_servers(
    runtime: &tokio::runtime::Runtime,
    args: &ChatArgs,
    timeout: Duration,
) -> anyhow::Result<Vec<McpToolProvider>> {
    let mut servers = Vec::new();
    for command in &args.mcp {
        let mut words = command.split_whitespace();
        let Some(program) = words.next() else {
            bail!("--mcp: empty command");
        };
        let rest: Vec<&str> = words.collect();
        let start = Duration::from_secs(args.mcp_start_timeout);
        // Past the deadline the future is dropped, and with it the child (killed on drop).
        let server = runtime
            .block_on(async {
                tokio::time::timeout(
                    start,
                    McpToolProvider::stdio(
                        program,
                        &rest,
                        McpOptions::default().with_timeout(timeout),
                    ),
                )
                .await
            })
            .map_err(|_| {
                anyhow::anyhow!(
                    "did not start and list its tools within {} s (--mcp-start-timeout)",
                    start.as_secs()
                )
            })
            .and_then(|r| r.map_err(anyhow::Error::from))
            .with_context(|| format!("--mcp {command}"))?;
        servers.push(server);
    }
    Ok(servers)
}

/// The tools each LLM call is offered: all of them, or with `--filter` those the decision
/// model selects; `None` without tools.
fn tool_provider(
    args: &ChatArgs,
    tools: Vec<ProvidedTool>,
    decisions: Option<&Arc<dyn DecisionModel>>,
) -> anyhow::Result<Option<Arc<dyn ToolProvider>>> {
    if tools.is_empty() {
        return Ok(None);
    }
    let Some(decisions) = decisions.filter(|_| args.filter) else {
        return Ok(Some(Arc::new(StaticToolProvider::new(tools))));
    };
    let builder = FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::new(tools)))
        .decision_model(Arc::clone(decisions));
    // An agent loses a turn when the tool it needs is held back, where `select` only shows a
    // choice: so with neither option given, the conformal set of DEFAULT_TARGET_RECALL when the
    // model has a table (the gate alone holds back a needed tool whose probability is low even
    // when the conversation plainly asks for one: "What is 19 plus 23? Use your tools.").
    let target_recall = args.target_recall.or_else(|| {
        (args.min_probability.is_none() && decisions.selection_hints().conformal.is_some())
            .then_some(DEFAULT_TARGET_RECALL)
    });
    let options = FilterOptions {
        min_probability: args.min_probability,
        target_recall,
        ..FilterOptions::default()
    };
    let filter = options
        .apply(builder)
        .and_then(|b| b.build())
        .map_err(crate::filtering::option_error)?;
    Ok(Some(Arc::new(filter)))
}

/// A client of `model` at `--base-url`.
fn client(args: &ChatArgs, model: &str, timeout: Duration) -> anyhow::Result<Arc<dyn ChatModel>> {
    let mut builder = OpenAiChatModel::builder(&args.base_url, model).timeout(timeout);
    if let Some(key) = &args.api_key {
        builder = builder.api_key(key);
    }
    Ok(Arc::new(builder.build().context("--base-url")?))
}

/// The model that answers: `--chat-model`, or with `--routes` the route's model the router
/// chooses for each call.
fn chat_model(
    args: &ChatArgs,
    decisions: Option<&Arc<dyn DecisionModel>>,
    timeout: Duration,
) -> anyhow::Result<Arc<dyn ChatModel>> {
    let (Some(path), Some(decisions)) = (&args.routes, decisions) else {
        return client(
            args,
            args.chat_model.as_deref().unwrap_or_default(),
            timeout,
        );
    };
    let routes = read_routes(path)?;
    let mut builder = RoutingChatModel::builder();
    for route in routes.routes() {
        // A route's name is the model that serves it.
        let model = client(args, route.name(), timeout)?;
        builder = builder.add_route(route.clone(), model);
    }
    let router = builder
        .router(Arc::new(DecisionModelChatModelRouter::new(Arc::clone(
            decisions,
        ))))
        .default_route(routes.default_route())
        .build()
        .with_context(|| path.display().to_string())?;
    Ok(Arc::new(router))
}

/// One turn per line of standard input, until it ends.
fn converse(runtime: &tokio::runtime::Runtime, agent: &Agent) -> anyhow::Result<()> {
    let interactive = std::io::stdin().is_terminal();
    let mut out = std::io::stdout().lock();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            write!(out, "> ")?;
            out.flush()?;
        }
        let Some(line) = lines.next() else {
            return Ok(());
        };
        let line = line.context("standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        match runtime.block_on(agent.chat(AgentRequest::new(line).memory_id("terminal"))) {
            Ok(response) => print_turn(&mut out, &response)?,
            // One failed turn does not end the session; the next line is a new try.
            Err(error) => writeln!(out, "error: {error}")?,
        }
    }
}

/// Each LLM call of the turn (its route, its tools, the tool calls and their results), then
/// the answer.
fn print_turn(out: &mut impl Write, response: &AgentResponse) -> anyhow::Result<()> {
    for (i, round) in response.rounds.iter().enumerate() {
        let route = round
            .response
            .attribute(ROUTE_ATTRIBUTE)
            .and_then(|v| v.as_str())
            .map(|r| format!(" route {r},"))
            .unwrap_or_default();
        let tools = if round.tools.is_empty() {
            "none".to_owned()
        } else {
            round.tools.join(", ")
        };
        writeln!(out, "[call {}]{route} tools: {tools}", i + 1)?;
        for execution in &round.executions {
            writeln!(
                out,
                "  {}({}) -> {}",
                execution.call.name,
                execution.call.arguments,
                execution.outcome.text.replace('\n', " ")
            )?;
        }
    }
    writeln!(out, "{}", response.text)?;
    out.flush()?;
    Ok(())
}
