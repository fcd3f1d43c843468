"""Checks `decide serve`'s `/v1/tool_search` against the LLM providers' own Python SDK types (`openai`, `anthropic`
from PyPI): the calls posted are the shapes the models emit, and the answers are the items the providers take back.

    tool_search_check.py BASE_URL TOOLS.json

Every check is an assert; on success the script prints one JSON line of what each search returned.
"""

import json
import sys
import urllib.request

from pydantic import TypeAdapter

import anthropic.types as anthropic_types
from openai.types.responses import (
    FunctionTool,
    ResponseInputItemParam,
    ResponseToolSearchCall,
    ResponseToolSearchOutputItemParam,
    ToolSearchToolParam,
)


def post(base, body):
    request = urllib.request.Request(base + "/v1/tool_search", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def only_keys(value, allowed, what):
    extra = set(value) - set(allowed)
    assert not extra, f"{what}: keys the SDK type does not have: {extra}"


def main():
    base, tools_path = sys.argv[1], sys.argv[2]
    with open(tools_path) as f:
        catalogue = json.load(f)["tools"]
    seen = {}

    # OpenAI Responses: the deferred tools as function tools with defer_loading, the search tool executed by the
    # client, the model's tool_search_call item, and the tool_search_output item to send back.
    deferred = [{"type": "function", "name": t["name"], "description": t["description"],
                 "parameters": t["inputSchema"], "defer_loading": True} for t in catalogue]
    for tool in deferred:
        FunctionTool.model_validate(tool)
    search_tool = {"type": "tool_search", "execution": "client",
                   "description": "Finds the tools for a task",
                   "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                  "required": ["query"]}}
    TypeAdapter(ToolSearchToolParam).validate_python(search_tool)
    call = {"type": "tool_search_call", "id": "ts_1", "call_id": "call_ts_1", "execution": "client",
            "status": "completed", "arguments": {"query": "weather forecast for a city"}}
    ResponseToolSearchCall.model_validate(call)
    answer = post(base, {"provider": "openai", "call": call, "tools": deferred, "max_results": 3})
    output = ResponseToolSearchOutputItemParam.model_validate(answer)
    only_keys(answer, ResponseToolSearchOutputItemParam.model_fields, "tool_search_output")
    TypeAdapter(ResponseInputItemParam).validate_python(answer)
    assert output.type == "tool_search_output" and output.call_id == "call_ts_1", answer
    assert output.execution == "client", answer
    names = [tool.name for tool in output.tools]
    assert 1 <= len(names) <= 3, names
    assert "get_forecast" in names, names
    # The definitions come back as the application gave them.
    for tool in answer["tools"]:
        assert tool == next(d for d in deferred if d["name"] == tool["name"]), tool
    seen["openai"] = names

    # OpenAI's default client schema (the search tool without parameters): the model names the tools to load as
    # paths, and those tools come back, in the order named, without ranking.
    default_tool = {"type": "tool_search", "execution": "client"}
    TypeAdapter(ToolSearchToolParam).validate_python(default_tool)
    call = {"type": "tool_search_call", "id": "ts_2", "call_id": "call_ts_2", "execution": "client",
            "status": "completed", "arguments": {"paths": ["send_email", "get_forecast"]}}
    ResponseToolSearchCall.model_validate(call)
    answer = post(base, {"provider": "openai", "call": call, "tools": deferred})
    output = ResponseToolSearchOutputItemParam.model_validate(answer)
    only_keys(answer, ResponseToolSearchOutputItemParam.model_fields, "tool_search_output")
    assert output.call_id == "call_ts_2", answer
    names = [tool.name for tool in output.tools]
    assert names == ["send_email", "get_forecast"], names
    seen["openai paths"] = names

    # Anthropic Messages: a custom search tool the application runs; the model's tool_use of it, and the
    # tool_result of tool_reference blocks that loads the found tools.
    deferred = [{"name": t["name"], "description": t["description"], "input_schema": t["inputSchema"],
                 "defer_loading": True} for t in catalogue]
    for tool in deferred:
        TypeAdapter(anthropic_types.ToolParam).validate_python(tool)
    call = {"type": "tool_use", "id": "toolu_01", "name": "tool_search",
            "input": {"query": "send an email to a colleague"}}
    anthropic_types.ToolUseBlock.model_validate(call)
    answer = post(base, {"provider": "anthropic", "call": call, "tools": deferred})
    TypeAdapter(anthropic_types.ToolResultBlockParam).validate_python(answer)
    only_keys(answer, anthropic_types.ToolResultBlockParam.__annotations__, "tool_result")
    assert answer["type"] == "tool_result" and answer["tool_use_id"] == "toolu_01", answer
    for block in answer["content"]:
        TypeAdapter(anthropic_types.ToolReferenceBlockParam).validate_python(block)
        only_keys(block, anthropic_types.ToolReferenceBlockParam.__annotations__, "tool_reference")
    TypeAdapter(anthropic_types.MessageParam).validate_python({"role": "user", "content": [answer]})
    names = [block["tool_name"] for block in answer["content"]]
    assert 1 <= len(names) <= 5, names
    assert "send_email" in names, names
    seen["anthropic"] = names
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
