#!/usr/bin/env python3
"""Converts τ²-bench's customer-service tasks (as copied, MIT, into the `inspect-evals` wheel on
PyPI, MIT) into `decide train` cases, for the MCP adaptation stage.

    python3 scripts/tooldata/tau2.py --wheel inspect_evals-0.28.0-py3-none-any.whl \
        --eval-data crates/decide-eval/data --out OUT [--heldout 0.1] [--seed 42]

The wheel is read as a zip archive and its Python as text (`ast`): it is never installed or
imported, so nothing of it runs here.

Each task of the `airline` and `retail` domains becomes one case:

* the message: τ² gives no user turn, only instructions for a simulated user. The case's single
  user message is the instructions' `reason_for_call`, then `known_info` (both already written to
  the user, "You want to ..."), joined with a space and otherwise as written. `task_instructions`
  and `unknown_info` are left out: they tell the simulator how to behave, they ask for nothing;
* the tools: the domain's agent tools, as the evaluation hands them to the agent (the
  `all_<domain>_tools` list of `inspect_evals/tau2/<domain>/tools.py`, which adds the shared
  `calculate` and `transfer_to_human_agents` to the domain's own), each with its name and the first
  paragraph of its docstring; so a case's negatives are the tools an agent really had beside the
  right ones. No parameters, as `bfcl.py` writes none: the engine scores names and descriptions;
* the expected tools: the distinct names of `evaluation_criteria.actions` the assistant makes, in
  order of first appearance. An action without `requestor` is the assistant's (τ²'s `Action`
  defaults it so); the user's own actions are dropped. A task that leaves the assistant no action
  is dropped and counted.

Domains not used: `telecom` (template-generated tasks, mostly about actions on the user's own
phone), `mock` (a test fixture) and `banking_knowledge`, whose user instructions are one free-form
role-play script (character, situation, a scripted "How to Behave") with no `reason_for_call` to
take as the request, and whose assistant actions are mostly the generic
`call_discoverable_agent_tool` / `unlock_discoverable_agent_tool`. A domain without structured
instructions is an error, not a guess.

Writes to `--out`:

- `tau2.jsonl`: the training cases (`{"id", "messages", "tools", "expected"}`);
- `heldout.jsonl`: `--heldout` of the cases (seeded, per domain), never trained on, with a
  `source` field, to measure on;
- `summary.json`: the counts, the seed and the sha256 of every input.

No conversation of a report part (or of the tuning parts) is taken: those are checked and counted.
Deterministic: the same wheel, options and seed give byte-identical files.
"""

import argparse
import ast
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bfcl import Wheel as ZipWheel, eval_conversations  # noqa: E402
from prepare import Fail, hold_out, keep_cases, rng_for, unique, write_split  # noqa: E402

PACKAGE = "inspect_evals/tau2"
DOMAINS = ["airline", "retail"]


class Wheel(ZipWheel):
    """bfcl.py's wheel (read once, hashed, named in errors as WHEEL!MEMBER), for τ²'s JSON and
    Python members."""

    def text(self, member: str) -> str:
        try:
            return self.zip.read(member).decode("utf-8")
        except KeyError:
            raise Fail(f"{self.path}!{member}: missing from the wheel") from None
        except UnicodeDecodeError:
            raise Fail(f"{self.path}!{member}: not UTF-8 text") from None

    def json(self, member: str):
        try:
            return json.loads(self.text(member))
        except json.JSONDecodeError as e:
            raise Fail(f"{self.path}!{member}:{e.lineno}: invalid JSON: {e.msg}") from None

    def module(self, member: str) -> ast.Module:
        try:
            return ast.parse(self.text(member), filename=member)
        except SyntaxError as e:
            raise Fail(f"{self.path}!{member}:{e.lineno}: not Python: {e.msg}") from None


def first_paragraph(doc: str) -> str:
    # τ²'s docstrings wrap their first paragraph over several lines (one indents a list); a
    # description is one line.
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def tool_description(wheel: Wheel, member: str, name: str) -> str:
    """The description inspect_ai gives the model for the `@tool` function `name` of `member`:
    the docstring of the function it returns."""
    at = f"{wheel.path}!{member}"
    module = wheel.module(member)
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            inner = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            doc = ast.get_docstring(inner[0]) if inner else None
            if not doc or not first_paragraph(doc):
                raise Fail(f"{at}:{node.lineno}: tool {name!r} has no docstring to describe it")
            return first_paragraph(doc)
    # Shared tools are imported from a sibling module of the package, by absolute name.
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == name and a.asname is None for a in node.names):
            if not (node.module or "").startswith("inspect_evals.tau2."):
                raise Fail(f"{at}:{node.lineno}: tool {name!r} is imported from outside the tau2 package")
            return tool_description(wheel, node.module.replace(".", "/") + ".py", name)
    raise Fail(f"{at}: tool {name!r} is neither defined nor imported there")


def agent_tools(wheel: Wheel, domain: str) -> list[dict]:
    member = f"{PACKAGE}/{domain}/tools.py"
    listing = f"all_{domain}_tools"
    for node in wheel.module(member).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == listing for t in node.targets):
            if not isinstance(node.value, ast.List) or not all(isinstance(e, ast.Name) for e in node.value.elts):
                raise Fail(f"{wheel.path}!{member}:{node.lineno}: {listing}: expected a list of tool names")
            names = unique([e.id for e in node.value.elts])
            return [{"name": n, "description": tool_description(wheel, member, n)} for n in names]
    raise Fail(f"{wheel.path}!{member}: no {listing} list")


def user_message(at: str, instructions) -> list[dict]:
    if not isinstance(instructions, dict) or not isinstance(instructions.get("reason_for_call"), str) \
            or not instructions["reason_for_call"].strip():
        raise Fail(f"{at}: user_scenario.instructions: expected an object with a reason_for_call")
    known = instructions.get("known_info")
    if known is not None and not isinstance(known, str):
        raise Fail(f"{at}: user_scenario.instructions.known_info: expected text or null")
    # Only the ends are trimmed, so that the join leaves a single space; the text is kept as written.
    parts = [instructions["reason_for_call"].strip()] + ([known.strip()] if known and known.strip() else [])
    return [{"role": "user", "content": " ".join(parts)}]


def assistant_actions(at: str, criteria) -> tuple[list[str], int]:
    """The distinct names of the assistant's actions, and how many of the user's were dropped."""
    actions = criteria.get("actions") if isinstance(criteria, dict) else None
    if actions is None:
        actions = []
    if not isinstance(actions, list):
        raise Fail(f"{at}: evaluation_criteria.actions: expected a list")
    names, dropped = [], 0
    for a in actions:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or not a["name"].strip():
            raise Fail(f"{at}: evaluation_criteria.actions: an action without a name")
        requestor = a.get("requestor", "assistant")
        if requestor == "user":
            dropped += 1
        elif requestor == "assistant":
            names.append(a["name"])
        else:
            raise Fail(f"{at}: action {a['name']!r}: requestor {requestor!r}: expected \"assistant\" or \"user\"")
    return unique(names), dropped


def domain_cases(wheel: Wheel, domain: str, tools: list[dict], count: dict):
    member = f"{PACKAGE}/data/domains/{domain}/tasks.json"
    tasks = wheel.json(member)
    if not isinstance(tasks, list):
        raise Fail(f"{wheel.path}!{member}: expected a list of tasks")
    names = {t["name"] for t in tools}
    for k, task in enumerate(tasks):
        task_id = task.get("id") if isinstance(task, dict) else None
        if not isinstance(task_id, str) or not task_id:
            raise Fail(f"{wheel.path}!{member}: task {k}: no id")
        at = f"{wheel.path}!{member}: task {task_id!r}"
        scenario = task.get("user_scenario")
        messages = user_message(at, scenario.get("instructions") if isinstance(scenario, dict) else None)
        expected, dropped = assistant_actions(at, task.get("evaluation_criteria"))
        count["user_actions_dropped"] += dropped
        unknown = [n for n in expected if n not in names]
        if unknown:
            raise Fail(f"{at}: expected tool {unknown[0]!r} is not among the {domain} agent's tools")
        yield f"tau2/{domain}/{task_id}", messages, expected


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", required=True, help="the inspect-evals wheel (pip download inspect-evals)")
    parser.add_argument("--eval-data", required=True, help="crates/decide-eval/data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--heldout", type=float, default=0.1, help="share of each domain held out")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if not 0 <= args.heldout < 1:
        raise Fail(f"--heldout {args.heldout}: expected 0 <= share < 1")

    wheel = Wheel(args.wheel)
    evals = eval_conversations(args.eval_data)
    train, heldout, counts = [], [], {}
    for domain in DOMAINS:
        tools = agent_tools(wheel, domain)
        count = {"tasks": 0, "tools": len(tools), "user_actions_dropped": 0, "no_call": 0,
                 "eval_overlap": 0, "duplicate": 0}
        cases = ((case_id, messages, tools, expected)
                 for case_id, messages, expected in domain_cases(wheel, domain, tools, count))
        kept = keep_cases(cases, evals, count, total="tasks")
        trained, held = hold_out(kept, args.heldout, rng_for(args.seed, "tau2", "heldout", domain), f"tau2-{domain}")
        train += trained
        heldout += held
        count.update(trained=len(trained), held_out=len(held))
        counts[domain] = count
    rng_for(args.seed, "tau2", "shuffle").shuffle(train)

    summary = {"seed": args.seed, "heldout": args.heldout, "domains": counts,
               "wheel": os.path.basename(args.wheel), "wheel_sha256": wheel.sha256}
    write_split(args.out, "tau2.jsonl", train, heldout, summary, counts)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"tau2.py: {e}", file=sys.stderr)
        sys.exit(2)
