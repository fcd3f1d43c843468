#!/usr/bin/env python3
"""Tests of reworded.py on conversations written in a temporary folder."""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "reworded.py"
CATALOGUE = {"tools": [{"name": "list_containers", "description": "List running Docker containers"},
                       {"name": "create_issue", "description": "Create an issue in a repository"}]}
HISTORY = [{"role": "user", "content": "list the containers"},
           {"role": "assistant", "content": "web, db and cache are up."}]


def case(id, text, expected=("list_containers",), kind="single", history=()):
    return {"id": id, "kind": kind, "messages": [*history, {"role": "user", "content": text}],
            "expected": list(expected)}


ORIGINALS = [case("c1", "list the running containers"),
             case("c2", "now create an issue about the db container", ["create_issue"], "follow-up", HISTORY),
             case("c3", "what is docker?", [], "topical-no-tool")]


class Reworded(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.write("original.jsonl", ORIGINALS)
        (self.root / "catalogue.json").write_text(json.dumps(CATALOGUE))

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, cases):
        (self.root / name).write_text("".join(json.dumps(c) + "\n" for c in cases))

    def run_script(self, reworded):
        self.write("reworded.jsonl", reworded)
        return subprocess.run([sys.executable, str(SCRIPT), *(str(self.root / f) for f in
                               ("original.jsonl", "reworded.jsonl", "catalogue.json"))],
                              capture_output=True, text=True)

    def test_a_full_rewording_passes_and_reports_how_far_it_moved_from_the_tools_words(self):
        done = self.run_script([case("c1-r", "what's up on this box rn"),
                                case("c2-r", "log that the db one keeps dying", ["create_issue"], "follow-up",
                                     HISTORY)])
        self.assertEqual(done.returncode, 0, done.stderr)
        # Words of three letters or more: "list the running containers" has 3 of its 4 in the tool's
        # text, "now create an issue about the db container" 2 of 6; the rewordings have none.
        self.assertIn("2 cases reworded", done.stdout)
        self.assertIn("0.542 of them before, 0.000 after", done.stdout)

    def test_a_changed_label_is_an_error_naming_the_line(self):
        done = self.run_script([case("c1-r", "what's up on this box", ["create_issue"])])
        self.assertEqual(done.returncode, 2)
        self.assertIn("reworded.jsonl:1: expected: not the original's", done.stderr)

    def test_only_the_last_user_message_may_change(self):
        history = [HISTORY[0], {"role": "assistant", "content": "web and db are up."}]
        done = self.run_script([case("c1-r", "what's up on this box"),
                                case("c2-r", "log that the db one keeps dying", ["create_issue"], "follow-up",
                                     history)])
        self.assertEqual(done.returncode, 2)
        self.assertIn("reworded.jsonl:2: messages: a message other than the last user one differs", done.stderr)

    def test_an_unchanged_request_is_an_error(self):
        done = self.run_script([case("c1-r", "list the running containers ")])
        self.assertEqual(done.returncode, 2)
        self.assertIn("reworded.jsonl:1: messages[0]: the last user message must be reworded", done.stderr)

    def test_every_case_needing_a_tool_must_be_reworded(self):
        done = self.run_script([case("c1-r", "what's up on this box rn")])
        self.assertEqual(done.returncode, 2)
        self.assertEqual(done.stderr.strip().splitlines(),
                         [f"reworded.py: {self.root / 'reworded.jsonl'}: 1 cases not reworded, the first 'c2'"])


if __name__ == "__main__":
    unittest.main()
