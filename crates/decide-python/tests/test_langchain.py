"""`DecideToolSelectorMiddleware` in a real LangChain agent (`create_agent`), tools executed, with
a scripted chat model that records the tools each model call was given."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, tool
from pydantic import Field

import decide
from decide.langchain import DecideToolSelectorMiddleware

EXECUTED: List[Tuple[str, Dict[str, Any]]] = []


def ran(name: str, **args: Any) -> None:
    EXECUTED.append((name, args))


@tool
def get_weather(city: str) -> str:
    """Current weather in a city: temperature, wind and conditions."""
    ran("get_weather", city=city)
    return f"{city}: sunny, 24°C, wind 10 km/h SW"


@tool
def get_forecast(city: str, days: int) -> str:
    """Weather forecast for the next days in a city."""
    ran("get_forecast", city=city, days=days)
    return "Showers on Wednesday"


@tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a recipient."""
    ran("send_email", to=to, subject=subject, body=body)
    return "sent"


@tool
def read_inbox(limit: int) -> str:
    """List the latest emails in the user's inbox."""
    return "no new mail"


@tool
def create_event(title: str, start: str, attendees: List[str]) -> str:
    """Create an event in the user's calendar."""
    return "created"


@tool
def list_events(day: str) -> str:
    """List the events in the user's calendar on a day."""
    return "nothing planned"


@tool
def read_file(path: str) -> str:
    """Read a text file from disk."""
    return ""


@tool
def write_file(path: str, content: str) -> str:
    """Write text to a file on disk, replacing it."""
    return "written"


@tool
def list_directory(path: str) -> str:
    """List the files and folders in a directory."""
    return ""


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression, such as 12 * (3 + 4)."""
    ran("calculate", expression=expression)
    left, right = expression.split("*")
    return str(int(left) * int(right))


@tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money from one currency to another at today's rate."""
    return ""


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights between two airports on a date."""
    return ""


@tool
def book_hotel(city: str, check_in: str, nights: int) -> str:
    """Book a hotel room in a city."""
    return ""


@tool
def get_stock_price(symbol: str) -> str:
    """The latest price of a stock by its ticker symbol."""
    return ""


@tool
def translate_text(text: str, target_language: str) -> str:
    """Translate text into another language."""
    return ""


@tool
def search_web(query: str) -> str:
    """Search the web and return the top results."""
    return ""


TOOLS: List[BaseTool] = [
    get_weather,
    get_forecast,
    send_email,
    read_inbox,
    create_event,
    list_events,
    read_file,
    write_file,
    list_directory,
    calculate,
    convert_currency,
    search_flights,
    book_hotel,
    get_stock_price,
    translate_text,
    search_web,
]


class ScriptedChatModel(FakeMessagesListChatModel):
    """LangChain's scripted fake chat model, answering with its responses in turn, that also
    records the names of the tools each call was given (the fake itself binds none)."""

    calls: List[List[str]] = Field(default_factory=list)

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: Optional[str] = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        names = [t["name"] if isinstance(t, dict) else t.name for t in tools]
        return self.bind(tool_names=names, **kwargs)

    def _generate(
        self,
        messages: List[BaseMessage],
        stop: Optional[List[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(list(kwargs.get("tool_names", [])))
        return super()._generate(messages, stop, run_manager, **kwargs)


def call(name: str, call_id: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


# Turn by turn: the user's message, the model's scripted answers, and for each model call the
# tool it needs and tools that have nothing to do with the conversation.
OFF_TOPIC = {
    "read_file",
    "write_file",
    "list_directory",
    "book_hotel",
    "get_stock_price",
    "translate_text",
    "search_flights",
}
TURNS: List[Tuple[str, List[AIMessage], List[Tuple[Optional[str], Set[str]]]]] = [
    (
        "What's the weather like in Paris right now?",
        [call("get_weather", "c1", city="Paris"), AIMessage("Sunny and 24°C in Paris.")],
        [("get_weather", OFF_TOPIC | {"send_email", "calculate"}), ("get_weather", OFF_TOPIC)],
    ),
    (
        "Great, email that to anna@example.com please",
        [
            call("send_email", "c2", to="anna@example.com", subject="Paris", body="Sunny, 24°C"),
            AIMessage("Sent to Anna."),
        ],
        [("send_email", OFF_TOPIC | {"calculate"}), ("send_email", OFF_TOPIC)],
    ),
    (
        "Now calculate 1234 * 5678 for me",
        [call("calculate", "c3", expression="1234 * 5678"), AIMessage("7,006,652.")],
        [("calculate", OFF_TOPIC), ("calculate", OFF_TOPIC)],
    ),
    (
        "Thanks, that's all!",
        [AIMessage("You're welcome!")],
        [(None, OFF_TOPIC | {"create_event", "search_web"})],
    ),
]


@pytest.fixture(scope="module")
def middleware(decider: decide.Decider) -> DecideToolSelectorMiddleware:
    return DecideToolSelectorMiddleware(decider)


def test_an_agent_sees_only_the_tools_each_call_needs(
    middleware: DecideToolSelectorMiddleware,
) -> None:
    model = ScriptedChatModel(responses=[m for _, answers, _ in TURNS for m in answers])
    agent = create_agent(
        model, tools=TOOLS, system_prompt="You are a helpful assistant.", middleware=[middleware]
    )
    EXECUTED.clear()
    messages: List[AnyMessage] = []
    expectations: List[Tuple[Optional[str], Set[str]]] = []
    for text, _, expected in TURNS:
        result: Dict[str, Any] = agent.invoke({"messages": [*messages, HumanMessage(text)]})
        messages = result["messages"]
        expectations.extend(expected)
    # The fake cycles through its responses: the count shows the script was followed exactly.
    assert len(model.calls) == len(expectations) == 7
    for i, (tools, (needed, unrelated)) in enumerate(zip(model.calls, expectations)):
        if needed is not None:
            assert needed in tools, (i, tools)
        assert not unrelated & set(tools), (i, tools)
        assert len(tools) < len(TOOLS) // 2, (i, tools)
    assert EXECUTED == [
        ("get_weather", {"city": "Paris"}),
        ("send_email", {"to": "anna@example.com", "subject": "Paris", "body": "Sunny, 24°C"}),
        ("calculate", {"expression": "1234 * 5678"}),
    ]
    assert messages[-1].content == "You're welcome!"
    assert any(m.content == "7006652" for m in messages if m.type == "tool")


def test_the_async_agent_is_filtered_too(middleware: DecideToolSelectorMiddleware) -> None:
    text, answers, expected = TURNS[0]
    model = ScriptedChatModel(responses=answers)
    agent = create_agent(model, tools=TOOLS, middleware=[middleware])
    result = asyncio.run(agent.ainvoke({"messages": [HumanMessage(text)]}))
    assert result["messages"][-1].content == "Sunny and 24°C in Paris."
    for tools, (needed, unrelated) in zip(model.calls, expected):
        assert needed in tools and not unrelated & set(tools), tools


def request(messages: Sequence[AnyMessage], tools: List[Any]) -> ModelRequest[Any]:
    return ModelRequest(model=ScriptedChatModel(responses=[]), messages=list(messages), tools=tools)


def given(mw: DecideToolSelectorMiddleware, req: ModelRequest[Any]) -> List[str]:
    """The names of the tools the model call behind the middleware gets."""
    seen: List[ModelRequest[Any]] = []

    def handler(r: ModelRequest[Any]) -> ModelResponse[Any]:
        seen.append(r)
        return ModelResponse(result=[AIMessage("ok")])

    mw.wrap_model_call(req, handler)
    return [t["type"] if isinstance(t, dict) else t.name for t in seen[0].tools]


def test_max_tools_and_always_include_as_llm_tool_selector(decider: decide.Decider) -> None:
    weather = [HumanMessage("What's the weather in Paris and the forecast for the weekend?")]
    assert set(given(DecideToolSelectorMiddleware(decider), request(weather, TOOLS))) >= {
        "get_weather"
    }
    capped = DecideToolSelectorMiddleware(decider, max_tools=1, always_include=["search_web"])
    # The one best tool, then the always-included ones, which max_tools does not count; and the
    # provider's own tools (dicts) untouched, after them.
    got = given(capped, request(weather, [*TOOLS, {"type": "web_search_preview"}]))
    assert len(got) == 3 and got[1:] == ["search_web", "web_search_preview"], got
    assert got[0] in {"get_weather", "get_forecast"}
    missing = DecideToolSelectorMiddleware(decider, always_include=["no_such_tool"])
    with pytest.raises(
        ValueError, match=r"^Tools in always_include not found in request: \['no_such_tool'\]"
    ):
        given(missing, request(weather, TOOLS))


def test_requests_with_nothing_to_decide(decider: decide.Decider) -> None:
    mw = DecideToolSelectorMiddleware(decider)
    assert given(mw, request([HumanMessage("hi")], [])) == []
    image = HumanMessage([{"type": "image", "url": "https://example.com/receipt.png"}])
    assert given(mw, request([image], TOOLS)) == [t.name for t in TOOLS]
    with pytest.raises(AssertionError, match="No user message found in request messages"):
        given(mw, request([SystemMessage("Be brief.")], TOOLS))


def test_a_default_decider() -> None:
    assert DecideToolSelectorMiddleware().decider.name == decide.DEFAULT_MODEL


def test_max_tools_below_one_is_refused_at_construction(decider: decide.Decider) -> None:
    with pytest.raises(decide.DecideError, match="^max_tools: must be at least 1, but was 0$"):
        DecideToolSelectorMiddleware(decider, max_tools=0)
