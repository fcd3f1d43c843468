#!/usr/bin/env python3
"""Tests of bfcl.py (BFCL's data as training cases) on a small wheel built in a temporary folder."""
import json
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "bfcl.py"
sys.path.insert(0, str(SCRIPT.parent))
from bfcl import IRRELEVANCE, LIVE, SUITES  # noqa: E402

D = "bfcl_eval/data"


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def fn(name, properties=None):
    return {"name": name, "description": f"does {name}",
            "parameters": {"type": "dict", "properties": properties or {}}}


class Bfcl(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        for part in ("own", "livemcpbench"):
            (self.root / "eval" / part).mkdir(parents=True)
            (self.root / "eval" / part / "tune.jsonl").write_text("")
            (self.root / "eval" / part / "report.jsonl").write_text(jsonl(
                [{"id": "r", "messages": [{"role": "user", "content": "a report question"}], "expected": []}]))
        self.members = {}
        for category in LIVE:
            rows, answers = [], []
            for i in range(10):
                text = "a report question" if (category, i) == ("live_simple", 0) else f"{category} ask {i}"
                rows.append({"id": f"{category}_{i}", "question": [[{"role": "user", "content": text}]],
                             "function": [fn("alpha"), fn("beta", {"x": {"type": "array", "description": "xs"}}),
                                          fn("alpha")]})
                answers.append({"id": f"{category}_{i}", "ground_truth": [{"beta": {"x": [1]}}, {"beta": {}}]})
            self.members[f"{D}/BFCL_v4_{category}.json"] = jsonl(rows)
            self.members[f"{D}/possible_answer/BFCL_v4_{category}.json"] = jsonl(answers)
        for suite, member in SUITES.items():
            self.members[f"{D}/multi_turn_func_doc/{member}"] = jsonl([fn(f"{suite}_a"), fn(f"{suite}_b")])
        self.members[f"{D}/BFCL_v4_multi_turn_base.json"] = jsonl([{
            "id": "multi_turn_base_0", "involved_classes": ["MathAPI", "TicketAPI"],
            "excluded_function": ["TicketAPI_b"],
            "question": [[{"role": "user", "content": "add them"}], [{"role": "user", "content": "now a ticket"}],
                         [{"role": "user", "content": "thanks"}]]}])
        self.members[f"{D}/possible_answer/BFCL_v4_multi_turn_base.json"] = jsonl([{
            "id": "multi_turn_base_0",
            "ground_truth": [["MathAPI_a(x=1)", "MathAPI_b(y='(')", "MathAPI_a(x=2)"], ["TicketAPI_a()"], []]}])
        for category in IRRELEVANCE:
            self.members[f"{D}/BFCL_v4_{category}.json"] = jsonl(
                [{"id": f"{category}_{i}", "question": [[{"role": "user", "content": f"{category} area {i}"}]],
                  "function": [fn("bmi", {"weight": {"type": "float"}})] if i else []} for i in range(9)])
        self.wheel = self.write_wheel(self.members)

    def tearDown(self):
        self.tmp.cleanup()

    def write_wheel(self, members, name="bfcl_eval-0-py3-none-any.whl"):
        path = self.root / name
        with zipfile.ZipFile(path, "w") as z:
            for member, text in sorted(members.items()):
                # A fixed date: a member named by a string is stamped with the clock, and two wheels
                # written either side of a two-second tick would differ in bytes and sha256.
                z.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), text)
        return path

    def run_bfcl(self, out, wheel=None):
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--wheel", str(wheel or self.wheel), "--eval-data", str(self.root / "eval"),
             "--out", str(self.root / out), "--heldout", "0.2"],
            capture_output=True, text=True)

    def lines(self, out, name):
        return [json.loads(l) for l in (self.root / out / name).read_text().splitlines()]

    def run_twice_to_the_same_bytes(self, *names):
        """Runs bfcl.py into `a` and `b`, and checks that each of `names` came out the same."""
        for out in ("a", "b"):
            done = self.run_bfcl(out)
            self.assertEqual(done.returncode, 0, done.stderr)
        for name in names:
            self.assertEqual((self.root / "a" / name).read_bytes(), (self.root / "b" / name).read_bytes())

    def test_cases_carry_their_tools_and_the_called_functions_and_the_same_seed_gives_the_same_bytes(self):
        self.run_twice_to_the_same_bytes("bfcl.jsonl", "heldout.jsonl", "summary.json")
        train, held = self.lines("a", "bfcl.jsonl"), self.lines("a", "heldout.jsonl")
        self.assertFalse({r["id"] for r in train} & {r["id"] for r in held})
        live = [r for r in train + held if r["id"].startswith("bfcl-live_")]
        # 40 live cases less the one whose conversation is a report part's.
        self.assertEqual(len(live), 39)
        self.assertEqual(live[0]["expected"], ["beta"])
        self.assertEqual([t["name"] for t in live[0]["tools"]], ["alpha", "beta"], "each name once")
        # The argument names are kept, and nothing else of the schema.
        self.assertNotIn("parameters", live[0]["tools"][0])
        self.assertEqual(live[0]["tools"][1]["parameters"], {"type": "object", "properties": {"x": {}}})
        turns = sorted((r for r in train + held if "multi_turn" in r["id"]), key=lambda r: r["id"])
        self.assertEqual([r["id"] for r in turns], ["bfcl-multi_turn_base_0-turn0", "bfcl-multi_turn_base_0-turn1"],
                         "a turn that calls nothing is left out")
        self.assertEqual(turns[0]["expected"], ["MathAPI_a", "MathAPI_b"])
        self.assertEqual(turns[1]["messages"], [{"role": "user", "content": "now a ticket"}])
        self.assertEqual([t["name"] for t in turns[1]["tools"]], ["MathAPI_a", "MathAPI_b", "TicketAPI_a"],
                         "the involved suites' functions, less the excluded")
        self.assertTrue(all(r["source"].startswith("bfcl-") for r in held))
        summary = json.loads((self.root / "a" / "summary.json").read_text())
        self.assertEqual(summary["categories"]["live_simple"]["eval_overlap"], 1)
        self.assertEqual(summary["categories"]["live_simple"]["held_out"], 2)

    def test_irrelevance_cases_need_no_tool_and_half_of_each_category_is_held_out(self):
        self.run_twice_to_the_same_bytes("irrelevance.jsonl", "irrelevance-heldout.jsonl", "irrelevance-summary.json")
        train, held = self.lines("a", "irrelevance.jsonl"), self.lines("a", "irrelevance-heldout.jsonl")
        # Nine a category, less the one without a function: four to train on, four held out.
        for category in IRRELEVANCE:
            self.assertEqual(sum(r["id"].startswith(f"bfcl-{category}_") for r in train), 4)
            self.assertEqual(sum(r["id"].startswith(f"bfcl-{category}_") for r in held), 4)
        self.assertFalse({r["id"] for r in train} & {r["id"] for r in held})
        self.assertTrue(all(r["expected"] == [] for r in train + held))
        self.assertEqual(train[0]["tools"], [{"name": "bmi", "description": "does bmi",
                                              "parameters": {"type": "object", "properties": {"weight": {}}}}])
        # The training file is the same whether or not the irrelevance cases are written.
        self.assertNotIn("irrelevance", (self.root / "a" / "bfcl.jsonl").read_text())

    def test_bad_input_is_a_one_line_error(self):
        members = dict(self.members)
        members[f"{D}/possible_answer/BFCL_v4_live_multiple.json"] = "{\"id\": \"live_multiple_0\"}\n"
        done = self.run_bfcl("c", self.write_wheel(members, "bad.whl"))
        self.assertEqual(done.returncode, 2)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1)
        self.assertIn("bad.whl!bfcl_eval/data/possible_answer/BFCL_v4_live_multiple.json:1: expected", done.stderr)
        (self.root / "not.whl").write_text("text")
        done = self.run_bfcl("d", self.root / "not.whl")
        self.assertEqual(done.returncode, 2)
        self.assertIn("not.whl: not a wheel", done.stderr)


if __name__ == "__main__":
    unittest.main()
