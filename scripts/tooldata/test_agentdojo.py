#!/usr/bin/env python3
"""Tests of agentdojo.py (AgentDojo's user tasks and tool-rot's queries as training cases) on small
wheels built in a temporary folder."""
import json
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "agentdojo.py"

V1 = "agentdojo/default_suites/v1"
FIX = "tool_rot/fixtures"

TOOLS_MODULE = '''
from typing import Annotated

def find_mail(inbox: Annotated[Inbox, Depends("inbox")], query: str) -> list:
    """Finds the emails that match `query`,
    newest first.

    :param query: What to look for.
    """

def send_mail(inbox: Annotated[Inbox, Depends("inbox")], to: str, body: str) -> None:
    """Sends an email.
    :param to: The recipient.
    :param body: The text.
    """

def _unlisted(x):
    """Not in TOOLS."""
'''

TASK_SUITE = '''
from agentdojo.default_suites.v1.tools.mail_client import find_mail, send_mail as send
from agentdojo.functions_runtime import make_function

def archive(inbox) -> None:
    """Archives the inbox."""

TOOLS = [
    find_mail,
    send,
    archive,
    find_mail,
]
'''

USER_TASKS = '''
from agentdojo.default_suites.v1.mail.task_suite import task_suite
from agentdojo.functions_runtime import FunctionCall

DOMAIN = "example.com"


@task_suite.register_user_task
class UserTask0(MailUserTask):
    _WHO: ClassVar[list[str]] = ["ann", "bob"]
    _SUBJECT = "Budget"
    PROMPT = f"Find the mail about '{_SUBJECT}' and send it to {', '.join(_WHO)} at {DOMAIN!r}, {3:02d} times."

    def ground_truth(self, pre_environment):
        return [
            FunctionCall(function="find_mail", args={"query": self._SUBJECT}),
            FunctionCall(function="send_mail", args={"to": "ann"}),
            FunctionCall(function="find_mail", args={"query": "again"}),
        ]


@task_suite.register_user_task
class UserTask1(MailUserTask):
    PROMPT = """\\
            Archive my inbox.
            Thanks!
            """

    def ground_truth(self, pre_environment):
        return [FunctionCall(function="archive", args={})]


@task_suite.register_user_task
class UserTask2(MailUserTask):
    PROMPT = "Just say hello."

    def ground_truth(self, pre_environment):
        return []


@task_suite.register_user_task
class UserTask3(MailUserTask):
    PROMPT = "a report question"

    def ground_truth(self, pre_environment):
        return [FunctionCall(function="find_mail", args={})]


@task_suite.register_user_task
class UserTask10(MailUserTask):
    PROMPT = "Send " + "the " * 2 + "summary"

    def ground_truth(self, pre_environment):
        return [FunctionCall(function="send_mail", args={})]


class Helper:
    PROMPT = f"{undefined_name}"


combinator = TaskCombinator[MailUserTask, MailEnvironment](task_suite)
combinator.create_combined_task("UserTask4", task_suite.user_tasks["user_task_0"], task_suite.user_tasks["user_task_1"])
combinator.create_combined_task(
    "UserTask5",
    task_suite.user_tasks["user_task_1"],
    task_suite.user_tasks["user_task_10"],
    prompt="Do my list.",
)
'''


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


class AgentDojo(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        for part in ("own", "livemcpbench"):
            (self.root / "eval" / part).mkdir(parents=True)
            (self.root / "eval" / part / "tune.jsonl").write_text("")
            (self.root / "eval" / part / "report.jsonl").write_text(jsonl(
                [{"id": "r", "messages": [{"role": "user", "content": "a report question"}], "expected": []}]))
        self.dojo = {
            f"{V1}/tools/mail_client.py": TOOLS_MODULE,
            f"{V1}/mail/task_suite.py": TASK_SUITE,
            f"{V1}/mail/user_tasks.py": USER_TASKS,
            # Neither is read: attacks, and a later version's rewording.
            f"{V1}/mail/injection_tasks.py": "this is not Python (",
            "agentdojo/default_suites/v1_1/mail/user_tasks.py": "neither is this (",
            f"{V1}/web/task_suite.py": textwrap.dedent('''
                from agentdojo.default_suites.v1.tools.mail_client import find_mail
                TOOLS: list = [find_mail]
                '''),
            f"{V1}/web/user_tasks.py": "".join(textwrap.dedent(f'''
                @task_suite.register_user_task
                class UserTask{n}(WebUserTask):
                    PROMPT = "web question {n}"

                    def ground_truth(self, env):
                        return [FunctionCall(function="find_mail", args={{}})]
                ''') for n in range(10)),
        }
        tools = [{"server_name": s, "name": n, "description": f"{n} on {s}",
                  "inputSchema": {"type": "object", "properties": {}}}
                 for s, n in [("fs", "read_file"), ("fs", "write_file"), ("gh", "create_issue"), ("gh", "search")]]
        self.rot = {
            f"{FIX}/benchmark_tools.json": json.dumps(tools),
            f"{FIX}/benchmark_queries.jsonl": jsonl(
                [{"query": f"rot question {i}", "correct_tool": ["read_file", "create_issue"][i % 2]}
                 for i in range(10)]),
        }

    def tearDown(self):
        self.tmp.cleanup()

    def write_wheel(self, members, name):
        path = self.root / name
        with zipfile.ZipFile(path, "w") as z:
            for member, text in sorted(members.items()):
                # A fixed date: a member named by a string is stamped with the clock, and two wheels
                # written either side of a two-second tick would differ in bytes and sha256.
                z.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), text)
        return path

    def run_it(self, out, dojo=None, rot=None, seed=42):
        return subprocess.run(
            [sys.executable, str(SCRIPT),
             "--agentdojo", str(self.write_wheel(dojo or self.dojo, "agentdojo-0-py3-none-any.whl")),
             "--tool-rot", str(self.write_wheel(rot or self.rot, "tool_rot-0-py3-none-any.whl")),
             "--eval-data", str(self.root / "eval"), "--out", str(self.root / out),
             "--heldout", "0.2", "--seed", str(seed)],
            capture_output=True, text=True)

    def cases(self, out):
        rows = []
        for name in ("agentdojo.jsonl", "heldout.jsonl"):
            rows += [json.loads(l) for l in (self.root / out / name).read_text().splitlines()]
        return {r["id"]: r for r in rows}

    def assert_one_line_error(self, done, *fragments):
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
        for fragment in fragments:
            self.assertIn(fragment, done.stderr)

    def test_tasks_carry_their_suites_tools_and_the_called_functions(self):
        done = self.run_it("a")
        self.assertEqual(done.returncode, 0, done.stderr)
        cases = self.cases("a")
        task0 = cases["agentdojo/mail/user_task_0"]
        self.assertEqual(task0["messages"], [{"role": "user", "content":
                         "Find the mail about 'Budget' and send it to ann, bob at 'example.com', 03 times."}],
                         "the f-string resolved from the class's and the module's constants")
        self.assertEqual(task0["expected"], ["find_mail", "send_mail"], "each called function once, in order")
        self.assertEqual(task0["tools"], [
            {"name": "find_mail", "description": "Finds the emails that match `query`, newest first."},
            {"name": "send_mail", "description": "Sends an email."},
            {"name": "archive", "description": "Archives the inbox."},
        ], "TOOLS in order, each once, imported names followed to their definition")
        self.assertEqual(cases["agentdojo/mail/user_task_1"]["messages"][0]["content"], "Archive my inbox.\nThanks!",
                         "source indentation is not part of a request")
        self.assertEqual(cases["agentdojo/mail/user_task_10"]["messages"][0]["content"], "Send the the summary")
        combined = cases["agentdojo/mail/user_task_4"]
        self.assertEqual(combined["messages"][0]["content"],
                         "Perform the following tasks in the order they are given: 1. "
                         + task0["messages"][0]["content"] + " 2. Archive my inbox.\nThanks!")
        self.assertEqual(combined["expected"], ["find_mail", "send_mail", "archive"])
        self.assertEqual(cases["agentdojo/mail/user_task_5"]["messages"][0]["content"], "Do my list.")
        self.assertEqual(cases["agentdojo/mail/user_task_5"]["expected"], ["archive", "send_mail"])
        self.assertNotIn("agentdojo/mail/user_task_2", cases, "a task that calls nothing is left out")
        self.assertNotIn("agentdojo/mail/user_task_3", cases, "a report part's conversation is left out")
        rot = cases["toolrot/3"]
        self.assertEqual(rot["messages"], [{"role": "user", "content": "rot question 2"}])
        self.assertEqual(rot["expected"], ["read_file"])
        self.assertEqual([t["name"] for t in rot["tools"]], ["read_file", "write_file", "create_issue", "search"])
        self.assertEqual(rot["tools"][0], {"name": "read_file", "description": "read_file on fs"})
        summary = json.loads((self.root / "a" / "summary.json").read_text())
        mail = summary["sources"]["agentdojo-mail"]
        self.assertEqual((mail["cases"], mail["no_call"], mail["eval_overlap"], mail["tools"]), (7, 1, 1, 3))
        self.assertEqual(mail["trained"] + mail["held_out"], 5)
        self.assertEqual(summary["sources"]["toolrot"]["held_out"], 2)
        self.assertEqual(summary["sources"]["agentdojo-web"]["held_out"], 2)
        self.assertEqual(sorted(summary["inputs"]), ["agentdojo-0-py3-none-any.whl", "tool_rot-0-py3-none-any.whl"])

    def test_the_held_out_share_is_seeded_per_source_and_the_same_seed_gives_the_same_bytes(self):
        for out in ("a", "b"):
            done = self.run_it(out)
            self.assertEqual(done.returncode, 0, done.stderr)
        for name in ("agentdojo.jsonl", "heldout.jsonl", "summary.json"):
            self.assertEqual((self.root / "a" / name).read_bytes(), (self.root / "b" / name).read_bytes())
        held = [json.loads(l) for l in (self.root / "a" / "heldout.jsonl").read_text().splitlines()]
        train = [json.loads(l) for l in (self.root / "a" / "agentdojo.jsonl").read_text().splitlines()]
        self.assertFalse({r["id"] for r in train} & {r["id"] for r in held})
        self.assertTrue(all("source" not in r for r in train))
        by_source = {}
        for r in held:
            by_source.setdefault(r["source"], []).append(r["id"])
        self.assertEqual({s: len(ids) for s, ids in by_source.items()},
                         {"agentdojo-mail": 1, "agentdojo-web": 2, "toolrot": 2})
        draws = set()
        for seed in range(1, 6):
            done = self.run_it(f"s{seed}", seed=seed)
            self.assertEqual(done.returncode, 0, done.stderr)
            draws.add((self.root / f"s{seed}" / "heldout.jsonl").read_bytes())
        self.assertGreater(len(draws), 1, "the seed chooses the held-out cases")

    def test_an_expected_tool_outside_the_case_tools_is_a_one_line_error_naming_the_file(self):
        dojo = dict(self.dojo)
        dojo[f"{V1}/mail/user_tasks.py"] = USER_TASKS.replace('function="archive"', 'function="shred"')
        self.assert_one_line_error(self.run_it("c", dojo=dojo), "agentdojo.py: ",
                                   f"agentdojo-0-py3-none-any.whl!{V1}/mail/user_tasks.py:", "'shred'")
        rot = dict(self.rot)
        rot[f"{FIX}/benchmark_queries.jsonl"] = jsonl([{"query": "q", "correct_tool": "read_file"},
                                                       {"query": "r", "correct_tool": "delete_repo"}])
        self.assert_one_line_error(self.run_it("d", rot=rot),
                                   f"tool_rot-0-py3-none-any.whl!{FIX}/benchmark_queries.jsonl:2:", "'delete_repo'")
        self.assertFalse((self.root / "d").exists(), "nothing written")

    def test_a_tool_name_two_servers_share_is_prefixed_and_cannot_be_expected(self):
        tools = json.loads(self.rot[f"{FIX}/benchmark_tools.json"])
        tools.append({"server_name": "gh", "name": "read_file", "description": "a file of a repository"})
        rot = {**self.rot, f"{FIX}/benchmark_tools.json": json.dumps(tools)}
        self.assert_one_line_error(self.run_it("e", rot=rot), "two servers have a tool of that name")
        rot[f"{FIX}/benchmark_queries.jsonl"] = jsonl([{"query": "q", "correct_tool": "fs_read_file"}])
        done = self.run_it("f", rot=rot)
        self.assertEqual(done.returncode, 0, done.stderr)
        case = self.cases("f")["toolrot/1"]
        self.assertEqual([t["name"] for t in case["tools"]],
                         ["fs_read_file", "write_file", "create_issue", "search", "gh_read_file"])

    def test_a_prompt_that_needs_running_code_is_an_error_not_run(self):
        dojo = dict(self.dojo)
        dojo[f"{V1}/mail/user_tasks.py"] = USER_TASKS.replace(
            'PROMPT = "Just say hello."', 'PROMPT = f"Hello {__import__(\'os\').getcwd()}"')
        self.assert_one_line_error(self.run_it("g", dojo=dojo), "UserTask2.PROMPT: cannot work out",
                                   f"{V1}/mail/user_tasks.py:")
        (self.root / "not.whl").write_text("text")
        done = subprocess.run([sys.executable, str(SCRIPT), "--agentdojo", str(self.root / "not.whl"),
                               "--tool-rot", str(self.root / "not.whl"), "--eval-data", str(self.root / "eval"),
                               "--out", str(self.root / "h")], capture_output=True, text=True)
        self.assert_one_line_error(done, "not.whl: not a wheel")


if __name__ == "__main__":
    unittest.main()
