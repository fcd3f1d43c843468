//! Tools with executors, and how the calls of one LLM turn are run.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use decide_chat::{
    InvocationContext, ProvidedTool, ToolCall, ToolExecutionError, ToolExecutor, ToolResultMessage,
    ToolSpecification,
};

/// The future of an asynchronous tool call.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<String, ToolExecutionError>> + Send>>;

type AsyncToolFn = dyn Fn(String, InvocationContext) -> ToolFuture + Send + Sync;

#[derive(Clone)]
enum Run {
    /// Synchronous: runs on the blocking pool.
    Blocking(Arc<dyn ToolExecutor>),
    /// Asynchronous: runs as a task.
    Async(Arc<AsyncToolFn>),
}

/// A tool the agent can run: what the LLM sees, and how to run it.
///
/// Made by the `#[tool]` and `#[tools]` attributes, by hand with [`Tool::blocking`] or [`Tool::from_async`], or from
/// a provider's [`ProvidedTool`].
#[derive(Clone)]
pub struct Tool {
    specification: ToolSpecification,
    run: Run,
}

impl Tool {
    /// A synchronous tool. It runs on the blocking pool, never on a runtime worker, so it may block (a database
    /// query, a file read, a computation).
    pub fn blocking(
        specification: ToolSpecification,
        executor: impl Fn(&str, &InvocationContext) -> Result<String, ToolExecutionError>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self::from_executor(specification, Arc::new(executor))
    }

    /// A synchronous tool from a [`ToolExecutor`], run on the blocking pool.
    pub fn from_executor(
        specification: ToolSpecification,
        executor: Arc<dyn ToolExecutor>,
    ) -> Self {
        Self {
            specification,
            run: Run::Blocking(executor),
        }
    }

    /// An asynchronous tool: `run` gets the raw JSON arguments and the caller's context, and its future runs as a
    /// task of the caller's runtime.
    pub fn from_async<F, Fut>(specification: ToolSpecification, run: F) -> Self
    where
        F: Fn(String, InvocationContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, ToolExecutionError>> + Send + 'static,
    {
        Self {
            specification,
            run: Run::Async(Arc::new(move |arguments, context| {
                Box::pin(run(arguments, context)) as ToolFuture
            })),
        }
    }

    /// A provider's tool, if it has an executor (a provider may hand out tools whose calls the application runs).
    pub fn from_provided(tool: ProvidedTool) -> Option<Self> {
        let executor = tool.executor?;
        Some(Self::from_executor(tool.specification, executor))
    }

    /// The tool as a provider hands it out, so that `#[tool]` functions can be served by a [`ToolProvider`] (and
    /// filtered by one); `None` for an asynchronous tool, since provider executors are synchronous.
    ///
    /// [`ToolProvider`]: decide_chat::ToolProvider
    pub fn into_provided(self) -> Option<ProvidedTool> {
        match self.run {
            Run::Blocking(executor) => {
                Some(ProvidedTool::new(self.specification).with_executor(executor))
            }
            Run::Async(_) => None,
        }
    }

    /// What the LLM sees.
    pub fn specification(&self) -> &ToolSpecification {
        &self.specification
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.specification.name
    }

    /// Whether the tool is asynchronous.
    pub fn is_async(&self) -> bool {
        matches!(self.run, Run::Async(_))
    }

    /// Runs the tool with the raw JSON `arguments` and the caller's `context`, catching a panic.
    ///
    /// Must be called within a Tokio runtime: a synchronous tool goes to `spawn_blocking`, an asynchronous one to
    /// `spawn`, so that a panic ends the task and not the agent, and so that the calls of one turn run in parallel.
    pub async fn execute(&self, arguments: String, context: InvocationContext) -> ToolOutcome {
        let joined = match &self.run {
            Run::Blocking(executor) => {
                let executor = Arc::clone(executor);
                tokio::task::spawn_blocking(move || executor.execute(&arguments, &context)).await
            }
            Run::Async(run) => tokio::spawn(run(arguments, context)).await,
        };
        match joined {
            Ok(Ok(text)) => ToolOutcome::success(text),
            Ok(Err(error)) => ToolOutcome::failure(format!("Error: {error}")),
            Err(error) if error.is_panic() => ToolOutcome::failure(format!(
                "Error: the tool panicked: {}",
                panic_message(error.into_panic())
            )),
            Err(error) => ToolOutcome::failure(format!("Error: the tool was cancelled: {error}")),
        }
    }
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("specification", &self.specification)
            .field("async", &self.is_async())
            .finish()
    }
}

/// The text of a panic payload: `panic!` gives a `&str` or a `String`.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(text) => (*text).to_owned(),
            Err(_) => "(no message)".to_owned(),
        },
    }
}

/// A type whose methods are tools: implemented by `#[tools]` on an impl block.
pub trait ToolBox: Send + Sync + 'static {
    /// One tool per `#[tool]` method, in declaration order, each holding the shared instance.
    fn into_tools(self: Arc<Self>) -> Vec<Tool>;
}

/// What a tool call gave: the text for the LLM, and whether it is an error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The text of the tool-result message.
    pub text: String,
    /// Whether the tool failed, panicked, was not found or got invalid arguments; the text then says why.
    pub is_error: bool,
}

impl ToolOutcome {
    fn success(text: String) -> Self {
        Self {
            text,
            is_error: false,
        }
    }

    fn failure(text: String) -> Self {
        Self {
            text,
            is_error: true,
        }
    }
}

/// One executed tool call: the call, and what it gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolExecution {
    /// The call as the LLM made it.
    pub call: ToolCall,
    /// What it gave.
    pub outcome: ToolOutcome,
}

impl ToolExecution {
    /// The tool-result message answering the call: same id, the tool's name, the outcome's text.
    pub fn result_message(&self) -> ToolResultMessage {
        ToolResultMessage {
            tool_call_id: self.call.id.clone(),
            tool_name: Some(self.call.name.clone()),
            text: self.outcome.text.clone(),
        }
    }
}

/// Runs the calls of one LLM turn concurrently and returns their executions in call order.
///
/// Every call is started before any is awaited (synchronous tools on the blocking pool, asynchronous ones as tasks),
/// so a slow call does not hold up the others; awaiting them in order then gives the results in call order, which is
/// the order the LLM expects them. A call of a tool that is not in `tools` gets an error text naming the tools that
/// are, so the LLM can correct itself.
pub async fn execute_tool_calls(
    calls: &[ToolCall],
    tools: &HashMap<String, Tool>,
    context: &InvocationContext,
) -> Vec<ToolExecution> {
    let handles: Vec<_> = calls
        .iter()
        .map(|call| {
            let tool = tools.get(&call.name).cloned();
            let arguments = call.arguments.clone();
            let context = context.clone();
            let available = || {
                let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
                names.sort_unstable();
                names.join(", ")
            };
            let unknown = format!(
                "Error: there is no tool named '{}'; the tools are: {}",
                call.name,
                available()
            );
            tokio::spawn(async move {
                match tool {
                    Some(tool) => tool.execute(arguments, context).await,
                    None => ToolOutcome::failure(unknown),
                }
            })
        })
        .collect();
    let mut executions = Vec::with_capacity(calls.len());
    for (call, handle) in calls.iter().zip(handles) {
        // `execute` catches the tool's panics itself; a join error here can only be a cancelled runtime.
        let outcome = handle.await.unwrap_or_else(|error| {
            ToolOutcome::failure(format!("Error: the tool call was cancelled: {error}"))
        });
        executions.push(ToolExecution {
            call: call.clone(),
            outcome,
        });
    }
    executions
}
