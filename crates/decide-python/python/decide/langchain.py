"""A LangChain agent middleware that passes each model call only the tools the conversation needs.

:class:`DecideToolSelectorMiddleware` is a drop-in for LangChain's ``LLMToolSelectorMiddleware``
(same ``max_tools`` and ``always_include``), with the local model deciding instead of an LLM
call::

    from langchain.agents import create_agent
    from decide.langchain import DecideToolSelectorMiddleware

    agent = create_agent(model, tools=tools, middleware=[DecideToolSelectorMiddleware(max_tools=3)])

It reads the whole conversation, tool calls and results included, so that a follow-up such as
"do the same for Berlin" keeps the tools of the earlier turn, and a turn that needs no tool can
get none. Needs ``langchain`` 1.x.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterable, List, Optional

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
    from langchain.agents.middleware.types import ModelCallResult, ModelResponse
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "decide.langchain needs LangChain 1.x: pip install 'langchain>=1,<2'"
    ) from error

from . import DecideError, Decider, _inputs

__all__ = ["DecideToolSelectorMiddleware"]


class DecideToolSelectorMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Before each model call, keeps only the tools the conversation needs, as decided by a
    local :class:`~decide.Decider` (a default one when ``decider`` is not given).

    ``max_tools`` caps the tools selected (the most probable first); ``always_include`` names
    tools always passed on, which do not count against ``max_tools``, and which must be among
    the agent's tools. ``target_recall`` and ``min_probability`` are ``Decider.select``'s: by
    default the model's needs-tool gate decides whether the conversation needs any tool, then
    passes the best tool and every other from the model's lower threshold.

    Provider tools given as dicts (built-ins such as web search) pass through untouched, as
    with ``LLMToolSelectorMiddleware``. A last user message with no text (an image alone)
    leaves nothing to decide on, so every tool passes.
    """

    def __init__(
        self,
        decider: Optional[Decider] = None,
        *,
        max_tools: Optional[int] = None,
        always_include: Optional[Iterable[str]] = None,
        target_recall: Optional[float] = None,
        min_probability: Optional[float] = None,
    ) -> None:
        super().__init__()
        # Refused here rather than at the agent's first model call.
        if max_tools is not None and max_tools < 1:
            raise DecideError(f"max_tools: must be at least 1, but was {max_tools}")
        self.decider = decider if decider is not None else Decider()
        self.max_tools = max_tools
        self.always_include: List[str] = list(always_include or ())
        self.target_recall = target_recall
        self.min_probability = min_probability

    def select_tools(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with only the tools its conversation needs (the request itself when
        there is nothing to choose)."""
        if not request.tools:
            return request
        # Provider tools (dicts) are not the agent's to filter; they pass as they are.
        base_tools = [t for t in request.tools if not isinstance(t, dict)]
        if self.always_include:
            available_names = {t.name for t in base_tools}
            missing = [n for n in self.always_include if n not in available_names]
            if missing:
                msg = (
                    f"Tools in always_include not found in request: {missing}. "
                    f"Available tools: {sorted(available_names)}"
                )
                raise ValueError(msg)
        candidates = [t for t in base_tools if t.name not in self.always_include]
        if not candidates:
            return request
        messages: List[Any] = list(request.messages)
        if request.system_message is not None:
            messages.insert(0, request.system_message)
        conversation = _inputs.conversation(messages)
        if not _has_user_text(conversation):
            if not any(isinstance(m, dict) and m.get("role") == "user" for m in conversation):
                msg = "No user message found in request messages"
                raise AssertionError(msg)
            return request
        selection = self.decider.select(
            conversation,
            candidates,
            max_results=self.max_tools,
            target_recall=self.target_recall,
            min_probability=self.min_probability,
        )
        chosen = set(selection.selected)
        selected = [t for t in candidates if t.name in chosen]
        always = [
            t for t in request.tools if not isinstance(t, dict) and t.name in self.always_include
        ]
        provider = [t for t in request.tools if isinstance(t, dict)]
        return request.override(tools=[*selected, *always, *provider])

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        """Calls the model with only the tools the conversation needs."""
        return handler(self.select_tools(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        """Calls the model with only the tools the conversation needs; the decision runs on a
        worker thread (it releases the GIL), so the event loop keeps serving."""
        return await handler(await asyncio.to_thread(self.select_tools, request))


def _has_user_text(conversation: Any) -> bool:
    """Whether the last user message has text to decide on."""
    for m in reversed(conversation):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return bool(content.strip())
            return any(
                isinstance(p, dict) and p.get("type") == "text" and str(p.get("text", "")).strip()
                for p in content or []
            )
    return False
