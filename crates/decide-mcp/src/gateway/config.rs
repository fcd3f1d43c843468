//! The upstream servers as users already list them: the `mcpServers` object of an MCP client's configuration file
//! (Claude Desktop, Cursor, VS Code and others share it), or one command line or URL each.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// How to reach one upstream MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSpec {
    /// A command the gateway starts and talks to over its standard input and output.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the gateway's environment.
        env: BTreeMap<String, String>,
        /// The working folder, when not the gateway's.
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint, e.g. `http://localhost:3001/mcp`.
        url: String,
    },
}

impl ServerSpec {
    /// A command line as `--mcp` gives it: the program and its arguments, split on white space.
    pub fn command_line(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace().map(str::to_owned);
        let command = words.next().ok_or_else(|| "empty command".to_owned())?;
        Ok(Self::Stdio {
            command,
            args: words.collect(),
            env: BTreeMap::new(),
            cwd: None,
        })
    }

    /// What errors call an unnamed server until it gives its own name: its program, or its URL without
    /// credentials or query. Never the arguments, which often carry tokens (`--api-key ...`).
    pub fn describe(&self) -> String {
        match self {
            Self::Stdio { command, .. } => command.clone(),
            Self::Http { url } => {
                let url = url.split(['?', '#']).next().unwrap_or_default();
                match url.split_once("://") {
                    Some((scheme, rest)) => {
                        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                        let host = authority.rsplit('@').next().unwrap_or_default();
                        format!("{scheme}://{host}{path}")
                    }
                    None => url.to_owned(),
                }
            }
        }
    }
}

/// Named upstream servers, in the order the file lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServersConfig {
    /// Each server's name (the key under `mcpServers`) and how to reach it; disabled servers are left out.
    pub servers: Vec<(String, ServerSpec)>,
}

/// Keys some MCP clients keep beside a server's definition for their own use (approval lists, timeouts shown in
/// their settings); the gateway has no use for them, and refusing them would make users edit a working file.
const CLIENT_ONLY_KEYS: [&str; 4] = ["autoApprove", "alwaysAllow", "timeout", "description"];

impl ServersConfig {
    /// Reads a configuration file: a JSON object with `mcpServers` (other top-level keys, which belong to the
    /// client, are ignored). Errors name the file and the JSON path, or the line and column of a syntax error.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        Self::from_json(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// Reads the text of a configuration file (see [`read`](Self::read)). An object that names a key twice is
    /// refused, naming the key: which of the two a reader keeps differs from one MCP client to another.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let value: Value =
            decide_http::unique_keys::from_str(text).map_err(|error| error.to_string())?;
        let Value::Object(top) = value else {
            return Err("expected a JSON object with mcpServers".into());
        };
        let servers = match top.get("mcpServers") {
            Some(Value::Object(servers)) => servers,
            Some(_) => return Err("mcpServers: expected an object of servers by name".into()),
            None => return Err("mcpServers: missing".into()),
        };
        let mut out = Vec::new();
        for (name, entry) in servers {
            let path = format!("mcpServers.{name}");
            let Value::Object(entry) = entry else {
                return Err(format!("{path}: expected an object"));
            };
            if let Some(spec) = server(&path, entry)? {
                out.push((name.clone(), spec));
            }
        }
        if out.is_empty() {
            return Err("mcpServers: no server (or every one disabled)".into());
        }
        Ok(Self { servers: out })
    }
}

fn string(path: &str, key: &str, value: &Value) -> Result<String, String> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{path}.{key}: expected a string"))
}

/// One server's entry; `None` when it is disabled.
fn server(path: &str, entry: &Map<String, Value>) -> Result<Option<ServerSpec>, String> {
    let mut command = None;
    let mut args = Vec::new();
    let mut env = BTreeMap::new();
    let mut cwd = None;
    let mut url = None;
    let mut kind = None;
    for (key, value) in entry {
        match key.as_str() {
            "command" => command = Some(string(path, key, value)?),
            "args" => {
                let Value::Array(items) = value else {
                    return Err(format!("{path}.args: expected an array of strings"));
                };
                for (i, item) in items.iter().enumerate() {
                    args.push(string(path, &format!("args[{i}]"), item)?);
                }
            }
            "env" => {
                let Value::Object(vars) = value else {
                    return Err(format!("{path}.env: expected an object of strings"));
                };
                for (name, value) in vars {
                    env.insert(name.clone(), string(path, &format!("env.{name}"), value)?);
                }
            }
            "cwd" => cwd = Some(PathBuf::from(string(path, key, value)?)),
            "url" => url = Some(string(path, key, value)?),
            "type" | "transport" => kind = Some(string(path, key, value)?),
            "disabled" => {
                if value.as_bool().ok_or_else(|| format!("{path}.disabled: expected true or false"))? {
                    return Ok(None);
                }
            }
            "headers" => {
                return Err(format!(
                    "{path}.headers: HTTP headers are not supported; reach the server without them or start it as a command"
                ))
            }
            other if CLIENT_ONLY_KEYS.contains(&other) => {}
            other => {
                return Err(format!(
                    "{path}.{other}: unknown field (expected command, args, env, cwd, url, type, disabled)"
                ))
            }
        }
    }
    let spec = match (command, url) {
        (Some(_), Some(_)) => return Err(format!("{path}: give command or url, not both")),
        (None, None) => return Err(format!("{path}: missing command (or url)")),
        (Some(command), None) => {
            if let Some(kind) = kind.filter(|k| k != "stdio") {
                return Err(format!(
                    "{path}.type: {kind:?} with a command (expected \"stdio\")"
                ));
            }
            ServerSpec::Stdio {
                command,
                args,
                env,
                cwd,
            }
        }
        (None, Some(url)) => {
            match kind.as_deref() {
                None | Some("http" | "streamable-http" | "streamableHttp" | "streamable_http") => {}
                Some("sse") => {
                    return Err(format!(
                        "{path}.type: \"sse\" (the deprecated HTTP+SSE transport) is not supported; the server's streamable HTTP endpoint is"
                    ))
                }
                Some(other) => return Err(format!("{path}.type: {other:?} with a url (expected \"http\")")),
            }
            ServerSpec::Http { url }
        }
    };
    Ok(Some(spec))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_is_described_without_its_arguments_or_credentials() {
        let stdio = ServerSpec::command_line("npx -y server-github --token ghp_secret").unwrap();
        assert_eq!(stdio.describe(), "npx");
        let http = ServerSpec::Http {
            url: "https://user:pw@mcp.example.com:8443/mcp?key=abc#x".into(),
        };
        assert_eq!(http.describe(), "https://mcp.example.com:8443/mcp");
        let plain = ServerSpec::Http {
            url: "http://localhost:3001".into(),
        };
        assert_eq!(plain.describe(), "http://localhost:3001");
    }

    use super::*;

    #[test]
    fn a_client_configuration_reads_unchanged() {
        let config = ServersConfig::from_json(
            r#"{"globalShortcut": "", "mcpServers": {
                "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"MEMORY_FILE_PATH": "/tmp/m.json"}, "autoApprove": []},
                "remote": {"type": "http", "url": "http://localhost:3001/mcp"},
                "off": {"command": "x", "disabled": true}}}"#,
        )
        .unwrap();
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.servers[0].0, "memory");
        let ServerSpec::Stdio {
            command, args, env, ..
        } = &config.servers[0].1
        else {
            panic!("{config:?}")
        };
        assert_eq!(command, "npx");
        assert_eq!(args, &["-y", "@modelcontextprotocol/server-memory"]);
        assert_eq!(env["MEMORY_FILE_PATH"], "/tmp/m.json");
        assert_eq!(
            config.servers[1].1,
            ServerSpec::Http {
                url: "http://localhost:3001/mcp".into()
            }
        );
    }

    #[test]
    fn mistakes_name_their_path() {
        let error = |text: &str| ServersConfig::from_json(text).unwrap_err();
        assert_eq!(error(r#"{"servers": {}}"#), "mcpServers: missing");
        assert_eq!(
            error(r#"{"mcpServers": {"a": {"comand": "x"}}}"#),
            "mcpServers.a.comand: unknown field (expected command, args, env, cwd, url, type, disabled)"
        );
        assert_eq!(
            error(r#"{"mcpServers": {"a": {"command": "x", "args": ["y", 2]}}}"#),
            "mcpServers.a.args[1]: expected a string"
        );
        assert_eq!(
            error(r#"{"mcpServers": {"a": {"args": []}}}"#),
            "mcpServers.a: missing command (or url)"
        );
        assert!(
            error(r#"{"mcpServers": {"a": {"url": "http://x", "type": "sse"}}}"#)
                .starts_with("mcpServers.a.type: \"sse\"")
        );
        assert!(error("{\n\"mcpServers\": }").contains("line 2"));
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_the_file_and_the_key() {
        let text =
            "{\"mcpServers\": {\"memory\": {\"command\": \"npx\",\n  \"command\": \"node\"}}}";
        assert_eq!(
            ServersConfig::from_json(text).unwrap_err(),
            "mcpServers.memory: duplicate key \"command\" at line 2 column 11"
        );
        let path =
            std::env::temp_dir().join(format!("decide-mcp-twice-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{"mcpServers": {"a": {"command": "x"}, "a": {"url": "http://y"}}}"#,
        )
        .unwrap();
        let error = ServersConfig::read(&path).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            error,
            format!(
                "{}: mcpServers: duplicate key \"a\" at line 1 column 42",
                path.display()
            )
        );
        assert_eq!(error.lines().count(), 1);
    }

    #[test]
    fn a_command_line_splits_on_white_space() {
        let spec = ServerSpec::command_line(" node  index.js stdio ").unwrap();
        let ServerSpec::Stdio { command, args, .. } = spec else {
            panic!("{spec:?}")
        };
        assert_eq!(
            (command.as_str(), args),
            ("node", vec!["index.js".to_owned(), "stdio".to_owned()])
        );
        assert!(ServerSpec::command_line("  ").is_err());
    }
}
