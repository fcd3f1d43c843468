//! Reading the user's files, with errors that name the file and line.

use std::path::Path;

use anyhow::{bail, Context};
use decide_chat::{parse_messages, parse_tools, ChatMessage, ParseError, ToolSpecification};
use decide_router::RoutesSpec;
use serde_json::Value;

/// Reads a file as UTF-8 text.
pub fn read_text(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// serde_json's error as `(line, column, message)`, the message without the position that
/// serde_json appends (decide-chat's `ParseError` already strips it; one place does that).
fn syntax_error(e: serde_json::Error) -> (usize, usize, String) {
    match ParseError::from(e) {
        ParseError::Syntax {
            line,
            column,
            message,
        } => (line, column, message),
        other => (0, 0, other.to_string()),
    }
}

/// Parses a JSON file; a syntax error names the line and column.
pub fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| {
        let (line, column, message) = syntax_error(e);
        anyhow::anyhow!(
            "{}:{line}:{column}: invalid JSON: {message}",
            path.display()
        )
    })
}

/// Reads a tool list in any of the shapes users have.
pub fn read_tools(path: &Path) -> anyhow::Result<Vec<ToolSpecification>> {
    let json = read_json(path)?;
    let tools = parse_tools(&json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if tools.is_empty() {
        bail!("{}: no tools", path.display());
    }
    Ok(tools)
}

/// Reads a routes file; every error names the file and the JSON path, e.g. `routes.json: routes[2].name: missing`.
pub fn read_routes(path: &Path) -> anyhow::Result<RoutesSpec> {
    RoutesSpec::from_value(read_json(path)?).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Reads a conversation in the OpenAI chat format.
pub fn read_messages(path: &Path) -> anyhow::Result<Vec<ChatMessage>> {
    let json = read_json(path)?;
    parse_messages(&json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The conversation of `decide select` and `decide route`: `--messages FILE`, else TEXT as one
/// user message. Also returns the name later errors about it carry (the file, or `TEXT`).
pub fn read_conversation(
    messages: Option<&Path>,
    text: Option<&str>,
) -> anyhow::Result<(Vec<ChatMessage>, String)> {
    match (messages, text) {
        (Some(path), _) => Ok((read_messages(path)?, path.display().to_string())),
        (None, Some(text)) if !text.trim().is_empty() => {
            Ok((vec![ChatMessage::user(text)], "TEXT".into()))
        }
        (None, Some(_)) => bail!("TEXT: empty message"),
        (None, None) => bail!("give the conversation with --messages FILE or as TEXT"),
    }
}

/// One line of a `decide score` file.
pub struct Case {
    /// The case's id.
    pub id: Value,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The tools, from the line or the catalogue.
    pub tools: Vec<ToolSpecification>,
    /// The tools that should be selected, when the line says.
    pub expected: Option<Vec<String>>,
}

/// Which tools a case of a [`Cases`] file must have.
#[derive(Clone, Copy)]
enum Tools<'a> {
    /// On its line, or else these.
    Needed(Option<&'a [ToolSpecification]>),
    /// None needed: its conversation and labels are what is read (`tools` is empty then).
    NotRead,
}

/// Parses one JSONL line; errors name the file, the line and the field.
fn parse_case(
    path: &Path,
    line_no: usize,
    line: &str,
    tools_rule: Tools<'_>,
) -> anyhow::Result<Case> {
    let at = || format!("{}:{line_no}", path.display());
    let value: Value = serde_json::from_str(line).map_err(|e| {
        let (_, column, message) = syntax_error(e);
        anyhow::anyhow!("{}: invalid JSON at column {column}: {message}", at())
    })?;
    let Value::Object(mut obj) = value else {
        bail!("{}: expected a JSON object", at());
    };
    let id = match obj.remove("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        Some(_) => bail!("{}: id: expected a string or a number", at()),
        None => bail!("{}: id: missing", at()),
    };
    let messages = match obj.get("messages") {
        Some(m) => parse_messages(m).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?,
        None => bail!("{}: messages: missing", at()),
    };
    let tools = match (obj.get("tools"), tools_rule) {
        (_, Tools::NotRead) => Vec::new(),
        (Some(t), _) => parse_tools(t).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?,
        (None, Tools::Needed(Some(c))) => c.to_vec(),
        (None, Tools::Needed(None)) => bail!(
            "{}: tools: missing (give them on the line or with --tools)",
            at()
        ),
    };
    if tools.is_empty() && !matches!(tools_rule, Tools::NotRead) {
        bail!("{}: tools: empty", at());
    }
    let expected = match obj.get("expected") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut names = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Some(name) = item.as_str() else {
                    bail!("{}: expected[{i}]: expected a tool name", at());
                };
                let read = !matches!(tools_rule, Tools::NotRead);
                if read && !tools.iter().any(|t| t.name == name) {
                    bail!("{}: expected[{i}]: unknown tool \"{name}\"", at());
                }
                names.push(name.to_string());
            }
            Some(names)
        }
        Some(_) => bail!("{}: expected: expected an array of tool names", at()),
    };
    Ok(Case {
        id,
        messages,
        tools,
        expected,
    })
}

/// Reads the lines of a JSONL file with their 1-based numbers, skipping blank lines; a line
/// that is not UTF-8 is an error naming it.
pub fn jsonl_lines(
    path: &Path,
) -> anyhow::Result<impl Iterator<Item = anyhow::Result<(usize, String)>>> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let path = path.to_path_buf();
    let reader = std::io::BufReader::new(file);
    Ok(reader
        .split(b'\n')
        .enumerate()
        .filter_map(move |(i, bytes)| {
            let line_no = i + 1;
            let bytes = match bytes {
                Ok(b) => b,
                Err(e) => return Some(Err(anyhow::anyhow!("{}:{line_no}: {e}", path.display()))),
            };
            match String::from_utf8(bytes) {
                Ok(s) if s.trim().is_empty() => None,
                Ok(s) => Some(Ok((line_no, s))),
                Err(_) => Some(Err(anyhow::anyhow!(
                    "{}:{line_no}: not UTF-8 text",
                    path.display()
                ))),
            }
        }))
}

/// The cases of a `decide score` file, read as every command that takes one reads them.
pub struct Cases {
    /// How many cases the file holds (non-blank lines), for a progress bar.
    pub total: u64,
    path: std::path::PathBuf,
    catalogue: Option<Vec<ToolSpecification>>,
    read_tools: bool,
    ids: std::collections::HashSet<String>,
    lines: Box<dyn Iterator<Item = anyhow::Result<(usize, String)>>>,
}

impl Cases {
    /// The file and its catalogue; an empty file, a bad catalogue or an unreadable file is an
    /// error before any model is loaded.
    pub fn open(args: &crate::args::CasesArgs) -> anyhow::Result<Self> {
        let catalogue = args.tools.as_deref().map(read_tools).transpose()?;
        let regular = std::fs::metadata(&args.data).is_ok_and(|m| m.is_file());
        let (total, lines): (u64, Box<dyn Iterator<Item = _>>) = if regular {
            // Counted in a first pass, read in a second: a large file is not held in memory.
            let mut total = 0;
            for line in jsonl_lines(&args.data)? {
                line?;
                total += 1;
            }
            (total, Box::new(jsonl_lines(&args.data)?))
        } else {
            // A pipe (`--data /dev/stdin`, `<(...)`) can be read only once: keep its lines.
            let lines = jsonl_lines(&args.data)?.collect::<anyhow::Result<Vec<_>>>()?;
            (lines.len() as u64, Box::new(lines.into_iter().map(Ok)))
        };
        if total == 0 {
            bail!("{}: no cases", args.data.display());
        }
        Ok(Self {
            total,
            path: args.data.clone(),
            catalogue,
            read_tools: true,
            ids: std::collections::HashSet::new(),
            lines,
        })
    }

    /// The same file, its cases read for their conversations and labels only: no line needs
    /// tools, and the cases come with none.
    pub fn without_tools(mut self) -> Self {
        self.read_tools = false;
        self
    }

    fn at(&self, line_no: usize) -> String {
        format!("{}:{line_no}", self.path.display())
    }
}

impl Iterator for Cases {
    /// Where the case is (`file:line`, for errors about it) and the case; a duplicate id is an
    /// error naming the line.
    type Item = anyhow::Result<(String, Case)>;

    fn next(&mut self) -> Option<Self::Item> {
        let (line_no, text) = match self.lines.next()? {
            Ok(line) => line,
            Err(e) => return Some(Err(e)),
        };
        let tools = match self.read_tools {
            true => Tools::Needed(self.catalogue.as_deref()),
            false => Tools::NotRead,
        };
        Some(
            parse_case(&self.path, line_no, &text, tools).and_then(|case| {
                if self.ids.insert(case.id.to_string()) {
                    Ok((self.at(line_no), case))
                } else {
                    Err(anyhow::anyhow!(
                        "{}: id: duplicate id {}",
                        self.at(line_no),
                        case.id
                    ))
                }
            }),
        )
    }
}
