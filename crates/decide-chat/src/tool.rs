//! Tool specifications, modelled on LangChain4j's `ToolSpecification`.

use std::fmt;

use serde_json::{json, Map, Value};

/// The metadata key that holds a tool's [`SearchBehavior`], as LangChain4j's `METADATA_SEARCH_BEHAVIOR`.
pub const METADATA_SEARCH_BEHAVIOR: &str = "searchBehavior";

/// A tool an LLM may call: its name, what it does, and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpecification {
    /// The name the LLM calls the tool by; unique within a tool list.
    pub name: String,
    /// What the tool does, for the LLM and for the decision model.
    pub description: Option<String>,
    /// The JSON schema of the arguments, kept as given: decision models only read it, and rewriting it into a typed
    /// schema would lose keywords this crate does not know.
    pub parameters: Option<Value>,
    /// Free-form metadata; [`METADATA_SEARCH_BEHAVIOR`] is the key this project reads.
    pub metadata: Map<String, Value>,
}

/// The metadata key that names the server a tool comes from (see [`ToolSpecification::server`]).
pub const METADATA_SERVER: &str = "server";

/// Whether a tool-filtering step may hide a tool, as LangChain4j's `SearchBehavior`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SearchBehavior {
    /// The tool is shown only when it is selected as relevant.
    #[default]
    Searchable,
    /// The tool is always shown, whatever the conversation.
    AlwaysVisible,
}

impl SearchBehavior {
    /// The metadata value: `"SEARCHABLE"` or `"ALWAYS_VISIBLE"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SearchBehavior::Searchable => "SEARCHABLE",
            SearchBehavior::AlwaysVisible => "ALWAYS_VISIBLE",
        }
    }

    /// Reads a metadata value, ignoring case (`"always_visible"` is accepted too); `None` if it is neither value.
    pub fn parse(value: &str) -> Option<Self> {
        [SearchBehavior::Searchable, SearchBehavior::AlwaysVisible]
            .into_iter()
            .find(|behavior| behavior.as_str().eq_ignore_ascii_case(value.trim()))
    }
}

impl fmt::Display for SearchBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ToolSpecification {
    /// A tool with only a name.
    pub fn new(name: impl Into<String>) -> Self {
        ToolSpecification {
            name: name.into(),
            description: None,
            parameters: None,
            metadata: Map::new(),
        }
    }

    /// The same tool with a description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// The same tool with a parameter schema.
    pub fn with_parameters(mut self, parameters: Value) -> Self {
        self.parameters = Some(parameters);
        self
    }

    /// The names of the tool's arguments: the keys of its schema's top-level `properties`, in
    /// the schema's order; empty without a schema or properties.
    pub fn parameter_names(&self) -> Vec<String> {
        self.parameters
            .as_ref()
            .and_then(|schema| schema.get("properties"))
            .and_then(Value::as_object)
            .map(|properties| properties.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The server the tool comes from: the metadata's `"server"` (an MCP catalogue's
    /// `_meta.server`, or the name decide's MCP client gives a server's tools), when it is a
    /// string.
    pub fn server(&self) -> Option<&str> {
        self.metadata.get(METADATA_SERVER).and_then(Value::as_str)
    }

    /// The same tool with its search behavior set in the metadata.
    pub fn with_search_behavior(mut self, behavior: SearchBehavior) -> Self {
        self.metadata.insert(
            METADATA_SEARCH_BEHAVIOR.to_owned(),
            Value::String(behavior.as_str().to_owned()),
        );
        self
    }

    /// The search behavior from the metadata; [`SearchBehavior::Searchable`] when it is absent or not one of the two
    /// values (the parsers reject unknown values, so this only happens to hand-built specifications).
    pub fn search_behavior(&self) -> SearchBehavior {
        self.metadata
            .get(METADATA_SEARCH_BEHAVIOR)
            .and_then(Value::as_str)
            .and_then(SearchBehavior::parse)
            .unwrap_or_default()
    }

    /// The tool in OpenAI chat-completions form, `{"type":"function","function":{...}}`. Metadata is not written:
    /// OpenAI rejects unknown fields.
    pub fn to_openai_json(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".to_owned(), Value::String(self.name.clone()));
        if let Some(description) = &self.description {
            function.insert("description".to_owned(), Value::String(description.clone()));
        }
        if let Some(parameters) = &self.parameters {
            function.insert("parameters".to_owned(), parameters.clone());
        }
        json!({"type": "function", "function": function})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_names_are_the_schemas_top_level_properties_in_order() {
        let tool = ToolSpecification::new("get_forecast").with_parameters(json!({
            "type": "object",
            "properties": {
                "longitude": {"type": "number"},
                "latitude": {"type": "number"},
                "options": {"type": "object", "properties": {"units": {"type": "string"}}}
            },
            "required": ["latitude"]
        }));
        assert_eq!(tool.parameter_names(), ["longitude", "latitude", "options"]);
        assert!(ToolSpecification::new("now").parameter_names().is_empty());
        let odd = ToolSpecification::new("x").with_parameters(json!({"properties": [1, 2]}));
        assert!(odd.parameter_names().is_empty());
    }

    #[test]
    fn search_behavior_defaults_to_searchable() {
        assert_eq!(
            ToolSpecification::new("t").search_behavior(),
            SearchBehavior::Searchable
        );
    }

    #[test]
    fn search_behavior_from_metadata_in_either_case() {
        for value in ["ALWAYS_VISIBLE", "always_visible", "Always_Visible"] {
            let mut tool = ToolSpecification::new("t");
            tool.metadata
                .insert(METADATA_SEARCH_BEHAVIOR.into(), json!(value));
            assert_eq!(tool.search_behavior(), SearchBehavior::AlwaysVisible);
        }
        let mut tool =
            ToolSpecification::new("t").with_search_behavior(SearchBehavior::AlwaysVisible);
        assert_eq!(tool.search_behavior(), SearchBehavior::AlwaysVisible);
        tool.metadata
            .insert(METADATA_SEARCH_BEHAVIOR.into(), json!("searchable"));
        assert_eq!(tool.search_behavior(), SearchBehavior::Searchable);
        tool.metadata
            .insert(METADATA_SEARCH_BEHAVIOR.into(), json!("sometimes"));
        assert_eq!(tool.search_behavior(), SearchBehavior::Searchable);
        tool.metadata
            .insert(METADATA_SEARCH_BEHAVIOR.into(), json!(1));
        assert_eq!(tool.search_behavior(), SearchBehavior::Searchable);
    }

    #[test]
    fn search_behavior_strings() {
        assert_eq!(SearchBehavior::AlwaysVisible.to_string(), "ALWAYS_VISIBLE");
        assert_eq!(
            SearchBehavior::parse(" searchable "),
            Some(SearchBehavior::Searchable)
        );
        assert_eq!(SearchBehavior::parse("visible"), None);
    }

    #[test]
    fn openai_json() {
        let tool = ToolSpecification::new("get_weather")
            .with_description("Weather for a city")
            .with_parameters(json!({"type": "object"}))
            .with_search_behavior(SearchBehavior::AlwaysVisible);
        assert_eq!(
            tool.to_openai_json(),
            json!({"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object"}
            }})
        );
        assert_eq!(
            ToolSpecification::new("t").to_openai_json(),
            json!({"type": "function", "function": {"name": "t"}})
        );
    }
}
