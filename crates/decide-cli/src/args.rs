//! The command line, as clap reads it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use decide_engine::{DeviceSpec, Engine, Precision, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MODEL};

/// Decide which tools an LLM should see, locally, in milliseconds.
#[derive(Parser, Debug)]
#[command(name = "decide", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Model: a folder, a name in models/, or a Hugging Face id in the local cache.
    #[arg(long, global = true, env = "DECIDE_MODEL", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Device: cpu, cuda, cuda:N, metal or auto.
    #[arg(long, global = true, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceSpec,
    /// Precision: f32, int8 (CPU: int8 linear layers, on AMX tiles or VNNI where the CPU has
    /// them), auto (the fastest that keeps the accuracy targets: bf16 on a CPU with AMX, else
    /// f32), bf16 (CPU: linear layers on AMX tiles, Intel Xeon since Sapphire Rapids; GPUs: bf16
    /// weights), or f16 on GPUs.
    /// `--precision` is the same option.
    #[arg(long, visible_alias = "precision", global = true, default_value = "f32", value_parser = parse_precision)]
    pub dtype: Precision,
    /// Token budget of one forward pass (rows × longest row).
    #[arg(long, global = true, default_value_t = DEFAULT_MAX_BATCH_TOKENS)]
    pub max_batch_tokens: usize,
    /// Weight of BM25 in hybrid scoring (default: the model's manifest; 0 = the model alone).
    /// The calibration is fitted for the manifest's weight.
    #[arg(long, global = true, value_name = "W")]
    pub lexical_weight: Option<f64>,
    /// Whether a tool's text carries its parameter names, `name: description (a, b)` (default:
    /// the model's manifest). The calibration is fitted for the manifest's choice.
    #[arg(long, global = true, value_name = "BOOL")]
    pub tool_parameters: Option<bool>,
    /// Whether a tool's text carries the name of its server (an MCP catalogue's
    /// `_meta.server`), `name: [server] description` (default: the model's manifest). The
    /// calibration is fitted for the manifest's choice.
    #[arg(long, global = true, value_name = "BOOL")]
    pub tool_server: Option<bool>,
    /// A second model (typically a cross-encoder) that rescores the --rerank-top most probable
    /// tools of --model: a cascade. For `decide serve`, the model of the rerank endpoints.
    #[arg(long, global = true, value_name = "MODEL")]
    pub rerank: Option<String>,
    /// How many tools the --rerank model rescores.
    #[arg(long, global = true, value_name = "K", default_value_t = decide_engine::DEFAULT_TOP_K)]
    pub rerank_top: usize,
    /// Which code runs the encoder on the CPU: auto (fused kernels at the widest instruction set
    /// detected, int8 products on AMX tiles where the CPU has them), avx512 (the int8 products
    /// on VNNI, not AMX), avx2, avx-vnni (avx2 with int8 products on AVX-VNNI), portable, or
    /// stock (candle's own ops, the f32 reference).
    #[arg(long, global = true, default_value = "auto", value_parser = parse_kernels)]
    pub kernels: decide_engine::CpuKernels,
}

fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    s.parse()
        .map_err(|e: decide_engine::EngineError| e.to_string())
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
        .map_err(|e: decide_engine::EngineError| e.to_string())
}

impl Global {
    /// Loads the engine these options name.
    pub fn engine(&self, allow_uncalibrated: bool) -> anyhow::Result<Engine> {
        self.engine_with(allow_uncalibrated, |b| b)
    }

    /// [`engine`](Self::engine) with further settings of the builder (a command's own).
    pub fn engine_with(
        &self,
        allow_uncalibrated: bool,
        more: impl FnOnce(decide_engine::EngineBuilder) -> decide_engine::EngineBuilder,
    ) -> anyhow::Result<Engine> {
        if self.model == decide_engine::BM25_MODEL_NAME {
            anyhow::bail!("--model bm25: this command needs a neural model");
        }
        let mut builder = more(Engine::builder());
        if let Some(w) = self.lexical_weight {
            builder = builder.lexical_weight(w);
        }
        if let Some(on) = self.tool_parameters {
            builder = builder.tool_parameters(on);
        }
        if let Some(on) = self.tool_server {
            builder = builder.tool_server(on);
        }
        Ok(builder
            .model(&self.model)
            .device(self.device)
            .precision(self.dtype)
            .max_batch_tokens(self.max_batch_tokens)
            .cpu_kernels(self.kernels)
            .allow_uncalibrated(allow_uncalibrated)
            .build()?)
    }

    /// Loads the decision model these options name: the engine, or BM25 for `--model bm25`.
    pub fn decider(&self, allow_uncalibrated: bool) -> anyhow::Result<crate::decider::Decider> {
        let first = crate::decider::Decider::load(&self.model, || self.engine(allow_uncalibrated))?;
        let Some(rerank) = &self.rerank else {
            return Ok(first);
        };
        if self.rerank_top == 0 {
            anyhow::bail!("--rerank-top: must be at least 1");
        }
        let second = crate::decider::Decider::load(rerank, || {
            let mut other = self.clone();
            other.model = rerank.clone();
            other.lexical_weight = None;
            other.tool_parameters = None;
            other.tool_server = None;
            other.engine(allow_uncalibrated)
        })
        .map_err(|e| anyhow::anyhow!("--rerank {rerank}: {e}"))?;
        crate::decider::Decider::cascade(first, second, self.rerank_top)
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Select the tools a conversation needs.
    Select(SelectArgs),
    /// Score every tool of every case of a JSONL file; one JSON line out per line in.
    Score(ScoreArgs),
    /// Fit the model's calibration (raw score to probability) on labelled cases, and write the
    /// conformal table --target-recall reads (use cases the model was not trained on).
    Calibrate(CalibrateArgs),
    /// Measure the quality of the tool selection on labelled cases: accuracy, recall@k, MRR, precision and
    /// recall at --min-probability (or --target-recall's threshold), tools selected per case, calibration error, latency.
    Eval(EvalArgs),
    /// Choose the route (the chat model) a conversation should go to.
    Route(RouteArgs),
    /// List, locate and download models.
    Models(ModelsArgs),
    /// Measure scoring throughput over batch sizes × sequence lengths, and decision latency.
    Bench(BenchArgs),
    /// Serve the OpenAI Decisions and System One APIs, /v1/select, /v1/route, embeddings, rerank and a playground over HTTP, batching across requests.
    Serve(ServeArgs),
    /// Chat with an LLM in the terminal, the local model choosing each call's tools (--filter) and model (--routes).
    Chat(ChatArgs),
    /// Fine-tune the model on labelled cases (the `decide score` format) and write a model folder.
    Train(TrainArgs),
    /// Serve the tools of many MCP servers to an MCP client through search (stdio, or streamable HTTP with --http).
    Mcp(McpArgs),
}

/// The tool filter's options, shared by `select`, `score`, `calibrate` and `eval` so that all
/// of them see a conversation the same way.
#[derive(Args, Debug, Clone)]
pub struct FilterArgs {
    /// Pass on every tool whose probability reaches this (inclusive) [default: 0.5].
    // Not a clap default: --target-recall must tell a given value from the default.
    #[arg(long, value_name = "P")]
    pub min_probability: Option<f64>,
    /// Instead of --min-probability, pass on the fewest tools that still find the needed ones this
    /// share of the time (0 < R < 1), by the conformal table `decide calibrate` writes into the
    /// model's manifest.
    #[arg(long, value_name = "R")]
    pub target_recall: Option<f64>,
    /// Keep at most this many of the most probable tools.
    #[arg(long)]
    pub max_results: Option<usize>,
    /// How many of the latest messages the decision sees (system messages come on top).
    #[arg(long, default_value_t = decide_filter::DEFAULT_MAX_MESSAGES)]
    pub max_messages: usize,
    /// Messages longer than this many characters are shortened (start and end kept).
    #[arg(long, default_value_t = decide_filter::DEFAULT_MAX_MESSAGE_LENGTH)]
    pub max_message_length: usize,
    /// Tools passed on without asking the model (repeat or separate with commas).
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    pub always_include: Vec<String>,
    /// What passes when the model fails: all-tools, no-tools or fail.
    #[arg(long, default_value = "all-tools", value_parser = parse_fallback)]
    pub fallback: decide_filter::Fallback,
    /// Decide first whether the conversation needs any tool (the model's needs-tool head and its
    /// best tool, against --min-probability), then pass the best tool and every tool over the
    /// model's lower threshold: on, off [default: on when the model has a needs-tool head and no
    /// --target-recall is given].
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub needs_tool_gate: Option<bool>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}': expected on or off")),
    }
}

fn parse_fallback(s: &str) -> Result<decide_filter::Fallback, String> {
    s.parse()
        .map_err(|_| format!("'{s}': expected all-tools, no-tools or fail"))
}

#[derive(Args, Debug)]
pub struct SelectArgs {
    /// Tools: OpenAI function tools, bare {name, description, parameters}, or an MCP tools/list result.
    #[arg(long, value_name = "TOOLS.json")]
    pub tools: PathBuf,
    /// The conversation, in the OpenAI chat format (tool calls and tool results included).
    #[arg(long, value_name = "CONVERSATION.json", conflicts_with = "text")]
    pub messages: Option<PathBuf>,
    /// A single user message, instead of --messages.
    #[arg(value_name = "TEXT")]
    pub text: Option<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RouteArgs {
    /// Routes: {"default": NAME, "routes": [{"name", "description"?, "descriptions"?}]}.
    #[arg(long, value_name = "ROUTES.json")]
    pub routes: PathBuf,
    /// The conversation, in the OpenAI chat format.
    #[arg(long, value_name = "CONVERSATION.json", conflicts_with = "text")]
    pub messages: Option<PathBuf>,
    /// A single user message, instead of --messages.
    #[arg(value_name = "TEXT")]
    pub text: Option<String>,
    /// How many of the latest messages, up to and including the last user message, the decision sees.
    #[arg(long, default_value_t = decide_router::DEFAULT_MAX_MESSAGES)]
    pub max_messages: usize,
    /// Take the default route when the best route's probability is below this.
    #[arg(long)]
    pub min_probability: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub cases: CasesArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// A file of cases, shared by `score`, `calibrate` and `eval`.
#[derive(Args, Debug, Clone)]
pub struct CasesArgs {
    /// Cases, one JSON object a line: {"id", "messages", "tools"?, "expected"?} ("expected": []
    /// for a case that needs no tool; `calibrate` and `eval` need it on every line).
    #[arg(long, value_name = "FILE.jsonl")]
    pub data: PathBuf,
    /// A tool catalogue for lines that have no "tools".
    #[arg(long, value_name = "CATALOGUE.json")]
    pub tools: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Labelled cases, one JSON object a line: {"id", "messages", "tools"?, "expected"}; repeat
    /// for several files.
    #[arg(long, value_name = "FILE.jsonl", required = true)]
    pub data: Vec<PathBuf>,
    /// A tool catalogue for lines that have no "tools": one for every --data, or one per
    /// --data in the same order.
    #[arg(long, value_name = "CATALOGUE.json")]
    pub tools: Vec<PathBuf>,
    /// More labelled cases whose needed tools --target-recall must cover, each file a source of
    /// its own: the threshold for a target recall R becomes the lowest of the sources' (the
    /// --data cases together, then each of these files), so that cases like each source's keep
    /// R of their needed tools. The Platt fit reads --data only. Repeat for several files.
    #[arg(long, value_name = "FILE.jsonl")]
    pub conformal_data: Vec<PathBuf>,
    /// A tool catalogue for --conformal-data lines that have no "tools": one for every
    /// --conformal-data, or one per file in the same order.
    #[arg(long, value_name = "CATALOGUE.json")]
    pub conformal_tools: Vec<PathBuf>,
    /// Labelled conversations to fit the model's needs-tool head on (`expected` empty for those
    /// that need no tool; "tools" are not read), written to the manifest's needs_tool table: whether
    /// a conversation needs any tool, which --needs-tool-gate reads. Thousands of them, both
    /// kinds; training cases will do, since the head is fitted apart from the encoder. Repeat for
    /// several files.
    #[arg(long, value_name = "FILE.jsonl")]
    pub needs_tool_data: Vec<PathBuf>,
    /// With --needs-tool-data, the probability at which further tools pass once the gate finds
    /// that the conversation needs a tool.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.2,
        requires = "needs_tool_data"
    )]
    pub companion_min_probability: f64,
    /// Print the fit without writing it to the model's manifest.
    #[arg(long)]
    pub dry_run: bool,
    /// Draw a reliability plot (PNG) of the probabilities before and after the fit.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub cases: CasesArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write every case's ranking here, one JSON line a case: {"id", "expected",
    /// "ranking": [{"tool", "probability"}, ...]}, most probable first.
    #[arg(long, value_name = "FILE.jsonl")]
    pub cases_out: Option<PathBuf>,
    /// Training cases (same format, read with --tools): also report recall@5/10 and MRR
    /// separately for the needed tools named in any "expected" there (seen) and the others
    /// (unseen). Repeat for several files.
    #[arg(long, value_name = "TRAIN.jsonl")]
    pub seen_in: Vec<PathBuf>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args, Debug)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub command: ModelsCommand,
}

#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// The models the engine knows, and whether each is on this machine.
    List,
    /// Where a model's files are (offline).
    Path {
        /// A name, a Hugging Face id or a folder.
        name: String,
    },
    /// Download a model from the Hugging Face hub into its cache (needs the network).
    Pull {
        /// A known name or a Hugging Face id.
        name: String,
    },
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Rows per forward pass (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub batch_sizes: Vec<usize>,
    /// Tokens per row, special tokens included (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "64,128,256")]
    pub seq_lens: Vec<usize>,
    /// Tool counts of the decision-latency runs (a 10-message conversation, tool embeddings
    /// cached).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub decision_tools: Vec<usize>,
    /// Skip the decision-latency runs.
    #[arg(long)]
    pub no_decisions: bool,
    /// Also time scoring every tool of this catalogue from scratch (`name: description`, as
    /// decisions read them; embeddings for a bi-encoder, pairs with one request for a
    /// cross-encoder): real texts of mixed lengths, as a filter's first call meets them.
    #[arg(long, value_name = "TOOLS.json")]
    pub catalogue: Option<PathBuf>,
    /// Also draw throughput (pairs/s) against batch size, a line per sequence length, into
    /// this PNG.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Timed calls per cell, at least.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Timed calls per cell, at most.
    #[arg(long, default_value_t = 50)]
    pub max_reps: usize,
    /// Keep timing a cell until this many seconds have passed (within --max-reps).
    #[arg(long, default_value_t = 1.0)]
    pub min_time_s: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No progress bar on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

fn parse_head(s: &str) -> Result<decide_train::TrainHead, String> {
    match s {
        "bi-encoder" => Ok(decide_train::TrainHead::BiEncoder),
        "cross-encoder" => Ok(decide_train::TrainHead::CrossEncoder),
        other => Err(format!(
            "'{other}' is not a head (bi-encoder or cross-encoder)"
        )),
    }
}

fn parse_kernels(s: &str) -> Result<decide_engine::CpuKernels, String> {
    s.parse()
        .map_err(|e: decide_engine::EngineError| e.to_string())
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, env = "DECIDE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Decisions in flight at once, queued ones included; past it, 503 with Retry-After.
    #[arg(long, default_value_t = 512)]
    pub max_concurrent_requests: usize,
    /// Requests batched into one forward pass (under --max-batch-tokens).
    #[arg(long, default_value_t = 64)]
    pub max_batch_requests: usize,
    /// Run every request in a forward pass of its own (for comparison).
    #[arg(long)]
    pub no_batching: bool,
    /// Largest request body in bytes; past it, 413.
    #[arg(long, default_value_t = 2 * 1024 * 1024)]
    pub payload_limit: usize,
    /// Seconds a request may take; past it, 504.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Questions per request.
    #[arg(long, default_value_t = 64)]
    pub max_questions: usize,
    /// Options per choice question (and tools or routes per request).
    #[arg(long, default_value_t = 255)]
    pub max_options: usize,
    /// Host names accepted in the Host header besides the bound address and the loopback names
    /// (repeat or separate with commas; `*` accepts any). Others get 403: a web page cannot
    /// reach the server by a name of its own that resolves here (DNS rebinding).
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
    /// Web origins (`https://app.example`) whose pages may call the server, answered with CORS
    /// headers; requests from any other web page get 403.
    #[arg(long, value_delimiter = ',', value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Seconds a client may take to send a request's headers, and then its body; idle
    /// connections are closed after it too.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub read_timeout: f64,
    /// Open connections at once; past it, new ones wait until one closes.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Memory for cached tool embeddings, in MiB, the texts counted (each stored once); the
    /// oldest go first. Bounds what many distinct large tool lists can make the server keep.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    pub cache_mb: usize,
    /// Seconds requests in flight may take after SIGTERM before their connections are dropped.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub shutdown_timeout: f64,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The OpenAI-compatible base URL of the LLM server (OpenAI, vLLM, llama.cpp, Ollama's /v1).
    #[arg(long, value_name = "URL", env = "DECIDE_BASE_URL")]
    pub base_url: String,
    /// The LLM at --base-url (`--model` names the local decision model).
    #[arg(long, value_name = "NAME")]
    pub chat_model: Option<String>,
    /// The LLM server's API key, sent to --base-url as a bearer token. Its variable is not
    /// DECIDE_API_KEY, `decide serve`'s own key, so neither key reaches the other's peer.
    #[arg(long, env = "DECIDE_LLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// An MCP server to start and take tools from, e.g. "npx -y @modelcontextprotocol/server-everything";
    /// repeatable. The command is split at whitespace.
    #[arg(long, value_name = "COMMAND")]
    pub mcp: Vec<String>,
    /// Send each LLM call only the MCP tools the decision model finds relevant.
    #[arg(long)]
    pub filter: bool,
    /// With --filter: pass on the fewest tools that keep at least this share of the needed ones
    /// (the model's conformal table, as `decide select --target-recall`). The default, 0.9, is
    /// taken when the model has a conformal table and --min-probability is not given: an agent
    /// that misses the tool it needs cannot answer, one with a few tools too many still can.
    #[arg(long, value_name = "R", requires = "filter")]
    pub target_recall: Option<f64>,
    /// With --filter: pass on every tool whose probability reaches this instead of a
    /// --target-recall set (a no-tool message can then get no tools at all); with a model that has
    /// a needs-tool head, this is the bar of its gate, and the tools that come with the best one
    /// pass from the model's lower threshold (see `decide select --needs-tool-gate`).
    #[arg(
        long,
        value_name = "P",
        requires = "filter",
        conflicts_with = "target_recall"
    )]
    pub min_probability: Option<f64>,
    /// Routes ({"default", "routes": [{"name", "description"}]}) whose names are models at --base-url; the decision
    /// model picks one per call.
    #[arg(long, value_name = "ROUTES.json")]
    pub routes: Option<PathBuf>,
    /// The system message.
    #[arg(long)]
    pub system: Option<String>,
    /// The most LLM calls per message.
    #[arg(long, default_value_t = decide_agent::DEFAULT_MAX_ROUNDS)]
    pub max_rounds: usize,
    /// Seconds to wait for the LLM server and for each MCP tool call.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Seconds an MCP server may take to start and list its tools; past it, it is stopped.
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    pub mcp_start_timeout: u64,
}

#[derive(Args, Debug)]
pub struct McpArgs {
    /// An upstream MCP server to start, e.g. "npx -y @modelcontextprotocol/server-memory"; repeatable. The
    /// command is split at whitespace; its tools are prefixed (on a clash) with the name the server gives itself.
    #[arg(long, value_name = "COMMAND")]
    pub mcp: Vec<String>,
    /// An upstream MCP server's streamable HTTP endpoint, e.g. http://localhost:3001/mcp; repeatable.
    #[arg(long, value_name = "URL")]
    pub mcp_url: Vec<String>,
    /// Upstream servers in the `mcpServers` JSON of MCP clients (Claude Desktop, Cursor, VS Code): an existing
    /// configuration file works unchanged.
    #[arg(long, value_name = "FILE.json")]
    pub config: Option<PathBuf>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// With --http: require `Authorization: Bearer KEY` (over stdio the client that starts the
    /// gateway is trusted, and an exported DECIDE_API_KEY is not read).
    #[arg(long, env = "DECIDE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// What tools/list holds: `search` (search_tools and call_tool) or `found` (search_tools and every tool found
    /// so far in the session, announced with notifications/tools/list_changed).
    #[arg(long, default_value = "search", value_parser = parse_expose)]
    pub expose: decide_mcp::Expose,
    /// A tool always listed (by its offered name); repeatable.
    #[arg(long, value_name = "NAME")]
    pub always_include: Vec<String>,
    /// The most tools a search returns when it does not say.
    #[arg(long, default_value_t = 5)]
    pub max_results: usize,
    /// Searches return the fewest tools (at most --max-results) that keep at least this share of the needed ones
    /// (the model's conformal table) instead of the best --max-results whatever their probability.
    #[arg(long, value_name = "R")]
    pub target_recall: Option<f64>,
    /// Seconds to wait for an upstream to start, list its tools or answer a call.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// With --http: host names accepted in the Host header besides the bound address and the loopback names
    /// (repeat or separate with commas; `*` accepts any); others get 403. Checked always on loopback, elsewhere
    /// only when given.
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
    /// With --http: web origins (`https://app.example`) whose pages may call the gateway, answered with CORS
    /// headers; requests from any other web page (Origin: null included) get 403.
    #[arg(long, value_delimiter = ',', value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// With --http: client sessions held at once; an initialize past it gets 503.
    #[arg(long, default_value_t = decide_mcp::DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,
    /// With --http: seconds a session may go without a message before it ends and its state is dropped.
    #[arg(long, default_value_t = 300.0, value_name = "SECONDS")]
    pub session_idle_timeout: f64,
    /// With --http: seconds a client may take to send a request's headers, and then its body; idle connections are
    /// closed after it too.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub read_timeout: f64,
    /// With --http: open connections at once; past it, new ones wait until one closes.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// With --http: seconds requests in flight may take after SIGTERM before their connections are dropped.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub shutdown_timeout: f64,
}

fn parse_expose(s: &str) -> Result<decide_mcp::Expose, String> {
    s.parse()
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Labelled cases to train on, one JSON object a line: {"id", "messages", "tools"?,
    /// "expected"}; "expected": [] marks a case that needs no tool.
    #[arg(long, value_name = "TRAIN.jsonl")]
    pub data: PathBuf,
    /// Labelled cases measured after every epoch (the best epoch by MRR is kept) and used to fit
    /// the calibration; they must not overlap --data.
    #[arg(long, value_name = "EVAL.jsonl")]
    pub eval: Option<PathBuf>,
    /// A tool catalogue for lines that have no "tools" (both files).
    #[arg(long, value_name = "CATALOGUE.json")]
    pub tools: Option<PathBuf>,
    /// The model to start from (default: --model).
    #[arg(long, value_name = "MODEL")]
    pub base: Option<String>,
    /// The model folder to write (replaced only if empty or written by decide train).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The model's name in its manifest (default: the folder's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Passes over the training pairs.
    #[arg(long, default_value_t = 4)]
    pub epochs: usize,
    /// Peak learning rate (AdamW, linear warm-up over 10% of the steps, then linear decay).
    #[arg(long, default_value_t = 2e-5)]
    pub lr: f64,
    /// (request, needed tool) pairs per step; the other pairs' tools are its negatives.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Longest input in tokens while training.
    #[arg(long, default_value_t = 128)]
    pub max_length: usize,
    /// Seed of the shuffles, hard negatives and dropout: the same seed gives the same weights.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Each pair's hard negative is drawn from this many of the tools the current model ranks
    /// highest among those the case does not need (0: in-batch negatives only).
    #[arg(long, default_value_t = 5)]
    pub hard_negatives: usize,
    /// How many distinct hard negatives each pair draws from its pool a step (bi-encoder).
    #[arg(long, default_value_t = 1)]
    pub negatives_per_pair: usize,
    /// With --eval: stop after this many epochs without a better MRR.
    #[arg(long, default_value_t = 2)]
    pub patience: usize,
    /// Stop after this many epochs of the --epochs schedule. The learning rate still warms up
    /// and decays over --epochs, so this is the longer run stopped there, as Ctrl-C after that
    /// epoch would stop it (the best epoch so far is what --out holds).
    #[arg(long, value_name = "EPOCHS")]
    pub stop_after: Option<usize>,
    /// What to train: `bi-encoder` (embeddings compared by cosine; fast, tool embeddings are
    /// cached) or `cross-encoder` (the conversation and a tool read together: one forward pass
    /// per pair, so use it with `--rerank` over a bi-encoder's shortlist). A cross-encoder is
    /// calibrated and measured on the --rerank-top tools the base model shortlists.
    #[arg(long, default_value = "bi-encoder", value_parser = parse_head)]
    pub head: decide_train::TrainHead,
    /// Freeze the embeddings and this many of the lowest encoder layers: only the layers above
    /// train, each text's frozen output is computed once and reused, and the trained model
    /// differs from its base only in those layers (0: train every weight).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub freeze_layers: usize,
    /// Train on the cases that need no tool too (otherwise skipped): a needed tool must reach
    /// this cosine and beat it, and no tool of a no-tool case may reach it; a fixed column in
    /// every row's softmax (bi-encoder only).
    #[arg(long, value_name = "COSINE")]
    pub no_tool_margin: Option<f64>,
    #[command(flatten)]
    pub filter: FilterArgs,
}
