#!/usr/bin/env python3
"""Side-by-side throughput of decide (candle) and sentence-transformers (torch) in one run.

Runs the criterion benchmark `benches/scoring.rs` (forward passes of the default model) and
then `benches/peer_sentence_transformers.py` on the same grid (batch 1, 8, 32, 128 x 64, 128,
256 tokens), one after the other on an otherwise idle machine, and prints a markdown table of
sequences per second (medians) with the ratio decide / peer for each.

    HF_HUB_OFFLINE=1 .venv/bin/python benches/compare.py [--skip-rust] [--skip-peer]

Needs `models/fetch` and the Python environment of
crates/decide-engine/fixtures/requirements.txt.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRITERION = ROOT / "target" / "criterion"
PEER_OUT = ROOT / "target" / "peer_sentence_transformers.jsonl"


def rust_median_s(tokens: int, batch: int) -> float | None:
    est = CRITERION / f"forward_{tokens}-tokens" / str(batch) / "new" / "estimates.json"
    if not est.is_file():
        return None
    return json.loads(est.read_text())["median"]["point_estimate"] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-rust", action="store_true", help="reuse target/criterion results")
    ap.add_argument("--skip-peer", action="store_true", help=f"reuse {PEER_OUT.relative_to(ROOT)}")
    ap.add_argument("--budget-s", default="120", help="time budget of the peer run")
    args = ap.parse_args()
    if not args.skip_rust:
        subprocess.run(
            ["cargo", "bench", "-p", "decide-engine", "--bench", "scoring", "--", "forward"],
            cwd=ROOT, check=True)
    if not args.skip_peer:
        with PEER_OUT.open("w") as out:
            subprocess.run(
                [sys.executable, str(ROOT / "benches" / "peer_sentence_transformers.py"),
                 str(ROOT / "models" / "all-MiniLM-L6-v2"), "--threads", "2",
                 "--budget-s", args.budget_s],
                cwd=ROOT, check=True, stdout=out)
    peer = {}
    for line in PEER_OUT.read_text().splitlines():
        r = json.loads(line)
        peer[(r["dtype"], r["batch"], r["tokens"])] = r["median_s"]
    print("| batch | tokens | decide seq/s | torch f32 seq/s | ratio | torch bf16 seq/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for tokens in (64, 128, 256):
        for batch in (1, 8, 32, 128):
            ours = rust_median_s(tokens, batch)
            f32 = peer.get(("float32", batch, tokens))
            bf16 = peer.get(("bfloat16", batch, tokens))
            if ours is None or f32 is None:
                continue
            row = [batch, tokens, f"{batch / ours:.1f}", f"{batch / f32:.1f}", f"{f32 / ours:.2f}x"]
            row += [f"{batch / bf16:.1f}", f"{bf16 / ours:.2f}x"] if bf16 else ["-", "-"]
            print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
    main()
