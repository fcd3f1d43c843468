#!/usr/bin/env python3
"""Measures tool-selection models side by side and prints the tables of docs/models.md (markdown).

    python3 scripts/tooldata/report.py [--decide target/release/decide] [--data target/tool-model/data]
                                       [--seen-in TRAIN.jsonl ...] [--json OUT.json] MODEL [MODEL ...]

For each model, with `decide --model MODEL eval --json`:

* the report parts (never trained, tuned or chosen on): own report at the model's default threshold,
  LiveMCPBench report, each with `--seen-in` the training files (tools named in training vs not;
  `DATA/train.jsonl` unless `--seen-in` names them, as both stages' files for a two-stage model),
  and `--target-recall` 0.9 / 0.95 / 0.99 (achieved recall and mean set size);
* the parts held out by tool (tools that training never saw), per source, and the own tune part:
  what recipes and epochs were chosen on;
* with `--bfcl DIR` (scripts/tooldata/bfcl.py's --out), BFCL's held-out cases per category, each
  against its own functions.

The held-out files come from scripts/tooldata/prepare.py (its --out folder, here --data). A model
without a conformal table gets "-" in the target-recall rows.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

EVAL = "crates/decide-eval/data"
OWN = (f"{EVAL}/own/report.jsonl", f"{EVAL}/own/catalogue.json")
LIVE = (f"{EVAL}/livemcpbench/report.jsonl", f"{EVAL}/livemcpbench/catalogue.json")
OWN_TUNE = (f"{EVAL}/own/tune.jsonl", f"{EVAL}/own/catalogue.json")
TARGETS = [0.9, 0.95, 0.99]


def fail(message):
    print(f"report.py: {message}", file=sys.stderr)
    sys.exit(2)


def run_eval(decide, model, data, tools=None, extra=()):
    cmd = [decide, "--model", model, "eval", "--data", data, "--json", *extra]
    if tools:
        cmd += ["--tools", tools]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        line = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, line
    return json.loads(done.stdout), None


def split_heldout(data, script):
    """DATA/heldout.jsonl, one file per "source" in order of appearance (a scratch folder)."""
    path = os.path.join(data, "heldout.jsonl")
    if not os.path.isfile(path):
        fail(f"{path}: missing; run scripts/tooldata/{script} --out {data} first")
    out = tempfile.mkdtemp(prefix="decide-report-")
    files = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                source = json.loads(line)["source"]
            except (ValueError, KeyError, TypeError) as e:
                fail(f"{path}:{n}: {e}")
            if not isinstance(source, str) or not source.replace("_", "").replace("-", "").isalnum():
                fail(f"{path}:{n}: \"source\" is not a plain name")
            if source not in files:
                files[source] = open(os.path.join(out, f"{source}.jsonl"), "w", encoding="utf-8")
            files[source].write(line)
    for f in files.values():
        f.close()
    return {s: os.path.join(out, f"{s}.jsonl") for s in files}


def fmt(v):
    return "-" if v is None else f"{v:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decide", default="target/release/decide")
    ap.add_argument("--data", default="target/tool-model/data")
    ap.add_argument("--bfcl", metavar="DIR", help="scripts/tooldata/bfcl.py's --out: also its held-out cases")
    ap.add_argument("--json", help="also write every report as JSON here")
    ap.add_argument("--seen-in", action="append", metavar="TRAIN.jsonl",
                    help="training files whose tools count as seen (repeat; default: DATA/train.jsonl)")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    seen_in = [x for t in (a.seen_in or [os.path.join(a.data, "train.jsonl")]) for x in ("--seen-in", t)]
    heldout = split_heldout(a.data, "prepare.py")
    bfcl = {f"BFCL {s.removeprefix('bfcl-')}": p for s, p in split_heldout(a.bfcl, "bfcl.py").items()} if a.bfcl else {}
    everything = {}
    for model in a.models:
        r = everything.setdefault(model, {})
        for key, (data, tools) in (("own", OWN), ("live", LIVE)):
            rep, err = run_eval(a.decide, model, data, tools, seen_in)
            if err:
                fail(f"{model} on {data}: {err}")
            r[key] = rep
            for t in TARGETS:
                rep, err = run_eval(a.decide, model, data, tools, ["--target-recall", str(t)])
                r[f"{key}@{t}"] = rep
        rep, err = run_eval(a.decide, model, *OWN_TUNE)
        r["own_tune"] = rep
        for s, path in {**heldout, **bfcl}.items():
            rep, err = run_eval(a.decide, model, path)
            if err:
                fail(f"{model} on {path}: {err}")
            r[s] = rep
        print(f"measured {model}", file=sys.stderr)

    print("Report parts (never trained, tuned or chosen on), default threshold:\n")
    print("| model | set | top-1 | recall@10 | MRR | precision | recall | no-tool cases empty | tools selected | ECE |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, r in everything.items():
        for key, name in (("own", "own report (145)"), ("live", "LiveMCPBench report (59)")):
            e = r[key]
            print(f"| {model} | {name} | {fmt(e['top1_accuracy'])} | {fmt(e['recall_at_10'])} | {fmt(e['mrr'])} "
                  f"| {fmt(e['precision'])} | {fmt(e['recall'])} | {fmt(e['no_tool_none_selected'])} "
                  f"| {e['mean_selected']:.2f} | {fmt(e['ece'])} |")
    print("\nSeen in training or not (`--seen-in`), report parts:\n")
    print("| model | set | seen pairs | seen recall@10 | seen MRR | unseen pairs | unseen recall@10 | unseen MRR |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, r in everything.items():
        for key, name in (("own", "own report"), ("live", "LiveMCPBench report")):
            s = r[key].get("seen_in") or {}
            seen, unseen = s.get("seen") or {}, s.get("unseen") or {}
            print(f"| {model} | {name} | {seen.get('needed', 0)} | {fmt(seen.get('recall_at_10'))} | {fmt(seen.get('mrr'))} "
                  f"| {unseen.get('needed', 0)} | {fmt(unseen.get('recall_at_10'))} | {fmt(unseen.get('mrr'))} |")
    print("\n`--target-recall R` on the report parts: achieved recall / cases with every needed tool / mean tools "
          "selected:\n")
    print("| model | set | " + " | ".join(f"R = {t}" for t in TARGETS) + " |")
    print("|---|---|" + "---:|" * len(TARGETS))
    for model, r in everything.items():
        for key, name in (("own", "own report"), ("live", "LiveMCPBench report")):
            cells = []
            for t in TARGETS:
                e = r.get(f"{key}@{t}")
                cells.append("-" if not e else
                             f"{fmt(e['recall'])} / {fmt(e.get('all_needed_selected'))} / {e['mean_selected']:.1f}")
            print(f"| {model} | {name} | " + " | ".join(cells) + " |")
    print("\nHeld out by tool (tools training never saw; 40 tools a case), the own tune part (what the recipe was "
          "chosen on) and BFCL's held-out cases (each against its own functions):\n")
    print("| model | set | cases | top-1 | recall@3 | recall@10 | MRR | recall at threshold | tools selected |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for model, r in everything.items():
        for key in [*heldout, "own_tune", *bfcl]:
            e = r.get(key)
            if not e:
                continue
            name = "own tune (74)" if key == "own_tune" else key
            print(f"| {model} | {name} | {e['cases']} | {fmt(e['top1_accuracy'])} | {fmt(e['recall_at_3'])} "
                  f"| {fmt(e['recall_at_10'])} | {fmt(e['mrr'])} | {fmt(e['recall'])} | {e['mean_selected']:.2f} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
