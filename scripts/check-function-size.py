#!/usr/bin/env python3
"""Fails when a function of the `decide` command is longer than MAX_LINES lines.

A command's function reads as a list of steps: parse and check the options, load, run, print.
One that outgrows a screen mixes the steps with their details, and is split into named steps
instead. Every `fn` with a body in the files of FILES counts (methods, nested functions and
test functions too), from the line of its `fn` to the line of its closing brace; attributes and
doc comments above it do not. Braces in comments, strings and character literals are not code.
Each function over the limit fails, one line each: `file:line fn name: N lines`.

Usage: scripts/check-function-size.py [--root DIR] (DIR stands for the repository root, for the tests).
"""
import importlib.util as _importlib_util
import re
import sys
from pathlib import Path

# The lexer and the `--root` option are the layer check's own, so both scripts read code alike.
_spec = _importlib_util.spec_from_file_location(
    "check_layers", Path(__file__).resolve().parent / "check-layers.py")
_layers = _importlib_util.module_from_spec(_spec)
_spec.loader.exec_module(_layers)
code_of = _layers.lexed

# The files checked, as globs from the repository root.
FILES = ["crates/decide-cli/src/*.rs"]
MAX_LINES = 80

FN_RE = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def body_start(code: str, i: int):
    """The index of the `{` opening the body of the `fn` whose signature starts at `i`, or
    None for a declaration without a body (`fn f();` in a trait or an `extern` block)."""
    depth = 0
    for j in range(i, len(code)):
        ch = code[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch == ";":
            return None
        elif depth == 0 and ch == "{":
            return j
    return None


def matching(code: str, i: int):
    """The index of the `}` closing the `{` at `i`, or None when the file ends first."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


def functions(text: str):
    """(line, name, lines) of every function with a body in the Rust source `text`."""
    code = code_of(text)
    found = []
    for m in FN_RE.finditer(code):
        start = body_start(code, m.end())
        if start is None:
            continue
        end = matching(code, start)
        if end is None:
            continue
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, end) + 1
        found.append((first, m.group(1), last - first + 1))
    return found


def main():
    root = _layers.root_of(sys.argv[1:], __doc__)
    files = sorted({f for pattern in FILES for f in root.glob(pattern) if f.is_file()})
    if not files:
        sys.exit(f"no files match {', '.join(FILES)} under {root}")
    problems = []
    count = 0
    for f in files:
        shown = f.relative_to(root).as_posix()
        for line, name, lines in functions(f.read_text(encoding="utf-8")):
            count += 1
            if lines > MAX_LINES:
                problems.append(f"{shown}:{line} fn {name}: {lines} lines")
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} functions over {MAX_LINES} lines: split each into named steps", file=sys.stderr)
        sys.exit(1)
    print(f"{count} functions in {len(files)} files, none over {MAX_LINES} lines")


if __name__ == "__main__":
    main()
