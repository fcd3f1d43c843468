"""Conversations and tool lists as users hold them, turned into the JSON shapes decide reads.

Dicts (OpenAI messages and tools, bare and MCP tools, an MCP ``tools/list`` result) go through
untouched: the native parsers read them, and refuse them, exactly as ``decide select`` reads a
file. Objects are converted here: LangChain messages and tools (duck-typed, so LangChain stays
optional) and pydantic models such as the MCP SDK's ``Tool``. Anything else is passed on for the
native parser to refuse with the path to it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

Json = Any
"""A JSON value as Python holds it: dict, list, str, int, float, bool or None."""

# LangChain's message types (and their `...MessageChunk` class names) as OpenAI roles.
_ROLES: Dict[str, str] = {
    "human": "user",
    "user": "user",
    "ai": "assistant",
    "assistant": "assistant",
    "system": "system",
    "developer": "developer",
    "tool": "tool",
    "function": "function",
}

_UNSET: Any = object()
_convert_to_openai_tool: Optional[Callable[[Any], Dict[str, Any]]] = _UNSET

# Converting a LangChain tool builds its pydantic schema, which costs far more than deciding;
# agents pass the same tool objects on every call. Entries keep their tool alive, so an id is
# never reused while it is a key here.
_TOOL_CACHE: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
_TOOL_CACHE_SIZE = 4096


def _langchain_converter() -> Optional[Callable[[Any], Dict[str, Any]]]:
    """LangChain's own tool converter when langchain_core is installed, imported on first need."""
    global _convert_to_openai_tool
    if _convert_to_openai_tool is _UNSET:
        try:
            from langchain_core.utils.function_calling import convert_to_openai_tool
        except ImportError:
            _convert_to_openai_tool = None
        else:
            _convert_to_openai_tool = convert_to_openai_tool
    return _convert_to_openai_tool


def conversation(messages: Any) -> Union[str, Json]:
    """A conversation: a string (one user message), a dict (`{"messages": [...]}`, read as is),
    or a sequence of messages, each a dict, a LangChain message, a `(role, content)` pair or a
    string (a user message)."""
    if isinstance(messages, (str, dict)):
        return messages
    if _is_message_object(messages):
        return [message(messages)]
    if isinstance(messages, (list, tuple)):
        return [message(m) for m in messages]
    if isinstance(messages, Iterable):
        return [message(m) for m in messages]
    return messages


def message(m: Any) -> Json:
    """One message as an OpenAI chat message."""
    if isinstance(m, dict):
        return m
    if isinstance(m, str):
        return {"role": "user", "content": m}
    if isinstance(m, (tuple, list)) and len(m) == 2 and isinstance(m[0], str):
        role, content = m
        return {"role": _ROLES.get(role, role), "content": content}
    if _is_message_object(m):
        return _langchain_message(m)
    return m


def _is_message_object(m: Any) -> bool:
    return isinstance(getattr(m, "type", None), str) and hasattr(m, "content")


def _role_of(m: Any) -> str:
    kind: str = m.type
    if kind.endswith("MessageChunk"):
        kind = kind[: -len("MessageChunk")].lower()
    if kind == "chat":
        return _ROLES.get(str(getattr(m, "role", "")), str(getattr(m, "role", "")))
    return _ROLES.get(kind, kind)


def _langchain_message(m: Any) -> Json:
    role = _role_of(m)
    out: Dict[str, Any] = {"role": role}
    if role == "user":
        out["content"] = _user_content(m.content)
        name = getattr(m, "name", None)
        if isinstance(name, str) and name:
            out["name"] = name
    else:
        out["content"] = _text(m.content)
    if role == "assistant":
        calls = [_tool_call(c) for c in (getattr(m, "tool_calls", None) or [])]
        if calls:
            out["tool_calls"] = calls
    elif role == "tool":
        call_id = getattr(m, "tool_call_id", None)
        if isinstance(call_id, str):
            out["tool_call_id"] = call_id
        name = getattr(m, "name", None)
        if isinstance(name, str) and name:
            out["name"] = name
    return out


def _tool_call(call: Any) -> Json:
    get = call.get if isinstance(call, dict) else lambda k, d=None: getattr(call, k, d)
    args = get("args", None)
    return {
        "id": get("id", None),
        "type": "function",
        "function": {
            "name": get("name", None),
            # Arguments that are not JSON (a date, say) are still something the model can read.
            "arguments": json.dumps(args if args is not None else {}, default=str),
        },
    }


def _blocks(content: Any) -> List[Any]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return content
    return [] if content is None else [str(content)]


def _text(content: Any) -> str:
    """The text of a message's content: strings and text blocks, joined by newlines as decide
    joins text parts. Reasoning, tool-use and other blocks carry no text for a decision."""
    if isinstance(content, str):
        return content
    texts: List[str] = []
    for block in _blocks(content):
        if isinstance(block, str):
            texts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            texts.append(str(block.get("text", "")))
    return "\n".join(texts)


def _user_content(content: Any) -> Json:
    """A user message's content: its text and images, which decide reads (an image alone leaves
    nothing to decide on, and the filter then passes every tool)."""
    if isinstance(content, str):
        return content
    parts: List[Json] = []
    for block in _blocks(content):
        if isinstance(block, str):
            parts.append({"type": "text", "text": block})
        elif isinstance(block, dict):
            kind = block.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif kind == "image_url":
                parts.append(block)
            elif kind == "image":
                url = _image_url(block)
                if url is not None:
                    parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts if parts else ""


def _image_url(block: Dict[str, Any]) -> Optional[str]:
    if isinstance(block.get("url"), str):
        return str(block["url"])
    data = block.get("base64", block.get("data"))
    if isinstance(data, str):
        mime = block.get("mime_type") or "image/png"
        return f"data:{mime};base64,{data}"
    return None


def tools(value: Any) -> Json:
    """A tool list: a dict (an MCP `tools/list` result, `{"tools": [...]}`) as is, the MCP SDK's
    `ListToolsResult` by its fields, or a sequence of tools, each a dict (OpenAI, bare or MCP) or
    an object ``tool`` converts. One tool object alone becomes its dict, which the native parser
    refuses as it refuses one tool dict: it asks for a list."""
    if isinstance(value, (dict, str, bytes)):
        return value
    # Before the iterable case: a pydantic model iterates over its (field, value) pairs.
    if _is_langchain_tool(value):
        return tool(value)
    if _is_pydantic_instance(value):
        return _dump(value)
    if isinstance(value, Iterable):
        return [tool(t) for t in value]
    return value


def tool(t: Any) -> Json:
    """One tool as JSON: a dict as is; a LangChain tool (or a function, or a pydantic class) by
    LangChain's `convert_to_openai_tool`; another pydantic model (the MCP SDK's `Tool`) by its
    fields."""
    if isinstance(t, dict):
        return t
    cached = _TOOL_CACHE.get(id(t))
    if cached is not None and cached[0] is t:
        return cached[1]
    converted = _convert_tool(t)
    if converted is t:
        return t
    if len(_TOOL_CACHE) >= _TOOL_CACHE_SIZE:
        _TOOL_CACHE.clear()
    _TOOL_CACHE[id(t)] = (t, converted)
    return converted


def _convert_tool(t: Any) -> Any:
    convert = _langchain_converter()
    if convert is not None and _is_langchain_tool(t):
        return convert(t)
    if _is_pydantic_instance(t):
        return _dump(t)
    if convert is not None and callable(t):
        return convert(t)
    return t


def _is_pydantic_instance(value: Any) -> bool:
    return callable(getattr(value, "model_dump", None)) and not isinstance(value, type)


def _dump(model: Any) -> Json:
    """A pydantic model's fields as JSON, by their wire names (the MCP SDK's `inputSchema`)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _is_langchain_tool(t: Any) -> bool:
    try:
        from langchain_core.tools import BaseTool
    except ImportError:
        return False
    return isinstance(t, BaseTool)
