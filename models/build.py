#!/usr/bin/env python3
"""Builds a fine-tuned model from its base model's files and a small file of changed tensors.

A model fine-tuned from a base (say decide-tools-minilm from all-MiniLM-L6-v2, with only the top
encoder layers trained) differs from its base in a few tensors. The repository keeps just those,
as float16 differences from the base, in a safetensors file (the "delta"), and models/fetch builds
the full model from the base's files and the delta:

  models/build.py extract --base models/all-MiniLM-L6-v2 --trained DIR \\
      --out models/decide-tools-minilm/delta.safetensors
      For every tensor of DIR/model.safetensors that differs from the base tensor of the same
      name, writes F16(trained - base): the difference of the two float32 values taken in float64
      and rounded once to float16 (nearest, ties to even). float16 keeps 11 significant bits of
      what it stores; fine-tuning moves a weight by far less than the weight itself, so storing
      the change rather than the weight makes the error relative to the change (under 1e-6 for a
      change of 1e-3) instead of to the weight (up to 5e-4 for a weight of 1). A tensor the base
      lacks (a new head) is written whole, as its own F16 values, and named in the metadata's
      "whole" entry.

  models/build.py assemble --base models/all-MiniLM-L6-v2 \\
      --delta models/decide-tools-minilm/delta.safetensors --out models/decide-tools-minilm
      Writes OUT/model.safetensors: every base tensor, under the base's name, as F32 (integer
      tensors such as position ids keep their type), with each changed tensor replaced by
      F32(base + delta), the sum taken in float64 and rounded once to float32 (nearest), and each
      whole tensor by its values as F32 (exactly); and copies the base's configuration and
      tokenizer files unchanged.

  models/build.py extract --int8 ...
      The same, with each changed matrix (every tensor of two or more dimensions) stored as
      int8 rows instead: per row of its last dimension, the differences taken in float64, the
      row's scale F32(max |difference| / 127), and each value round(difference / scale), to
      nearest even, clamped to [-127, 127]; the scales go beside it as an F32 tensor named
      `<name>:scale`. Half the size of float16 differences, at an error of at most half a scale
      (under 0.4% of the row's largest change); vectors (biases, LayerNorm) stay float16
      differences. assemble adds q * scale, taken in float64, to the base value and rounds once to
      float32.

The delta's metadata is {"delta": "difference", "format": "pt"}, plus "whole": the names of the
tensors stored whole, sorted, comma-separated, when there are any, and "int8": the names of the
tensors stored as int8 rows, likewise; assemble refuses a file without the "delta" entry (such as
one of float16 values, which it would misread).

Names are compared without a `bert.` or `model.` prefix, as `decide train` writes them bare. Both
outputs are deterministic: sorted keys, a compact JSON header with sorted keys padded with spaces
to a multiple of 8 bytes, the tensors in key order, the metadata above (`{"format": "pt"}` for the
model). So the same inputs always give byte-identical files, which is what lets manifest.toml pin
their sha256. Files are written through a `.part` name, so an interrupted build never leaves a
truncated file that looks complete. Standard library only (no numpy): float conversions go
through struct, whole tensors at a time (a few seconds for the 5.3 million values of three
MiniLM layers).

Errors are one line naming the file, with exit status 2.
"""

import argparse
import json
import math
import operator
import os
import shutil
import struct
import sys

PROG = "models/build.py"

# Bytes per element of each safetensors dtype.
DTYPE_SIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}
FLOATS = ("F64", "F32", "F16", "BF16")

# The delta's metadata: what its tensors hold, and which are stored whole.
DELTA_KIND = ("delta", "difference")
WHOLE_KEY = "whole"

# The delta's metadata entry listing the tensors stored as int8 rows, and the suffix of the name
# under which each one's row scales are stored (a colon is in no checkpoint's parameter names).
INT8_KEY = "int8"
SCALE_SUFFIX = ":scale"

# Prefixes under which checkpoints keep the encoder; names are compared without them.
PREFIXES = ("bert.", "model.")

# The files of the base folder, besides the weights, that the built model needs. The first two
# are required; the others are copied when the base has them.
REQUIRED_FILES = ("config.json", "tokenizer.json")
OPTIONAL_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "LICENSE",
    "NOTICE",
)


class BuildError(Exception):
    """A one-line message naming the file at fault."""


def bare(name):
    for p in PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


class Tensor:
    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype = dtype
        self.shape = shape
        self.data = data  # bytes-like, little-endian

    @property
    def count(self):
        return math.prod(self.shape)

    def floats(self, what):
        """The values as Python floats (exact for every float dtype)."""
        n = self.count
        if self.dtype == "F32":
            return struct.unpack(f"<{n}f", self.data)
        if self.dtype == "F16":
            return struct.unpack(f"<{n}e", self.data)
        if self.dtype == "F64":
            return struct.unpack(f"<{n}d", self.data)
        if self.dtype == "BF16":
            return struct.unpack(f"<{n}f", bf16_to_f32(self.data))
        if self.dtype in ("I64", "I32", "I16", "I8", "U8"):
            code = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B"}[self.dtype]
            return tuple(float(v) for v in struct.unpack(f"<{n}{code}", self.data))
        raise BuildError(f"{what}: cannot read {self.dtype} values")


def bf16_to_f32(data):
    """bfloat16 is the top half of a float32: interleave two zero bytes below each value."""
    out = bytearray(len(data) * 2)
    out[2::4] = data[0::2]
    out[3::4] = data[1::2]
    return bytes(out)


def read_safetensors(path):
    """Returns ({name: Tensor}, metadata) of a safetensors file; the tensors' data are views."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise BuildError(f"{path}: {e.strerror or e}") from None
    if len(raw) < 8:
        raise BuildError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise BuildError(f"{path}: not a safetensors file (header of {n} bytes, file of {len(raw)})")
    try:
        header = json.loads(raw[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise BuildError(f"{path}: not a safetensors file (header is not an object)")
    metadata = header.pop("__metadata__", None)
    body = memoryview(raw)[8 + n:]
    tensors = {}
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise BuildError(f"{path}: tensor {name}: bad header entry") from None
        if dtype not in DTYPE_SIZE:
            raise BuildError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= len(body):
            raise BuildError(f"{path}: tensor {name}: data offsets out of range (truncated file?)")
        if end - begin != math.prod(shape) * DTYPE_SIZE[dtype]:
            raise BuildError(
                f"{path}: tensor {name}: {end - begin} bytes for {dtype} {shape}")
        tensors[name] = Tensor(dtype, shape, body[begin:end])
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: Tensor} deterministically, through a `.part` name; metadata is a dict of
    strings, {"format": "pt"} when not given."""
    header = {"__metadata__": dict(metadata) if metadata is not None else {"format": "pt"}}
    offset = 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        size = len(t.data)
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    part = path + ".part"
    try:
        with open(part, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name in names:
                f.write(tensors[name].data)
        os.replace(part, path)
    except OSError as e:
        raise BuildError(f"{path}: {e.strerror or e}") from None
    return 8 + len(text) + offset


def by_bare_name(tensors, path):
    out = {}
    for name, t in tensors.items():
        b = bare(name)
        if b in out:
            raise BuildError(f"{path}: two tensors are named {b} once prefixes are dropped")
        out[b] = (name, t)
    return out


def same_values(a, b, what):
    if a.shape != b.shape:
        return False
    if a.dtype == b.dtype:
        return bytes(a.data) == bytes(b.data)
    # Different types (decide train saves everything as F32, the base keeps position ids as I64):
    # compare the values.
    return a.floats(what) == b.floats(what)


def to_f16(t, what):
    """The values as F16 bytes, rounded to nearest even."""
    return pack_f16(t.floats(what), t.count, what)


def pack_f16(values, n, what):
    try:
        return struct.pack(f"<{n}e", *values)
    except (OverflowError, struct.error):
        raise BuildError(f"{what}: a value is out of float16 range") from None


def f16_difference(t, b, what, scale_by=1.0):
    """F16(scale_by * (t - b)) as bytes: each difference taken in float64 (Python floats) from the
    two tensors' values and rounded once to float16, to nearest even."""
    diff = map(operator.sub, t.floats(what), b.floats(what))
    if scale_by != 1.0:
        diff = [scale_by * d for d in diff]
    return pack_f16(diff, t.count, what)


def int8_difference(t, b, what, scale_by=1.0):
    """(I8 bytes, F32 scale bytes) of t - b: each row of the last dimension scaled by its largest
    |difference| / 127, rounded once to float32, and each difference divided by its row's scale,
    rounded to nearest even and clamped to [-127, 127]. A row without change has scale 0."""
    cols = t.shape[-1]
    rows = t.count // cols if cols else 0
    diff = [scale_by * d for d in map(operator.sub, t.floats(what), b.floats(what))]
    values = []
    scales = []
    for r in range(rows):
        row = diff[r * cols:(r + 1) * cols]
        largest = max(map(abs, row))
        if not math.isfinite(largest):
            raise BuildError(f"{what}: a difference from the base is not finite")
        # The scale as stored, so that assemble multiplies by exactly the value divided by here.
        (scale,) = struct.unpack("<f", struct.pack("<f", largest / 127))
        scales.append(scale)
        if scale == 0:
            values.extend([0] * cols)
        else:
            values.extend(max(-127, min(127, round(v / scale))) for v in row)
    return struct.pack(f"<{t.count}b", *values), struct.pack(f"<{rows}f", *scales)


def f32_sum(b, d, what):
    """F32(b + d) as bytes: each sum taken in float64 and rounded once to float32 (struct's 'f'
    rounds to nearest)."""
    return pack_f32_sums(b, d.floats(what), what)


def f32_sum_int8(b, q, scales, what):
    """F32(b + q * scale) as bytes, q's row scaled by its scale, both operations in float64 and
    the result rounded once to float32."""
    cols = q.shape[-1]
    per_row = scales.floats(what)
    changes = [v * per_row[i // cols] for i, v in enumerate(q.floats(what))]
    return pack_f32_sums(b, changes, what)


def pack_f32_sums(b, changes, what):
    try:
        return struct.pack(f"<{b.count}f", *map(operator.add, b.floats(what), changes))
    except (OverflowError, struct.error):
        raise BuildError(f"{what}: a sum with the base is out of float32 range") from None


def to_f32(t, what):
    if t.dtype == "F32":
        return t.data
    if t.dtype == "BF16":
        return bf16_to_f32(t.data)
    n = t.count
    try:
        return struct.pack(f"<{n}f", *t.floats(what))
    except (OverflowError, struct.error):
        raise BuildError(f"{what}: a value is out of float32 range") from None


def human(size):
    return f"{size} bytes ({size / 1e6:.2f} MB)"


def extract(args):
    if args.scale != 1.0 and not args.int8:
        raise BuildError("extract: --scale needs --int8")
    if not 0.0 < args.scale <= 1.0:
        raise BuildError(f"extract: --scale {args.scale}: expected a number in (0, 1]")
    base_path = os.path.join(args.base, "model.safetensors")
    trained_path = os.path.join(args.trained, "model.safetensors")
    base = by_bare_name(read_safetensors(base_path)[0], base_path)
    trained = by_bare_name(read_safetensors(trained_path)[0], trained_path)
    delta = {}
    whole = []
    int8 = []
    for name in sorted(trained):
        _, t = trained[name]
        what = f"{trained_path}: tensor {name}"
        if t.dtype not in FLOATS:
            if name in base and same_values(t, base[name][1], what):
                continue
            raise BuildError(f"{what}: a {t.dtype} tensor that the base lacks or has with other values; only float tensors can be stored")
        if name in base:
            b = base[name][1]
            if b.shape != t.shape:
                raise BuildError(f"{what}: shape {t.shape}, the base's is {b.shape}")
            if same_values(t, b, what):
                continue
            if args.int8 and len(t.shape) >= 2 and t.count:
                if "," in name:
                    raise BuildError(f"{what}: its name has a comma, which the delta's list of int8 tensors cannot hold")
                data, scales = int8_difference(t, b, what, args.scale)
                dtype = "I8"
                delta[name + SCALE_SUFFIX] = Tensor("F32", [math.prod(t.shape[:-1])], scales)
                int8.append(name)
                note = "changed: the difference from the base, int8 rows"
            else:
                data = f16_difference(t, b, what, args.scale)
                dtype = "F16"
                note = "changed: the difference from the base"
        else:
            if "," in name:
                raise BuildError(f"{what}: the base lacks it and its name has a comma, which the delta's list of whole tensors cannot hold")
            data = to_f16(t, what)
            dtype = "F16"
            whole.append(name)
            note = "not in the base: stored whole"
        delta[name] = Tensor(dtype, t.shape, data)
        print(f"{PROG}: {name} {t.shape} ({note})")
    metadata = {"format": "pt", DELTA_KIND[0]: DELTA_KIND[1]}
    if whole:
        metadata[WHOLE_KEY] = ",".join(whole)  # sorted, as the loop is
    if int8:
        metadata[INT8_KEY] = ",".join(int8)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    size = write_safetensors(args.out, delta, metadata)
    scales = scale_names(int8)
    values = sum(t.count for n, t in delta.items() if n not in scales)
    print(f"{PROG}: wrote {args.out}: {len(delta) - len(int8)} tensors ({len(whole)} whole, "
          f"{len(int8)} int8), {values} values, {human(size)}")


def scale_names(int8):
    return {name + SCALE_SUFFIX for name in int8}


def listed(metadata, key):
    """The set of names a metadata entry lists, comma-separated."""
    names = metadata.get(key, "")
    return set(names.split(",")) if isinstance(names, str) and names else set()


def copy_file(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    part = dst + ".part"
    try:
        shutil.copyfile(src, part)
        os.replace(part, dst)
    except OSError as e:
        raise BuildError(f"{e.filename or src}: {e.strerror or e}") from None


def assemble(args):
    base_path = os.path.join(args.base, "model.safetensors")
    base_tensors, _ = read_safetensors(base_path)
    base = by_bare_name(base_tensors, base_path)
    delta, metadata = read_safetensors(args.delta)
    metadata = metadata if isinstance(metadata, dict) else {}
    if metadata.get(DELTA_KIND[0]) != DELTA_KIND[1]:
        raise BuildError(
            f"{args.delta}: not a delta of differences (its metadata lacks "
            f'"{DELTA_KIND[0]}": "{DELTA_KIND[1]}"); extract it again with {PROG} extract')
    whole = listed(metadata, WHOLE_KEY)
    int8 = listed(metadata, INT8_KEY)
    scales = scale_names(int8)
    for kind, names in (("stored whole", whole), ("stored as int8 rows", int8), ("int8 scales", scales)):
        missing = sorted(names - set(delta))
        if missing:
            raise BuildError(f"{args.delta}: its metadata names {missing[0]} as {kind}, but it has no such tensor")
    for name in REQUIRED_FILES:
        path = os.path.join(args.base, name)
        if not os.path.isfile(path):
            raise BuildError(f"{path}: missing")
    out = {}
    for full, t in base_tensors.items():
        if t.dtype in FLOATS:
            out[full] = Tensor("F32", t.shape, to_f32(t, f"{base_path}: tensor {full}"))
        else:
            out[full] = t
    for name in sorted(delta):
        d = delta[name]
        what = f"{args.delta}: tensor {name}"
        if name in scales:
            continue  # read with its tensor
        if name in int8:
            row_scales = delta[name + SCALE_SUFFIX]
            full, b = int8_base(base, base_path, name, d, row_scales, what)
            out[full] = Tensor("F32", d.shape, f32_sum_int8(b, d, row_scales, what))
            continue
        if d.dtype not in FLOATS:
            raise BuildError(f"{what}: {d.dtype} is not a float type")
        if name in whole:
            if name in base:
                raise BuildError(f"{what}: stored whole, as a tensor the base lacks, but {base_path} has it")
            # A tensor the base lacks (a new head) is added under its bare name, as it is.
            out[name] = Tensor("F32", d.shape, to_f32(d, what))
            continue
        if name not in base:
            raise BuildError(f"{what}: a difference from a tensor that {base_path} lacks")
        full, b = base[name]
        if b.shape != d.shape:
            raise BuildError(f"{what}: shape {d.shape}, the base's is {b.shape}")
        out[full] = Tensor("F32", d.shape, f32_sum(b, d, what))
    os.makedirs(args.out, exist_ok=True)
    weights = os.path.join(args.out, "model.safetensors")
    size = write_safetensors(weights, out)
    copied = []
    for name in REQUIRED_FILES + OPTIONAL_FILES:
        src = os.path.join(args.base, name)
        if os.path.isfile(src):
            copy_file(src, os.path.join(args.out, name))
            copied.append(name)
    changed = len(delta) - len(whole) - len(scales)
    print(f"{PROG}: wrote {weights}: {len(out)} tensors ({changed} changed and "
          f"{len(whole)} added by {args.delta}), {human(size)}")
    print(f"{PROG}: copied from {args.base}: {', '.join(copied)}")


def int8_base(base, base_path, name, q, scales, what):
    """The base tensor (full name, Tensor) an int8 difference applies to, once the difference
    and its scales are checked against it."""
    if name not in base:
        raise BuildError(f"{what}: a difference from a tensor that {base_path} lacks")
    full, b = base[name]
    if q.dtype != "I8" or len(q.shape) < 2:
        raise BuildError(f"{what}: listed as int8 rows but is {q.dtype} {q.shape}")
    if b.shape != q.shape:
        raise BuildError(f"{what}: shape {q.shape}, the base's is {b.shape}")
    rows = math.prod(q.shape[:-1])
    if scales.dtype != "F32" or scales.shape != [rows]:
        raise BuildError(f"{what}{SCALE_SUFFIX}: {scales.dtype} {scales.shape}, expected F32 [{rows}] (one scale a row)")
    return full, b


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("extract", help="write the tensors a trained model changed, as F16 differences")
    p.add_argument("--base", required=True, help="the base model's folder")
    p.add_argument("--trained", required=True, help="the trained model's folder")
    p.add_argument("--out", required=True, help="the delta safetensors file to write")
    p.add_argument("--scale", type=float, default=1.0,
                   help="scale the int8 differences: the delta of base + SCALE * (trained - base), an average "
                        "of the two models' weights (1: the trained model itself)")
    p.add_argument("--int8", action="store_true",
                   help="store changed matrices as int8 rows with a scale each (half the size)")
    p = sub.add_parser("assemble", help="build a model folder from a base and a delta")
    p.add_argument("--base", required=True, help="the base model's folder")
    p.add_argument("--delta", required=True, help="the delta safetensors file")
    p.add_argument("--out", required=True, help="the model folder to write")
    args = parser.parse_args(argv)
    try:
        {"extract": extract, "assemble": assemble}[args.command](args)
    except BuildError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
