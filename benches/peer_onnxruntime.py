#!/usr/bin/env python3
"""Peer side of decide's int8 benchmark: ONNX Runtime, float32 and dynamic int8, on CPU.

What a user would run instead of decide's ``--dtype int8``: the same sentence-transformers
model exported to ONNX and quantized with ``onnxruntime.quantization.quantize_dynamic`` (int8
weights per output channel, u8 activations quantized at run time, the setting optimum's
``avx512_vnni`` configuration uses), run by ``onnxruntime.InferenceSession`` with all graph
optimizations.

The ONNX graph is written here from ``model.safetensors`` and ``config.json`` with
``onnx.helper`` (BERT / MiniLM: embeddings and their LayerNorm, per layer Q/K/V ``MatMul`` +
``Add``, scaled masked softmax attention, output ``MatMul`` + residual + LayerNorm, FFN with erf
GELU, then mean pooling and L2 normalization, opset 17) rather than exported from torch: the
torch wheel on PyPI is a CUDA build of about 5 GB with its dependencies, and the graph is small.
Before timing, the f32 graph is checked against sentence-transformers' own embeddings of
``crates/decide-engine/fixtures/minilm-embeddings.json`` (cosine ≥ 0.99999 or the script stops),
and the int8 graph's lowest cosine to them is printed.

Same grid and output as ``benches/peer_sentence_transformers.py``: for batch sizes 1, 8, 32,
128 and inputs of exactly 64, 128 and 256 tokens, one JSON line per (dtype, batch, tokens)::

    {"peer": "onnxruntime", "dtype": "int8", "batch": 8, "tokens": 128, "median_s": 0.05,
     "seqs_per_s": 160.0, "min_s": 0.049, "reps": 6, "threads": 2}

and with ``--catalogue TOOLS.json`` one line per dtype for encoding every tool (``name:
description``), sorted by length and padded per batch of 32 as sentence-transformers does.

    target/ort-venv/bin/python benches/peer_onnxruntime.py [models/all-MiniLM-L6-v2] \\
        [--threads 2] [--dtypes float32,int8] [--budget-s 60] [--catalogue TOOLS.json]

Needs ``onnx``, ``onnxruntime``, ``numpy`` and ``tokenizers`` from PyPI (no torch):
``benches/requirements-onnx.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = kinds[meta["dtype"]]
        arr = np.frombuffer(raw[8 + n + start:8 + n + end], dtype=dtype).reshape(meta["shape"])
        out[name] = arr.astype(np.float32)
    return out


def build_graph(model_dir: Path):
    """The f32 ONNX model of a BERT sentence-transformer with mean pooling and normalization."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    cfg = json.loads((model_dir / "config.json").read_text())
    w = read_safetensors(model_dir / "model.safetensors")
    prefix = next((p for p in ("bert.", "") if f"{p}embeddings.word_embeddings.weight" in w), None)
    if prefix is None:
        sys.exit(f"peer_onnxruntime: {model_dir}: not a BERT checkpoint")
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = hidden // heads
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    nodes, inits = [], []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def linear(x: str, name: str, out: str) -> str:
        # torch's Linear exports as MatMul with the transposed weight, then Add: the pattern
        # quantize_dynamic turns into DynamicQuantizeMatMul / MatMulInteger.
        wt = const(f"{name}.weight.T", np.ascontiguousarray(w[f"{name}.weight"].T))
        b = const(f"{name}.bias", w[f"{name}.bias"])
        return node("Add", [node("MatMul", [x, wt], f"{out}.mm"), b], out)

    def layer_norm(x: str, name: str, out: str) -> str:
        g, b = const(f"{name}.weight", w[f"{name}.weight"]), const(f"{name}.bias", w[f"{name}.bias"])
        return node("LayerNormalization", [x, g, b], out, axis=-1, epsilon=eps)

    e = f"{prefix}embeddings"
    words = node("Gather", [const("word_embeddings", w[f"{e}.word_embeddings.weight"]),
                            "input_ids"], "words")
    types = node("Gather", [const("type_embeddings", w[f"{e}.token_type_embeddings.weight"]),
                            "token_type_ids"], "types")
    positions = node("Gather", [const("position_embeddings",
                                      w[f"{e}.position_embeddings.weight"]), "position_ids"],
                     "positions")
    x = node("Add", [node("Add", [words, types], "emb.sum1"), positions], "emb.sum")
    x = layer_norm(x, f"{e}.LayerNorm", "emb.out")
    maskf = node("Cast", ["attention_mask"], "maskf", to=TensorProto.FLOAT)
    bias = node("Mul", [node("Sub", [const("one", np.float32(1.0)), maskf], "mask.inv"),
                        const("neg", np.float32(-1e4))], "mask.bias")
    bias = node("Unsqueeze", [bias, const("axes12", np.array([1, 2], dtype=np.int64))],
                "mask.bias4")
    split_shape = const("split_shape", np.array([0, 0, heads, d], dtype=np.int64))
    merge_shape = const("merge_shape", np.array([0, 0, hidden], dtype=np.int64))
    scale = const("scale", np.float32(1.0 / np.sqrt(d)))
    for i in range(cfg["num_hidden_layers"]):
        p = f"{prefix}encoder.layer.{i}"
        a = f"{p}.attention"
        q = node("Reshape", [linear(x, f"{a}.self.query", f"l{i}.q"), split_shape], f"l{i}.q4")
        k = node("Reshape", [linear(x, f"{a}.self.key", f"l{i}.k"), split_shape], f"l{i}.k4")
        v = node("Reshape", [linear(x, f"{a}.self.value", f"l{i}.v"), split_shape], f"l{i}.v4")
        q = node("Transpose", [q], f"l{i}.qt", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], f"l{i}.kt", perm=[0, 2, 3, 1])
        v = node("Transpose", [v], f"l{i}.vt", perm=[0, 2, 1, 3])
        s = node("Mul", [node("MatMul", [q, k], f"l{i}.qk"), scale], f"l{i}.s")
        s = node("Add", [s, bias], f"l{i}.sm")
        probs = node("Softmax", [s], f"l{i}.p", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"l{i}.pv")], f"l{i}.ctx4",
                   perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_shape], f"l{i}.ctx")
        h = node("Add", [linear(ctx, f"{a}.output.dense", f"l{i}.ao"), x], f"l{i}.ares")
        x = layer_norm(h, f"{a}.output.LayerNorm", f"l{i}.an")
        up = linear(x, f"{p}.intermediate.dense", f"l{i}.up")
        # erf GELU, as BERT's "gelu".
        erf = node("Erf", [node("Mul", [up, const(f"l{i}.rs2", np.float32(1 / np.sqrt(2)))],
                                f"l{i}.g0")], f"l{i}.g1")
        gelu = node("Mul", [node("Mul", [up, const(f"l{i}.half", np.float32(0.5))], f"l{i}.g2"),
                            node("Add", [erf, const(f"l{i}.one", np.float32(1.0))], f"l{i}.g3")],
                    f"l{i}.gelu")
        h = node("Add", [linear(gelu, f"{p}.output.dense", f"l{i}.down"), x], f"l{i}.dres")
        x = layer_norm(h, f"{p}.output.LayerNorm", f"l{i}.out")
    # Mean over the real tokens, then unit length (sentence-transformers' Pooling + Normalize).
    m3 = node("Unsqueeze", [maskf, const("axis2", np.array([2], dtype=np.int64))], "mask3")
    axis1 = const("axis1", np.array([1], dtype=np.int64))
    summed = node("ReduceSum", [node("Mul", [x, m3], "masked"), axis1], "summed", keepdims=0)
    count = node("ReduceSum", [m3, axis1], "count", keepdims=0)
    pooled = node("Div", [summed, count], "pooled")
    # Opset 17's ReduceL2 takes its axes as an attribute (ReduceSum as an input).
    norm = node("ReduceL2", [pooled], "norm", axes=[-1], keepdims=1)
    node("Div", [pooled, node("Max", [norm, const("tiny", np.float32(1e-12))], "normc")],
         "embedding")
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "token_type_ids", "position_ids", "attention_mask")]
    out = [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])]
    graph = helper.make_graph(nodes, "sentence_bert", ids, out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class Encoder:
    """Tokenizes, pads per call to the longest row, runs the session."""

    def __init__(self, session, tokenizer, max_len: int):
        self.session = session
        self.tok = tokenizer
        self.tok.enable_truncation(max_len)

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        # Sorted by length and padded per batch, as sentence-transformers' encode does.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = [None] * len(texts)
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            encs = self.tok.encode_batch([texts[i] for i in idx])
            n = max(len(e.ids) for e in encs)
            ids = np.zeros((len(idx), n), dtype=np.int64)
            types = np.zeros_like(ids)
            mask = np.zeros_like(ids)
            for r, enc in enumerate(encs):
                ids[r, :len(enc.ids)] = enc.ids
                types[r, :len(enc.ids)] = enc.type_ids
                mask[r, :len(enc.ids)] = 1
            pos = np.broadcast_to(np.arange(n, dtype=np.int64), ids.shape).copy()
            (emb,) = self.session.run(None, {"input_ids": ids, "token_type_ids": types,
                                             "position_ids": pos, "attention_mask": mask})
            for r, i in enumerate(idx):
                out[i] = emb[r]
        return np.stack(out)


def make_texts(tok, words: list[str], n: int, tokens: int, rng: random.Random) -> list[str]:
    texts = []
    for _ in range(n):
        text = " ".join(rng.choice(words) for _ in range(tokens - 2))
        got = len(tok.encode(text).ids)
        assert got == tokens, f"built a {got}-token text, wanted {tokens}"
        texts.append(text)
    return texts


def catalogue_texts(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    tools = data["tools"] if isinstance(data, dict) and "tools" in data else data
    texts = []
    for tool in tools:
        if tool.get("type") == "function" and "function" in tool:
            tool = tool["function"]
        description = (tool.get("description") or "").strip()
        name = tool["name"]
        texts.append(name if not description or description == name else f"{name}: {description}")
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=str(ROOT / "models" / "all-MiniLM-L6-v2"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--tokens", default="64,128,256")
    ap.add_argument("--dtypes", default="float32,int8")
    ap.add_argument("--budget-s", type=float, default=60.0,
                    help="time to aim for over all timed calls of one dtype's grid")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--catalogue", type=Path)
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--work-dir", type=Path, help="where the .onnx files go (default: a temp dir)")
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from tokenizers import Tokenizer

    model_dir = Path(args.model)
    if not (model_dir / "model.safetensors").is_file():
        sys.exit(f"peer_onnxruntime: no model.safetensors in {model_dir} (run models/fetch)")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="decide-ort-"))
    work.mkdir(parents=True, exist_ok=True)
    f32_path, int8_path = work / "model-f32.onnx", work / "model-int8.onnx"
    onnx.save(build_graph(model_dir), str(f32_path))
    quantize_dynamic(str(f32_path), str(int8_path), weight_type=QuantType.QInt8,
                     per_channel=True, reduce_range=False)
    log(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, {args.threads} threads, "
        f"{platform.processor() or platform.machine()}; f32 model "
        f"{f32_path.stat().st_size / 1e6:.1f} MB, int8 model {int8_path.stat().st_size / 1e6:.1f} MB")

    st = json.loads((model_dir / "sentence_bert_config.json").read_text())
    max_len = st.get("max_seq_length", 512)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    fixture = json.loads((ROOT / "crates/decide-engine/fixtures/minilm-embeddings.json")
                         .read_text())
    want = np.asarray(fixture["embeddings"], dtype=np.float64)

    def session(path: Path):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    vocab = tok.get_vocab()
    words = sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) > 2
                   and len(tok.encode(w, add_special_tokens=False).ids) == 1)
    rng = random.Random(args.seed)
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(t) for t in args.tokens.split(",")]
    assert max(lengths) <= max_len
    dtypes = [x.strip() for x in args.dtypes.split(",") if x.strip()]
    for dtype in dtypes:
        enc = Encoder(session(f32_path if dtype == "float32" else int8_path), tok, max_len)
        got = enc.encode(fixture["texts"], 32).astype(np.float64)
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        log(f"{dtype}: cosine with sentence-transformers' embeddings: lowest {cos.min():.6f}")
        if dtype == "float32" and cos.min() < 0.99999:
            sys.exit("peer_onnxruntime: the f32 graph does not reproduce the model")
        if args.catalogue:
            texts = catalogue_texts(args.catalogue)

            def call_cat() -> float:
                t0 = time.perf_counter()
                enc.encode(texts, 32)
                return time.perf_counter() - t0

            call_cat()
            times = [call_cat() for _ in range(max(args.min_reps, 5))]
            median = statistics.median(times)
            row = {"peer": "onnxruntime", "dtype": dtype, "catalogue": str(args.catalogue),
                   "texts": len(texts), "median_s": round(median, 6),
                   "texts_per_s": round(len(texts) / median, 2), "min_s": round(min(times), 6),
                   "reps": len(times), "threads": args.threads}
            print(json.dumps(row), flush=True)
            log(f"  {dtype:>8} catalogue of {len(texts)} tools: {len(texts) / median:9.1f} texts/s")
        cells = [] if args.no_grid else [(b, t) for b in batches for t in lengths]
        total = sum(b * t for b, t in cells) or 1
        for batch, tokens in cells:
            texts = make_texts(tok, words, batch, tokens, rng)

            def call() -> float:
                t0 = time.perf_counter()
                enc.encode(texts, batch)
                return time.perf_counter() - t0

            warm = [call(), call()]
            per_call = statistics.median(warm)
            share = args.budget_s * batch * tokens / total
            reps = int(max(args.min_reps, min(args.max_reps, share / max(per_call, 1e-6))))
            times = [call() for _ in range(reps)]
            median = statistics.median(times)
            row = {"peer": "onnxruntime", "dtype": dtype, "batch": batch, "tokens": tokens,
                   "median_s": round(median, 6), "seqs_per_s": round(batch / median, 2),
                   "min_s": round(min(times), 6), "reps": reps, "threads": args.threads}
            print(json.dumps(row), flush=True)
            log(f"  {dtype:>8} batch {batch:>3} tokens {tokens:>3}: {median * 1e3:9.2f} ms "
                f"{batch / median:9.1f} seq/s (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
