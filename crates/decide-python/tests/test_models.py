"""Routing, embeddings, reranking, BM25, and one `Decider` shared by many threads."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import pytest
from conftest import Cli, example

import decide

CODE = "Write a Python function that reverses a string"


def test_route_answers_as_decide_route(decider: decide.Decider, cli: Cli) -> None:
    expected = cli.json("route", "--routes", "examples/routes.json", CODE)
    got = decider.route(CODE, example("routes.json"))
    assert got.route == expected["route"] == "code"
    assert list(got.probabilities) == list(expected["probabilities"])
    for name, p in got.probabilities.items():
        assert p == pytest.approx(expected["probabilities"][name], abs=1e-5)
    assert got.to_dict()["route"] == "code"


def test_route_from_a_list_of_routes(decider: decide.Decider) -> None:
    spec = example("routes.json")
    from_file = decider.route(CODE, spec)
    from_list = decider.route(CODE, spec["routes"], default="simple")
    assert from_list == from_file
    assert from_file.reason == "chosen"
    assert sum(from_file.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
    # Below min_probability the default route is taken.
    low = decider.route(CODE, spec, min_probability=0.999)
    assert (low.route, low.reason) == ("simple", "below-min-probability")
    # Bare names are routes described by their names; the first is the default.
    only = decider.route("hello", ["chat"])
    assert (only.route, only.reason) == ("chat", "only-candidate")


def test_bad_routes(decider: decide.Decider) -> None:
    def error(routes: Any, **kwargs: Any) -> str:
        with pytest.raises(decide.DecideError) as caught:
            decider.route(CODE, routes, **kwargs)
        return str(caught.value)

    assert error({"default": "a", "routes": []}) == "routes: empty"
    assert error({"default": "x", "routes": [{"name": "a"}, {"name": "b"}]}) == (
        'default: "x" is not one of the routes a, b'
    )
    assert error({"default": "a", "routes": [{"name": "a", "descriptons": "typo"}]}).startswith(
        "routes[0].descriptons: unknown field"
    )
    assert error({"default": "a", "routes": [{"name": "a"}]}, default="a") == (
        "default: given twice, in routes and as default=; give one"
    )
    assert (
        error("code")
        == 'routes: expected a routes file {"default", "routes"} or a list of routes, got a string'
    )


def cosine(a: List[float], b: List[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embed(decider: decide.Decider) -> None:
    texts = [
        "Will it rain in Paris tomorrow?",
        "Weather forecast for Paris",
        "Send an email to Anna",
    ]
    vectors = decider.embed(texts)
    assert len(vectors) == 3 and all(len(v) == 384 for v in vectors)
    assert all(isinstance(x, float) for x in vectors[0])
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    # A text's embedding does not depend on the batch it came in.
    alone = decider.embed(texts[2])
    assert alone[0] == pytest.approx(vectors[2], abs=1e-5)


def test_embed_refuses_what_the_server_refuses(decider: decide.Decider) -> None:
    def error(texts: Any) -> str:
        with pytest.raises(decide.DecideError) as caught:
            decider.embed(texts)
        return str(caught.value)

    assert error([]) == "texts: empty: send at least one text"
    assert error(["fine", " "]) == "texts[1]: empty text"
    assert error(["fine", 3]) == "texts[1]: expected a string, got a number"
    long = "word " * 1000
    assert error([long]) == (
        "texts[0]: longer than the model's 256 tokens; shorten it, or pass truncate=True"
    )
    assert len(decider.embed([long], truncate=True)[0]) == 384


def test_rerank_ranks_by_the_bi_encoders_cosine(decider: decide.Decider) -> None:
    query = "Will it rain in Paris tomorrow?"
    documents = [
        "Send an email to a colleague",
        "Weather forecast for a city: rain, wind and temperature",
        {"text": "Create a calendar event"},
    ]
    ranked = decider.rerank(query, documents)
    assert [r.index for r in ranked][0] == 1
    assert ranked[0].document == documents[1]
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    q = decider.embed([query])[0]
    for r in ranked:
        text = documents[r.index]
        d = decider.embed([text if isinstance(text, str) else text["text"]])[0]
        assert r.score == pytest.approx(cosine(q, d), abs=1e-4)
        assert 0.0 <= r.relevance_score <= 1.0
    assert decider.rerank(query, documents, top_n=1) == ranked[:1]
    with pytest.raises(decide.DecideError, match="^query: empty text$"):
        decider.rerank(" ", documents)
    with pytest.raises(decide.DecideError, match="^documents: empty: send at least one text$"):
        decider.rerank(query, [])
    with pytest.raises(decide.DecideError, match=r"^documents\[0\]: empty text$"):
        decider.rerank(query, [""])


def test_bm25_selects_without_model_files(mcp_tools: Dict[str, Any]) -> None:
    bm25 = decide.Decider(decide.BM25_MODEL)
    assert bm25.name == "bm25" and bm25.dtype is None
    selection = bm25.select("weather forecast for Berlin", mcp_tools, min_probability=0.1)
    assert "get_forecast" in selection.selected
    with pytest.raises(decide.DecideError, match="embeddings and reranking need a neural model"):
        bm25.embed(["x"])


CONVERSATIONS = [
    "What's the weather forecast for Lisbon this weekend?",
    "Email the quarterly report to the finance team",
    "Thanks, that's all!",
    "Add a meeting with Sam to my calendar on Friday at 10",
]


def test_one_decider_serves_many_threads(
    decider: decide.Decider, mcp_tools: Dict[str, Any]
) -> None:
    reference = {c: decider.select(c, mcp_tools) for c in CONVERSATIONS}
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda c: (c, decider.select(c, mcp_tools)), CONVERSATIONS * 6))
    assert len(results) == 24
    for conversation, selection in results:
        expected = reference[conversation]
        assert selection.selected == expected.selected
        for got, want in zip(selection.scores, expected.scores):
            assert got.probability == pytest.approx(want.probability, abs=1e-5)


def test_scoring_releases_the_gil(decider: decide.Decider) -> None:
    """While another thread embeds for a second or so, this one keeps running Python: with the
    GIL held through the native call it would stall for the whole call."""
    texts = [f"Document {i}: " + "tools for weather, mail and calendars " * 20 for i in range(400)]
    done = threading.Event()
    elapsed: List[float] = []

    def work() -> None:
        started = time.perf_counter()
        decider.embed(texts, truncate=True)
        elapsed.append(time.perf_counter() - started)
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    last = time.perf_counter()
    longest_gap = 0.0
    while not done.is_set():
        now = time.perf_counter()
        longest_gap = max(longest_gap, now - last)
        last = now
    worker.join()
    assert elapsed[0] > 0.2, "too little work to tell"
    assert longest_gap < elapsed[0] / 2, (longest_gap, elapsed[0])
