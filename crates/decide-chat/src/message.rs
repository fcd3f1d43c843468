//! Chat messages, modelled on LangChain4j's `ChatMessage` hierarchy.

use serde_json::{json, Map, Value};

/// One message of a conversation.
///
/// The four kinds are the ones every chat API agrees on. Provider-specific extras (refusals, audio replies, reasoning
/// items) are not kept: nothing in this project decides on them.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatMessage {
    /// Instructions from the application (OpenAI `system` or `developer`).
    System(SystemMessage),
    /// A message from the user: text and attachments.
    User(UserMessage),
    /// A reply of the model: text, tool calls, or both.
    Assistant(AssistantMessage),
    /// The result of running a tool the assistant called.
    ToolResult(ToolResultMessage),
}

/// Instructions from the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemMessage {
    /// The instructions.
    pub text: String,
}

/// A message from the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserMessage {
    /// The parts of the message, in order. A plain text message has one [`Content::Text`].
    pub contents: Vec<Content>,
    /// The participant name OpenAI lets callers attach, if any.
    pub name: Option<String>,
}

/// A reply of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssistantMessage {
    /// The text of the reply; `None` when the model only called tools.
    pub text: Option<String>,
    /// The tools the model asked to run, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// A request by the model to run one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The provider's id for the call, which the matching [`ToolResultMessage`] refers to. Legacy OpenAI
    /// `function_call` messages have none.
    pub id: Option<String>,
    /// The name of the tool.
    pub name: String,
    /// The arguments as raw JSON text. Kept as text rather than a parsed value because models do emit invalid JSON,
    /// and the agent loop must be able to show the model what it sent.
    pub arguments: String,
}

/// The result of a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResultMessage {
    /// The id of the [`ToolCall`] this answers, if the format had one.
    pub tool_call_id: Option<String>,
    /// The name of the tool, if the format carried it (OpenAI `tool` messages usually do not).
    pub tool_name: Option<String>,
    /// What the tool returned.
    pub text: String,
}

/// One part of a user message.
///
/// Only the kind matters to the decision models, which see attachments as `[attached <kind>]` markers; the payloads
/// are kept as the JSON gave them so that a message can be passed on to a chat model unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// An image, by URL or `data:` URL.
    Image {
        /// The URL, possibly a `data:` URL.
        url: String,
        /// OpenAI's `detail` hint (`low`, `high`, `auto`), if given.
        detail: Option<String>,
    },
    /// Base64 audio (OpenAI `input_audio`).
    Audio {
        /// The base64 data.
        data: String,
        /// The format, e.g. `wav` or `mp3`, if given.
        format: Option<String>,
    },
    /// A video, by URL (the `video_url` part that vLLM and Qwen accept).
    Video {
        /// The URL, possibly a `data:` URL.
        url: String,
    },
    /// A PDF document: a file part whose name ends in `.pdf` or whose data is a `data:application/pdf` URL.
    Pdf(FileRef),
    /// Any other file.
    File(FileRef),
}

/// Where a file attachment comes from; any field may be missing, as in OpenAI's `file` part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileRef {
    /// The file name, if given.
    pub filename: Option<String>,
    /// Inline data, usually a `data:` URL.
    pub file_data: Option<String>,
    /// The id of a file uploaded to the provider.
    pub file_id: Option<String>,
    /// A URL to fetch the file from (Responses API `input_file`).
    pub file_url: Option<String>,
}

impl FileRef {
    /// Whether this file is a PDF, judged by its name, its `data:` URL or its URL.
    ///
    /// Providers treat PDFs specially (they extract text and page images), so they are a kind of their own.
    pub fn is_pdf(&self) -> bool {
        let ends_in_pdf = |s: &String| {
            let path = s.split(['?', '#']).next().unwrap_or(s);
            path.to_ascii_lowercase().ends_with(".pdf")
        };
        self.filename.as_ref().is_some_and(ends_in_pdf)
            || self.file_url.as_ref().is_some_and(ends_in_pdf)
            || self.file_data.as_ref().is_some_and(|data| {
                const PREFIX: &str = "data:application/pdf";
                // `get` rather than slicing: the data may be shorter or start with multi-byte characters.
                data.get(..PREFIX.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
            })
    }

    fn to_openai_json(&self) -> Value {
        let mut file = Map::new();
        for (key, value) in [
            ("filename", &self.filename),
            ("file_data", &self.file_data),
            ("file_id", &self.file_id),
            ("file_url", &self.file_url),
        ] {
            if let Some(value) = value {
                file.insert(key.to_owned(), Value::String(value.clone()));
            }
        }
        json!({"type": "file", "file": file})
    }
}

impl Content {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Content::Text(text.into())
    }

    /// An image part without a detail hint.
    pub fn image(url: impl Into<String>) -> Self {
        Content::Image {
            url: url.into(),
            detail: None,
        }
    }

    /// A file part, classified as [`Content::Pdf`] or [`Content::File`] by [`FileRef::is_pdf`].
    pub fn file(file: FileRef) -> Self {
        if file.is_pdf() {
            Content::Pdf(file)
        } else {
            Content::File(file)
        }
    }

    /// The kind of the part: `"text"`, `"image"`, `"audio"`, `"video"`, `"pdf"` or `"file"`.
    ///
    /// These are LangChain4j's `ContentType` names in lower case, which the `[attached <kind>]` markers use.
    pub fn kind(&self) -> &'static str {
        match self {
            Content::Text(_) => "text",
            Content::Image { .. } => "image",
            Content::Audio { .. } => "audio",
            Content::Video { .. } => "video",
            Content::Pdf(_) => "pdf",
            Content::File(_) => "file",
        }
    }

    /// The text for a decision model: the text itself, or `[attached <kind>]` for an attachment.
    pub fn text_or_marker(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            other => format!("[attached {}]", other.kind()),
        }
    }

    /// The part in OpenAI chat-completions form.
    pub fn to_openai_json(&self) -> Value {
        match self {
            Content::Text(text) => json!({"type": "text", "text": text}),
            Content::Image { url, detail } => {
                let mut image = Map::new();
                image.insert("url".to_owned(), Value::String(url.clone()));
                if let Some(detail) = detail {
                    image.insert("detail".to_owned(), Value::String(detail.clone()));
                }
                json!({"type": "image_url", "image_url": image})
            }
            Content::Audio { data, format } => {
                let mut audio = Map::new();
                audio.insert("data".to_owned(), Value::String(data.clone()));
                if let Some(format) = format {
                    audio.insert("format".to_owned(), Value::String(format.clone()));
                }
                json!({"type": "input_audio", "input_audio": audio})
            }
            Content::Video { url } => json!({"type": "video_url", "video_url": {"url": url}}),
            Content::Pdf(file) | Content::File(file) => file.to_openai_json(),
        }
    }
}

impl UserMessage {
    /// A plain text message.
    pub fn new(text: impl Into<String>) -> Self {
        Self::from_contents(vec![Content::Text(text.into())])
    }

    /// A message made of the given parts.
    pub fn from_contents(contents: Vec<Content>) -> Self {
        UserMessage {
            contents,
            name: None,
        }
    }

    /// The same message with a participant name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Whether some text part is not blank, as LangChain4j's `hasText`: an image-only message has no text.
    pub fn has_text(&self) -> bool {
        self.contents
            .iter()
            .any(|c| matches!(c, Content::Text(t) if !t.trim().is_empty()))
    }

    /// The parts joined with `"\n"`, attachments as `[attached <kind>]` markers.
    pub fn text(&self) -> String {
        self.contents
            .iter()
            .map(Content::text_or_marker)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl ToolCall {
    /// A call with the given id, tool name and raw JSON arguments.
    pub fn new(id: Option<&str>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: id.map(str::to_owned),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

impl ChatMessage {
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        ChatMessage::System(SystemMessage { text: text.into() })
    }

    /// A plain text user message.
    pub fn user(text: impl Into<String>) -> Self {
        ChatMessage::User(UserMessage::new(text))
    }

    /// An assistant message with text and no tool calls.
    pub fn assistant(text: impl Into<String>) -> Self {
        ChatMessage::Assistant(AssistantMessage {
            text: Some(text.into()),
            tool_calls: Vec::new(),
        })
    }

    /// An assistant message that only calls tools.
    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        ChatMessage::Assistant(AssistantMessage {
            text: None,
            tool_calls: calls,
        })
    }

    /// A tool result.
    pub fn tool_result(
        tool_call_id: Option<&str>,
        tool_name: Option<&str>,
        text: impl Into<String>,
    ) -> Self {
        ChatMessage::ToolResult(ToolResultMessage {
            tool_call_id: tool_call_id.map(str::to_owned),
            tool_name: tool_name.map(str::to_owned),
            text: text.into(),
        })
    }

    /// The OpenAI role of the message: `"system"`, `"user"`, `"assistant"` or `"tool"`.
    pub fn role(&self) -> &'static str {
        match self {
            ChatMessage::System(_) => "system",
            ChatMessage::User(_) => "user",
            ChatMessage::Assistant(_) => "assistant",
            ChatMessage::ToolResult(_) => "tool",
        }
    }

    /// The text of the message, as LangChain4j's `DecisionModelInputUtils.text`.
    ///
    /// A user message gives its parts joined with `"\n"`, attachments as `[attached image]` and so on; an assistant
    /// message its text or `""` (tool calls are not text). Unlike LangChain4j, which returns `""` for them because it
    /// never renders them, system messages and tool results give their text: this crate can render both (see
    /// [`crate::RenderOptions`]).
    pub fn text(&self) -> String {
        match self {
            ChatMessage::System(m) => m.text.clone(),
            ChatMessage::User(m) => m.text(),
            ChatMessage::Assistant(m) => m.text.clone().unwrap_or_default(),
            ChatMessage::ToolResult(m) => m.text.clone(),
        }
    }

    /// Whether the message has non-blank text; for a user message only text parts count, as in
    /// [`UserMessage::has_text`].
    pub fn has_text(&self) -> bool {
        match self {
            ChatMessage::User(m) => m.has_text(),
            other => !other.text().trim().is_empty(),
        }
    }

    /// The message in OpenAI chat-completions form.
    ///
    /// A user message made of one text part is written with string content, as most clients write it; tool results
    /// are always written with role `tool` (the legacy `function` role is read but not written).
    pub fn to_openai_json(&self) -> Value {
        match self {
            ChatMessage::System(m) => json!({"role": "system", "content": m.text}),
            ChatMessage::User(m) => {
                let content = match m.contents.as_slice() {
                    [Content::Text(text)] => Value::String(text.clone()),
                    parts => Value::Array(parts.iter().map(Content::to_openai_json).collect()),
                };
                let mut object = Map::new();
                object.insert("role".to_owned(), json!("user"));
                object.insert("content".to_owned(), content);
                if let Some(name) = &m.name {
                    object.insert("name".to_owned(), Value::String(name.clone()));
                }
                Value::Object(object)
            }
            ChatMessage::Assistant(m) => {
                let mut object = Map::new();
                object.insert("role".to_owned(), json!("assistant"));
                object.insert(
                    "content".to_owned(),
                    m.text.clone().map_or(Value::Null, Value::String),
                );
                if !m.tool_calls.is_empty() {
                    let calls = m.tool_calls.iter().map(|call| {
                        let mut object = Map::new();
                        if let Some(id) = &call.id {
                            object.insert("id".to_owned(), Value::String(id.clone()));
                        }
                        object.insert("type".to_owned(), json!("function"));
                        object.insert(
                            "function".to_owned(),
                            json!({"name": call.name, "arguments": call.arguments}),
                        );
                        Value::Object(object)
                    });
                    object.insert("tool_calls".to_owned(), Value::Array(calls.collect()));
                }
                Value::Object(object)
            }
            ChatMessage::ToolResult(m) => {
                let mut object = Map::new();
                object.insert("role".to_owned(), json!("tool"));
                if let Some(id) = &m.tool_call_id {
                    object.insert("tool_call_id".to_owned(), Value::String(id.clone()));
                }
                if let Some(name) = &m.tool_name {
                    object.insert("name".to_owned(), Value::String(name.clone()));
                }
                object.insert("content".to_owned(), Value::String(m.text.clone()));
                Value::Object(object)
            }
        }
    }
}

/// A conversation in OpenAI chat-completions form: `{"messages": [...]}` without a model.
pub fn to_openai_json(messages: &[ChatMessage]) -> Value {
    json!({"messages": messages.iter().map(ChatMessage::to_openai_json).collect::<Vec<_>>()})
}

impl From<UserMessage> for ChatMessage {
    fn from(message: UserMessage) -> Self {
        ChatMessage::User(message)
    }
}

impl From<SystemMessage> for ChatMessage {
    fn from(message: SystemMessage) -> Self {
        ChatMessage::System(message)
    }
}

impl From<AssistantMessage> for ChatMessage {
    fn from(message: AssistantMessage) -> Self {
        ChatMessage::Assistant(message)
    }
}

impl From<ToolResultMessage> for ChatMessage {
    fn from(message: ToolResultMessage) -> Self {
        ChatMessage::ToolResult(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdf(filename: &str) -> FileRef {
        FileRef {
            filename: Some(filename.to_owned()),
            ..FileRef::default()
        }
    }

    #[test]
    fn kinds() {
        let contents = [
            Content::text("hi"),
            Content::image("https://x/cat.png"),
            Content::Audio {
                data: "AAA".into(),
                format: Some("wav".into()),
            },
            Content::Video {
                url: "https://x/v.mp4".into(),
            },
            Content::file(pdf("report.PDF")),
            Content::file(pdf("data.csv")),
        ];
        let kinds: Vec<_> = contents.iter().map(Content::kind).collect();
        assert_eq!(kinds, ["text", "image", "audio", "video", "pdf", "file"]);
    }

    #[test]
    fn pdf_detection() {
        assert!(pdf("a.pdf").is_pdf());
        assert!(!pdf("a.pdf.txt").is_pdf());
        let data = FileRef {
            file_data: Some("data:application/pdf;base64,JVBER".into()),
            ..FileRef::default()
        };
        assert!(data.is_pdf());
        let url = FileRef {
            file_url: Some("https://x/a.pdf?download=1".into()),
            ..FileRef::default()
        };
        assert!(url.is_pdf());
        let other = FileRef {
            file_data: Some("data:text/plain;base64,aGk=".into()),
            ..FileRef::default()
        };
        assert!(!other.is_pdf());
        // A short or multi-byte data string must not panic on slicing.
        let odd = FileRef {
            file_data: Some("dä".into()),
            ..FileRef::default()
        };
        assert!(!odd.is_pdf());
        assert!(!FileRef::default().is_pdf());
    }

    #[test]
    fn user_text_joins_parts_with_markers() {
        let message = ChatMessage::User(UserMessage::from_contents(vec![
            Content::text("What is this?"),
            Content::image("https://x/cat.png"),
            Content::Audio {
                data: "AAA".into(),
                format: None,
            },
            Content::Video { url: "v".into() },
            Content::file(pdf("a.pdf")),
            Content::file(pdf("a.csv")),
        ]));
        assert_eq!(
            message.text(),
            "What is this?\n[attached image]\n[attached audio]\n[attached video]\n[attached pdf]\n[attached file]"
        );
    }

    #[test]
    fn has_text_ignores_attachments() {
        let image_only = UserMessage::from_contents(vec![Content::image("u"), Content::text("  ")]);
        assert!(!image_only.has_text());
        assert!(!ChatMessage::User(image_only.clone()).has_text());
        // The marker makes the text non-blank even though the user wrote nothing.
        assert_eq!(ChatMessage::User(image_only).text(), "[attached image]\n  ");
        assert!(ChatMessage::user("hi").has_text());
        assert!(!ChatMessage::tool_calls(vec![ToolCall::new(Some("1"), "f", "{}")]).has_text());
        assert!(ChatMessage::system("be brief").has_text());
        assert!(!ChatMessage::tool_result(Some("1"), None, " ").has_text());
    }

    #[test]
    fn texts_and_roles() {
        let messages = [
            ChatMessage::system("sys"),
            ChatMessage::user("u"),
            ChatMessage::assistant("a"),
            ChatMessage::tool_calls(vec![]),
            ChatMessage::tool_result(None, Some("f"), "r"),
        ];
        let texts: Vec<_> = messages.iter().map(ChatMessage::text).collect();
        assert_eq!(texts, ["sys", "u", "a", "", "r"]);
        let roles: Vec<_> = messages.iter().map(ChatMessage::role).collect();
        assert_eq!(roles, ["system", "user", "assistant", "assistant", "tool"]);
    }

    #[test]
    fn openai_json() {
        let messages = vec![
            ChatMessage::system("Be brief."),
            ChatMessage::User(UserMessage::new("Hi").with_name("ann")),
            ChatMessage::User(UserMessage::from_contents(vec![
                Content::text("Look"),
                Content::Image {
                    url: "https://x/cat.png".into(),
                    detail: Some("low".into()),
                },
                Content::Audio {
                    data: "AAA".into(),
                    format: Some("wav".into()),
                },
                Content::Video { url: "v".into() },
                Content::file(FileRef {
                    filename: Some("a.pdf".into()),
                    file_data: Some("data:application/pdf;base64,JV".into()),
                    ..FileRef::default()
                }),
            ])),
            ChatMessage::tool_calls(vec![ToolCall::new(
                Some("call_1"),
                "get_weather",
                r#"{"city":"Paris"}"#,
            )]),
            ChatMessage::tool_result(Some("call_1"), None, "sunny"),
            ChatMessage::assistant("It is sunny."),
        ];
        assert_eq!(
            to_openai_json(&messages),
            json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi", "name": "ann"},
                {"role": "user", "content": [
                    {"type": "text", "text": "Look"},
                    {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}},
                    {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
                    {"type": "video_url", "video_url": {"url": "v"}},
                    {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JV"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "assistant", "content": "It is sunny."}
            ]})
        );
    }

    #[test]
    fn from_impls() {
        let message: ChatMessage = UserMessage::new("x").into();
        assert_eq!(message, ChatMessage::user("x"));
        let message: ChatMessage = SystemMessage { text: "s".into() }.into();
        assert_eq!(message, ChatMessage::system("s"));
        let message: ChatMessage = AssistantMessage {
            text: Some("a".into()),
            tool_calls: vec![],
        }
        .into();
        assert_eq!(message, ChatMessage::assistant("a"));
        let message: ChatMessage = ToolResultMessage {
            tool_call_id: None,
            tool_name: None,
            text: "t".into(),
        }
        .into();
        assert_eq!(message.role(), "tool");
    }
}
