//! Tool lists in OpenAI, bare and MCP shape.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{expect_object, optional_string, required_name, Object};
use crate::error::{quote, type_name, ParseError};
use crate::tool::{SearchBehavior, ToolSpecification, METADATA_SEARCH_BEHAVIOR};

/// The keys a bare tool may hold its argument schema under: OpenAI, MCP, Anthropic.
const SCHEMA_KEYS: [&str; 3] = ["parameters", "inputSchema", "input_schema"];

/// Parses a tool list from JSON text; see [`parse_tools`].
pub fn parse_tools_str(text: &str) -> Result<Vec<ToolSpecification>, ParseError> {
    let value: Value = serde_json::from_str(text)?;
    parse_tools(&value)
}

/// Parses a tool list in any of the shapes users have.
///
/// * OpenAI: `[{"type":"function","function":{"name","description","parameters"}}]`;
/// * bare: `[{"name","description","parameters"}]`, with the schema also accepted as MCP's `inputSchema` or
///   Anthropic's `input_schema`;
/// * an object `{"tools":[...]}` holding either, such as an MCP `tools/list` result or a whole chat request;
/// * a JSON-RPC response `{"jsonrpc":"2.0","id":..,"result":{"tools":[...]}}`, as saved from an MCP server.
///
/// The shapes may be mixed within one list. A tool's `metadata` object is kept; MCP `annotations` are kept under
/// the metadata key `"annotations"` and MCP `_meta` entries are merged in, so a server can mark a tool
/// `"searchBehavior": "ALWAYS_VISIBLE"`. Names must be unique, because an LLM calls tools by name.
pub fn parse_tools(json: &Value) -> Result<Vec<ToolSpecification>, ParseError> {
    Ok(parse_tools_where(json, |_| true)?
        .into_iter()
        .map(|(_, tool)| tool)
        .collect())
}

/// [`parse_tools`] over the entries of the list that `keep` accepts, each with its index in the list: the others are
/// skipped unread, and errors name an entry by its place in the list as given.
pub fn parse_tools_where(
    json: &Value,
    keep: impl Fn(&Value) -> bool,
) -> Result<Vec<(usize, ToolSpecification)>, ParseError> {
    const EXPECTED: &str =
        r#"expected an array of tools, an object with "tools" or a JSON-RPC tools/list response"#;
    let (base, items) = match json {
        Value::Array(items) => ("tools", items),
        Value::Object(object) => {
            if let Some(tools) = object.get("tools") {
                ("tools", expect_array(tools, "tools")?)
            } else if let Some(result) = object.get("result") {
                let result = expect_object(result, "result")?;
                match result.get("tools") {
                    Some(tools) => ("result.tools", expect_array(tools, "result.tools")?),
                    None => return Err(ParseError::invalid("result.tools", "missing")),
                }
            } else if let Some(error) = object.get("error") {
                return Err(ParseError::invalid(
                    "error",
                    format!(
                        "the server answered with a JSON-RPC error: {}",
                        rpc_error(error)
                    ),
                ));
            } else if object.contains_key("name") || object.contains_key("function") {
                // A lone tool is a common slip; say so instead of the generic complaint.
                return Err(ParseError::invalid(
                    "tools",
                    format!("{EXPECTED}, got a single tool (wrap it in [ ])"),
                ));
            } else {
                return Err(ParseError::invalid(
                    "tools",
                    format!(r#"{EXPECTED}, got an object without "tools""#),
                ));
            }
        }
        other => {
            return Err(ParseError::invalid(
                "tools",
                format!("{EXPECTED}, got {}", type_name(other)),
            ))
        }
    };

    let mut first_index: HashMap<String, usize> = HashMap::new();
    let mut tools = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        if !keep(item) {
            continue;
        }
        let path = format!("{base}[{index}]");
        let (tool, name_path) = parse_tool(item, &path)?;
        if let Some(first) = first_index.get(&tool.name) {
            return Err(ParseError::invalid(
                name_path,
                format!(
                    "duplicate tool name {} (first at {base}[{first}])",
                    quote(&tool.name)
                ),
            ));
        }
        first_index.insert(tool.name.clone(), index);
        tools.push((index, tool));
    }
    Ok(tools)
}

fn expect_array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>, ParseError> {
    value.as_array().ok_or_else(|| {
        ParseError::invalid(path, format!("expected an array, got {}", type_name(value)))
    })
}

/// A JSON-RPC error object as `"message" (code N)`, or compact JSON when it is not the standard shape.
fn rpc_error(error: &Value) -> String {
    if let Value::String(message) = error {
        return quote(message);
    }
    let message = error.get("message").and_then(Value::as_str);
    let code = error.get("code").and_then(Value::as_i64);
    match (message, code) {
        (Some(message), Some(code)) => format!("{} (code {code})", quote(message)),
        (Some(message), None) => quote(message),
        _ => quote(&error.to_string()),
    }
}

/// One tool, with the path of its name for duplicate reports.
fn parse_tool(value: &Value, path: &str) -> Result<(ToolSpecification, String), ParseError> {
    let outer = expect_object(value, path)?;
    let tool_type = optional_string(outer, "type", path)?;
    // Only function tools can be filtered or routed; built-ins such as "web_search" have no name or schema to judge.
    if let Some(other) = tool_type.as_deref().filter(|t| *t != "function") {
        return Err(ParseError::invalid(
            format!("{path}.type"),
            format!("unknown tool type {}", quote(other)),
        ));
    }

    let mut metadata = Map::new();
    let (object, object_path, schema_keys): (&Object, String, &[&str]) = match outer.get("function")
    {
        Some(function) => {
            let function_path = format!("{path}.function");
            let function = expect_object(function, &function_path)?;
            // Metadata may sit beside "function" or inside it; the inner one is closer to the tool, so it wins.
            merge_metadata(outer, "metadata", path, &mut metadata)?;
            (function, function_path, &SCHEMA_KEYS[..1])
        }
        None => (outer, path.to_owned(), &SCHEMA_KEYS[..]),
    };
    merge_metadata(object, "metadata", &object_path, &mut metadata)?;
    merge_metadata(object, "_meta", &object_path, &mut metadata)?;
    match object.get("annotations") {
        None | Some(Value::Null) => {}
        Some(annotations @ Value::Object(_)) => {
            metadata.insert("annotations".to_owned(), annotations.clone());
        }
        Some(other) => {
            return Err(ParseError::invalid(
                format!("{object_path}.annotations"),
                format!("expected an object, got {}", type_name(other)),
            ))
        }
    }

    let name = required_name(object, "name", &object_path)?;
    let description = optional_string(object, "description", &object_path)?;
    let mut parameters = None;
    if let Some((key, schema)) = schema_keys
        .iter()
        .find_map(|key| object.get(*key).map(|schema| (*key, schema)))
    {
        match schema {
            Value::Null => {}
            Value::Object(_) => parameters = Some(schema.clone()),
            other => {
                return Err(ParseError::invalid(
                    format!("{object_path}.{key}"),
                    format!(
                        "expected an object (a JSON schema), got {}",
                        type_name(other)
                    ),
                ))
            }
        }
    }

    let tool = ToolSpecification {
        name,
        description,
        parameters,
        metadata,
    };
    Ok((tool, format!("{object_path}.name")))
}

/// Adds the entries of `object[key]` to `metadata`, overriding earlier ones, and checks the search behavior there:
/// a misspelt value would otherwise silently leave a tool hidden that the user meant to keep visible.
fn merge_metadata(
    object: &Object,
    key: &str,
    path: &str,
    metadata: &mut Map<String, Value>,
) -> Result<(), ParseError> {
    let entries = match object.get(key) {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(entries)) => entries,
        Some(other) => {
            return Err(ParseError::invalid(
                format!("{path}.{key}"),
                format!("expected an object, got {}", type_name(other)),
            ))
        }
    };
    if let Some(behavior) = entries.get(METADATA_SEARCH_BEHAVIOR) {
        let behavior_path = format!("{path}.{key}.{METADATA_SEARCH_BEHAVIOR}");
        match behavior.as_str() {
            Some(value) if SearchBehavior::parse(value).is_some() => {}
            Some(value) => {
                return Err(ParseError::invalid(
                    behavior_path,
                    format!(
                        "unknown search behavior {} (expected SEARCHABLE or ALWAYS_VISIBLE)",
                        quote(value)
                    ),
                ))
            }
            None => {
                return Err(ParseError::invalid(
                    behavior_path,
                    format!("expected a string, got {}", type_name(behavior)),
                ))
            }
        }
    }
    metadata.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn error(value: Value) -> String {
        parse_tools(&value).unwrap_err().to_string()
    }

    fn weather() -> ToolSpecification {
        ToolSpecification::new("get_weather")
            .with_description("Weather for a city")
            .with_parameters(json!({"type": "object", "properties": {"city": {"type": "string"}}}))
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"city": {"type": "string"}}})
    }

    #[test]
    fn openai_shape() {
        let tools = parse_tools(&json!([
            {"type": "function", "function": {
                "name": "get_weather", "description": "Weather for a city", "parameters": schema(), "strict": true
            }},
            {"function": {"name": "get_time"}}
        ]))
        .unwrap();
        assert_eq!(tools, vec![weather(), ToolSpecification::new("get_time")]);
    }

    #[test]
    fn bare_shape() {
        let tools = parse_tools(&json!([
            {"name": "get_weather", "description": "Weather for a city", "parameters": schema()},
            {"name": "get_time", "description": null, "parameters": null},
            {"type": "function", "name": "responses_style"},
            {"name": "anthropic", "input_schema": {"type": "object"}}
        ]))
        .unwrap();
        assert_eq!(tools[0], weather());
        assert_eq!(tools[1], ToolSpecification::new("get_time"));
        assert_eq!(tools[2], ToolSpecification::new("responses_style"));
        assert_eq!(tools[3].parameters, Some(json!({"type": "object"})));
    }

    #[test]
    fn mcp_shapes() {
        let list = json!({"tools": [
            {"name": "get_weather", "description": "Weather for a city", "inputSchema": schema(),
             "annotations": {"readOnlyHint": true}, "_meta": {"searchBehavior": "always_visible"}},
            {"name": "delete_file", "inputSchema": {"type": "object"}}
        ]});
        let tools = parse_tools(&list).unwrap();
        assert_eq!(tools[0].name, "get_weather");
        assert_eq!(tools[0].parameters, Some(schema()));
        assert_eq!(
            tools[0].metadata["annotations"],
            json!({"readOnlyHint": true})
        );
        assert_eq!(tools[0].search_behavior(), SearchBehavior::AlwaysVisible);
        assert_eq!(tools[1].search_behavior(), SearchBehavior::Searchable);

        let response = json!({"jsonrpc": "2.0", "id": 1, "result": list});
        assert_eq!(parse_tools(&response).unwrap(), tools);
        assert_eq!(parse_tools_str(&response.to_string()).unwrap(), tools);
    }

    #[test]
    fn object_with_openai_or_bare_tools() {
        let request = json!({"model": "gpt-4o", "messages": [], "tools": [
            {"type": "function", "function": {"name": "a"}},
            {"name": "b"}
        ]});
        let names: Vec<_> = parse_tools(&request)
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(parse_tools(&json!({"tools": []})).unwrap(), vec![]);
        assert_eq!(parse_tools(&json!([])).unwrap(), vec![]);
    }

    #[test]
    fn metadata_kept_and_merged() {
        let tools = parse_tools(&json!([
            {"type": "function", "metadata": {"searchBehavior": "SEARCHABLE", "owner": "ops"},
             "function": {"name": "a", "metadata": {"searchBehavior": "ALWAYS_VISIBLE"}}},
            {"name": "b", "metadata": {"team": "x"}}
        ]))
        .unwrap();
        assert_eq!(tools[0].search_behavior(), SearchBehavior::AlwaysVisible);
        assert_eq!(tools[0].metadata["owner"], json!("ops"));
        assert_eq!(
            tools[1].metadata,
            json!({"team": "x"}).as_object().unwrap().clone()
        );
    }

    #[test]
    fn top_level_errors() {
        let expected = r#"expected an array of tools, an object with "tools" or a JSON-RPC tools/list response"#;
        assert_eq!(
            error(json!("x")),
            format!("tools: {expected}, got a string")
        );
        assert_eq!(error(json!(null)), format!("tools: {expected}, got null"));
        assert_eq!(
            error(json!({"foo": 1})),
            format!(r#"tools: {expected}, got an object without "tools""#)
        );
        assert_eq!(
            error(json!({"name": "get_weather"})),
            format!("tools: {expected}, got a single tool (wrap it in [ ])")
        );
        assert_eq!(
            error(json!({"tools": {}})),
            "tools: expected an array, got an object"
        );
        assert_eq!(
            error(json!({"result": []})),
            "result: expected an object, got an array"
        );
        assert_eq!(
            error(json!({"jsonrpc": "2.0", "result": {}})),
            "result.tools: missing"
        );
        assert_eq!(
            error(json!({"result": {"tools": "x"}})),
            "result.tools: expected an array, got a string"
        );
        assert_eq!(
            error(
                json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}})
            ),
            r#"error: the server answered with a JSON-RPC error: "Method not found" (code -32601)"#
        );
        assert_eq!(
            error(json!({"error": "boom"})),
            r#"error: the server answered with a JSON-RPC error: "boom""#
        );
    }

    #[test]
    fn syntax_error() {
        assert_eq!(
            parse_tools_str("[{\"name\": \"a\"}\n{\"name\": \"b\"}]")
                .unwrap_err()
                .to_string(),
            "invalid JSON at line 2, column 1: expected `,` or `]`"
        );
    }

    #[test]
    fn tool_errors() {
        let at_3 = |tool: Value| {
            error(json!([
                {"name": "t0"}, {"name": "t1"}, {"name": "t2"}, tool
            ]))
        };
        let cases = [
            (
                json!({"type": "function", "function": {"description": "x"}}),
                "tools[3].function.name: missing",
            ),
            (json!({"description": "x"}), "tools[3].name: missing"),
            (json!({"name": null}), "tools[3].name: missing"),
            (json!({"name": " \t"}), "tools[3].name: blank"),
            (
                json!({"name": 42}),
                "tools[3].name: expected a string, got a number",
            ),
            (
                json!({"function": {"name": ["a"]}}),
                "tools[3].function.name: expected a string, got an array",
            ),
            (
                json!({"name": "x", "description": 1}),
                "tools[3].description: expected a string, got a number",
            ),
            (
                json!({"function": {"name": "x", "description": {}}}),
                "tools[3].function.description: expected a string, got an object",
            ),
            (
                json!({"name": "x", "parameters": "{}"}),
                "tools[3].parameters: expected an object (a JSON schema), got a string",
            ),
            (
                json!({"name": "x", "inputSchema": []}),
                "tools[3].inputSchema: expected an object (a JSON schema), got an array",
            ),
            (
                json!({"function": {"name": "x", "parameters": true}}),
                "tools[3].function.parameters: expected an object (a JSON schema), got a boolean",
            ),
            ("x".into(), "tools[3]: expected an object, got a string"),
            (
                json!({"type": "function", "function": "get_weather"}),
                "tools[3].function: expected an object, got a string",
            ),
            (
                json!({"type": "web_search_preview"}),
                r#"tools[3].type: unknown tool type "web_search_preview""#,
            ),
            (
                json!({"type": 3, "name": "x"}),
                "tools[3].type: expected a string, got a number",
            ),
            (
                json!({"name": "x", "metadata": {"searchBehavior": "sometimes"}}),
                r#"tools[3].metadata.searchBehavior: unknown search behavior "sometimes" (expected SEARCHABLE or ALWAYS_VISIBLE)"#,
            ),
            (
                json!({"name": "x", "_meta": {"searchBehavior": true}}),
                "tools[3]._meta.searchBehavior: expected a string, got a boolean",
            ),
            (
                json!({"name": "x", "metadata": []}),
                "tools[3].metadata: expected an object, got an array",
            ),
            (
                json!({"name": "x", "annotations": "ro"}),
                "tools[3].annotations: expected an object, got a string",
            ),
        ];
        for (tool, expected) in cases {
            assert_eq!(at_3(tool), expected);
        }
    }

    #[test]
    fn duplicate_names_name_both_positions() {
        assert_eq!(
            error(json!([
                {"name": "a"}, {"name": "get_weather"}, {"name": "b"}, {"name": "c"}, {"name": "d"},
                {"name": "get_weather"}
            ])),
            r#"tools[5].name: duplicate tool name "get_weather" (first at tools[1])"#
        );
        assert_eq!(
            error(json!({"tools": [
                {"type": "function", "function": {"name": "x"}},
                {"type": "function", "function": {"name": "x"}}
            ]})),
            r#"tools[1].function.name: duplicate tool name "x" (first at tools[0])"#
        );
        assert_eq!(
            error(json!({"result": {"tools": [{"name": "x"}, {"name": "x"}]}})),
            r#"result.tools[1].name: duplicate tool name "x" (first at result.tools[0])"#
        );
    }
}
