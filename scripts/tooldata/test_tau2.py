#!/usr/bin/env python3
"""Tests of tau2.py (τ²-bench's tasks as training cases) on a small wheel built in a temporary folder."""
import json
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "tau2.py"
sys.path.insert(0, str(SCRIPT.parent))
from tau2 import DOMAINS, PACKAGE  # noqa: E402

COMMON = '''
from inspect_ai.tool import Tool, tool


@tool
def calculate() -> Tool:
    async def execute(expression: str) -> str:
        """
        Calculate the result of a mathematical expression.

        Args:
            expression: The mathematical expression to calculate.
        """
        return expression

    return execute


@tool
def transfer_to_human_agents() -> Tool:
    async def execute(summary: str) -> str:
        """
        Transfer the user to a human agent.
        Only transfer if
         -  the user asks

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"

    return execute
'''


def domain_tools(domain):
    own = [f"{domain}_lookup", f"{domain}_change"]
    defs = "".join(f'''
@tool
def {name}() -> Tool:
    async def execute(order_id: str) -> str:
        """Does {name} for
        an order.

        Args:
            order_id: The order.
        """
        return order_id

    return execute
''' for name in own)
    return (f"from inspect_ai.tool import Tool, tool\n"
            f"from inspect_evals.tau2.common.tools import calculate, transfer_to_human_agents\n{defs}\n"
            f"all_{domain}_tools = [{own[1]}, calculate, {own[0]}, transfer_to_human_agents]\n")


def task(task_id, reason, known, actions):
    return {"id": task_id, "user_scenario": {"persona": None, "instructions": {
        "domain": "x", "reason_for_call": reason, "known_info": known, "unknown_info": None,
        "task_instructions": "Be terse and never give your zip code."}},
        "evaluation_criteria": {"actions": [
            {"action_id": f"{task_id}_{k}", "name": a[0], "arguments": {},
             **({"requestor": a[1]} if len(a) > 1 else {})}
            for k, a in enumerate(actions)]}}


class Tau2(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        for part in ("own", "livemcpbench"):
            (self.root / "eval" / part).mkdir(parents=True)
            (self.root / "eval" / part / "tune.jsonl").write_text("")
            report = {"id": "r", "messages": [{"role": "user", "content": "You want a report. You are R."}],
                      "expected": []}
            (self.root / "eval" / part / "report.jsonl").write_text(json.dumps(report) + "\n")
        self.members = {f"{PACKAGE}/common/tools.py": COMMON}
        for domain in DOMAINS:
            self.members[f"{PACKAGE}/{domain}/tools.py"] = domain_tools(domain)
            tasks = [task(str(i), f"You want thing {i} of {domain}. \n", "You are Ann.\nYour id is a_1.",
                          [(f"{domain}_lookup",), (f"{domain}_change", "assistant"), (f"{domain}_lookup",)])
                     for i in range(20)]
            self.members[f"{PACKAGE}/data/domains/{domain}/tasks.json"] = json.dumps(tasks)
        airline = json.loads(self.members[f"{PACKAGE}/data/domains/airline/tasks.json"])
        airline += [
            task("only-user", "You want to apply yourself.", None, [("apply_for_card", "user")]),
            task("mixed", "You want help.", None, [("apply_for_card", "user"), ("calculate",)]),
            task("none", "You just want to chat.", "", []),
            task("report", "You want a report.", "You are R.", [("calculate",)]),
            task("again", "You want thing 0 of airline.", "You are Ann.\nYour id is a_1.", [("calculate",)]),
        ]
        self.members[f"{PACKAGE}/data/domains/airline/tasks.json"] = json.dumps(airline)
        self.wheel = self.write_wheel(self.members)

    def tearDown(self):
        self.tmp.cleanup()

    def write_wheel(self, members, name="inspect_evals-0-py3-none-any.whl"):
        path = self.root / name
        with zipfile.ZipFile(path, "w") as z:
            for member, text in sorted(members.items()):
                # A fixed date: a member named by a string is stamped with the clock, and two wheels
                # written either side of a two-second tick would differ in bytes and sha256.
                z.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), text)
        return path

    def run_tau2(self, out, wheel=None, seed="42"):
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--wheel", str(wheel or self.wheel), "--eval-data", str(self.root / "eval"),
             "--out", str(self.root / out), "--heldout", "0.2", "--seed", seed],
            capture_output=True, text=True)

    def lines(self, out, name):
        return [json.loads(l) for l in (self.root / out / name).read_text().splitlines()]

    def test_cases_carry_the_domain_tools_and_the_assistant_actions_and_the_same_seed_gives_the_same_bytes(self):
        for out, seed in (("a", "42"), ("b", "42"), ("c", "7")):
            done = self.run_tau2(out, seed=seed)
            self.assertEqual(done.returncode, 0, done.stderr)
        for name in ("tau2.jsonl", "heldout.jsonl", "summary.json"):
            self.assertEqual((self.root / "a" / name).read_bytes(), (self.root / "b" / name).read_bytes())
        train, held = self.lines("a", "tau2.jsonl"), self.lines("a", "heldout.jsonl")
        self.assertNotEqual({r["id"] for r in held}, {r["id"] for r in self.lines("c", "heldout.jsonl")},
                            "another seed holds out other cases")
        self.assertFalse({r["id"] for r in train} & {r["id"] for r in held})
        cases = {r["id"]: r for r in train + held}
        self.assertEqual(len(cases), 41, "20 + 20 tasks and 'mixed'; no 'only-user', 'none', 'report' or 'again'")
        first = cases["tau2/airline/0"]
        self.assertEqual(first["messages"],
                         [{"role": "user", "content": "You want thing 0 of airline. You are Ann.\nYour id is a_1."}],
                         "reason_for_call, then known_info, without task_instructions")
        self.assertEqual(first["expected"], ["airline_lookup", "airline_change"], "each once, in order of first use")
        self.assertEqual(first["tools"], [
            {"name": "airline_change", "description": "Does airline_change for an order."},
            {"name": "calculate", "description": "Calculate the result of a mathematical expression."},
            {"name": "airline_lookup", "description": "Does airline_lookup for an order."},
            {"name": "transfer_to_human_agents",
             "description": "Transfer the user to a human agent. Only transfer if - the user asks"}])
        self.assertEqual([t["name"] for t in cases["tau2/retail/3"]["tools"]],
                         ["retail_change", "calculate", "retail_lookup", "transfer_to_human_agents"])
        self.assertEqual(cases["tau2/airline/mixed"]["expected"], ["calculate"], "the user's own action is dropped")
        self.assertEqual(cases["tau2/airline/mixed"]["messages"][0]["content"], "You want help.")
        self.assertEqual({r["source"] for r in held}, {"tau2-airline", "tau2-retail"})
        summary = json.loads((self.root / "a" / "summary.json").read_text())
        airline = summary["domains"]["airline"]
        self.assertEqual((airline["tasks"], airline["tools"], airline["no_call"], airline["user_actions_dropped"],
                          airline["eval_overlap"], airline["duplicate"]), (25, 4, 2, 2, 1, 1))
        self.assertEqual((airline["trained"], airline["held_out"]), (17, 4))
        self.assertEqual(summary["domains"]["retail"]["held_out"], 4)
        self.assertEqual(len(summary["wheel_sha256"]), 64)

    def test_bad_input_is_a_one_line_error(self):
        members = dict(self.members)
        member = f"{PACKAGE}/data/domains/retail/tasks.json"
        members[member] = json.dumps([task("7", "You want it.", None, [("retail_lookup",), ("refund_everything",)])])
        done = self.run_tau2("d", self.write_wheel(members, "bad.whl"))
        self.assertEqual(done.returncode, 2)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1)
        self.assertIn(f"bad.whl!{member}: task '7': expected tool 'refund_everything' is not among", done.stderr)
        members[member] = json.dumps([{"id": "8", "user_scenario": {"instructions": "You are playing a customer."},
                                       "evaluation_criteria": {"actions": []}}])
        done = self.run_tau2("e", self.write_wheel(members, "free.whl"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("free.whl!", done.stderr)
        self.assertIn("expected an object with a reason_for_call", done.stderr)
        (self.root / "not.whl").write_text("text")
        done = self.run_tau2("f", self.root / "not.whl")
        self.assertEqual(done.returncode, 2)
        self.assertIn("not.whl: not a wheel", done.stderr)


if __name__ == "__main__":
    unittest.main()
