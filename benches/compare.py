#!/usr/bin/env python3
"""Side-by-side throughput of decide (candle) and sentence-transformers (torch), interleaved.

Runs, for each of ``--rounds`` rounds, ``decide bench --json`` with the fused CPU kernels,
``decide bench --json --kernels stock`` (candle's own ops; skip with ``--no-stock``) and
``benches/peer_sentence_transformers.py`` (torch float32 and bfloat16) on the same grid of batch
sizes × sequence lengths, in a rotating order, so that all of them see the same load on a
shared machine. Prints a markdown table of sequences per second (the median over rounds of each
round's median) with the spread over rounds, and the ratios decide / peer; then decide's
decision latency (10 messages, 100 and 1000 cached tools).

``--int8`` adds ``decide bench --dtype int8`` to the rounds and ``--onnx`` adds
``benches/peer_onnxruntime.py`` (ONNX Runtime float32 and dynamic int8, run by
``--onnx-python``), and a second table puts decide int8 beside decide f32 and ONNX Runtime;
``--no-torch`` leaves sentence-transformers out (e.g. where torch is not installed).

``--amx`` (on a CPU with AMX) adds ``decide bench --dtype bf16`` and ``--dtype int8`` twice, on
the tiles (``--kernels auto``) and on VNNI (``--kernels avx512``), and a third table puts them
beside decide f32 and torch's f32 and bf16.

    HF_HUB_OFFLINE=1 .venv/bin/python benches/compare.py [--rounds 3] [--batches 1,8,32] \\
        [--tokens 64,128,256] [--catalogue TOOLS.json] [--decide target/release/decide] \\
        [--out target/compare.json]

Needs `cargo build --release -p decide-cli`, `models/fetch` and the Python environment of
crates/decide-engine/fixtures/requirements.txt. All raw results go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_decide(args, kernels: str, decisions: bool, dtype: str = "f32") -> dict:
    cmd = [args.decide, "bench", "--json", "--no-progress", "--kernels", kernels, "--dtype", dtype,
           "--batch-sizes", args.batches, "--seq-lens", args.tokens,
           "--reps", str(args.reps), "--min-time-s", str(args.min_time_s),
           *(["--decision-tools", "100,1000"] if decisions else ["--no-decisions"]),
           *(["--catalogue", args.catalogue] if args.catalogue else [])]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def run_peer(args) -> list[dict]:
    cmd = [sys.executable, str(ROOT / "benches" / "peer_sentence_transformers.py"),
           str(ROOT / "models" / "all-MiniLM-L6-v2"), "--threads", str(args.threads),
           "--batches", args.batches, "--tokens", args.tokens, "--budget-s", str(args.peer_budget_s),
           "--min-reps", str(args.reps),
           *(["--catalogue", args.catalogue] if args.catalogue else [])]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def run_onnx(args) -> list[dict]:
    cmd = [args.onnx_python, str(ROOT / "benches" / "peer_onnxruntime.py"),
           str(ROOT / "models" / "all-MiniLM-L6-v2"), "--threads", str(args.threads),
           "--batches", args.batches, "--tokens", args.tokens,
           "--budget-s", str(args.peer_budget_s / 2), "--min-reps", str(args.reps),
           "--work-dir", str(ROOT / "target" / "onnx"),
           *(["--catalogue", args.catalogue] if args.catalogue else [])]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f" ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--tokens", default="64,128,256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="timed calls per cell, at least")
    ap.add_argument("--min-time-s", type=float, default=0.5, help="decide: seconds per cell")
    ap.add_argument("--peer-budget-s", type=float, default=40.0, help="peer: seconds per round")
    ap.add_argument("--no-stock", action="store_true", help="skip candle's stock ops")
    ap.add_argument("--no-torch", action="store_true", help="skip sentence-transformers")
    ap.add_argument("--int8", action="store_true", help="also decide bench --dtype int8")
    ap.add_argument("--amx", action="store_true",
                    help="also decide bf16 and int8 on AMX tiles and int8 on VNNI")
    ap.add_argument("--onnx", action="store_true", help="also ONNX Runtime f32 and int8")
    ap.add_argument("--onnx-python", default=sys.executable,
                    help="the Python with onnx, onnxruntime, numpy and tokenizers")
    ap.add_argument("--catalogue", help="also time scoring this tool catalogue from scratch "
                    "(mixed lengths), e.g. crates/decide-eval/data/livemcpbench/catalogue.json")
    ap.add_argument("--decide", default=str(ROOT / "target" / "release" / "decide"))
    ap.add_argument("--out", default=str(ROOT / "target" / "compare.json"))
    ap.add_argument("--from-json", help="print the tables of an earlier run's --out file "
                    "(with the same --batches, --tokens and --catalogue) instead of measuring")
    args = ap.parse_args()

    runs = {"fused": [], "stock": [], "peer": [], "int8": [], "onnx": [], "bf16": [],
            "int8-vnni": []}
    kinds = (["fused"] + (["int8"] if args.int8 or args.amx else [])
             + (["bf16", "int8-vnni"] if args.amx else []) + ([] if args.no_torch else ["peer"])
             + (["onnx"] if args.onnx else []) + ([] if args.no_stock else ["stock"]))
    started = time.time()
    if args.from_json:
        runs = json.loads(Path(args.from_json).read_text())
        args.rounds = 0
    for r in range(args.rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        for kind in order:
            t0 = time.time()
            load = os.getloadavg()[0]
            if kind == "peer":
                runs["peer"].append(run_peer(args))
            elif kind == "onnx":
                runs["onnx"].append(run_onnx(args))
            elif kind == "int8":
                runs["int8"].append(run_decide(args, "auto", decisions=True, dtype="int8"))
            elif kind == "int8-vnni":
                runs[kind].append(run_decide(args, "avx512", decisions=True, dtype="int8"))
            elif kind == "bf16":
                runs["bf16"].append(run_decide(args, "auto", decisions=True, dtype="bf16"))
            else:
                runs[kind].append(run_decide(args, "auto" if kind == "fused" else "stock",
                                             decisions=kind == "fused"))
            log(f"round {r + 1}/{args.rounds} {kind:>5}: {time.time() - t0:6.1f} s "
                f"(load average before {load:.2f}, after {os.getloadavg()[0]:.2f})")
    if not args.from_json:
        Path(args.out).write_text(json.dumps(runs))

    def ours(kind: str, batch: int, tokens: int) -> list[float]:
        return [c["pairs_per_s"] for run in runs[kind] for c in run["cells"]
                if (c["batch"], c["tokens"]) == (batch, tokens)]

    def peer(dtype: str, batch: int, tokens: int, kind: str = "peer") -> list[float]:
        return [row["seqs_per_s"] for run in runs.get(kind, []) for row in run
                if (row["dtype"], row.get("batch"), row.get("tokens")) == (dtype, batch, tokens)]

    first = runs["fused"][0]
    print(f"decide: {first['model']}, kernels {first['kernels']}, {first['threads']} threads, "
          f"matmul peak {statistics.median(r['matmul_peak_gflops'] for r in runs['fused']):.0f} "
          f"GFLOP/s; {args.rounds} interleaved rounds, {time.time() - started:.0f} s; "
          "seq/s = median over rounds (min–max of the rounds)")
    print()
    print("| batch | tokens | decide fused | candle stock | torch f32 | torch bf16 "
          "| fused / stock | fused / torch f32 | fused / torch bf16 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tokens in map(int, args.tokens.split(",")):
        for batch in map(int, args.batches.split(",")):
            f = ours("fused", batch, tokens)
            s = ours("stock", batch, tokens)
            t32 = peer("float32", batch, tokens)
            t16 = peer("bfloat16", batch, tokens)
            med = lambda v: statistics.median(v) if v else None  # noqa: E731
            cells = [f"{med(v):.1f}{spread(v)}" if v else "-" for v in (f, s, t32, t16)]
            ratios = [f"{med(f) / med(v):.2f}x" if v and f else "-" for v in (s, t32, t16)]
            print(f"| {batch} | {tokens} | " + " | ".join(cells + ratios) + " |")
    if args.catalogue:
        def texts_per_s(kind: str) -> list[float]:
            return [run["catalogue"]["texts_per_s"] for run in runs[kind] if run.get("catalogue")]

        def peer_texts(dtype: str) -> list[float]:
            return [row["texts_per_s"] for run in runs["peer"] for row in run
                    if row.get("catalogue") and row["dtype"] == dtype]

        f, s_, t32, t16 = (texts_per_s("fused"), texts_per_s("stock"), peer_texts("float32"),
                           peer_texts("bfloat16"))
        n = runs["fused"][0]["catalogue"]["texts"]
        print()
        print(f"Catalogue {args.catalogue} ({n} tools, mixed lengths, from scratch), tools/s:")
        print()
        print("| decide fused | candle stock | torch f32 | torch bf16 "
              "| fused / stock | fused / torch f32 | fused / torch bf16 |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        med = lambda v: statistics.median(v) if v else None  # noqa: E731
        cells = [f"{med(v):.1f}{spread(v)}" if v else "-" for v in (f, s_, t32, t16)]
        ratios = [f"{med(f) / med(v):.2f}x" if v and f else "-" for v in (s_, t32, t16)]
        print("| " + " | ".join(cells + ratios) + " |")
    print()
    print("| decision | tools | median ms | p95 ms |")
    print("|---|---:|---:|---:|")
    for tools in (100, 1000):
        meds = [d["median_ms"] for run in runs["fused"] for d in run["decisions"]
                if d["tools"] == tools]
        p95s = [d["p95_ms"] for run in runs["fused"] for d in run["decisions"]
                if d["tools"] == tools]
        if meds:
            print(f"| 10 messages | {tools} | {statistics.median(meds):.1f}{spread(meds)} "
                  f"| {statistics.median(p95s):.1f} |")

    if runs.get("int8") and not runs.get("bf16"):
        int8_tables(args, runs, ours, peer)
    if runs.get("bf16"):
        amx_tables(args, runs, ours, peer)


def amx_tables(args, runs: dict, ours, peer) -> None:
    """decide f32, int8 on VNNI and on AMX tiles, and bf16 on AMX beside torch f32 and bf16."""
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    kinds = ["fused", "int8-vnni", "int8", "bf16"]
    names = ["decide f32", "int8 VNNI", "int8 AMX", "bf16 AMX"]
    print()
    print("AMX: " + ", ".join(f"{n} = {runs[k][0]['kernels']}" for k, n in zip(kinds, names))
          + "; seq/s = median over rounds (min–max)")
    print()
    print("| batch | tokens | " + " | ".join(names) + " | torch f32 | torch bf16 "
          "| bf16 / torch bf16 | int8 AMX / torch bf16 | bf16 / f32 | int8 AMX / int8 VNNI |")
    print("|---:|---:|" + "---:|" * 10)

    def row(values: list[list[float]]) -> str:
        f, v8, a8, b16, _, t16 = values
        cells = [f"{med(v):.1f}{spread(v)}" if v else "-" for v in values]
        pairs = [(b16, t16), (a8, t16), (b16, f), (a8, v8)]
        ratios = [f"{med(a) / med(b):.2f}x" if a and b else "-" for a, b in pairs]
        return " | ".join(cells + ratios) + " |"

    for tokens in map(int, args.tokens.split(",")):
        for batch in map(int, args.batches.split(",")):
            values = [ours(k, batch, tokens) for k in kinds]
            values += [peer("float32", batch, tokens), peer("bfloat16", batch, tokens)]
            print(f"| {batch} | {tokens} | " + row(values))
    if args.catalogue:
        def texts_per_s(kind: str) -> list[float]:
            return [run["catalogue"]["texts_per_s"] for run in runs[kind] if run.get("catalogue")]

        def peer_texts(dtype: str) -> list[float]:
            return [r["texts_per_s"] for run in runs["peer"] for r in run
                    if r.get("catalogue") and r["dtype"] == dtype]

        values = [texts_per_s(k) for k in kinds] + [peer_texts("float32"), peer_texts("bfloat16")]
        print(f"| {Path(args.catalogue).parent.name} (tools/s) | | " + row(values))
    print()
    print("| decision, 10 messages | " + " | ".join(f"{n} p50 (p95)" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for tools in (100, 1000):
        cells = []
        for kind in kinds:
            meds = [d["median_ms"] for run in runs[kind] for d in run["decisions"]
                    if d["tools"] == tools]
            p95s = [d["p95_ms"] for run in runs[kind] for d in run["decisions"]
                    if d["tools"] == tools]
            cells.append(f"{med(meds):.1f} ms{spread(meds)} ({med(p95s):.1f})" if meds else "-")
        print(f"| {tools} tools | " + " | ".join(cells) + " |")


def int8_tables(args, runs: dict, ours, peer) -> None:
    """decide int8 beside decide f32 and ONNX Runtime f32 / dynamic int8."""
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    first = runs["int8"][0]
    print()
    print(f"int8: kernels {first['kernels']}, seq/s = median over rounds (min–max)")
    print()
    print("| batch | tokens | decide f32 | decide int8 | ORT f32 | ORT int8 "
          "| int8 / f32 | int8 / ORT int8 | int8 / ORT f32 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tokens in map(int, args.tokens.split(",")):
        for batch in map(int, args.batches.split(",")):
            f, q = ours("fused", batch, tokens), ours("int8", batch, tokens)
            o32 = peer("float32", batch, tokens, "onnx")
            o8 = peer("int8", batch, tokens, "onnx")
            cells = [f"{med(v):.1f}{spread(v)}" if v else "-" for v in (f, q, o32, o8)]
            ratios = [f"{med(q) / med(v):.2f}x" if v and q else "-" for v in (f, o8, o32)]
            print(f"| {batch} | {tokens} | " + " | ".join(cells + ratios) + " |")
    if args.catalogue:
        def texts_per_s(kind: str) -> list[float]:
            return [run["catalogue"]["texts_per_s"] for run in runs[kind] if run.get("catalogue")]

        def onnx_texts(dtype: str) -> list[float]:
            return [row["texts_per_s"] for run in runs["onnx"] for row in run
                    if row.get("catalogue") and row["dtype"] == dtype]

        f, q, o32, o8 = (texts_per_s("fused"), texts_per_s("int8"), onnx_texts("float32"),
                         onnx_texts("int8"))
        print()
        print("| catalogue, tools/s | decide f32 | decide int8 | ORT f32 | ORT int8 "
              "| int8 / f32 | int8 / ORT int8 | int8 / ORT f32 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        cells = [f"{med(v):.1f}{spread(v)}" if v else "-" for v in (f, q, o32, o8)]
        ratios = [f"{med(q) / med(v):.2f}x" if v and q else "-" for v in (f, o8, o32)]
        print(f"| {Path(args.catalogue).parent.name} | " + " | ".join(cells + ratios) + " |")
    print()
    print("| decision | tools | f32 median ms | int8 median ms | f32 p95 | int8 p95 | f32 / int8 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tools in (100, 1000):
        def stat(kind: str, key: str) -> list[float]:
            return [d[key] for run in runs[kind] for d in run["decisions"] if d["tools"] == tools]
        fm, qm = stat("fused", "median_ms"), stat("int8", "median_ms")
        if fm and qm:
            print(f"| 10 messages | {tools} | {med(fm):.1f}{spread(fm)} | {med(qm):.1f}{spread(qm)} "
                  f"| {med(stat('fused', 'p95_ms')):.1f} | {med(stat('int8', 'p95_ms')):.1f} "
                  f"| {med(fm) / med(qm):.2f}x |")


if __name__ == "__main__":
    main()
