#!/usr/bin/env python3
"""Route sets as training cases: each conversation scored against its set's routes, as `decide train` reads cases
that carry their own tools (`adapt.py --extra`).

    python3 scripts/routedata/cases.py [--dir scripts/routedata/train] --out FILE.jsonl
                                       [--unseen DIR ...]

A route set is `X.routes.json` (`{"default", "routes": [{"name", "description" | "descriptions"}]}`) beside
`X.cases.jsonl` (`{"id", "kind", "messages", "expected": ROUTE}` a line), the format of
crates/decide-eval/data/routes/. The router asks one choice question whose options are the routes: a route
with one description is one option named after it, a route with n > 1 descriptions gives options `route#1` …
`route#n`, each scored as `name: description`. So each case becomes

    {"id": "route-ID", "messages": [...], "tools": [{"name": OPTION, "description": TEXT}, ...],
     "expected": [the expected route's options]}

and the other routes of its set are the hard negatives it is trained against.

`--unseen DIR` names route sets that no training may read (the held-out report sets and the sets recipes are
chosen on): a training user message of three words or more that one of theirs repeats (case, spacing and
punctuation aside) is an error, so a copy cannot leak in. Every error is one line naming the file, line and
field, and the exit status is 2. Standard library only; the same inputs give the same bytes.
"""
import argparse
import json
import re
import sys
from collections import namedtuple
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tooldata"))
from prepare import Fail, json_objects  # noqa: E402

KINDS = ("single", "greeting", "chit-chat", "near-miss", "follow-up", "non-english")


def normal(text):
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def options(routes_path, spec):
    """[(option name, description, route name)] as the router names them; validates the routes file."""
    if not isinstance(spec, dict) or not isinstance(spec.get("routes"), list) or not spec["routes"]:
        raise Fail(f"{routes_path}: routes: a non-empty list is required")
    out, names = [], []
    for i, route in enumerate(spec["routes"]):
        where = f"{routes_path}: routes[{i}]"
        name = route.get("name") if isinstance(route, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise Fail(f"{where}.name: a non-blank string is required")
        if name in names:
            raise Fail(f"{where}.name: '{name}' is given twice")
        names.append(name)
        if ("description" in route) == ("descriptions" in route):
            raise Fail(f"{where}: give one of description and descriptions")
        texts = [route["description"]] if "description" in route else route["descriptions"]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise Fail(f"{where}: descriptions must be non-blank strings")
        if len(texts) == 1:
            out.append((name, texts[0], name))
        else:
            out.extend((f"{name}#{k}", t, name) for k, t in enumerate(texts, 1))
    if spec.get("default") not in names:
        raise Fail(f"{routes_path}: default: '{spec.get('default')}' is not one of the routes")
    return out


def user_texts(messages):
    return [m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]


def read_case(path, n, case, routes):
    where = f"{path}:{n}"
    if not isinstance(case.get("id"), str) or not case["id"].strip():
        raise Fail(f"{where}: id: a non-blank string is required")
    if case.get("kind") not in KINDS:
        raise Fail(f"{where}: kind: '{case.get('kind')}' is not one of {', '.join(KINDS)}")
    messages = case.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Fail(f"{where}: messages: a non-empty list is required")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system") \
                or not isinstance(m.get("content"), str) or not m["content"].strip():
            raise Fail(f"{where}: messages[{k}]: a user, assistant or system message with non-blank content is required")
    if messages[-1]["role"] != "user":
        raise Fail(f"{where}: messages: the last message must be the user's")
    if case.get("expected") not in routes:
        raise Fail(f"{where}: expected: '{case.get('expected')}' is not a route of the set")
    return case


# A route set as read: `options` are the router's (option name, description, route name).
RouteSet = namedtuple("RouteSet", "name routes_path default options cases_path cases")


def route_sets(folder):
    """[RouteSet] of every set in `folder`, sorted by name."""
    sets = []
    for routes_path in sorted(Path(folder).glob("*.routes.json")):
        name = routes_path.name[: -len(".routes.json")]
        cases_path = routes_path.with_name(f"{name}.cases.jsonl")
        if not cases_path.exists():
            raise Fail(f"{routes_path}: no {cases_path.name} beside it")
        try:
            spec = json.loads(routes_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise Fail(f"{routes_path}:{e.lineno}: not JSON ({e.msg})") from None
        opts = options(routes_path, spec)
        routes = {route for _, _, route in opts}
        objects = json_objects(cases_path.read_text(encoding="utf-8"), lambda n: f"{cases_path}:{n}")
        cases = [read_case(cases_path, n, case, routes) for n, case in objects]
        if not cases:
            raise Fail(f"{cases_path}: no cases")
        sets.append(RouteSet(name, routes_path, spec["default"], opts, cases_path, cases))
    if not sets:
        raise Fail(f"{folder}: no *.routes.json")
    return sets


def unseen_messages(folders):
    seen = {}
    for folder in folders:
        for route_set in route_sets(folder):
            cases_path = route_set.cases_path
            for case in route_set.cases:
                for text in user_texts(case["messages"]):
                    key = normal(text)
                    if len(key.split()) >= 3:
                        seen.setdefault(key, f"{cases_path} ({case['id']})")
    return seen


def training_cases(folder, unseen):
    out, ids = [], set()
    sets = route_sets(folder)
    for _, _, _, opts, cases_path, cases in sets:
        tools = [{"name": option, "description": text} for option, text, _ in opts]
        for n, case in enumerate(cases, 1):
            if case["id"] in ids:
                raise Fail(f"{cases_path}:{n}: id: '{case['id']}' is used twice")
            ids.add(case["id"])
            for text in user_texts(case["messages"]):
                if normal(text) in unseen:
                    raise Fail(f"{cases_path}:{n}: messages: '{text}' is also in {unseen[normal(text)]}")
            out.append({
                "id": f"route-{case['id']}",
                "messages": case["messages"],
                "tools": tools,
                "expected": [option for option, _, route in opts if route == case["expected"]],
            })
    return out, len(sets)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(Path(__file__).resolve().parent / "train"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--unseen", action="append", default=[], metavar="DIR")
    args = parser.parse_args(argv)
    try:
        cases, sets = training_cases(args.dir, unseen_messages(args.unseen))
    except Fail as e:
        print(f"cases.py: {e}", file=sys.stderr)
        return 2
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            for case in cases:
                f.write(json.dumps(case, ensure_ascii=False) + "\n")
    except OSError as e:
        print(f"cases.py: {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"{len(cases)} cases of {sets} route sets written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
