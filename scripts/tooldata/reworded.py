#!/usr/bin/env python3
"""Checks a reworded copy of written conversations against its original, and says how far the rewording moved
the requests away from the needed tools' own words.

    python3 scripts/tooldata/reworded.py ORIGINAL.jsonl REWORDED.jsonl CATALOGUE.json

A reworded case is `{"id": ORIGINAL_ID + "-r", ...}`: the same kind, the same `expected` and the same
messages, except its last user message, which must differ. Every original case that needs a tool and is of
kind single, multi, follow-up or near-miss must have one. The overlap printed is the share of the last user
message's words (three letters or more, names split at `_` and camelCase) found in the needed tools' names and
descriptions, averaged over the cases. Every error is one line naming the file and line; the exit status is 2.
Standard library only.
"""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare import Fail, Inputs  # noqa: E402

KINDS = ("single", "multi", "follow-up", "near-miss")


def words(text):
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).replace("_", " ").lower()
    return {w for w in re.findall(r"[a-z0-9]+", text) if len(w) > 2}


def last_user(messages):
    return max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)


def overlap(text, tool_words):
    said = words(text)
    return len(said & tool_words) / max(1, len(said))


def check(original_path, reworded_path, catalogue_path):
    """(reworded cases, mean overlap of the originals, mean overlap of the rewordings)."""
    inputs = Inputs()
    originals = {case["id"]: case for case in inputs.cases(original_path, "original")}
    text = {t["name"]: f"{t['name']} {t['description']}" for t in inputs.catalogue(catalogue_path, "catalogue")}
    seen, before, after = set(), [], []
    for case in inputs.cases(reworded_path, "reworded"):
        where = f"{reworded_path}:{case['_line']}"
        cid = case.get("id")
        if not isinstance(cid, str) or not cid.endswith("-r") or cid[:-2] not in originals:
            raise Fail(f"{where}: id: {cid!r} is not an id of {original_path} followed by '-r'")
        if cid in seen:
            raise Fail(f"{where}: id: {cid!r} is given twice")
        seen.add(cid)
        original = originals[cid[:-2]]
        for field in ("kind", "expected"):
            if case.get(field) != original.get(field):
                raise Fail(f"{where}: {field}: not the original's")
        messages, was = case.get("messages"), original["messages"]
        i = last_user(was)
        if i is None:
            raise Fail(f"{original_path}:{original['_line']}: messages: no user message to reword")
        if not isinstance(messages, list) or len(messages) != len(was) or last_user(messages) != i:
            raise Fail(f"{where}: messages: not the original's messages")
        if messages[:i] != was[:i] or messages[i + 1:] != was[i + 1:]:
            raise Fail(f"{where}: messages: a message other than the last user one differs from the original's")
        new, old = messages[i].get("content"), was[i]["content"]
        if not isinstance(new, str) or not new.strip() or new.strip() == old.strip():
            raise Fail(f"{where}: messages[{i}]: the last user message must be reworded, not empty or the same")
        tool_words = set().union(*(words(text.get(t, "")) for t in original["expected"]))
        before.append(overlap(old, tool_words))
        after.append(overlap(new, tool_words))
    missing = [k for k, c in originals.items() if c.get("expected") and c.get("kind") in KINDS and k + "-r" not in seen]
    if missing:
        raise Fail(f"{reworded_path}: {len(missing)} cases not reworded, the first {missing[0]!r}")
    if not seen:
        raise Fail(f"{reworded_path}: no cases")
    return len(seen), sum(before) / len(before), sum(after) / len(after)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("original")
    parser.add_argument("reworded")
    parser.add_argument("catalogue")
    args = parser.parse_args(argv)
    try:
        cases, before, after = check(args.original, args.reworded, args.catalogue)
    except Fail as e:
        print(f"reworded.py: {e}", file=sys.stderr)
        return 2
    print(f"{args.reworded}: {cases} cases reworded; the needed tools' words in the last user message: "
          f"{before:.3f} of them before, {after:.3f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
