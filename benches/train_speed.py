#!/usr/bin/env python3
"""Training speed of `decide train`, its paths side by side in one run: pairs per second and peak memory.

Takes the first ``--cases`` cases of a training file (scripts/tooldata/prepare.py's train.jsonl,
each line with its own catalogue) and trains one epoch on them with the default model's recipe
(``--freeze-layers 3 --batch-size 32 --lr 5e-5 --max-length 128 --hard-negatives 5``), then the same
recipe with every layer trained (``--freeze-layers 0``) on the first ``--full-cases`` of them, since
that path is several times slower; ``--rounds`` repeats both, alternating, so that both see the same
load on a shared machine. For each run it records what `decide train` reports on its last line (the
pairs trained, the minutes spent training, hard-negative mining and the frozen layers' cache
included, and the process's peak resident memory, Linux's VmHWM) and the process's wall time,
and prints a markdown table: the medians over rounds, the ratio of the two paths, and what one
epoch of ``--epoch-pairs`` pairs would take at the measured rate.

    python3 benches/train_speed.py --data target/tool-model/data/train.jsonl \\
        [--cases 2000] [--full-cases 150] [--rounds 1] [--epoch-pairs 35000] \\
        [--decide target/release/decide] [--out target/train-speed.json] [--keep DIR]

Needs `cargo build --release -p decide-cli` and `models/fetch`. Writes only under target/.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ["--batch-size", "32", "--lr", "5e-5", "--max-length", "128", "--hard-negatives", "5",
          "--epochs", "1", "--seed", "42"]
# decide train's last line: "trained 612 pairs in 3.0 min (3.4 pairs/s), peak memory 2.81 GB"
SUMMARY = re.compile(r"trained (\d+) pairs in ([\d.]+) min \(([\d.]+) pairs/s\)(?:, peak memory ([\d.]+) GB)?")


def fail(message: str) -> None:
    print(f"train_speed.py: {message}", file=sys.stderr)
    sys.exit(2)


def head(src: Path, n: int, dest: Path) -> int:
    """Copies the first n lines of src to dest; returns how many there were."""
    count = 0
    with src.open(encoding="utf-8") as f, dest.open("w", encoding="utf-8") as out:
        for line in f:
            if count == n:
                break
            out.write(line)
            count += 1
    return count


def train(args, data: Path, frozen: int, scratch: Path) -> dict:
    out = scratch / f"model-{frozen}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.decide, "--model", args.base, "train", "--data", str(data), "--out", str(out),
           "--freeze-layers", str(frozen), *RECIPE]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if args.keep and frozen == 3:
        shutil.rmtree(args.keep, ignore_errors=True)
        shutil.move(str(out), args.keep)
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"{' '.join(cmd)}: exit {done.returncode}: {last}")
    # The summary is on standard output, the progress on standard error.
    found = [m for m in map(SUMMARY.search, (done.stdout + done.stderr).splitlines()) if m]
    if not found:
        fail(f"{' '.join(cmd)}: no summary line in its output")
    m = found[-1]
    return {
        "frozen_layers": frozen,
        "pairs": int(m.group(1)),
        "train_min": float(m.group(2)),
        "pairs_per_s": float(m.group(3)),
        "peak_gb": float(m.group(4)) if m.group(4) else None,
        "wall_s": wall,
    }


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="training cases, each line with its own tools")
    ap.add_argument("--cases", type=int, default=2000, help="cases for the frozen path (default 2000)")
    ap.add_argument("--full-cases", type=int, default=150, help="cases for every layer trained (default 150)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--epoch-pairs", type=int, default=35000)
    ap.add_argument("--base", default="all-MiniLM-L6-v2")
    ap.add_argument("--decide", default=str(ROOT / "target" / "release" / "decide"))
    ap.add_argument("--out", type=Path, default=ROOT / "target" / "train-speed.json")
    ap.add_argument("--keep", type=Path, help="keep the frozen path's model folder here (its last round's)")
    a = ap.parse_args()
    if not a.data.is_file():
        fail(f"{a.data}: not a file (run scripts/tooldata/prepare.py first)")
    if a.cases < 1 or a.full_cases < 1 or a.rounds < 1:
        fail("--cases, --full-cases and --rounds must be at least 1")
    if not Path(a.decide).is_file():
        fail(f"{a.decide}: missing; run cargo build --release -p decide-cli")

    (ROOT / "target").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="train-speed-", dir=ROOT / "target"))
    try:
        frozen_data, full_data = scratch / "frozen.jsonl", scratch / "full.jsonl"
        n_frozen = head(a.data, a.cases, frozen_data)
        n_full = head(a.data, min(a.full_cases, a.cases), full_data)
        runs = []
        for r in range(a.rounds):
            order = [(3, frozen_data), (0, full_data)]
            if r % 2:
                order.reverse()
            for frozen, data in order:
                print(f"round {r + 1}/{a.rounds}: --freeze-layers {frozen}", file=sys.stderr, flush=True)
                runs.append({"round": r + 1, **train(a, data, frozen, scratch)})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(frozen: int, key: str):
        values = [x[key] for x in runs if x["frozen_layers"] == frozen and x[key] is not None]
        return statistics.median(values) if values else None

    result = {"commit": git_commit(), "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
              "cases": {"frozen": n_frozen, "full": n_full}, "runs": runs}
    a.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"`decide train`, one epoch, {result['date']}, commit {result['commit']}, {result['cpu']}, "
          f"{a.rounds} round(s), medians:\n")
    print("| path | cases | pairs | pairs/s | peak memory | wall | one epoch of "
          f"{a.epoch_pairs:,} pairs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for frozen, n, label in [(3, n_frozen, "lowest 3 layers frozen and cached (the recipe)"),
                             (0, n_full, "every layer trained")]:
        rate, peak = median(frozen, "pairs_per_s"), median(frozen, "peak_gb")
        epoch_min = a.epoch_pairs / rate / 60 if rate else None
        print(f"| {label} | {n} | {median(frozen, 'pairs'):.0f} | {rate:.2f} | "
              f"{'-' if peak is None else f'{peak:.2f} GB'} | {median(frozen, 'wall_s') / 60:.1f} min | "
              f"{'-' if epoch_min is None else f'{epoch_min:.0f} min'} |")
    fast, slow = median(3, "pairs_per_s"), median(0, "pairs_per_s")
    if fast and slow:
        print(f"\nfrozen / full: {fast / slow:.2f}x the pairs per second")
    print(f"raw results: {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
