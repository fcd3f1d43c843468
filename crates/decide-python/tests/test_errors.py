"""Bad input and bad settings raise `decide.DecideError` with the one line `decide` prints."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import REPO, Cli

import decide

TOOLS = [{"name": "get_weather", "description": "Current weather for a city"}]
HELLO = [{"role": "user", "content": "hello"}]


def error_of(call: Any) -> str:
    with pytest.raises(decide.DecideError) as caught:
        call()
    return str(caught.value)


def test_decide_error_is_a_value_error() -> None:
    assert issubclass(decide.DecideError, ValueError)
    assert decide.DecideError.__module__ == "decide"


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([{"description": "no name"}], "tools[0].name: missing"),
        (
            [{"name": "a"}, {"name": "a"}],
            'tools[1].name: duplicate tool name "a" (first at tools[0])',
        ),
        ([], "tools: empty"),
        (
            [{"type": "function", "function": {"name": 3}}],
            "tools[0].function.name: expected a string, got a number",
        ),
        ({"name": "lonely"}, "got a single tool (wrap it in [ ])"),
        ([{"name": "a", "parameters": float("nan")}], "tools[0].parameters: not a finite number"),
        ([{"name": "a", "description": object()}], "tools[0].description: expected JSON data"),
        ([{"name": "a", "metadata": {1: "x"}}], "tools[0].metadata: keys must be strings, got int"),
    ],
)
def test_bad_tools(decider: decide.Decider, tools: Any, message: str) -> None:
    assert message in error_of(lambda: decider.select(HELLO, tools))


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages: empty conversation"),
        ("  ", "messages: empty message"),
        ([{"content": "hi"}], 'messages[0]: missing "role"'),
        ([{"role": "robot", "content": "hi"}], 'messages[0].role: unknown role "robot"'),
        (
            [{"role": "system", "content": "Be brief."}],
            "messages: the conversation has no user message",
        ),
        (
            [{"role": "user", "content": "rain?"}, {"role": "user", "content": "\n"}],
            "messages: the last user message is blank",
        ),
        ({"role": "user", "content": "hi"}, "got a single message (wrap it in [ ])"),
    ],
)
def test_bad_conversations(decider: decide.Decider, messages: Any, message: str) -> None:
    assert message in error_of(lambda: decider.select(messages, TOOLS))


def test_bad_options(decider: decide.Decider) -> None:
    def select(**options: Any) -> str:
        return error_of(lambda: decider.select(HELLO, TOOLS, **options))

    assert select(min_probability=0.3, target_recall=0.9) == (
        "target_recall: replaces min_probability: set one of them, not both"
    )
    assert select(target_recall=1.5).startswith("target_recall: ")
    assert select(min_probability=1.5) == "min_probability: must be between 0 and 1, but was 1.5"
    assert select(max_results=0) == "max_results: must be at least 1, but was 0"
    assert select(max_results=-2) == "max_results: must be at least 1, but was -2"
    assert select(always_include=["nope"]) == 'always_include: no tool is named "nope"'
    assert select(fallback="maybe") == 'fallback: "maybe" is not one of all-tools, no-tools, fail'
    assert select(needs_tool_gate=True, target_recall=0.9) == (
        "needs_tool_gate: cannot be combined with target_recall, whose recall is promised for one threshold"
    )


def test_the_messages_are_those_of_decide_select(
    decider: decide.Decider, cli: Cli, tmp_path: Path
) -> None:
    """For the same bad file, `decide select` prints `FILE: ` and then the same words."""
    cases: List[Dict[str, Any]] = [
        {"tools": [{"description": "no name"}], "messages": HELLO},
        {"tools": [{"name": "a"}, {"name": "a"}], "messages": HELLO},
        {"tools": TOOLS, "messages": [{"role": "robot", "content": "hi"}]},
        {"tools": TOOLS, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"tools": [{"type": "web_search"}], "messages": HELLO},
    ]
    for case in cases:
        tools = tmp_path / "tools.json"
        messages = tmp_path / "messages.json"
        tools.write_text(json.dumps(case["tools"]))
        messages.write_text(json.dumps(case["messages"]))
        line = cli.error("select", "--tools", str(tools), "--messages", str(messages))
        line = re.sub(rf"^({re.escape(str(tools))}|{re.escape(str(messages))}): ", "", line)
        assert error_of(lambda: decider.select(case["messages"], case["tools"])) == line


def test_models_that_cannot_be_loaded() -> None:
    missing = error_of(lambda: decide.Decider("no-such-model"))
    assert missing.startswith("model 'no-such-model' was not found (looked in ")
    assert error_of(lambda: decide.Decider(device="tpu")) == (
        "device 'tpu': expected cpu, cuda, cuda:N, metal or auto"
    )
    assert error_of(lambda: decide.Decider(dtype="f8")) == (
        "dtype: 'f8': expected f32, int8, f16, bf16 or auto"
    )


def test_a_missing_model_reads_as_decide_prints_it(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From the same folder: `models/` relative to it is one of the places searched.
    monkeypatch.chdir(REPO)
    line = cli.error("--model", "no-such-model", "select", "--tools", "examples/tools.json", "hi")
    assert error_of(lambda: decide.Decider("no-such-model")) == line
