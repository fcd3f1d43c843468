#!/usr/bin/env python3
"""Tests of cases.py (route sets as training cases) and of the route report's reading of the same sets, on route sets
written in a temporary folder."""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "cases.py"

ROUTES = {
    "default": "chat",
    "routes": [
        {"name": "chat", "description": "Anything else"},
        {"name": "code", "descriptions": ["Writing code", "Fixing errors"]},
    ],
}


def case(id, expected, *texts, kind="single"):
    roles = ["user", "assistant"] * len(texts)
    return {"id": id, "kind": kind, "messages": [{"role": r, "content": t} for r, t in zip(roles, texts)],
            "expected": expected}


class Cases(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.train = self.root / "train"
        self.train.mkdir()
        self.write("dev", ROUTES, [case("d1", "code", "fix my python import error please"),
                                   case("d2", "chat", "hi there", kind="greeting")])

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, routes, cases, folder=None):
        folder = folder or self.train
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.routes.json").write_text(json.dumps(routes))
        (folder / f"{name}.cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))

    def run_script(self, *extra):
        out = self.root / "out.jsonl"
        done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(self.train), "--out", str(out), *extra],
                              capture_output=True, text=True)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else None
        return done, rows

    def test_each_case_is_scored_against_its_sets_options_as_the_router_names_them(self):
        done, rows = self.run_script()
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("2 cases of 1 route sets", done.stderr)
        options = [{"name": "chat", "description": "Anything else"},
                   {"name": "code#1", "description": "Writing code"},
                   {"name": "code#2", "description": "Fixing errors"}]
        self.assertEqual(rows[0], {"id": "route-d1", "messages": [
            {"role": "user", "content": "fix my python import error please"}], "tools": options,
            "expected": ["code#1", "code#2"]})
        self.assertEqual(rows[1]["expected"], ["chat"])

    def test_the_same_sets_give_the_same_bytes(self):
        self.write("another", {"default": "a", "routes": [{"name": "a", "description": "A things"}]},
                   [case("a1", "a", "something about a")])
        self.run_script()
        first = (self.root / "out.jsonl").read_bytes()
        self.run_script()
        self.assertEqual(first, (self.root / "out.jsonl").read_bytes())
        self.assertEqual([json.loads(l)["id"] for l in first.decode().splitlines()], ["route-a1", "route-d1", "route-d2"])

    def test_a_message_of_an_unseen_set_may_not_be_trained_on(self):
        unseen = self.root / "held-out"
        self.write("held", ROUTES, [case("h1", "code", "Fix my Python import error, please!")], folder=unseen)
        done, _ = self.run_script("--unseen", str(unseen))
        self.assertEqual(done.returncode, 2)
        self.assertIn("dev.cases.jsonl:1: messages: 'fix my python import error please' is also in", done.stderr)
        self.assertIn("held.cases.jsonl (h1)", done.stderr)

    def test_short_messages_may_repeat_an_unseen_sets(self):
        unseen = self.root / "held-out"
        self.write("held", ROUTES, [case("h1", "chat", "hi there", kind="greeting")], folder=unseen)
        done, rows = self.run_script("--unseen", str(unseen))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(len(rows), 2)

    def test_bad_sets_are_one_line_errors_naming_the_place(self):
        bad = [
            ({"default": "nope", "routes": ROUTES["routes"]}, [], "dev.routes.json: default: 'nope' is not one of the routes"),
            ({"default": "chat", "routes": [{"name": "chat", "description": " "}]}, [],
             "dev.routes.json: routes[0]: descriptions must be non-blank strings"),
            ({"default": "chat", "routes": [{"name": "chat", "description": "x", "descriptions": ["y"]}]}, [],
             "dev.routes.json: routes[0]: give one of description and descriptions"),
            (ROUTES, [case("d1", "legal", "is this legal")], "dev.cases.jsonl:1: expected: 'legal' is not a route of the set"),
            (ROUTES, [case("d1", "chat", "hi", "hello!")], "dev.cases.jsonl:1: messages: the last message must be the user's"),
            (ROUTES, [case("d1", "chat", "hi", kind="smalltalk")], "dev.cases.jsonl:1: kind: 'smalltalk' is not one of"),
            (ROUTES, [case("d1", "chat", "hi"), case("d1", "chat", "hello")], "dev.cases.jsonl:2: id: 'd1' is used twice"),
        ]
        for routes, cases, message in bad:
            with self.subTest(message):
                self.write("dev", routes, cases)
                done, _ = self.run_script()
                self.assertEqual(done.returncode, 2)
                self.assertIn(message, done.stderr)
                self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)

    def test_a_cases_file_that_is_not_json_names_its_line(self):
        (self.train / "dev.cases.jsonl").write_text(json.dumps(case("d1", "chat", "hi")) + "\n{oops\n")
        done, _ = self.run_script()
        self.assertEqual(done.returncode, 2)
        self.assertIn("dev.cases.jsonl:2: invalid JSON", done.stderr)

    def test_an_output_that_cannot_be_written_is_a_one_line_error(self):
        done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(self.train),
                               "--out", str(self.root / "missing" / "out.jsonl")], capture_output=True, text=True)
        self.assertEqual(done.returncode, 2)
        self.assertIn("out.jsonl: No such file or directory", done.stderr)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)

    def test_a_routes_file_without_its_cases_is_an_error(self):
        (self.train / "dev.cases.jsonl").unlink()
        done, _ = self.run_script()
        self.assertEqual(done.returncode, 2)
        self.assertIn("dev.routes.json: no dev.cases.jsonl beside it", done.stderr)

    def test_the_route_report_reads_route_sets_as_training_does(self):
        # A kind training would refuse fails the report too, as one line, before any decision runs.
        self.write("dev", ROUTES, [case("d1", "code", "fix my python import error please", kind="rant")])
        report = SCRIPT.parent.parent / "route_report.py"
        done = subprocess.run([sys.executable, str(report), "--dir", str(self.train), "--decide", "/nonexistent",
                               "bm25"], capture_output=True, text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertEqual(done.stderr.strip().splitlines(), [
            f"route_report.py: {self.train / 'dev.cases.jsonl'}:1: kind: 'rant' is not one of "
            "single, greeting, chit-chat, near-miss, follow-up, non-english"])


if __name__ == "__main__":
    unittest.main()
