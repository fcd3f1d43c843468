"""`Decider.select`: the answers of `decide select`, from every input shape users hold."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
from conftest import Cli
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import StructuredTool
from mcp.types import ListToolsResult, Tool

import decide


def assert_same(a: decide.Selection, b: decide.Selection) -> None:
    assert a.selected == b.selected
    assert [(s.name, s.reason, s.passed) for s in a.scores] == [
        (s.name, s.reason, s.passed) for s in b.scores
    ]
    for x, y in zip(a.scores, b.scores):
        assert (x.probability is None) == (y.probability is None), x.name
        if x.probability is not None and y.probability is not None:
            assert x.probability == pytest.approx(y.probability, abs=1e-6), x.name
    assert (a.needs_tool is None) == (b.needs_tool is None)
    if a.needs_tool is not None and b.needs_tool is not None:
        assert a.needs_tool.probability == pytest.approx(b.needs_tool.probability, abs=1e-6)
        assert a.needs_tool.open == b.needs_tool.open


def test_the_default_model_loads_as_the_command_line_loads_it(decider: decide.Decider) -> None:
    assert decide.DEFAULT_MODEL == "decide-tools-minilm"
    assert decider.name == decide.DEFAULT_MODEL
    assert decider.device == "cpu"
    assert decider.dtype == "f32"
    assert repr(decider) == "Decider(model='decide-tools-minilm', device='cpu', dtype='f32')"


def test_the_readme_example(
    decider: decide.Decider, mcp_tools: Dict[str, Any], conversation: List[Any]
) -> None:
    selection = decider.select(conversation, mcp_tools)
    # The forecast tool was called earlier, so it passes without asking; the email tool is asked.
    assert selection.selected == ["get_forecast", "send_email"]
    assert len(selection.scores) == 27
    by_name = {s.name: s for s in selection.scores}
    assert by_name["get_forecast"].reason == "already-called"
    assert by_name["get_forecast"].probability is None
    assert by_name["send_email"].reason == "asked"
    assert by_name["send_email"].probability == pytest.approx(0.88, abs=0.01)
    assert selection.needs_tool is not None and selection.needs_tool.open
    assert selection.min_probability == 0.5
    assert selection.companion_min_probability == pytest.approx(0.2)
    assert selection.target_recall is None
    assert selection.fallback is None
    assert selection.probabilities["send_email"] == by_name["send_email"].probability


def test_select_answers_as_decide_select_json(
    decider: decide.Decider, mcp_tools: Dict[str, Any], conversation: List[Any], cli: Cli
) -> None:
    files = ["--tools", "examples/tools.json", "--messages", "examples/conversation.json"]
    for options, kwargs in [
        ([], {}),
        (["--target-recall", "0.9"], {"target_recall": 0.9}),
        (
            ["--needs-tool-gate", "off", "--min-probability", "0.3"],
            {"needs_tool_gate": False, "min_probability": 0.3},
        ),
        (
            ["--max-results", "1", "--always-include", "list_events"],
            {"max_results": 1, "always_include": ["list_events"]},
        ),
    ]:
        expected = cli.json("select", *files, *options)
        got = decider.select(conversation, mcp_tools, **kwargs).to_dict()
        assert [s["name"] for s in got["selected"]] == [s["name"] for s in expected["selected"]]
        assert [(s["name"], s["reason"]) for s in got["scores"]] == [
            (s["name"], s["reason"]) for s in expected["scores"]
        ]
        for g, e in zip(got["scores"], expected["scores"]):
            assert g["probability"] == pytest.approx(e["probability"], abs=1e-5), g["name"]
        assert ("needs_tool" in got) == ("needs_tool" in expected)
        if "needs_tool" in got:
            assert got["needs_tool"]["open"] == expected["needs_tool"]["open"]
            assert got["needs_tool"]["probability"] == pytest.approx(
                expected["needs_tool"]["probability"], abs=1e-5
            )


def test_target_recall_trades_tools_for_recall(
    decider: decide.Decider, mcp_tools: Dict[str, Any], conversation: List[Any]
) -> None:
    selection = decider.select(conversation, mcp_tools, target_recall=0.9)
    assert len(selection.selected) == 2
    assert {"get_forecast", "send_email"} <= set(selection.selected)
    assert selection.needs_tool is None
    assert selection.target_recall == 0.9
    assert selection.min_probability < 0.5


def test_options(
    decider: decide.Decider, mcp_tools: Dict[str, Any], conversation: List[Any]
) -> None:
    capped = decider.select(conversation, mcp_tools, max_results=1)
    # The called tool passes without asking; the cap is on the tools the model chose.
    assert capped.selected == ["get_forecast", "send_email"]
    included = decider.select(conversation, mcp_tools, always_include=["list_events"])
    assert "list_events" in included.selected
    assert {s.name: s.reason for s in included.scores}["list_events"] == "always-included"
    one_threshold = decider.select(conversation, mcp_tools, needs_tool_gate=False)
    assert one_threshold.needs_tool is None
    assert one_threshold.companion_min_probability is None
    everything = decider.select(conversation, mcp_tools, needs_tool_gate=False, min_probability=0.0)
    assert len(everything.selected) == 27


def test_a_string_is_one_user_message(decider: decide.Decider, mcp_tools: Dict[str, Any]) -> None:
    text = "What's the weather forecast for Lisbon this weekend?"
    assert_same(
        decider.select(text, mcp_tools),
        decider.select([{"role": "user", "content": text}], mcp_tools),
    )
    assert "get_forecast" in decider.select(text, mcp_tools).selected


def bare(tool: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "name": tool["name"],
        "description": tool["description"],
        "parameters": tool["inputSchema"],
    }


def test_every_tool_shape_gives_the_same_answer(
    decider: decide.Decider,
    mcp_tools: Dict[str, Any],
    conversation: List[Any],
) -> None:
    reference = decider.select(conversation, mcp_tools)
    listed = mcp_tools["tools"]
    shapes: Dict[str, Any] = {
        "OpenAI function tools": [{"type": "function", "function": bare(t)} for t in listed],
        "MCP tool dicts": listed,
        "a JSON-RPC tools/list response": {"jsonrpc": "2.0", "id": 1, "result": mcp_tools},
        "bare tools": [bare(t) for t in listed],
        "a tuple": tuple(listed),
        "a generator": (t for t in listed),
        "MCP SDK Tool objects": [Tool.model_validate(t) for t in listed],
        "an MCP SDK ListToolsResult": ListToolsResult.model_validate(mcp_tools),
        "LangChain tools": [
            StructuredTool.from_function(
                func=lambda **kwargs: "",
                name=t["name"],
                description=t["description"],
                args_schema=t["inputSchema"],
            )
            for t in listed
        ],
    }
    for shape, tools in shapes.items():
        try:
            assert_same(decider.select(conversation, tools), reference)
        except AssertionError as error:
            raise AssertionError(f"{shape}: {error}") from error


def test_langchain_messages_give_the_same_answer(
    decider: decide.Decider, mcp_tools: Dict[str, Any], conversation: List[Any]
) -> None:
    call = conversation[2]["tool_calls"][0]
    messages = [
        SystemMessage(conversation[0]["content"]),
        HumanMessage(conversation[1]["content"]),
        AIMessage(
            content="",
            tool_calls=[
                {
                    "name": call["function"]["name"],
                    "args": json.loads(call["function"]["arguments"]),
                    "id": call["id"],
                }
            ],
        ),
        ToolMessage(conversation[3]["content"], tool_call_id=call["id"]),
        AIMessage(conversation[4]["content"]),
        HumanMessage([{"type": "text", "text": conversation[5]["content"]}]),
    ]
    assert_same(decider.select(messages, mcp_tools), decider.select(conversation, mcp_tools))
    pairs = [("system", conversation[0]["content"]), ("human", conversation[1]["content"])]
    assert_same(
        decider.select(pairs, mcp_tools),
        decider.select(conversation[:2], mcp_tools),
    )
    # A whole chat-completions request is a conversation too.
    assert_same(
        decider.select({"model": "gpt-5", "messages": conversation}, mcp_tools),
        decider.select(conversation, mcp_tools),
    )


def test_an_image_alone_leaves_nothing_to_decide_on(
    decider: decide.Decider, mcp_tools: Dict[str, Any]
) -> None:
    image = HumanMessage([{"type": "image", "url": "https://example.com/cat.png"}])
    selection = decider.select([image], mcp_tools)
    assert len(selection.selected) == 27
    assert {s.reason for s in selection.scores} == {"no-text"}


def test_openai_tools_answer_as_decide_select_reads_them(
    decider: decide.Decider, openai_tools: List[Dict[str, Any]], conversation: List[Any], cli: Cli
) -> None:
    expected = cli.json(
        "select",
        "--tools",
        "examples/tools-openai.json",
        "--messages",
        "examples/conversation.json",
    )
    got = decider.select(conversation, openai_tools).to_dict()
    assert [s["name"] for s in got["selected"]] == [s["name"] for s in expected["selected"]]
    for g, e in zip(got["scores"], expected["scores"]):
        assert (g["name"], g["reason"]) == (e["name"], e["reason"])
        assert g["probability"] == pytest.approx(e["probability"], abs=1e-5)
