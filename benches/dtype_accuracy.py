#!/usr/bin/env python3
"""A dtype's decisions against f32's, case by case, on every report part.

For each report part (own, LiveMCPBench, and the held-out registry groups d, e and h), runs
``decide eval --json --cases-out`` once in f32 and once for each ``--dtype`` given (optionally
with ``--kernels``), and prints one markdown table a dtype: the cases whose most probable tool is
the same, top-1 accuracy and recall@10 in f32 and in the dtype (as ``decide eval`` computes
them), the cases whose default selection (the tools passed) is the same, and the largest change
of any tool's probability. The bars of the AMX work: the same top-1 on at least 99% of the
cases, recall@10 within 0.005 and the same selection on at least 98%.

    python3 benches/dtype_accuracy.py --dtype bf16 --dtype int8 [--kernels auto] \\
        [--decide target/release/decide] [--out target/dtype-accuracy]

Needs `cargo build --release -p decide-cli` and `models/fetch`. Writes every run's cases to
``--out`` (one ``PART.DTYPE.jsonl`` each).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "crates" / "decide-eval" / "data"
PARTS = {
    "own": (DATA / "own" / "report.jsonl", DATA / "own" / "catalogue.json"),
    "LiveMCPBench": (DATA / "livemcpbench" / "report.jsonl",
                     DATA / "livemcpbench" / "catalogue.json"),
    **{f"registry {g}": (DATA / "registry" / f"{g}.report.jsonl",
                         DATA / "registry" / f"{g}.catalogue.json") for g in "deh"},
}


def evaluate(args, part: str, dtype: str) -> tuple[dict, list[dict]]:
    cases, catalogue = PARTS[part]
    out = Path(args.out) / f"{part.replace(' ', '-')}.{dtype}.jsonl"
    kernels = ["--kernels", args.kernels] if args.kernels and dtype != "f32" else []
    cmd = [args.decide, "eval", "--json", "--data", str(cases), "--tools", str(catalogue),
           "--dtype", dtype, "--cases-out", str(out), *kernels]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"dtype_accuracy.py: {' '.join(cmd)} failed: {run.stderr.strip()}")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return json.loads(run.stdout), rows


def compare(f32: list[dict], other: list[dict]) -> tuple[int, int, float]:
    """Cases with the same most probable tool, with the same tools passed, and the largest
    change of a tool's probability."""
    if [c["id"] for c in f32] != [c["id"] for c in other]:
        sys.exit("dtype_accuracy.py: the two runs wrote different cases")
    same_top = same_passed = 0
    largest = 0.0
    for a, b in zip(f32, other):
        top = lambda c: c["ranking"][0]["tool"] if c["ranking"] else None  # noqa: E731
        same_top += top(a) == top(b)
        same_passed += sorted(a.get("passed", [])) == sorted(b.get("passed", []))
        pb = {r["tool"]: r["probability"] for r in b["ranking"]}
        for r in a["ranking"]:
            if r["tool"] in pb:
                largest = max(largest, abs(r["probability"] - pb[r["tool"]]))
    return same_top, same_passed, largest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", action="append", required=True, help="a dtype to compare (repeat)")
    ap.add_argument("--kernels", help="--kernels for the compared dtypes (f32 runs auto)")
    ap.add_argument("--decide", default=str(ROOT / "target" / "release" / "decide"))
    ap.add_argument("--out", default=str(ROOT / "target" / "dtype-accuracy"))
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    f32 = {part: evaluate(args, part, "f32") for part in PARTS}
    for dtype in args.dtype:
        print(f"\n{dtype}{' --kernels ' + args.kernels if args.kernels else ''} against f32:\n")
        print("| report part | cases | same top-1 | top-1 f32 → " + dtype + " | recall@10 f32 → "
              + dtype + " | same selection | largest probability change |")
        print("|---|---:|---:|---|---|---:|---:|")
        totals = [0, 0, 0]
        for part in PARTS:
            (m32, c32), (m, c) = f32[part], evaluate(args, part, dtype)
            same_top, same_passed, largest = compare(c32, c)
            n = len(c32)
            totals = [totals[0] + n, totals[1] + same_top, totals[2] + same_passed]
            print(f"| {part} | {n} | {same_top} ({same_top / n:.1%}) "
                  f"| {m32['top1_accuracy']:.3f} → {m['top1_accuracy']:.3f} "
                  f"| {m32['recall_at_10']:.3f} → {m['recall_at_10']:.3f} "
                  f"| {same_passed / n:.1%} | {largest:.3f} |")
        n, top, passed = totals
        print(f"| all | {n} | {top} ({top / n:.1%}) | | | {passed / n:.1%} | |")


if __name__ == "__main__":
    main()
