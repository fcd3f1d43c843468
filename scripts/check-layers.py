#!/usr/bin/env python3
"""Fails when a module of decide-engine imports a higher layer, or docs/architecture.md names a
module that is not there.

The layers of `crates/decide-engine/src/` are LAYERS below, bottom first, as docs/architecture.md
documents them. A module may use modules of its own layer and of lower ones, never of a higher
one; the module-cycle check (check-module-cycles.py) keeps uses inside one layer one-way. A use
is any path `crate::x::...`, `super::...` or `self::...` in code (comments, strings and test
code, that is `#[cfg(test)]` items and files named `tests.rs`, are left out); `crate::Name` of a
name `lib.rs` re-exports counts as a use of the module it comes from. Every top-level module
must be in exactly one layer, so a new module is placed on purpose. A use against the order that
has to stay for a while goes in KNOWN_LEAKS, with why; any other one fails, one line per use
(file, line, the rule broken).

docs/architecture.md is checked against the code too:
* its table of the engine's layers (the section "decide-engine in layers") lists the same layers,
  in the same order, with the same modules as LAYERS;
* every module path it names in backticks exists: `crates/<crate>/src/...` from the repository
  root, and a relative one (`lib.rs`, `gateway/`, `backend/kernels.rs`) under the last
  `crates/<crate>/src/` named in backticks before it in the same section. Only names that end in
  `.rs` or `/` count as paths.

Usage: scripts/check-layers.py [--root DIR] (DIR stands for the repository root, for the tests).
"""
import importlib.util as _importlib_util
import re
import sys
from pathlib import Path

# The group-import parser is the module-cycle check's own, so both read `use` lines alike.
_spec = _importlib_util.spec_from_file_location(
    "check_module_cycles", Path(__file__).resolve().parent / "check-module-cycles.py")
_cycles = _importlib_util.module_from_spec(_spec)
_spec.loader.exec_module(_cycles)
group_heads = _cycles.group_heads

ROOT = Path(__file__).resolve().parent.parent
ENGINE_SRC = Path("crates/decide-engine/src")
DOC = Path("docs/architecture.md")
LAYER_SECTION = "## decide-engine in layers"

# The engine's layers, bottom first: (name, top-level modules). Keep docs/architecture.md's table
# the same (this script checks that it is).
LAYERS = [
    # What every layer may use and which uses nothing above it: the one error type, and the two
    # fitted heads that are numbers in, numbers out (Platt scaling; the needs-tool regression).
    ("base", ["error", "calibration", "needs_tool"]),
    # The model behind the `Backend` trait: token rows in, one vector per row out.
    ("backend", ["backend"]),
    # Text to token rows, trimmed to the model's length; decide-train reads through it too.
    ("tokenization", ["tokenize"]),
    # Models on disk: manifests (read and written) and offline resolution.
    ("models", ["registry"]),
    # A request to documents, raw scores to calibrated answers; the `Scorer` trait, `Cascade`.
    ("answering", ["answering"]),
    # BM25, alone and as the hybrid term.
    ("lexical", ["lexical"]),
    # The `Engine`: stage, forward, finish.
    ("scoring", ["scoring"]),
    # For the commands only, nothing in the engine uses them: the benchmarks' helpers and
    # `decide models pull`'s download.
    ("commands", ["bench", "pull"]),
]

# Known uses against the order: (file under src/, module it uses) -> why it is there. Each is a
# leak to take out, not a rule; a leak not listed here fails, and a listed one that is gone is
# noted so that the list does not outlive it. Empty while the engine keeps the order.
KNOWN_LEAKS = {}

PATH_RE = re.compile(r"\b(crate|super|self)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP_RE = re.compile(r"\b(crate|super|self)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*::\s*\{")
# Comments, string literals (raw and byte ones too) and character literals; a lifetime (`'a`)
# has no closing quote right after one character, so it is left alone. check-function-size.py
# reads code through the same lexer.
LEX_RE = re.compile(
    r"//[^\n]*"
    r"|/\*.*?\*/"
    r"|(?<![A-Za-z0-9_])b?r(?P<hashes>#*)\".*?\"(?P=hashes)"
    r"|(?<![A-Za-z0-9_])b?\"(?:\\.|[^\"\\])*\""
    r"|'(?:\\u\{[0-9A-Fa-f]+\}|\\.|[^\\'\n])'",
    re.S,
)


def blank(text, start, end):
    """`text` with [start, end) turned into spaces, newlines kept so that lines still count."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def lexed(text: str) -> str:
    """The Rust source `text` with comments, string and char literals turned into spaces,
    newlines kept so that lines still count."""
    return LEX_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def code_of(file: Path) -> str:
    """The file's code: comments, string and char literals and `#[cfg(test)]` items blanked."""
    text = lexed(file.read_text())
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        text = blank(text, m.start(), item_end(text, m.end()))


def item_end(text, i):
    """Where the item starting at `i` ends: after its `;` or its `{...}`, or at the `,` or `}`
    that closes a field."""
    depth = 0
    while i < len(text):
        ch = text[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch in ";,":
            return i + 1
        elif depth == 0 and ch == "}":
            return i
        elif depth == 0 and ch == "{":
            return matching(text, i) + 1
        i += 1
    return i


def matching(text, i):
    """The index of the `}` closing the `{` at `i`."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def module_path(src: Path, file: Path):
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def segments(s):
    return [p.strip() for p in s.split("::") if p.strip()]


def uses(module, text):
    """(offset, path) of every path the code names, resolved to a path from the crate root;
    `super` and `self` are taken relative to the inline `mod x { ... }` they are written in."""
    inline = [(m.end() - 1, matching(text, m.end() - 1), m.group(1))
              for m in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", text)]
    found = [(m.start(), m.group(1), segments(m.group(2))) for m in PATH_RE.finditer(text)]
    for m in GROUP_RE.finditer(text):
        prefix = segments(m.group(2))
        for head in group_heads(text, m.end() - 1):
            if head != "self":
                found.append((m.start(), m.group(1), prefix + [head]))
    out = []
    for pos, anchor, segs in found:
        here = module + tuple(name for start, end, name in inline if start < pos < end)
        if anchor == "crate":
            base = ()
        elif anchor == "self":
            base = here
        else:
            base = here[:-1]
        while segs and segs[0] in ("super", "self"):
            base = base[:-1] if segs[0] == "super" else base
            segs = segs[1:]
        out.append((pos, base + tuple(segs)))
    return out


def reexports(lib_text, tops):
    """Names `lib.rs` re-exports (`pub use x::{A, B as C}`) -> the top-level module they come from."""
    names = {}
    for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", lib_text):
        tree = re.sub(r"^\s*(?:crate|self)\s*::", "", m.group(1)).strip()
        first = segments(tree.split("{")[0])[:1]
        if not first or first[0] not in tops:
            continue
        for leaf in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)(?:\s+as\s+([A-Za-z_][A-Za-z0-9_]*))?\s*(?=,|\}|$)", tree):
            names[leaf.group(2) or leaf.group(1)] = first[0]
    return names


def layer_violations(src: Path, shown):
    """Lines for the uses against the order, and the notes on stale known leaks."""
    layer_of = {}
    problems, notes = [], []
    for i, (name, modules) in enumerate(LAYERS):
        for mod in modules:
            if mod in layer_of:
                problems.append(f"scripts/check-layers.py: module {mod} is in two layers of LAYERS")
            layer_of[mod] = (i, name)
    files = sorted(f for f in src.rglob("*.rs") if f.name != "tests.rs")
    mods = {f: module_path(src, f) for f in files}
    tops = {m[0] for m in mods.values() if m}
    for top in sorted(tops - set(layer_of)):
        problems.append(f"{shown(src)}: module {top} is in no layer: place it in LAYERS of "
                        f"scripts/check-layers.py and in docs/architecture.md's table")
    for mod in sorted(set(layer_of) - tops):
        problems.append(f"scripts/check-layers.py: LAYERS names {mod}, which is not a module of {shown(src)}")
    lib = src / "lib.rs"
    names = reexports(code_of(lib), tops) if lib.is_file() else {}
    seen = set()
    for f in files:
        module = mods[f]
        if not module or module[0] not in layer_of:
            continue
        text = code_of(f)
        rel = f.relative_to(src).as_posix()
        reported = set()
        for pos, path in sorted(uses(module, text)):
            if not path:
                continue
            target = path[0] if path[0] in tops else names.get(path[0])
            if target is None or target == module[0] or target not in layer_of:
                continue
            (mine, my_name), (theirs, their_name) = layer_of[module[0]], layer_of[target]
            if theirs <= mine:
                continue
            if (rel, target) in KNOWN_LEAKS:
                seen.add((rel, target))
                continue
            line = text.count("\n", 0, pos) + 1
            if (line, target) in reported:
                continue
            reported.add((line, target))
            problems.append(
                f"{shown(f)}:{line}: {module[0]} (layer {my_name}) uses {target} (layer {their_name}, "
                f"higher): a module may use only its own layer and lower ones "
                f"({' < '.join(n for n, _ in LAYERS)})")
    for key in sorted(set(KNOWN_LEAKS) - seen):
        notes.append(f"note: the known leak {key[0]} -> {key[1]} is gone: take it out of KNOWN_LEAKS")
    return problems, notes


def doc_table(doc_lines):
    """The engine's layer table of the doc: [(line number, layer name, [module names])]."""
    rows, inside = [], False
    for n, line in enumerate(doc_lines, 1):
        if line.startswith("## "):
            inside = line.strip() == LAYER_SECTION
            continue
        if not inside or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0] == "layer":
            continue
        names = [re.sub(r"(\.rs|/)$", "", t) for t in re.findall(r"`([^`]+)`", cells[1])]
        rows.append((n, cells[0], names))
    return rows


def doc_problems(root: Path, doc: Path, shown):
    if not doc.is_file():
        return [f"{shown(doc)}: missing"]
    lines = doc.read_text().splitlines()
    problems = []
    rows = doc_table(lines)
    want = [(name, sorted(modules)) for name, modules in LAYERS]
    have = [(name, sorted(modules)) for _, name, modules in rows]
    if have != want:
        where = rows[0][0] if rows else 1
        show = lambda layers: "; ".join(f"{n}: {', '.join(m)}" for n, m in layers) or "no table"
        problems.append(f"{shown(doc)}:{where}: the engine's layer table ({show(have)}) differs from "
                        f"LAYERS in scripts/check-layers.py ({show(want)})")
    base = None
    for n, line in enumerate(lines, 1):
        if line.startswith("#"):
            base = None
        for token in re.findall(r"`([^`\n]+)`", line):
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*(?:/[A-Za-z0-9_.\-]+)*/?", token):
                continue
            crate_src = re.match(r"crates/[A-Za-z0-9_\-]+/src/", token)
            if crate_src:
                base = crate_src.group(0)
            if not (token.endswith(".rs") or token.endswith("/")):
                continue
            if token.startswith("crates/"):
                path = token
            elif base:
                path = base + token
            else:
                continue
            target = root / path
            if not (target.is_dir() if token.endswith("/") else target.is_file()):
                problems.append(f"{shown(doc)}:{n}: names `{token}` ({path}), which does not exist")
    return problems


def root_of(args, doc):
    """The repository root: DIR of `--root DIR` in `args`, else ROOT. Any other arguments exit
    with the usage, the last line of the script's docstring `doc`."""
    if not args:
        return ROOT
    if args[0] == "--root" and len(args) == 2:
        return Path(args[1]).resolve()
    sys.exit(doc.strip().splitlines()[-1])


def main():
    root = root_of(sys.argv[1:], __doc__)

    def shown(path: Path):
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            return str(path)

    src = root / ENGINE_SRC
    problems, notes = layer_violations(src, shown)
    problems += doc_problems(root, root / DOC, shown)
    for line in notes + problems:
        print(line)
    if problems:
        sys.exit(1)
    print(f"decide-engine keeps its {len(LAYERS)} layers ({len(KNOWN_LEAKS)} known leaks), "
          f"and every module {DOC.as_posix()} names exists")


if __name__ == "__main__":
    main()
