#!/usr/bin/env python3
"""Turns the public tool-selection data into training and held-out files for `decide train`.

Reads the four converted public sets in `--tooldata` (metatool, sealtools, apibank,
stabletoolbench: `examples.jsonl`, `catalogue.json`, `LICENSE` each; see docs/training.md) and the
project's own tuning parts in `--eval-data`, and writes to `--out`:

- `train.jsonl`: training cases, one `{"id", "messages", "tools", "expected"}` object a line, the
  sources mixed (shuffled). Every line carries its own candidate tools, so tool names of different
  sources never meet and need not be unique across sources.
- `heldout.jsonl`: cases that need a held-out tool, at most 150 per source, each with a `"source"`
  field (`decide`'s case reader ignores unknown fields), for choosing epochs and recipes.
- `select.jsonl`: `heldout.jsonl` plus `own/tune.jsonl` against the whole own catalogue: the
  calibration and model-selection set.
- `summary.json`: counts per source, the held-out tool names, the seed and the sha256 of every
  input read.
- `licenses/<source>.LICENSE`: the sources' licence texts.

Why it is built this way:

- Held out by tool, not by case: per source, `round(--heldout-share * tools used by any case)`
  tools are drawn at random. A case that needs any of them is held out, and no training line lists
  one, not even as a negative, so the held-out figure says how well a model does on tools it never
  saw (a by-case split would mostly measure memory of tool descriptions).
- MetaTool is capped: its labels are skewed (FinanceTool has 1,188 cases), so at most
  `--metatool-cap` single-tool training cases are kept per tool (seeded sample); every multi-tool
  case is kept.
- Candidates per line: the expected tools plus `--negatives` random tools of the same source
  (StableToolBench: the tools the benchmark offered first, then random ones; API-Bank: its whole
  catalogue), in shuffled order. Of a tool's `parameters` (or MCP `inputSchema`) only the argument
  names are kept, as `{"type": "object", "properties": {NAME: {}, ...}}`: a model whose manifest
  says `tool_parameters` reads them, and nothing reads the rest. LiveMCPBench's `tune.jsonl` is added with 60 random negatives from its
  catalogue; `own/tune.jsonl` stays out of training (it is kept for calibration and selection);
  no `report.jsonl` is used except to check that no training or held-out conversation is one of
  them.
- Exact-duplicate conversations (the same messages) are kept once, over all sources, so a held-out
  conversation can never also be a training one.
- Deterministic: the same inputs and `--seed` give byte-identical outputs. Every random choice
  uses its own `random.Random` seeded with the seed and what it is for, and everything is
  iterated in file or sorted order.

Licences: MetaTool is MIT; Seal-Tools, API-Bank (DAMO-ConvAI), StableToolBench and LiveMCPBench
are Apache-2.0. Files derived from them keep those notices (the licence texts are copied to
`--out/licenses/`).

Pure Python 3.11 standard library. Errors print one line, `prepare.py: FILE:LINE: what`, and exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from collections import defaultdict

SOURCES = ["metatool", "sealtools", "apibank", "stabletoolbench"]
HELDOUT_PER_SOURCE = 150
HELDOUT_TOOLS_PER_LINE = 40
LIVEMCPBENCH_NEGATIVES = 60


def argument_names(item: dict) -> list[str]:
    """The top-level property names of a tool's argument schema (`parameters`, MCP's `inputSchema`
    or `input_schema`), in the schema's order; none when it has no such object."""
    for key in ("parameters", "inputSchema", "input_schema"):
        schema = item.get(key)
        if isinstance(schema, dict):
            properties = schema.get("properties")
            return list(properties) if isinstance(properties, dict) else []
    return []


def with_arguments(tool: dict, item: dict) -> dict:
    """`tool` with `parameters` holding `item`'s argument names, when it has any."""
    names = argument_names(item)
    if names:
        tool["parameters"] = {"type": "object", "properties": {n: {} for n in names}}
    return tool


class Fail(Exception):
    """An error to report as one line and exit 2."""


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def json_objects(text: str, where):
    """(line number, object) for each non-blank line of JSONL text; `where(n)` names line n in
    errors."""
    for line_no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise Fail(f"{where(line_no)}: invalid JSON at column {e.colno}: {e.msg}") from None
        if not isinstance(obj, dict):
            raise Fail(f"{where(line_no)}: expected a JSON object")
        yield line_no, obj


def write_jsonl(folder: str, name: str, rows: list[dict]) -> str:
    """Writes the rows as compact JSON lines; returns the sha256 of the bytes written."""
    data = "".join(dumps(row) + "\n" for row in rows).encode("utf-8")
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def write_summary(folder: str, summary: dict, name: str = "summary.json") -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")


def keep_cases(cases, evals: set, count: dict, total: str = "cases") -> list[dict]:
    """The (id, messages, tools, expected) cases worth training on, as case objects: each calls a
    tool, is no conversation of `evals`, and has a message not seen before (the first case keeps
    it: one message with two answers would teach neither). `count` counts them under `total` and
    each drop by its reason."""
    kept, seen = [], set()
    for case_id, messages, tools, expected in cases:
        count[total] += 1
        key = conversation_key(messages)
        if not expected:
            count["no_call"] += 1
        elif key in evals:
            count["eval_overlap"] += 1
        elif key in seen:
            count["duplicate"] += 1
        else:
            seen.add(key)
            kept.append({"id": case_id, "messages": messages, "tools": tools, "expected": expected})
    return kept


def hold_out(kept: list[dict], share: float, rng, source: str) -> tuple[list[dict], list[dict]]:
    """Splits one source's cases into (trained, held out): `share` of them, drawn by `rng`, are held
    out with a `source` field to measure on. Both keep `kept`'s order, so the split depends only on
    the seed."""
    order = list(range(len(kept)))
    rng.shuffle(order)
    held = set(order[: round(len(kept) * share)])
    trained = [case for i, case in enumerate(kept) if i not in held]
    return trained, [{**case, "source": source} for i, case in enumerate(kept) if i in held]


def write_split(out: str, name: str, train: list[dict], heldout: list[dict], summary: dict,
                counts: dict, heldout_name: str = "heldout.jsonl", summary_name: str = "summary.json") -> None:
    """Writes a converter's `name` (the training cases), `heldout_name` and `summary_name` (with
    both files' sha256) into `out`, and says what it wrote, per source, on stderr."""
    os.makedirs(out, exist_ok=True)
    outputs = {file: write_jsonl(out, file, rows) for file, rows in ((name, train), (heldout_name, heldout))}
    write_summary(out, {**summary, "outputs_sha256": outputs}, summary_name)
    print(f"{name}: {len(train)} cases, {heldout_name}: {len(heldout)} ("
          + ", ".join(f"{s} {n['trained']}+{n['held_out']}" for s, n in counts.items())
          + f"); written to {out}", file=sys.stderr)


def conversation_key(messages) -> str:
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class Inputs:
    """Reads input files and records their sha256 under a stable label."""

    def __init__(self) -> None:
        self.sha256: dict[str, str] = {}

    def read(self, path: str, label: str) -> bytes:
        if not os.path.isfile(path):
            raise Fail(f"{path}: no such file")
        with open(path, "rb") as f:
            data = f.read()
        self.sha256[label] = hashlib.sha256(data).hexdigest()
        return data

    def text(self, path: str, label: str) -> str:
        data = self.read(path, label)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise Fail(f"{path}:{line}: not UTF-8 text") from None

    def catalogue(self, path: str, label: str, servers: bool = False) -> list[dict]:
        """A tool list as `[{"name", "description", "parameters"?}]`, from the bare, OpenAI or MCP
        shape; `parameters` holds the argument names only (see `argument_names`). With `servers`,
        a tool whose `_meta.server` is a string keeps it, as `"_meta": {"server": ...}`."""
        text = self.text(path, label)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise Fail(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
        if isinstance(value, dict):
            if isinstance(value.get("result"), dict) and "tools" in value["result"]:
                value = value["result"]["tools"]
            elif "tools" in value:
                value = value["tools"]
        if not isinstance(value, list):
            raise Fail(f"{path}:1: expected a list of tools or an object with \"tools\"")
        tools, seen = [], set()
        for i, item in enumerate(value):
            if isinstance(item, dict) and isinstance(item.get("function"), dict):
                item = item["function"]
            if not isinstance(item, dict):
                raise Fail(f"{path}:1: tools[{i}]: expected an object")
            name = item.get("name")
            if not isinstance(name, str) or not name.strip():
                raise Fail(f"{path}:1: tools[{i}].name: missing or blank")
            if name in seen:
                raise Fail(f"{path}:1: tools[{i}].name: duplicate tool name {name!r}")
            seen.add(name)
            description = item.get("description")
            if description is None:
                description = ""
            if not isinstance(description, str):
                raise Fail(f"{path}:1: tools[{i}].description: expected a string")
            tool = with_arguments({"name": name, "description": description}, item)
            meta = item.get("_meta")
            server = meta.get("server") if isinstance(meta, dict) else None
            if servers and isinstance(server, str):
                tool["_meta"] = {"server": server}
            tools.append(tool)
        return tools

    def cases(self, path: str, label: str) -> list[dict]:
        """The JSONL cases with their line numbers (`_line`); checks the fields used here."""
        text = self.text(path, label)
        cases = []
        for line_no, obj in json_objects(text, lambda n: f"{path}:{n}"):
            at = f"{path}:{line_no}"
            if not isinstance(obj.get("id"), (str, int)) or isinstance(obj.get("id"), bool):
                raise Fail(f"{at}: id: missing or not a string")
            messages = obj.get("messages")
            if not isinstance(messages, list) or not messages:
                raise Fail(f"{at}: messages: missing or empty")
            expected = obj.get("expected")
            if not isinstance(expected, list) or not all(isinstance(n, str) for n in expected):
                raise Fail(f"{at}: expected: expected an array of tool names")
            obj["_line"] = line_no
            cases.append(obj)
        return cases


def unique(names: list[str]) -> list[str]:
    out, seen = [], set()
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def rng_for(seed: int, *purpose: str) -> random.Random:
    # A string seed is hashed with SHA-512 (version 2): the same on every run and machine.
    return random.Random(":".join([str(seed), *purpose]))


def pick_others(rng: random.Random, pool: list[str], exclude: set[str], k: int) -> list[str]:
    """`k` names of `pool` (catalogue order) not in `exclude`, drawn at random."""
    k = max(0, k)
    draw = rng.sample(pool, min(len(pool), k + len(exclude)))
    out = [n for n in draw if n not in exclude][:k]
    if len(out) < k:  # only when `exclude` took more than its share; fall back to a full pass
        taken = exclude | set(out)
        rest = [n for n in pool if n not in taken]
        out += rng.sample(rest, min(len(rest), k - len(out)))
    return out


def admit(case, by_name, seen_conversations, eval_keys, skipped):
    """The case's expected tools, each once, or None (counted in `skipped`) for a case that needs
    none, names a tool its catalogue lacks, repeats a conversation already taken, or is one of the
    evaluation sets' conversations."""
    expected = unique(case["expected"])
    if not expected:
        skipped["empty_expected"] += 1
        return None
    if any(n not in by_name for n in expected):
        skipped["unknown_tool"] += 1
        return None
    key = conversation_key(case["messages"])
    if key in seen_conversations:
        skipped["duplicate_conversation"] += 1
        return None
    seen_conversations.add(key)
    if key in eval_keys:
        skipped["eval_overlap"] += 1
        return None
    return expected


def line(case_id, messages, tools_by_name, names, expected, source=None) -> dict:
    obj = {
        "id": case_id,
        "messages": messages,
        "tools": [tools_by_name[n] for n in names],
        "expected": expected,
    }
    if source is not None:
        obj["source"] = source
    return obj


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tooldata", required=True, help="the folder of converted public tool-selection data sets")
    parser.add_argument("--eval-data", required=True, help="crates/decide-eval/data")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--heldout-share", type=float, default=0.1)
    parser.add_argument("--metatool-cap", type=int, default=40)
    parser.add_argument("--negatives", type=int, default=30)
    args = parser.parse_args(argv)
    if not 0 <= args.heldout_share < 1:
        raise Fail("--heldout-share: expected a number in [0, 1)")
    if args.metatool_cap < 1 or args.negatives < 0:
        raise Fail("--metatool-cap must be at least 1 and --negatives at least 0")
    for folder in [args.tooldata, args.eval_data] + [os.path.join(args.tooldata, s) for s in SOURCES]:
        if not os.path.isdir(folder):
            raise Fail(f"{folder}: no such folder")

    inputs = Inputs()
    seed = args.seed

    # The evaluation conversations that must stay out of training and selection.
    eval_keys: dict[str, str] = {}
    for part in ["own/report", "own/tune", "livemcpbench/report"]:
        path = os.path.join(args.eval_data, part + ".jsonl")
        for c in inputs.cases(path, f"eval-data/{part}.jsonl"):
            eval_keys.setdefault(conversation_key(c["messages"]), f"{path}:{c['_line']}")

    seen_conversations: set[str] = set()
    train: list[dict] = []
    heldout: list[dict] = []
    summary_sources: dict[str, dict] = {}
    licences: dict[str, bytes] = {}

    for source in SOURCES:
        folder = os.path.join(args.tooldata, source)
        catalogue = inputs.catalogue(
            os.path.join(folder, "catalogue.json"), f"tooldata/{source}/catalogue.json"
        )
        cases = inputs.cases(os.path.join(folder, "examples.jsonl"), f"tooldata/{source}/examples.jsonl")
        licences[source] = inputs.read(os.path.join(folder, "LICENSE"), f"tooldata/{source}/LICENSE")
        by_name = {t["name"]: t for t in catalogue}
        names = [t["name"] for t in catalogue]
        skipped = {"empty_expected": 0, "unknown_tool": 0, "duplicate_conversation": 0, "eval_overlap": 0}

        kept = []
        for c in cases:
            expected = admit(c, by_name, seen_conversations, eval_keys, skipped)
            if expected is None:
                continue
            candidates = [n for n in c.get("candidates") or [] if n in by_name]
            kept.append({"id": c["id"], "messages": c["messages"], "expected": expected,
                         "candidates": unique(candidates)})

        used = sorted({n for c in kept for n in c["expected"]})
        n_held = round(args.heldout_share * len(used))
        held = set(rng_for(seed, source, "heldout-tools").sample(used, n_held))
        pool = [c for c in kept if any(n in held for n in c["expected"])]
        train_cases = [c for c in kept if not any(n in held for n in c["expected"])]

        capped = 0
        if source == "metatool":
            singles: dict[str, list[int]] = defaultdict(list)
            for i, c in enumerate(train_cases):
                if len(c["expected"]) == 1:
                    singles[c["expected"][0]].append(i)
            drop: set[int] = set()
            for tool in sorted(singles):
                idx = singles[tool]
                if len(idx) > args.metatool_cap:
                    keep = set(rng_for(seed, source, "cap", tool).sample(idx, args.metatool_cap))
                    drop.update(i for i in idx if i not in keep)
            capped = len(drop)
            train_cases = [c for i, c in enumerate(train_cases) if i not in drop]

        # Training lines: expected + negatives, never a held-out tool.
        trainable = [n for n in names if n not in held]
        rng = rng_for(seed, source, "train-candidates")
        pairs = 0
        for c in train_cases:
            chosen = list(c["expected"])
            if source == "apibank":
                chosen += [n for n in trainable if n not in set(chosen)]
            else:
                target = len(chosen) + args.negatives
                for n in c["candidates"]:
                    if len(chosen) >= target:
                        break
                    if n not in held and n not in chosen:
                        chosen.append(n)
                chosen += pick_others(rng, trainable, set(chosen), target - len(chosen))
            rng.shuffle(chosen)
            train.append(line(c["id"], c["messages"], by_name, chosen, c["expected"]))
            pairs += len(c["expected"])

        # Held-out lines: a sample balanced over the held-out tools, 40 tools a line.
        groups: dict[str, list[dict]] = defaultdict(list)
        for c in pool:
            groups[min(n for n in c["expected"] if n in held)].append(c)
        rng = rng_for(seed, source, "heldout-sample")
        queues = []
        for tool in sorted(groups):
            group = list(groups[tool])
            rng.shuffle(group)
            queues.append(group)
        picked_ids = set()
        while len(picked_ids) < min(HELDOUT_PER_SOURCE, len(pool)):
            for q in queues:
                if q and len(picked_ids) < HELDOUT_PER_SOURCE:
                    picked_ids.add(id(q.pop()))
        rng = rng_for(seed, source, "heldout-candidates")
        written = 0
        for c in pool:  # file order
            if id(c) not in picked_ids:
                continue
            chosen = list(c["expected"])
            target = max(HELDOUT_TOOLS_PER_LINE, len(chosen))
            for n in c["candidates"]:
                if len(chosen) < target and n not in chosen:
                    chosen.append(n)
            chosen += pick_others(rng, names, set(chosen), target - len(chosen))
            rng.shuffle(chosen)
            heldout.append(line(c["id"], c["messages"], by_name, chosen, c["expected"], source))
            written += 1

        summary_sources[source] = {
            "cases": len(cases),
            "tools": len(catalogue),
            "tools_used": len(used),
            "heldout_tools": sorted(held),
            "train_cases": len(train_cases),
            "train_pairs": pairs,
            "heldout_pool": len(pool),
            "heldout_cases": written,
            "skipped": skipped,
        }
        if source == "metatool":
            summary_sources[source]["metatool_capped"] = capped

    # LiveMCPBench's tuning part, whole, with 60 negatives a line.
    path = os.path.join(args.eval_data, "livemcpbench")
    catalogue = inputs.catalogue(os.path.join(path, "catalogue.json"), "eval-data/livemcpbench/catalogue.json")
    cases = inputs.cases(os.path.join(path, "tune.jsonl"), "eval-data/livemcpbench/tune.jsonl")
    by_name = {t["name"]: t for t in catalogue}
    names = [t["name"] for t in catalogue]
    rng = rng_for(seed, "livemcpbench", "train-candidates")
    skipped = {"empty_expected": 0, "unknown_tool": 0, "duplicate_conversation": 0, "eval_overlap": 0}
    n_cases = pairs = 0
    for c in cases:
        expected = admit(c, by_name, seen_conversations, eval_keys, skipped)
        if expected is None:
            continue
        chosen = expected + pick_others(rng, names, set(expected), LIVEMCPBENCH_NEGATIVES)
        rng.shuffle(chosen)
        train.append(line(c["id"], c["messages"], by_name, chosen, expected))
        n_cases += 1
        pairs += len(expected)
    summary_sources["livemcpbench_tune"] = {
        "cases": len(cases), "tools": len(catalogue), "train_cases": n_cases, "train_pairs": pairs,
        "skipped": skipped,
    }

    # The selection set: held-out cases plus own/tune against the whole own catalogue.
    path = os.path.join(args.eval_data, "own")
    own_catalogue = inputs.catalogue(os.path.join(path, "catalogue.json"), "eval-data/own/catalogue.json")
    own_names = {t["name"] for t in own_catalogue}
    select = list(heldout)
    own_cases = 0
    for c in inputs.cases(os.path.join(path, "tune.jsonl"), "eval-data/own/tune.jsonl"):
        for n in c["expected"]:
            if n not in own_names:
                raise Fail(f"{path}/tune.jsonl:{c['_line']}: expected: unknown tool {n!r}")
        select.append({"id": c["id"], "messages": c["messages"], "tools": own_catalogue,
                       "expected": c["expected"], "source": "own"})
        own_cases += 1

    rng_for(seed, "train-order").shuffle(train)

    # Invariants `decide train` relies on: unique ids within a file, no id shared between the
    # training and selection files, every expected tool among the line's tools, unique names.
    train_ids = set()
    for file_name, lines in [("train.jsonl", train), ("select.jsonl", select)]:
        ids = set()
        for obj in lines:
            key = dumps(obj["id"])
            if key in ids:
                raise Fail(f"{file_name}: duplicate id {obj['id']}")
            ids.add(key)
            tool_names = [t["name"] for t in obj["tools"]]
            if len(set(tool_names)) != len(tool_names) or not set(obj["expected"]) <= set(tool_names):
                raise Fail(f"{file_name}: {obj['id']}: bad tool list")
        if file_name == "train.jsonl":
            train_ids = ids
        elif ids & train_ids:
            raise Fail(f"select.jsonl: id {sorted(ids & train_ids)[0]} is also a training case")

    os.makedirs(os.path.join(args.out, "licenses"), exist_ok=True)

    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout), ("select.jsonl", select)):
        write_jsonl(args.out, name, rows)
    for source, data in licences.items():
        with open(os.path.join(args.out, "licenses", f"{source}.LICENSE"), "wb") as f:
            f.write(data)

    totals = {
        "train_cases": len(train),
        "train_pairs": sum(len(o["expected"]) for o in train),
        "heldout_cases": len(heldout),
        "select_cases": len(select),
        "select_own_cases": own_cases,
        "heldout_tools": sum(len(s.get("heldout_tools", [])) for s in summary_sources.values()),
        "skipped": {
            k: sum(s["skipped"][k] for s in summary_sources.values())
            for k in ["empty_expected", "unknown_tool", "duplicate_conversation", "eval_overlap"]
        },
    }
    summary = {
        "seed": seed,
        "heldout_share": args.heldout_share,
        "metatool_cap": args.metatool_cap,
        "negatives": args.negatives,
        "sources": summary_sources,
        "totals": totals,
        "inputs_sha256": dict(sorted(inputs.sha256.items())),
    }
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(summary, ensure_ascii=False, indent=1) + "\n")

    err = sys.stderr
    print(f"{'source':<18}{'tools':>6}{'used':>6}{'held':>6}{'train':>7}{'pairs':>7}{'pool':>6}{'heldout':>8}  skipped",
          file=err)
    for source, s in summary_sources.items():
        skips = ", ".join(f"{k} {v}" for k, v in s["skipped"].items() if v)
        extra = f", capped {s['metatool_capped']}" if s.get("metatool_capped") else ""
        print(f"{source:<18}{s['tools']:>6}{s.get('tools_used', ''):>6}{len(s.get('heldout_tools', [])) or '':>6}"
              f"{s['train_cases']:>7}{s['train_pairs']:>7}{s.get('heldout_pool', ''):>6}{s.get('heldout_cases', ''):>8}"
              f"  {skips or '-'}{extra}", file=err)
    print(f"train.jsonl {totals['train_cases']} cases, {totals['train_pairs']} pairs; heldout.jsonl "
          f"{totals['heldout_cases']} cases; select.jsonl {totals['select_cases']} cases "
          f"({own_cases} own/tune); written to {args.out}", file=err)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"prepare.py: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"prepare.py: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
