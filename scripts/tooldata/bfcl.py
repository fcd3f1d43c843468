#!/usr/bin/env python3
"""Converts the Berkeley Function Calling Leaderboard's data (the `bfcl-eval` wheel on PyPI,
Apache-2.0) into `decide train` cases, for the MCP adaptation stage.

    python3 scripts/tooldata/bfcl.py --wheel bfcl_eval-2026.3.23-py3-none-any.whl \
        --eval-data crates/decide-eval/data --out OUT [--heldout 0.1] [--seed 42]

Two kinds of BFCL data are read, both closer to what an agent's tool list looks like than the
general sets' plugin-store descriptions:

* the "live" categories (`live_simple`, `live_multiple`, `live_parallel`,
  `live_parallel_multiple`): requests users contributed against their own functions, each case
  with its own short function list and the function(s) its answer calls;
* `multi_turn_base`: conversations with API suites shaped like MCP servers (a file system, a
  messaging app, a trading bot, vehicle control ...); each user turn becomes a case, its message
  against the functions of the suites the conversation involves, expecting the functions that
  turn's answer calls. Earlier turns are left out: the data holds no tool results to show.

The irrelevance categories (`irrelevance`, `live_irrelevance`: requests whose functions cannot
answer them, "the area of a triangle" with only a body-mass-index function) are written apart, half
of each to train on (against `decide train --no-tool-margin`: no function of such a case may reach
the margin) and half to measure on: a public set of requests for a tool the catalogue lacks.

Writes to `--out`:

- `bfcl.jsonl`: the training cases (`{"id", "messages", "tools", "expected"}`);
- `heldout.jsonl`: `--heldout` of the cases (seeded, per category), never trained on, with a
  `source` field, to measure on;
- `summary.json`: the counts, the seed and the sha256 of every input;
- `irrelevance.jsonl` and `irrelevance-heldout.jsonl`: the irrelevance cases (`expected` empty),
  half each (seeded, per category), and `irrelevance-summary.json`.

No conversation of a report part (or of the tuning parts) is taken: those are checked and counted.
Deterministic: the same wheel, options and seed give byte-identical files.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare import (  # noqa: E402
    Fail, conversation_key, hold_out, json_objects, rng_for, with_arguments, write_split)  # noqa: E402

DATA = "bfcl_eval/data"
LIVE = ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"]
MULTI_TURN = "multi_turn_base"
# As bfcl_eval/constants/executable_backend_config.py maps them.
SUITES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}


class Wheel:
    """The JSONL members of the wheel, each read once and named in errors as WHEEL!MEMBER."""

    def __init__(self, path: str) -> None:
        if not os.path.isfile(path):
            raise Fail(f"{path}: no such file")
        with open(path, "rb") as f:
            data = f.read()
        self.path = path
        self.sha256 = hashlib.sha256(data).hexdigest()
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile:
            raise Fail(f"{path}: not a wheel (zip) file") from None

    def jsonl(self, member: str) -> list[tuple[str, dict]]:
        """(where, object) for each line of the member."""
        try:
            text = self.zip.read(member).decode("utf-8")
        except KeyError:
            raise Fail(f"{self.path}!{member}: missing from the wheel") from None
        except UnicodeDecodeError:
            raise Fail(f"{self.path}!{member}: not UTF-8 text") from None
        where = lambda n: f"{self.path}!{member}:{n}"  # noqa: E731
        return [(where(n), obj) for n, obj in json_objects(text, where)]

    def answers(self, category: str) -> dict[str, object]:
        out = {}
        for at, obj in self.jsonl(f"{DATA}/possible_answer/BFCL_v4_{category}.json"):
            if not isinstance(obj.get("id"), str) or "ground_truth" not in obj:
                raise Fail(f"{at}: expected \"id\" and \"ground_truth\"")
            out[obj["id"]] = obj["ground_truth"]
        return out


def tool(at: str, fn) -> dict:
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
        raise Fail(f"{at}: a function without a name")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise Fail(f"{at}: function {fn['name']!r}: description is not a string")
    return with_arguments({"name": fn["name"], "description": description}, fn)


def tools_of(at: str, functions) -> list[dict]:
    """Each name once (a few cases list a function twice; the first is kept)."""
    if not isinstance(functions, list):
        raise Fail(f"{at}: function: expected a list")
    out, seen = [], set()
    for fn in functions:
        t = tool(at, fn)
        if t["name"] not in seen:
            seen.add(t["name"])
            out.append(t)
    return out


def user_messages(at: str, turn) -> list[dict]:
    if not isinstance(turn, list) or not turn:
        raise Fail(f"{at}: question: expected a non-empty list of messages")
    out = []
    for m in turn:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise Fail(f"{at}: question: a message without a role and text content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def live_cases(wheel: Wheel, category: str):
    answers = wheel.answers(category)
    for at, obj in wheel.jsonl(f"{DATA}/BFCL_v4_{category}.json"):
        case_id = obj.get("id")
        if case_id not in answers:
            raise Fail(f"{at}: no ground truth for id {case_id!r}")
        question = obj.get("question")
        if not isinstance(question, list) or len(question) != 1:
            raise Fail(f"{at}: question: expected one turn")
        calls = answers[case_id]
        if not isinstance(calls, list) or not all(isinstance(c, dict) and len(c) == 1 for c in calls):
            raise Fail(f"{at}: ground truth: expected a list of {{name: arguments}} calls")
        expected = list(dict.fromkeys(next(iter(c)) for c in calls))
        yield at, f"bfcl-{case_id}", user_messages(at, question[0]), tools_of(at, obj.get("function")), expected


def multi_turn_cases(wheel: Wheel):
    suites = {}
    for suite, member in SUITES.items():
        suites[suite] = [tool(at, fn) for at, fn in wheel.jsonl(f"{DATA}/multi_turn_func_doc/{member}")]
    answers = wheel.answers(MULTI_TURN)
    for at, obj in wheel.jsonl(f"{DATA}/BFCL_v4_{MULTI_TURN}.json"):
        case_id = obj.get("id")
        turns, calls = obj.get("question"), answers.get(case_id)
        if not isinstance(turns, list) or not isinstance(calls, list) or len(turns) != len(calls):
            raise Fail(f"{at}: question and ground truth must have one entry per turn")
        classes = obj.get("involved_classes")
        if not isinstance(classes, list) or any(c not in suites for c in classes):
            raise Fail(f"{at}: involved_classes: expected names among {sorted(suites)}")
        excluded = set(obj.get("excluded_function") or [])
        catalogue, seen = [], set()
        for suite in classes:
            for t in suites[suite]:
                if t["name"] not in seen and t["name"] not in excluded:
                    seen.add(t["name"])
                    catalogue.append(t)
        for k, (turn, turn_calls) in enumerate(zip(turns, calls)):
            if not isinstance(turn_calls, list) or not all(isinstance(c, str) for c in turn_calls):
                raise Fail(f"{at}: ground truth of turn {k}: expected a list of calls")
            # A call is written as Python source, `name(arg=value, ...)`.
            expected = list(dict.fromkeys(c.split("(", 1)[0].strip() for c in turn_calls))
            yield at, f"bfcl-{case_id}-turn{k}", user_messages(at, turn), catalogue, expected


IRRELEVANCE = ["irrelevance", "live_irrelevance"]


def irrelevance_cases(wheel: Wheel, category: str):
    """Requests none of whose functions answers them; the few without a function are skipped."""
    for at, obj in wheel.jsonl(f"{DATA}/BFCL_v4_{category}.json"):
        case_id = obj.get("id")
        question = obj.get("question")
        if not isinstance(case_id, str) or not isinstance(question, list) or len(question) != 1:
            raise Fail(f"{at}: expected an \"id\" and one turn")
        tools = tools_of(at, obj.get("function"))
        if tools:
            yield {"id": f"bfcl-{case_id}", "messages": user_messages(at, question[0]), "tools": tools,
                   "expected": []}


def write_irrelevance(wheel: Wheel, out: str, seed: int, evals: set[str]) -> None:
    train, heldout, counts = [], [], {}
    for category in IRRELEVANCE:
        kept = [c for c in irrelevance_cases(wheel, category) if conversation_key(c["messages"]) not in evals]
        trained, held = hold_out(kept, 0.5, rng_for(seed, "bfcl", "irrelevance", category), f"bfcl-{category}")
        train += trained
        heldout += held
        counts[category] = {"cases": len(kept), "trained": len(trained), "held_out": len(held)}
    write_split(out, "irrelevance.jsonl", train, heldout, {"seed": seed, "categories": counts}, counts,
                heldout_name="irrelevance-heldout.jsonl", summary_name="irrelevance-summary.json")


def eval_conversations(eval_data: str) -> set[str]:
    keys = set()
    for part in ("own", "livemcpbench"):
        for name in ("report.jsonl", "tune.jsonl"):
            path = os.path.join(eval_data, part, name)
            if not os.path.isfile(path):
                raise Fail(f"{path}: no such file")
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            keys.add(conversation_key(json.loads(line)["messages"]))
                        except (ValueError, KeyError, TypeError) as e:
                            raise Fail(f"{path}:{n}: {e}") from None
    return keys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", required=True, help="the bfcl-eval wheel (pip download bfcl-eval)")
    parser.add_argument("--eval-data", required=True, help="crates/decide-eval/data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--heldout", type=float, default=0.1, help="share of each category held out")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if not 0 <= args.heldout < 1:
        raise Fail(f"--heldout {args.heldout}: expected 0 <= share < 1")

    wheel = Wheel(args.wheel)
    evals = eval_conversations(args.eval_data)
    train, heldout, counts = [], [], {}
    sources = [(c, live_cases(wheel, c)) for c in LIVE] + [(MULTI_TURN, multi_turn_cases(wheel))]
    for category, cases in sources:
        count = {"cases": 0, "no_call": 0, "unknown_tool": 0, "eval_overlap": 0, "duplicate": 0}
        kept, seen = [], set()
        for at, case_id, messages, tools, expected in cases:
            count["cases"] += 1
            names = {t["name"] for t in tools}
            key = conversation_key(messages)
            if not expected:
                count["no_call"] += 1
            elif any(n not in names for n in expected):
                count["unknown_tool"] += 1
            elif key in evals:
                count["eval_overlap"] += 1
            elif (key, tuple(sorted(names))) in seen:
                count["duplicate"] += 1
            else:
                seen.add((key, tuple(sorted(names))))
                kept.append({"id": case_id, "messages": messages, "tools": tools, "expected": expected})
        trained, held = hold_out(kept, args.heldout, rng_for(args.seed, "bfcl", "heldout", category), f"bfcl-{category}")
        train += trained
        heldout += held
        count.update(trained=len(trained), held_out=len(held))
        counts[category] = count
    rng_for(args.seed, "bfcl", "shuffle").shuffle(train)

    summary = {"seed": args.seed, "heldout": args.heldout, "categories": counts,
               "wheel": os.path.basename(args.wheel), "wheel_sha256": wheel.sha256}
    write_split(args.out, "bfcl.jsonl", train, heldout, summary, counts)
    write_irrelevance(wheel, args.out, args.seed, evals)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"bfcl.py: {e}", file=sys.stderr)
        sys.exit(2)
