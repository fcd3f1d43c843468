#!/usr/bin/env python3
"""Fails when, in any crate of the workspace, a module uses a sibling module that uses it back.

Every `.rs` file under `crates/*/src` is a module (`a/b.rs` and `a/b/mod.rs` are `a::b`). A
reference `crate::x::y`, `super::y` or `self::y` in module M counts as M depending on the
module it names. Two sibling modules A and B (same parent) are in a cycle when something in A's
subtree names something in B's subtree and the other way round, directly or through other
siblings. Test code (`#[cfg(test)]` onwards, and files named `tests.rs`) is left out: a test
module may look at anything. Usage: scripts/check-module-cycles.py [crate dir...]
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")


def module_path(src: Path, file: Path):
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(file: Path) -> str:
    text = file.read_text()
    text = re.sub(r"//[^\n]*", "", text)
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def group_heads(text: str, start: int):
    """The first segment of each path inside a `{...}` group opening at `start`."""
    depth, item, heads = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                heads.append(item)
                break
        if depth == 1 and ch == ",":
            heads.append(item)
            item = ""
        elif depth >= 1:
            item += ch
    return [h.strip().split("::")[0].strip() for h in heads if h.strip()]


def references(module, text, modules):
    found = set()
    spans = [(m.group(1), m.group(2).strip(":").split("::")) for m in PATH_RE.finditer(text)]
    for m in GROUP_RE.finditer(text):
        prefix = [p for p in m.group(2).strip(":").split("::") if p]
        for head in group_heads(text, m.end() - 1):
            spans.append((m.group(1), prefix + [head]))
    for anchor, segs in spans:
        if anchor == "crate":
            base = ()
        elif anchor == "self":
            base = module
        else:
            base = module[:-1]
            while segs and segs[0] == "super":
                base, segs = base[:-1], segs[1:]
        path = base + tuple(s for s in segs if s)
        while path and path not in modules:
            path = path[:-1]
        if path:
            found.add(path)
    return found


def cycles_in(crate: Path):
    src = crate / "src"
    files = [f for f in src.rglob("*.rs") if f.name != "tests.rs"]
    modules = {module_path(src, f): f for f in files}
    deps = {m: references(m, code_of(f), modules) for m, f in modules.items()}
    problems = []
    parents = {m[:-1] for m in modules if m} | {()}
    for parent in parents:
        children = sorted({m[: len(parent) + 1] for m in modules if len(m) > len(parent) and m[: len(parent)] == parent})
        edges = {c: set() for c in children}
        for m, ds in deps.items():
            if len(m) <= len(parent) or m[: len(parent)] != parent:
                continue
            a = m[: len(parent) + 1]
            for d in ds:
                if len(d) > len(parent) and d[: len(parent)] == parent:
                    b = d[: len(parent) + 1]
                    if b != a:
                        edges[a].add(b)
        problems += find_cycles(edges)
    return problems


def find_cycles(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    crates = [Path(a) for a in sys.argv[1:]] or sorted((ROOT / "crates").iterdir())
    bad = 0
    for crate in crates:
        if not (crate / "src").is_dir():
            continue
        for comp in cycles_in(crate):
            bad += 1
            names = ", ".join("::".join(c) for c in comp)
            print(f"{crate.name}: modules import each other in a cycle: {names}")
    if bad:
        sys.exit(1)
    print(f"no module cycles in {len(crates)} crates")


if __name__ == "__main__":
    main()
