#!/usr/bin/env python3
"""The held-out servers' report part: tool selection on real MCP servers' catalogues that no training,
calibration or choice of recipe reads (crates/decide-eval/data/registry/), models side by side.

    python3 scripts/tooldata/registry_report.py [--decide target/release/decide] [--data DIR]
                                                [--part CASES.jsonl CATALOGUE.json ...]
                                                [--irrelevance FILE.jsonl] [--json OUT.json] MODEL [MODEL ...]

MODEL is anything `decide --model` takes (`bm25`, `all-MiniLM-L6-v2`, `decide-tools-minilm`, a folder); a
`MODEL@OPTIONS` form passes extra `decide eval` options, e.g. `decide-tools-minilm@--target-recall=0.9`.
For each model, every `X.report.jsonl` of the folder is run against its `X.catalogue.json` with
`decide eval --cases-out`, and the cases are pooled. `--part` (repeatable) names the parts instead, each a cases
file with its catalogue: the fold a recipe is chosen on, or its reworded copy
(`--part scripts/tooldata/written/registry-m.reworded.jsonl scripts/tooldata/written/registry-m.catalogue.json`).

* ranking, over the cases needing a tool: top-1 (cases needing exactly one), recall@5, recall@10, MRR;
* what the default rule passes on (as `decide select` would): the share of needed tools passed and tools
  passed a case; by kind: follow-ups needing a new tool (share of their needed tools passed), turns needing
  none (no-tool follow-ups and topical requests: share with nothing passed but the tools already called),
  requests needing a tool the catalogue lacks (`absent-tool`: share with nothing passed but those called).

`--irrelevance` adds a row of the same kind from a larger public set: the share of cases left empty of a file of
requests that no tool of theirs answers, each with its own tools (`irrelevance-heldout.jsonl`, the half of BFCL's
irrelevance categories that scripts/tooldata/bfcl.py holds out).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

NO_TOOL_KINDS = ("no-tool-follow-up", "topical-no-tool")


def fail(message):
    print(f"registry_report.py: {message}", file=sys.stderr)
    sys.exit(2)


def called(messages):
    names = set()
    for m in messages:
        for call in m.get("tool_calls") or []:
            names.add(call["function"]["name"])
    return names


def run(decide, model, options, *eval_args):
    """`decide --model MODEL eval EVAL_ARGS --json OPTIONS`'s report; a failure ends the script with its last line."""
    command = [decide, "--model", model, "eval", *eval_args, "--json"] + options
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout)


def model_and_options(spec):
    """MODEL@--opt=v,--flag as ("MODEL", ["--opt", "v", "--flag"])."""
    model, _, extra = spec.partition("@")
    return model, [w for o in extra.split(",") if o for w in o.replace("=", " ", 1).split(" ", 1)]


def measure(decide, spec, parts):
    model, options = model_and_options(spec)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, report, catalogue in parts:
            out = os.path.join(tmp, f"{name}.jsonl")
            run(decide, model, options, "--data", report, "--tools", catalogue, "--cases-out", out)
            cases = {}
            with open(report) as f:
                for line in f:
                    if line.strip():
                        c = json.loads(line)
                        cases[c["id"]] = c
            with open(out) as f:
                for line in f:
                    r = json.loads(line)
                    c = cases[r["id"]]
                    rows.append((name, c.get("kind", ""), called(c["messages"]), r))
    return pool(rows)


def mean(values):
    return sum(values) / len(values) if values else None


def pool(rows):
    top1, r5, r10, mrr, needed, passed_needed, per_case = [], [], [], [], 0, 0, []
    follow, no_tool, absent = [], [], []
    for _, kind, history, r in rows:
        expected = set(r["expected"])
        ranked = [t["tool"] for t in r["ranking"]]
        passed = set(r["passed"])
        asked = passed - history
        per_case.append(len(passed))
        if expected:
            if len(expected) == 1:
                top1.append(ranked[0] in expected)
            r5.append(len(expected & set(ranked[:5])) / len(expected))
            r10.append(len(expected & set(ranked[:10])) / len(expected))
            mrr.append(1 / (1 + min(ranked.index(t) for t in expected)))
            needed += len(expected)
            passed_needed += len(expected & passed)
            if kind == "follow-up":
                follow.append(len(expected & passed) / len(expected))
        elif kind in NO_TOOL_KINDS:
            no_tool.append(not asked)
        elif kind == "absent-tool":
            absent.append(not asked)
    return {
        "cases": len(rows),
        "top1": mean(top1), "recall_at_5": mean(r5), "recall_at_10": mean(r10), "mrr": mean(mrr),
        "needed_passed": passed_needed / needed if needed else None,
        "tools_per_case": mean(per_case),
        "tools_per_tool_case": mean([n for (_, _, _, r), n in zip(rows, per_case) if r["expected"]]),
        "follow_up_needed_passed": mean(follow), "follow_up_cases": len(follow),
        "no_tool_clean": mean(no_tool), "no_tool_cases": len(no_tool),
        "absent_clean": mean(absent), "absent_cases": len(absent),
    }


ROWS = [
    ("top-1", "top1"), ("recall@5", "recall_at_5"), ("recall@10", "recall_at_10"), ("MRR", "mrr"),
    ("by default: needed tools passed", "needed_passed"), ("tools passed a case (all cases)", "tools_per_case"),
    ("tools passed a case (cases needing a tool)", "tools_per_tool_case"),
    ("follow-ups needing a new tool: needed passed", "follow_up_needed_passed"),
    ("turns needing no tool: nothing asked passed", "no_tool_clean"),
    ("requests needing an absent tool: nothing passed", "absent_clean"),
    ("--irrelevance: nothing passed", "irrelevance_clean"),
]


def irrelevance(decide, spec, path):
    """The share of `path`'s cases (none needs a tool) that the model's default rule leaves empty."""
    model, options = model_and_options(spec)
    return run(decide, model, options, "--data", path)["no_tool_none_selected"]


def named_parts(pairs):
    """[(name, cases, catalogue)] of the `--part` pairs, each named after its cases file."""
    parts = []
    for cases, catalogue in pairs:
        for path in (cases, catalogue):
            if not os.path.exists(path):
                fail(f"--part: {path}: no such file")
        name = os.path.basename(cases).removesuffix(".jsonl")
        if any(name == p[0] for p in parts):
            fail(f"--part: {cases}: a second part named {name}")
        parts.append((name, cases, catalogue))
    return parts


def folder_parts(folder):
    """[(name, cases, catalogue)] of every `X.report.jsonl` of `folder` with its `X.catalogue.json`."""
    parts = []
    for report in sorted(glob.glob(os.path.join(folder, "*.report.jsonl"))):
        name = os.path.basename(report)[: -len(".report.jsonl")]
        catalogue = os.path.join(folder, f"{name}.catalogue.json")
        if not os.path.exists(catalogue):
            fail(f"{report}: no {catalogue} beside it")
        parts.append((name, report, catalogue))
    if not parts:
        fail(f"{folder}: no *.report.jsonl")
    return parts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decide", default="target/release/decide")
    parser.add_argument("--data", default="crates/decide-eval/data/registry")
    parser.add_argument("--part", nargs=2, action="append", default=[], metavar=("CASES.jsonl", "CATALOGUE.json"))
    parser.add_argument("--irrelevance", metavar="FILE.jsonl")
    parser.add_argument("--json")
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    parts = named_parts(args.part) if args.part else folder_parts(args.data)
    results = {m: measure(args.decide, m, parts) for m in args.models}
    for m in args.models:
        results[m]["irrelevance_clean"] = irrelevance(args.decide, m, args.irrelevance) if args.irrelevance else None
    first = next(iter(results.values()))
    print(f"{first['cases']} cases of {len(parts)} catalogues ({', '.join(p[0] for p in parts)}); "
          f"{first['follow_up_cases']} follow-ups needing a tool, {first['no_tool_cases']} turns needing none, "
          f"{first['absent_cases']} needing an absent tool\n")
    print("| measure | " + " | ".join(args.models) + " |")
    print("|---|" + "---:|" * len(args.models))
    for label, key in ROWS:
        if key == "irrelevance_clean" and not args.irrelevance:
            continue
        cells = ["" if results[m][key] is None else f"{results[m][key]:.3f}" for m in args.models]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
