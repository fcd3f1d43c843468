#!/usr/bin/env python3
"""Route report: how often `decide route` sends held-out conversations to the route an operator wants.

For every `X.routes.json` / `X.cases.jsonl` pair in the routes folder (default
crates/decide-eval/data/routes), each conversation is written to a temporary file and routed with

    decide --model MODEL route --routes X.routes.json --messages FILE --json

once per MODEL given. The result is a markdown table of the share routed right per set and kind, per set, per kind
over all sets, and overall, one column per model.

Cases are JSON lines: {"id", "kind", "messages": [OpenAI chat messages], "expected": ROUTE_NAME}.

    scripts/route_report.py decide-tools-minilm all-MiniLM-L6-v2 bm25
    scripts/route_report.py decide-tools-minilm --max-messages 1 --errors --json /tmp/routes.json

Standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "routedata"))
from cases import route_sets  # noqa: E402
from prepare import Fail  # noqa: E402  (cases.py puts scripts/tooldata on the path)
KIND_ORDER = ["single", "greeting", "chit-chat", "near-miss", "follow-up", "non-english"]


def load_sets(folder, only):
    """The route sets of `folder` (all of them validated, as training reads them), those named in `only` if any."""
    sets = []
    for route_set in route_sets(folder):
        if not only or route_set.name in only:
            sets.append({"name": route_set.name, "routes": route_set.routes_path, "default": route_set.default,
                         "cases": route_set.cases})
    return sets


def route_one(args, model, routes_path, default, case, tmpdir):
    path = os.path.join(tmpdir, f"{model.replace('/', '_')}-{case['id']}.json")
    with open(path, "w") as f:
        json.dump(case["messages"], f, ensure_ascii=False)
    cmd = [args.decide, "--model", model, "route", "--routes", str(routes_path), "--messages", path, "--json"]
    if args.max_messages is not None:
        cmd += ["--max-messages", str(args.max_messages)]
    cmd += args.extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["exit %d" % proc.returncode]}
    out = json.loads(proc.stdout)
    route = out.get("route") or default
    return {"route": route, "probabilities": out.get("probabilities", {})}


def frac(right, total):
    return f"{right / total:.2f} ({right}/{total})" if total else "–"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["decide-tools-minilm"], help="models, side by side (bm25 works)")
    p.add_argument("--dir", type=Path, default=ROOT / "crates/decide-eval/data/routes")
    p.add_argument("--decide", default=str(ROOT / "target/release/decide"))
    p.add_argument("--set", action="append", help="only this set (repeatable)")
    p.add_argument("--max-messages", type=int, help="passed to decide route (its default: 1, the last message)")
    p.add_argument("--jobs", type=int, default=2, help="processes at once")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write every decision and the shares as JSON")
    p.add_argument("--errors", action="store_true", help="list the misrouted cases after the table")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="further options for decide route")
    args = p.parse_args()

    try:
        sets = load_sets(args.dir, set(args.set or []))
    except Fail as e:
        sys.exit(f"route_report.py: {e}")
    if not sets:
        sys.exit(f"route_report.py: {args.dir}: no route set named {', '.join(sorted(args.set))}")

    results = {}  # (model, set, id) -> result
    with tempfile.TemporaryDirectory(prefix="route_report-") as tmpdir, ThreadPoolExecutor(args.jobs) as pool:
        futures = {}
        for model in args.models:
            for s in sets:
                for case in s["cases"]:
                    fut = pool.submit(route_one, args, model, s["routes"], s["default"], case, tmpdir)
                    futures[(model, s["name"], case["id"])] = fut
        for key, fut in futures.items():
            results[key] = fut.result()

    failures = [(k, r["error"]) for k, r in results.items() if "error" in r]
    for (model, sname, cid), err in failures[:10]:
        print(f"error: {model} {sname}/{cid}: {err[0]}", file=sys.stderr)
    if failures:
        print(f"{len(failures)} decisions failed (counted as wrong)", file=sys.stderr)

    # tallies[model][(set, kind)] = [right, total]; set "*" and kind "*" aggregate
    tallies = {m: defaultdict(lambda: [0, 0]) for m in args.models}
    for model in args.models:
        for s in sets:
            for case in s["cases"]:
                ok = results[(model, s["name"], case["id"])].get("route") == case["expected"]
                for key in [(s["name"], case["kind"]), (s["name"], "*"), ("*", case["kind"]), ("*", "*")]:
                    tallies[model][key][0] += ok
                    tallies[model][key][1] += 1

    def kinds_of(cases):
        present = {c["kind"] for c in cases}
        return [k for k in KIND_ORDER if k in present] + sorted(present - set(KIND_ORDER))

    header = "| set | kind | " + " | ".join(args.models) + " |"
    lines = [header, "|---|---|" + "---:|" * len(args.models)]
    rows = []
    for s in sets:
        for kind in kinds_of(s["cases"]):
            rows.append((s["name"], kind, s["name"], kind))
        rows.append((f"**{s['name']}**", "all", s["name"], "*"))
    all_cases = [c for s in sets for c in s["cases"]]
    for kind in kinds_of(all_cases):
        rows.append(("all sets", kind, "*", kind))
    rows.append(("**all sets**", "**all**", "*", "*"))
    for label_set, label_kind, sk, kk in rows:
        cells = [frac(*tallies[m][(sk, kk)]) for m in args.models]
        lines.append(f"| {label_set} | {label_kind} | " + " | ".join(cells) + " |")
    mm = args.max_messages if args.max_messages is not None else "1 (default)"
    print(f"Routed right, share (right/total); --max-messages {mm}\n")
    print("\n".join(lines))

    if args.errors:
        print("\nMisrouted:\n")
        print("| model | case | kind | expected | routed | p(routed) | last user turn |")
        print("|---|---|---|---|---|---:|---|")
        for model in args.models:
            for s in sets:
                for case in s["cases"]:
                    r = results[(model, s["name"], case["id"])]
                    if r.get("route") == case["expected"]:
                        continue
                    last = next((m for m in reversed(case["messages"]) if m["role"] == "user"), {"content": ""})
                    text = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
                    text = text.replace("|", "\\|").replace("\n", " ")[:70]
                    prob = r.get("probabilities", {}).get(r.get("route"), float("nan"))
                    print(f"| {model} | {case['id']} | {case['kind']} | {case['expected']} | {r.get('route', 'ERROR')} "
                          f"| {prob:.2f} | {text} |")

    if args.json_out:
        out = {
            "max_messages": args.max_messages,
            "models": args.models,
            "shares": {
                m: {f"{sk}/{kk}": {"right": v[0], "total": v[1], "share": v[0] / v[1]} for (sk, kk), v in t.items()}
                for m, t in tallies.items()
            },
            "decisions": [
                {"model": m, "set": sn, "id": cid, "expected": next(c["expected"] for s in sets if s["name"] == sn
                                                                  for c in s["cases"] if c["id"] == cid), **r}
                for (m, sn, cid), r in results.items()
            ],
        }
        Path(args.json_out).write_text(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
