"""decide: which tools an LLM should see, which chat model should answer, decided locally.

A :class:`Decider` loads a small local encoder (``decide-tools-minilm`` by default) once and
answers from any number of threads::

    import decide

    decider = decide.Decider()
    selection = decider.select("Will it rain in Paris tomorrow?", tools)
    selection.selected      # ['get_forecast']

The rules are those of the ``decide`` command line and server (``decide select``,
``/v1/select``, ``decide route``, ``/v1/rerank``): the same library calls, the same defaults and
the same error messages, raised as :class:`DecideError`. ``decide.langchain`` holds a LangChain
agent middleware built on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Union

from . import _inputs
from ._native import BM25_MODEL, DEFAULT_MODEL, DecideError, __version__
from ._native import Decider as _NativeDecider

__all__ = [
    "BM25_MODEL",
    "DEFAULT_MODEL",
    "DecideError",
    "Decider",
    "FallbackUsed",
    "NeedsTool",
    "RerankResult",
    "RouteResult",
    "Selection",
    "ToolScore",
    "__version__",
]


class ToolScore(NamedTuple):
    """What the filter decided about one tool."""

    name: str
    probability: Optional[float]
    """The model's probability that the conversation needs the tool; ``None`` when it passed
    without asking."""
    reason: str
    """``asked``, or why it passed without asking: ``already-called``, ``always-included``,
    ``always-visible`` or ``no-text``."""
    passed: bool


class NeedsTool(NamedTuple):
    """What the needs-tool gate decided on: whether the conversation needs any tool."""

    answer: Optional[float]
    """The model's needs-tool head's answer; ``None`` for a model without one."""
    probability: float
    """The probability compared with ``min_probability``: the head's answer and the best
    tool's probability together."""
    open: bool
    """Whether it reached ``min_probability``, so that tools passed."""


class FallbackUsed(NamedTuple):
    """A fallback the filter applied because the model failed."""

    strategy: str
    """``all-tools`` or ``no-tools``."""
    reason: str


@dataclass(frozen=True)
class Selection:
    """The tools a conversation needs, as ``decide select --json`` reports them."""

    selected: List[str]
    """The names of the tools passed on, in the catalogue's order."""
    scores: List[ToolScore]
    """Every tool, in the catalogue's order."""
    needs_tool: Optional[NeedsTool]
    """The needs-tool gate's decision, when the gate is on."""
    fallback: Optional[FallbackUsed]
    """The fallback applied, when the model failed."""
    min_probability: float
    """The threshold used: ``min_probability``, or the one ``target_recall`` gave."""
    target_recall: Optional[float]
    companion_min_probability: Optional[float]
    """With the gate, the lower threshold of the tools that pass with the best one."""

    @property
    def probabilities(self) -> Dict[str, Optional[float]]:
        """Every tool's probability by name (``None`` for those passed without asking)."""
        return {s.name: s.probability for s in self.scores}

    def to_dict(self) -> Dict[str, Any]:
        """The selection as ``/v1/select`` answers it."""
        scores = [
            {"name": s.name, "probability": s.probability, "reason": s.reason} for s in self.scores
        ]
        out: Dict[str, Any] = {
            "selected": [d for d, s in zip(scores, self.scores) if s.passed],
            "scores": scores,
        }
        if self.needs_tool is not None:
            out["needs_tool"] = self.needs_tool._asdict()
        if self.fallback is not None:
            out["fallback"] = self.fallback._asdict()
        return out


@dataclass(frozen=True)
class RouteResult:
    """The route a conversation takes, as ``decide route --json`` reports it."""

    route: str
    probabilities: Dict[str, float]
    """Every route's probability, in the routes' order; empty when the model was not asked."""
    reason: str
    """``chosen``, ``only-candidate``, ``no-user-message`` or ``below-min-probability`` (the
    default route)."""

    def to_dict(self) -> Dict[str, Any]:
        """The decision as ``/v1/route`` answers it."""
        return {"route": self.route, "probabilities": dict(self.probabilities)}


@dataclass(frozen=True)
class RerankResult:
    """One document's place in a reranking."""

    index: int
    """Its position in the documents given."""
    relevance_score: float
    """The model's calibrated score (Cohere's ``relevance_score``)."""
    score: float
    """The raw score: a cosine for a bi-encoder, a logit for a cross-encoder."""
    document: str


class Decider:
    """A local decision model, loaded once and safe to share between threads.

    ``model`` is what ``decide --model`` takes: a name in ``models/`` (``decide-tools-minilm``,
    the default), a model folder, a Hugging Face id in the local cache, or ``"bm25"``.
    ``device`` is ``cpu`` (or ``cuda``, ``metal``, ``auto`` on a build with them), ``dtype``
    ``f32``, ``int8`` (faster on CPUs with VNNI), ``bf16`` (AMX) or ``auto``. Nothing is ever
    downloaded. Scoring releases the GIL.
    """

    __slots__ = ("_native",)

    def __init__(
        self,
        model: Union[str, "os.PathLike[str]", None] = None,
        device: str = "cpu",
        dtype: str = "f32",
    ) -> None:
        self._native = _NativeDecider(None if model is None else os.fspath(model), device, dtype)

    @property
    def name(self) -> str:
        """The model's name."""
        return self._native.name

    @property
    def device(self) -> str:
        """The device it runs on."""
        return self._native.device

    @property
    def dtype(self) -> Optional[str]:
        """The precision of its weights; ``None`` for BM25."""
        return self._native.dtype

    def __repr__(self) -> str:
        return f"Decider(model={self.name!r}, device={self.device!r}, dtype={self.dtype!r})"

    def select(
        self,
        messages: Any,
        tools: Any,
        *,
        min_probability: Optional[float] = None,
        target_recall: Optional[float] = None,
        max_results: Optional[int] = None,
        always_include: Iterable[str] = (),
        needs_tool_gate: Optional[bool] = None,
        fallback: Optional[str] = None,
        max_messages: Optional[int] = None,
        max_message_length: Optional[int] = None,
    ) -> Selection:
        """The tools ``messages`` needs among ``tools``, by the rule ``decide select`` applies.

        ``messages``: a string (one user message), OpenAI chat messages (tool calls and results
        included), LangChain messages or ``(role, content)`` pairs. ``tools``: OpenAI function
        tools, bare ``{name, description, parameters}`` or MCP ``{name, description,
        inputSchema}`` dicts, an MCP ``tools/list`` result, LangChain tools or MCP SDK ``Tool``
        objects.

        By default the model's needs-tool gate decides whether the conversation needs a tool,
        then the best tool passes with every other from the model's lower threshold.
        ``min_probability`` moves the gate's bar (0.5), ``target_recall`` instead passes the
        fewest tools that keep that share of the needed ones, ``max_results`` caps the set,
        ``always_include`` names tools passed without asking, ``needs_tool_gate=False`` passes
        every tool from ``min_probability``, and ``fallback`` (``all-tools``, ``no-tools`` or
        ``fail``) says what passes when the model fails.
        """
        rows, gate, used, thresholds = self._native.select(
            _inputs.conversation(messages),
            _inputs.tools(tools),
            min_probability=min_probability,
            target_recall=target_recall,
            max_results=max_results,
            always_include=list(always_include),
            needs_tool_gate=needs_tool_gate,
            fallback=fallback,
            max_messages=max_messages,
            max_message_length=max_message_length,
        )
        scores = [ToolScore(*row) for row in rows]
        return Selection(
            selected=[s.name for s in scores if s.passed],
            scores=scores,
            needs_tool=None if gate is None else NeedsTool(*gate),
            fallback=None if used is None else FallbackUsed(*used),
            min_probability=thresholds[0],
            target_recall=thresholds[1],
            companion_min_probability=thresholds[2],
        )

    def route(
        self,
        messages: Any,
        routes: Any,
        *,
        default: Optional[str] = None,
        min_probability: Optional[float] = None,
        max_messages: Optional[int] = None,
    ) -> RouteResult:
        """The route (chat model) ``messages`` should go to, as ``decide route`` chooses it.

        ``routes``: a routes file's ``{"default": NAME, "routes": [{"name", "description"}]}``,
        or a list of routes (dicts, or bare names) with ``default`` (the first route when not
        given). Below ``min_probability`` the default route is taken; the decision sees the
        latest ``max_messages`` (1: the last user message alone) messages up to the last user
        message.
        """
        route, probabilities, reason = self._native.route(
            _inputs.conversation(messages),
            routes,
            default=default,
            min_probability=min_probability,
            max_messages=max_messages,
        )
        return RouteResult(route=route, probabilities=dict(probabilities), reason=reason)

    def embed(
        self, texts: Union[str, Sequence[str]], *, truncate: bool = False
    ) -> List[List[float]]:
        """The model's embedding of each text (one list of floats per text, in order), as
        ``/v1/embeddings`` answers. A text longer than the model reads is refused unless
        ``truncate``, which drops its end."""
        if isinstance(texts, str):
            texts = [texts]
        return self._native.embed(list(texts), truncate=truncate)

    def rerank(
        self,
        query: str,
        documents: Sequence[Union[str, Dict[str, str]]],
        *,
        top_n: Optional[int] = None,
    ) -> List[RerankResult]:
        """``documents`` ranked against ``query``, most relevant first, as ``decide serve``'s
        rerank endpoints rank them: by the cross-encoder's logit, or for a bi-encoder (the
        default model) by the cosine of the query's and each document's embeddings. Documents
        are strings or ``{"text": ...}``; ``top_n`` keeps the first n."""
        if top_n is not None and top_n < 1:
            raise DecideError("top_n: must be at least 1")
        docs = list(documents)
        _, _, ranks = self._native.rerank(query, docs)
        results = [
            RerankResult(i, relevance, raw, _document_text(docs[i])) for i, relevance, raw in ranks
        ]
        return results if top_n is None else results[:top_n]


def _document_text(document: Union[str, Dict[str, str]]) -> str:
    return document if isinstance(document, str) else str(document["text"])
