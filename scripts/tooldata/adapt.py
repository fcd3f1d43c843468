#!/usr/bin/env python3
"""Writes the MCP adaptation stage's training file: MCP conversations, repeated, over a replay of
the general training cases.

    python3 scripts/tooldata/adapt.py --data target/tool-model/data --eval-data crates/decide-eval/data \
        --no-tool scripts/tooldata/no-tool.jsonl --tools examples/tools.json --out OUT \
        [--replay 1000] [--repeat 4] [--seed 42] [--folds 2 --fold I] [--extra BFCL/bfcl.jsonl]
        [--mcp CASES.jsonl CATALOGUE.json]

The general sets (MetaTool, Seal-Tools, API-Bank, StableToolBench) teach the model what a request
for a tool looks like, but their tools read like plugin-store and REST descriptions. The tools a
user's agent sees are MCP tools: terse names, one-line descriptions, near-duplicates across
servers. This stage continues training on the MCP conversations the project may train on, the
tuning parts of `--eval-data` (`own/tune.jsonl` against its 62-tool catalogue and
`livemcpbench/tune.jsonl` against all 526 tools, so the hard negatives are the real near misses)
and the hand-written no-tool conversations of `--no-tool` (against `--tools`), each repeated
`--repeat` times, with any more such conversations given by `--mcp` (the ones written for
this stage against the two catalogues, `scripts/tooldata/written/`, which may not copy a report
part or a `--held-back` conversation), mixed with `--replay` cases drawn from `--data`'s
`train.jsonl` so the general sets are not forgotten. `--extra` adds cases that carry their own tools (scripts/tooldata/bfcl.py's
`bfcl.jsonl`), each once.

Writes to `--out`:

- `adapt.jsonl`: the training file (shuffled; repeats get ids `ID~rK`, since ids must be unique);
- `summary.json`: the counts, the seed and the sha256 of every input.

With `--folds N --fold I`, the MCP cases are dealt into N folds per set (seeded) and fold I is
held out: it is left out of `adapt.jsonl` and written to `test.jsonl` (every line with its
catalogue as `tools` and a `source` field), so the stage's recipe is chosen by cross-validation on
the tuning parts. No report part is read; the models/calibration cases stay out of training, to fit
the calibration on conversations the model never saw.

With `--servers`, every tool of a `--mcp` or tuning catalogue that names its server keeps it
(`"_meta": {"server": ...}`), for a model that reads a tool with its server's name
(`decide train --tool-server true`); without it the lines are what they were before the option.

Deterministic: the same inputs, options and seed give byte-identical files.
"""

import argparse
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare import Fail, Inputs, rng_for, write_jsonl, write_summary  # noqa: E402


def mcp_sets(inputs: Inputs, args) -> list[tuple[str, list[dict], list[dict]]]:
    """(source, cases, catalogue) for each MCP set training may use; every expected tool is in
    its catalogue."""
    # (source, cases, their label in the summary, catalogue, its label)
    parts = [(part, os.path.join(args.eval_data, part, "tune.jsonl"), f"eval-data/{part}/tune.jsonl",
              os.path.join(args.eval_data, part, "catalogue.json"), f"eval-data/{part}/catalogue.json")
             for part in ("own", "livemcpbench")]
    parts.append(("no-tool", args.no_tool, "no-tool", args.tools, "tools"))
    for n, (cases_path, catalogue_path) in enumerate(args.mcp):
        parts.append((f"mcp{n}", cases_path, f"mcp{n}", catalogue_path, f"mcp{n}-catalogue"))
    held = held_back_words(inputs, args) if args.mcp else []
    sets = []
    for source, cases_path, cases_label, catalogue_path, catalogue_label in parts:
        catalogue = inputs.catalogue(catalogue_path, catalogue_label, servers=args.servers)
        cases = inputs.cases(cases_path, cases_label)
        if source.startswith("mcp"):
            check_not_near_copies(cases_path, cases, held)
        names = {t["name"] for t in catalogue}
        for c in cases:
            for n in c["expected"]:
                if n not in names:
                    raise Fail(f"{cases_path}:{c['_line']}: expected: unknown tool {n!r}")
        sets.append((source, cases, catalogue))
    return sets


# Word overlap of two last user messages at which a written conversation counts as a copy of a
# held-back one: "thanks, that's all" is written often enough by anyone, a request with the same
# city, file and wording is not.
NEAR_COPY = 0.6


def last_user_words(case: dict) -> frozenset:
    content = next((m.get("content") for m in reversed(case["messages"]) if m.get("role") == "user"), "")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return frozenset(re.findall(r"[a-z0-9]+", (content or "").lower()))


def held_back_words(inputs: Inputs, args) -> list[frozenset]:
    """The last user messages no `--mcp` case may copy: every report part's and `--held-back`'s."""
    paths = sorted(glob.glob(os.path.join(args.eval_data, "*", "report.jsonl")))
    # Report parts of several catalogues (registry/) name each catalogue's part X.report.jsonl.
    paths += sorted(glob.glob(os.path.join(args.eval_data, "*", "*.report.jsonl"))) + args.held_back
    return [last_user_words(c) for n, path in enumerate(paths) for c in inputs.cases(path, f"held-back{n}")]


def check_not_near_copies(cases_path: str, cases: list[dict], held: list[frozenset]) -> None:
    """Fails on a written case whose last user message is a near copy of a held-back one:
    written conversations must not bring what is measured into training."""
    for c in cases:
        words = last_user_words(c)
        overlap = max((len(words & h) / len(words | h) for h in held if words | h), default=0.0)
        if overlap >= NEAR_COPY:
            raise Fail(f"{cases_path}:{c['_line']}: a near copy of a held-back conversation "
                       f"(word overlap {overlap:.2f}); rewrite or drop it")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="scripts/tooldata/prepare.py's --out folder")
    parser.add_argument("--eval-data", required=True, help="crates/decide-eval/data")
    parser.add_argument("--no-tool", required=True, help="conversations that need no tool (JSONL)")
    parser.add_argument("--tools", required=True, help="the catalogue of the --no-tool cases")
    parser.add_argument("--out", required=True)
    parser.add_argument("--replay", type=int, default=1000, help="general training cases mixed in")
    parser.add_argument("--repeat", type=int, default=4, help="times each MCP case is repeated")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--extra", action="append", default=[], metavar="FILE.jsonl",
                        help="more cases, each with its own \"tools\", taken --extra-repeat times (repeat)")
    parser.add_argument("--extra-repeat", type=int, default=1, metavar="N",
                        help="times each --extra case is taken (default 1)")
    parser.add_argument("--mcp", nargs=2, action="append", default=[], metavar=("CASES.jsonl", "CATALOGUE.json"),
                        help="more MCP conversations against a catalogue, repeated like the tuning parts (repeat)")
    parser.add_argument("--held-back", action="append", default=[], metavar="CASES.jsonl",
                        help="conversations never trained on (besides the report parts), which no --mcp case may copy")
    parser.add_argument("--servers", action="store_true",
                        help="keep each catalogue tool's _meta.server, for a model that reads servers")
    parser.add_argument("--folds", type=int, default=0, help="deal the MCP cases into this many folds")
    parser.add_argument("--fold", type=int, default=0, help="the fold held out (0-based)")
    args = parser.parse_args(argv)
    if args.replay < 0 or args.repeat < 1 or args.extra_repeat < 1:
        raise Fail("--replay must be at least 0, and --repeat and --extra-repeat at least 1")
    if args.folds == 1 or args.folds < 0 or (args.folds and not 0 <= args.fold < args.folds):
        raise Fail(f"--fold {args.fold} of --folds {args.folds}: need at least 2 folds and 0 <= fold < folds")

    inputs = Inputs()
    train_path = os.path.join(args.data, "train.jsonl")
    general = [c for c in inputs.cases(train_path, "train.jsonl")
               # The LiveMCPBench tune cases are in the MCP mix already, against the whole catalogue.
               if not str(c["id"]).startswith("livemcpbench-")]
    rng = rng_for(args.seed, "adapt", "replay")
    replay = rng.sample(general, min(args.replay, len(general)))

    lines, test, counts = [], [], {}
    for source, cases, catalogue in mcp_sets(inputs, args):
        held = set()
        if args.folds:
            order = list(range(len(cases)))
            rng_for(args.seed, "adapt", "folds", source).shuffle(order)
            held = {i for k, i in enumerate(order) if k % args.folds == args.fold}
        trained = 0
        for i, c in enumerate(cases):
            obj = {"id": c["id"], "messages": c["messages"], "tools": catalogue, "expected": c["expected"]}
            if i in held:
                test.append({**obj, "source": source})
                continue
            trained += 1
            for k in range(args.repeat):
                lines.append({**obj, "id": f"{c['id']}~r{k}" if k else c["id"]})
        counts[source] = {"cases": len(cases), "trained": trained, "held_out": len(held)}
    for c in replay:
        lines.append({k: v for k, v in c.items() if k != "_line"})
    for n, path in enumerate(args.extra):
        extra = inputs.cases(path, f"extra{n}")
        for c in extra:
            if not isinstance(c.get("tools"), list) or not c["tools"]:
                raise Fail(f"{path}:{c['_line']}: tools: each --extra case needs its own tools")
        # Each copy whole, one after the other; ids stay unique as the repeated MCP cases' do.
        for k in range(args.extra_repeat):
            for c in extra:
                obj = {key: v for key, v in c.items() if key != "_line"}
                lines.append({**obj, "id": f"{c['id']}~r{k}"} if k else obj)
        counts[f"extra{n}"] = {"cases": len(extra), "trained": len(extra), "held_out": 0}
    rng_for(args.seed, "adapt", "shuffle").shuffle(lines)

    os.makedirs(args.out, exist_ok=True)

    outputs = {"adapt.jsonl": write_jsonl(args.out, "adapt.jsonl", lines)}
    if args.folds:
        outputs["test.jsonl"] = write_jsonl(args.out, "test.jsonl", test)
    summary = {"seed": args.seed, "replay": len(replay), "repeat": args.repeat, "folds": args.folds,
               "fold": args.fold if args.folds else None, "mcp": counts, "lines": len(lines),
               "inputs_sha256": inputs.sha256, "outputs_sha256": outputs}
    write_summary(args.out, summary)
    print(f"adapt.jsonl: {len(lines)} lines ({len(replay)} replayed, MCP cases x{args.repeat}: "
          + ", ".join(f"{s} {c['trained']}" for s, c in counts.items())
          + (f"); test.jsonl: {len(test)} cases (fold {args.fold} of {args.folds})" if args.folds else ")")
          + f"; written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"adapt.py: {e}", file=sys.stderr)
        sys.exit(2)
