#!/usr/bin/env python3
"""Training speed of several `decide train` paths on the default model's later stages' recipe, in one run.

Each ``--run LABEL=DECIDE:DTYPE`` is a binary and a ``--dtype`` (f32, or bf16 for the linear
layers on AMX tiles); the runs train one epoch each, interleaved round by round so that they
share the machine's load, with the recipe of the default model's second and third stages
(``--freeze-layers 2 --batch-size 32 --lr 3e-5 --max-length 128 --hard-negatives 5
--no-tool-margin 0.5 --seed 42``) from ``--base``. The data is the conversations written for the
MIT registry's training groups (``--groups``, default a, b, c, f and g of
scripts/tooldata/written/, each case with its group's catalogue), the part of the third stage's
data that is real MCP servers. Prints a markdown table: each run's median pairs per second (as
`decide train` reports it, mining and the frozen layers' cache included), peak memory, wall
time, its ratio to the first run, and its loss over the epoch.

    python3 benches/train_paths.py --run before=target/prof/decide-base:f32 \\
        --run f32=target/release/decide:f32 --run bf16=target/release/decide:bf16 [--rounds 1]

Writes only under target/.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_speed  # noqa: E402  (its summary pattern, commit and CPU name)

ROOT = Path(__file__).resolve().parent.parent
WRITTEN = ROOT / "scripts" / "tooldata" / "written"
RECIPE = ["--freeze-layers", "2", "--batch-size", "32", "--lr", "3e-5", "--max-length", "128",
          "--hard-negatives", "5", "--no-tool-margin", "0.5", "--epochs", "1", "--seed", "42"]
# decide train's epoch line: "epoch 1/1: loss 1.0743, calibration a 15.977 b -11.501 (kept)"
EPOCH = re.compile(r"epoch \d+/\d+: loss ([\d.]+),")


def fail(message: str) -> None:
    print(f"train_paths.py: {message}", file=sys.stderr)
    sys.exit(2)


def write_data(groups: list[str], dest: Path) -> int:
    """The groups' written conversations, each case with its group's tools; returns the count."""
    count = 0
    with dest.open("w", encoding="utf-8") as out:
        for g in groups:
            cases, catalogue = WRITTEN / f"registry-{g}.jsonl", WRITTEN / f"registry-{g}.catalogue.json"
            if not cases.is_file() or not catalogue.is_file():
                fail(f"--groups {g}: {cases} or {catalogue} is missing")
            tools = json.loads(catalogue.read_text(encoding="utf-8"))["tools"]
            for n, line in enumerate(cases.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    case = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{cases}:{n}: {e}")
                case["tools"] = tools
                out.write(json.dumps(case) + "\n")
                count += 1
    return count


def parse_run(spec: str) -> tuple[str, str, str]:
    label, sep, rest = spec.partition("=")
    binary, sep2, dtype = rest.rpartition(":")
    if not (sep and sep2 and label and binary and dtype):
        fail(f"--run {spec}: expected LABEL=DECIDE:DTYPE")
    if not Path(binary).is_file():
        fail(f"--run {spec}: {binary} is missing")
    return label, binary, dtype


def train(binary: str, dtype: str, base: str, data: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [binary, "--model", base, "--dtype", dtype, "train", "--data", str(data), "--out", str(out),
           *RECIPE]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    shutil.rmtree(out, ignore_errors=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"{' '.join(cmd)}: exit {done.returncode}: {last}")
    found = [m for m in map(train_speed.SUMMARY.search, text.splitlines()) if m]
    losses = [float(m.group(1)) for m in map(EPOCH.search, text.splitlines()) if m]
    if not found:
        fail(f"{' '.join(cmd)}: no summary line in its output")
    m = found[-1]
    return {"pairs": int(m.group(1)), "pairs_per_s": float(m.group(3)),
            "peak_gb": float(m.group(4)) if m.group(4) else None, "wall_s": wall,
            "loss": losses[-1] if losses else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=DECIDE:DTYPE, repeatable")
    ap.add_argument("--groups", default="a,b,c,f,g", help="registry groups of scripts/tooldata/written")
    ap.add_argument("--base", default="decide-tools-minilm")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "target" / "train-paths.json")
    a = ap.parse_args()
    runs = [parse_run(s) for s in a.run]
    if a.rounds < 1:
        fail("--rounds must be at least 1")
    (ROOT / "target").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="train-paths-", dir=ROOT / "target"))
    results = []
    try:
        data = scratch / "train.jsonl"
        cases = write_data([g.strip() for g in a.groups.split(",") if g.strip()], data)
        for r in range(a.rounds):
            order = runs if r % 2 == 0 else runs[::-1]
            for label, binary, dtype in order:
                print(f"round {r + 1}/{a.rounds}: {label}", file=sys.stderr, flush=True)
                res = train(binary, dtype, a.base, data, scratch / "model")
                print(f"  {res['pairs_per_s']} pairs/s, loss {res['loss']}", file=sys.stderr, flush=True)
                results.append({"round": r + 1, "label": label, "dtype": dtype, **res})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(label: str, key: str):
        values = [x[key] for x in results if x["label"] == label and x[key] is not None]
        return statistics.median(values) if values else None

    result = {"commit": train_speed.git_commit(), "cpu": train_speed.cpu_name(),
              "date": time.strftime("%Y-%m-%d"), "cases": cases, "runs": results}
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    first = median(runs[0][0], "pairs_per_s")
    print(f"`decide train`, one epoch of the later stages' recipe on {cases} cases (registry groups "
          f"{a.groups}), {result['date']}, commit {result['commit']}, {result['cpu']}, "
          f"{a.rounds} round(s), medians:\n")
    print(f"| run | --dtype | pairs | pairs/s | against {runs[0][0]} | peak memory | wall | epoch loss |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, _, dtype in runs:
        rate, peak, loss = median(label, "pairs_per_s"), median(label, "peak_gb"), median(label, "loss")
        print(f"| {label} | {dtype} | {median(label, 'pairs'):.0f} | {rate:.2f} | {rate / first:.2f}× | "
              f"{'-' if peak is None else f'{peak:.2f} GB'} | {median(label, 'wall_s') / 60:.1f} min | "
              f"{'-' if loss is None else f'{loss:.4f}'} |")
    print(f"raw results: {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
