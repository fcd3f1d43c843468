#!/usr/bin/env python3
"""Peer side of decide's throughput benchmark: sentence-transformers on CPU.

Measures sequences per second of ``SentenceTransformer.encode(batch, batch_size=B,
convert_to_tensor=True)`` with sentence-transformers/all-MiniLM-L6-v2, for batch sizes 1, 8,
32, 128 and inputs of exactly 64, 128 and 256 tokens (special tokens included; 256 is the
model's max_seq_length, so nothing is truncated), in float32 and, where this CPU runs it,
bfloat16 (``model.to(torch.bfloat16)``). For each case: warm-up calls, then the median of
several timed calls, their count sized from the warm-up so that the timed calls take about
``--budget-s`` seconds in all (default 120, shared out in proportion to batch x tokens; at
least ``--min-reps`` = 3 calls each, so a slow or busy machine goes over). On 2 idle cores of
an AVX-512 Xeon the default run took 134 s plus about 10 s of start-up. ``--budget-s`` scales
the run.

Output: one JSON line per (dtype, batch, tokens) on stdout::

    {"peer": "sentence-transformers", "dtype": "float32", "batch": 8, "tokens": 128,
     "median_s": 0.117, "seqs_per_s": 68.3, "min_s": 0.108, "reps": 6, "threads": 2}

(``seqs_per_s`` = batch / median_s; ``min_s``, the fastest timed call, is the figure least
disturbed by other work on the machine) and a table on stderr. Run it on an otherwise idle
machine: with other processes on the same cores, torch's OpenMP threads wait on each other at
every operator and small batches came out up to 45x slower here. The Rust side,
benches/scoring.rs, measures the same grid.

Run (from the repository root; see crates/decide-engine/fixtures/requirements.txt for the
environment, and models/fetch for the model)::

    HF_HUB_OFFLINE=1 .venv/bin/python benches/peer_sentence_transformers.py \\
        [models/all-MiniLM-L6-v2] [--threads 2] [--budget-s 120] > /tmp/peer_bench.jsonl

Each text is made of random words that are one token each in the model's vocabulary, so its
length is exact; every row of a batch is different.

``--catalogue TOOLS.json`` also times encoding every tool of a real catalogue (``name:
description``, the text decide scores; an MCP ``{"tools": [...]}`` list, a bare list, or OpenAI
``{"type": "function", "function": {...}}`` entries) with sentence-transformers' own batching
(``batch_size=32``, sorted by length and padded per batch), one line per dtype::

    {"peer": "sentence-transformers", "dtype": "float32", "catalogue": "...", "texts": 526,
     "median_s": 1.9, "texts_per_s": 277.0, "min_s": 1.8, "reps": 5, "threads": 2}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def single_token_words(tokenizer) -> list[str]:
    """Lower-case alphabetic whole words that the tokenizer keeps as one token."""
    vocab = tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) > 2)
    out = []
    for w in words:
        if len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1:
            out.append(w)
    return out


def make_texts(tokenizer, words: list[str], n: int, tokens: int, rng: random.Random) -> list[str]:
    special = len(tokenizer("")["input_ids"])  # [CLS] [SEP]
    texts = []
    for _ in range(n):
        text = " ".join(rng.choice(words) for _ in range(tokens - special))
        got = len(tokenizer(text)["input_ids"])
        assert got == tokens, f"built a {got}-token text, wanted {tokens}"
        texts.append(text)
    return texts


def candidate_text(name: str, description: str) -> str:
    """decide's `candidate_text`: `name: description`, or the name when that adds nothing."""
    description = (description or "").strip()
    return name if not description or description == name else f"{name}: {description}"


def catalogue_texts(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    tools = data["tools"] if isinstance(data, dict) and "tools" in data else data
    texts = []
    for tool in tools:
        if tool.get("type") == "function" and "function" in tool:
            tool = tool["function"]
        texts.append(candidate_text(tool["name"], tool.get("description", "")))
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="models/all-MiniLM-L6-v2",
                    help="sentence-transformers folder (default: models/all-MiniLM-L6-v2)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--tokens", default="64,128,256")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="time to aim for over all timed calls (default 120); scales the run")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--catalogue", type=Path, help="also time encoding this tool catalogue")
    ap.add_argument("--no-grid", action="store_true", help="only the catalogue")
    args = ap.parse_args()

    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    batches = [int(x) for x in args.batches.split(",")]
    lengths = [int(x) for x in args.tokens.split(",")]
    dtypes = [x.strip() for x in args.dtypes.split(",") if x.strip()]
    path = Path(args.model)
    if not (path / "model.safetensors").is_file():
        sys.exit(f"peer_sentence_transformers: no model.safetensors in {path} (run models/fetch)")

    model = SentenceTransformer(str(path), device="cpu")
    model.eval()
    tok = model.tokenizer
    assert max(lengths) <= model.max_seq_length, "inputs longer than max_seq_length get truncated"
    words = single_token_words(tok)
    rng = random.Random(args.seed)
    log(f"torch {torch.__version__}, sentence-transformers "
        f"{__import__('sentence_transformers').__version__}, {args.threads} threads, "
        f"{platform.processor() or platform.machine()}, load average {os.getloadavg()}")

    cases = [] if args.no_grid else [(d, b, t) for d in dtypes for b in batches for t in lengths]
    work = {c: c[1] * c[2] for c in cases}  # tokens per call, to share out the budget
    total_work = sum(work.values())
    results = []
    start_all = time.perf_counter()
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        model.to(dtype)
        try:
            probe = model.encode(["a short probe"], convert_to_tensor=True)
            assert probe.dtype == dtype, probe.dtype
            assert torch.isfinite(probe.float()).all()
        except Exception as e:  # noqa: BLE001 - report and go on with the other dtypes
            log(f"{dtype_name}: does not run here ({type(e).__name__}: {e}); skipped")
            continue
        if args.catalogue:
            results.append(time_catalogue(model, args, dtype_name))
        for batch in [] if args.no_grid else batches:
            for tokens in lengths:
                texts = make_texts(tok, words, batch, tokens, rng)

                def call() -> float:
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        out = model.encode(texts, batch_size=batch, convert_to_tensor=True,
                                           show_progress_bar=False)
                    _ = out.float().sum().item()
                    return time.perf_counter() - t0

                # The first call of a shape builds its kernels (oneDNN primitives, notably for
                # bfloat16) and can be 10x slower: warm up twice, more while it is cheap, once
                # when one call alone is long.
                warm = [call()]
                while len(warm) < 6 and (len(warm) < 2 or sum(warm) < 0.5) and warm[-1] < 1.0:
                    warm.append(call())
                per_call = statistics.median(warm[1:]) if len(warm) > 1 else warm[0]
                share = args.budget_s * work[(dtype_name, batch, tokens)] / total_work
                reps = int(max(args.min_reps, min(args.max_reps, share / max(per_call, 1e-6))))
                times = [call() for _ in range(reps)]
                median = statistics.median(times)
                row = {"peer": "sentence-transformers", "dtype": dtype_name, "batch": batch,
                       "tokens": tokens, "median_s": round(median, 6),
                       "seqs_per_s": round(batch / median, 2), "min_s": round(min(times), 6),
                       "reps": reps, "threads": args.threads}
                results.append(row)
                print(json.dumps(row), flush=True)
                log(f"  {dtype_name:>8} batch {batch:>3} tokens {tokens:>3}: "
                    f"{median * 1e3:9.2f} ms  {batch / median:9.1f} seq/s  "
                    f"(min {min(times) * 1e3:.2f} ms, {reps} reps, "
                    f"load {os.getloadavg()[0]:.2f})")
    model.to(torch.float32)

    log("")
    log(f"{'dtype':>8} {'batch':>5} " + " ".join(f"{t:>9}t" for t in lengths) + "   (seq/s)")
    for dtype_name in dtypes:
        for batch in [] if args.no_grid else batches:
            cells = []
            for tokens in lengths:
                r = [x for x in results if (x["dtype"], x.get("batch"), x.get("tokens"))
                     == (dtype_name, batch, tokens)]
                cells.append(f"{r[0]['seqs_per_s']:>10.1f}" if r else f"{'-':>10}")
            log(f"{dtype_name:>8} {batch:>5} " + " ".join(cells))
    log(f"total {time.perf_counter() - start_all:.1f} s, load average {os.getloadavg()}")


def time_catalogue(model, args, dtype_name: str) -> dict:
    texts = catalogue_texts(args.catalogue)

    def call() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.encode(texts, batch_size=32, convert_to_tensor=True,
                               show_progress_bar=False)
        _ = out.float().sum().item()
        return time.perf_counter() - t0

    call()
    call()
    times = [call() for _ in range(max(args.min_reps, 5))]
    median = statistics.median(times)
    row = {"peer": "sentence-transformers", "dtype": dtype_name,
           "catalogue": str(args.catalogue), "texts": len(texts), "median_s": round(median, 6),
           "texts_per_s": round(len(texts) / median, 2), "min_s": round(min(times), 6),
           "reps": len(times), "threads": args.threads}
    print(json.dumps(row), flush=True)
    log(f"  {dtype_name:>8} catalogue of {len(texts)} tools: {median * 1e3:9.2f} ms  "
        f"{len(texts) / median:9.1f} texts/s")
    return row


if __name__ == "__main__":
    main()
