#!/usr/bin/env python3
"""Tests of adapt.py (the MCP adaptation stage's training file) on small data in a temporary folder."""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "adapt.py"


def write_jsonl(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def case(i, expected, text=None):
    return {"id": i, "messages": [{"role": "user", "content": text or f"request {i}"}], "expected": expected}


class Adapt(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = Path(self.tmp.name)
        self.root = root
        general = [dict(case(f"g{i}", ["t1"]), tools=[{"name": "t1", "description": "a tool"}]) for i in range(20)]
        general.append(dict(case("livemcpbench-x", ["t1"]), tools=[{"name": "t1", "description": "a tool"}]))
        write_jsonl(root / "data" / "train.jsonl", general)
        for part, tool in [("own", "read_file"), ("livemcpbench", "get-tickets")]:
            (root / "eval" / part).mkdir(parents=True)
            schema = {"type": "object", "properties": {"path": {"type": "string"}, "head": {"type": "number"}}}
            (root / "eval" / part / "catalogue.json").write_text(json.dumps(
                {"tools": [{"name": tool, "description": "d", "inputSchema": schema},
                           {"name": "other", "description": "e"}]}))
            write_jsonl(root / "eval" / part / "tune.jsonl",
                        [case(f"{part}-{i}", [tool] if i % 3 else []) for i in range(9)])
            write_jsonl(root / "eval" / part / "report.jsonl", [case(f"{part}-report", [tool])])
        write_jsonl(root / "no-tool.jsonl", [case(f"n{i}", []) for i in range(4)])
        (root / "tools.json").write_text(json.dumps([{"name": "x", "description": "y"}]))

    def tearDown(self):
        self.tmp.cleanup()

    def run_adapt(self, out, *extra):
        r = self.root
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--data", str(r / "data"), "--eval-data", str(r / "eval"),
             "--no-tool", str(r / "no-tool.jsonl"), "--tools", str(r / "tools.json"), "--out", str(r / out),
             "--replay", "5", "--repeat", "3", *extra],
            capture_output=True, text=True)

    def lines(self, out, name):
        return [json.loads(l) for l in (self.root / out / name).read_text().splitlines()]

    def test_mcp_cases_are_repeated_over_a_replay_and_the_same_seed_gives_the_same_bytes(self):
        self.assertEqual(self.run_adapt("a").returncode, 0)
        self.assertEqual(self.run_adapt("b").returncode, 0)
        self.assertEqual((self.root / "a" / "adapt.jsonl").read_bytes(), (self.root / "b" / "adapt.jsonl").read_bytes())
        rows = self.lines("a", "adapt.jsonl")
        ids = [r["id"] for r in rows]
        self.assertEqual(len(ids), len(set(ids)), "ids are unique, repeats included")
        self.assertEqual(len(rows), 5 + 3 * (9 + 9 + 4))
        self.assertNotIn("livemcpbench-x", ids, "the general file's LiveMCPBench cases are not replayed")
        self.assertFalse(any("report" in i for i in ids), "no report case is read")
        own = [r for r in rows if r["id"].startswith("own-1")]
        self.assertEqual(len(own), 3)
        self.assertEqual([t["name"] for t in own[0]["tools"]], ["read_file", "other"], "the whole catalogue")
        # An MCP tool's argument names, in its schema's order, and nothing else of the schema.
        self.assertEqual(own[0]["tools"][0]["parameters"], {"type": "object", "properties": {"path": {}, "head": {}}})
        self.assertNotIn("parameters", own[0]["tools"][1])

    def test_folds_hold_out_each_case_once(self):
        held = []
        for fold in range(3):
            self.assertEqual(self.run_adapt(f"f{fold}", "--folds", "3", "--fold", str(fold)).returncode, 0)
            test = self.lines(f"f{fold}", "test.jsonl")
            trained = {r["id"].split("~")[0] for r in self.lines(f"f{fold}", "adapt.jsonl")}
            self.assertFalse(trained & {r["id"] for r in test}, "a held-out case is not trained on")
            held += [r["id"] for r in test]
        self.assertEqual(sorted(held), sorted(set(held)))
        self.assertEqual(len(held), 9 + 9 + 4)

    def test_extra_cases_are_taken_with_their_own_tools_once_or_as_often_as_asked(self):
        extra = [dict(case(f"x{i}", ["b"]), tools=[{"name": "a", "description": "p"}, {"name": "b", "description": "q"}])
                 for i in range(4)]
        write_jsonl(self.root / "extra.jsonl", extra)
        self.assertEqual(self.run_adapt("e", "--extra", str(self.root / "extra.jsonl")).returncode, 0)
        rows = self.lines("e", "adapt.jsonl")
        self.assertEqual(len(rows), 5 + 3 * (9 + 9 + 4) + 4)
        self.assertEqual(sorted(r["id"] for r in rows if r["id"].startswith("x")), ["x0", "x1", "x2", "x3"])
        self.assertEqual(next(r for r in rows if r["id"] == "x0")["tools"], extra[0]["tools"])
        # --extra-repeat takes each a given number of times, the copies' ids kept unique.
        self.assertEqual(self.run_adapt("g", "--extra", str(self.root / "extra.jsonl"), "--extra-repeat", "3")
                         .returncode, 0)
        ids = sorted(r["id"] for r in self.lines("g", "adapt.jsonl") if r["id"].startswith("x0"))
        self.assertEqual(ids, ["x0", "x0~r1", "x0~r2"])
        self.assertEqual(self.run_adapt("h", "--extra-repeat", "0").returncode, 2)
        write_jsonl(self.root / "extra.jsonl", [case("y", ["b"])])
        done = self.run_adapt("f", "--extra", str(self.root / "extra.jsonl"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("extra.jsonl:1: tools: each --extra case needs its own tools", done.stderr)

    def test_written_mcp_cases_are_repeated_against_their_catalogue_and_may_not_copy_a_held_back_one(self):
        (self.root / "cat.json").write_text(json.dumps({"tools": [{"name": "send_email", "description": "s"},
                                                                 {"name": "read_file", "description": "r"}]}))
        write_jsonl(self.root / "written.jsonl",
                    [case("w0", ["send_email"], "mail the minutes to Ana please"), case("w1", [], "thanks a lot")])
        write_jsonl(self.root / "held.jsonl", [case("h0", ["read_file"], "open notes.txt in my home folder")])
        mcp = ["--mcp", str(self.root / "written.jsonl"), str(self.root / "cat.json"),
               "--held-back", str(self.root / "held.jsonl")]
        self.assertEqual(self.run_adapt("w", *mcp).returncode, 0)
        rows = self.lines("w", "adapt.jsonl")
        self.assertEqual(len(rows), 5 + 3 * (9 + 9 + 4 + 2))
        w0 = [r for r in rows if r["id"].split("~")[0] == "w0"]
        self.assertEqual(len(w0), 3)
        self.assertEqual([t["name"] for t in w0[0]["tools"]], ["send_email", "read_file"])
        # A written request with the same words as a held-back one (here a report part's) is refused.
        write_jsonl(self.root / "written.jsonl",
                    [case("w0", ["send_email"], "mail Ana"), case("w1", ["read_file"], "Request own-report, please!")])
        done = self.run_adapt("x", *mcp)
        self.assertEqual(done.returncode, 2)
        self.assertIn("written.jsonl:2: a near copy of a held-back conversation (word overlap 0.75)", done.stderr)
        write_jsonl(self.root / "written.jsonl", [case("w0", ["read_file"], "open notes.txt in my home folder now")])
        done = self.run_adapt("y", *mcp)
        self.assertEqual(done.returncode, 2)
        self.assertIn("written.jsonl:1: a near copy of a held-back conversation (word overlap 0.88)", done.stderr)

    def test_servers_are_kept_only_when_asked(self):
        (self.root / "cat.json").write_text(json.dumps({"tools": [
            {"name": "send_message", "description": "s", "_meta": {"server": "slack-mcp"}},
            {"name": "read_file", "description": "r", "_meta": {"other": 1}}]}))
        write_jsonl(self.root / "written.jsonl", [case("w0", ["send_message"], "tell #ops the deploy is done")])
        mcp = ["--mcp", str(self.root / "written.jsonl"), str(self.root / "cat.json")]
        self.assertEqual(self.run_adapt("plain", *mcp).returncode, 0)
        self.assertEqual(self.run_adapt("served", *mcp, "--servers").returncode, 0)
        plain = [r for r in self.lines("plain", "adapt.jsonl") if r["id"] == "w0"][0]
        served = [r for r in self.lines("served", "adapt.jsonl") if r["id"] == "w0"][0]
        self.assertEqual(plain["tools"][0], {"name": "send_message", "description": "s"})
        self.assertEqual(served["tools"][0]["_meta"], {"server": "slack-mcp"})
        # A tool without a server's name is as it was.
        self.assertEqual(served["tools"][1], plain["tools"][1])

    def test_bad_input_is_a_one_line_error(self):
        write_jsonl(self.root / "eval" / "own" / "tune.jsonl", [case("own-1", ["missing_tool"])])
        done = self.run_adapt("c")
        self.assertEqual(done.returncode, 2)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1)
        self.assertIn("tune.jsonl:1: expected: unknown tool 'missing_tool'", done.stderr)
        done = self.run_adapt("d", "--folds", "2", "--fold", "2")
        self.assertEqual(done.returncode, 2)
        self.assertIn("--fold 2 of --folds 2", done.stderr)


if __name__ == "__main__":
    unittest.main()
