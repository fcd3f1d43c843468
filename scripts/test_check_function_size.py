#!/usr/bin/env python3
"""Tests of check-function-size.py on small source trees written to a temporary folder."""
import importlib.util
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "check-function-size.py"
_spec = importlib.util.spec_from_file_location("check_function_size", SCRIPT)
size = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(size)

SRC = "crates/decide-cli/src"


def body(lines):
    """A function body of `lines` lines in all: the `fn` line, lines - 2 statements, the brace."""
    return "{\n" + "    let _ = 1;\n" * (lines - 2) + "}\n"


def check(files):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        run = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)
        return run.returncode, run.stdout, run.stderr


class FunctionSize(unittest.TestCase):
    def test_functions_at_the_limit_pass(self):
        code, out, err = check({
            f"{SRC}/main.rs": "fn main() " + body(80),
            f"{SRC}/eval.rs": "/// Docs and\n#[allow(dead_code)]\n/// attributes do not count.\npub fn run(\n    a: u32,\n) -> u32 "
                              + body(78),
        })
        self.assertEqual(code, 0, out + err)
        self.assertIn("2 functions in 2 files, none over 80 lines", out)

    def test_each_long_function_is_one_line(self):
        code, out, _ = check({
            f"{SRC}/train.rs": "use std::fmt;\n\npub fn run() " + body(81)
                              + "impl X {\n    fn step(&self) " + body(90) + "}\n",
            f"{SRC}/bench.rs": "fn short() {}\n",
        })
        self.assertEqual(code, 1)
        self.assertEqual(out.splitlines(), [
            f"{SRC}/train.rs:3 fn run: 81 lines",
            f"{SRC}/train.rs:85 fn step: 90 lines",
        ])

    def test_braces_in_strings_comments_and_chars_are_not_code(self):
        tricky = (
            "fn run<'a>(x: &'a str) -> &'a str {\n"
            "    let s = \"}}}\";\n"
            "    let r = r#\"} \"} \"#;\n"
            "    let c = '}';\n"
            "    // }\n"
            "    /* } */\n"
            "    x\n"
            "}\n"
            "fn after() " + body(81)
        )
        self.assertEqual([(n, lines) for _, n, lines in size.functions(tricky)], [("run", 8), ("after", 81)])
        code, out, _ = check({f"{SRC}/chat.rs": tricky})
        self.assertEqual(code, 1)
        self.assertEqual(out.splitlines(), [f"{SRC}/chat.rs:9 fn after: 81 lines"])

    def test_declarations_nested_functions_and_fn_types(self):
        text = (
            "trait T {\n    fn declared(&self);\n}\n"
            "fn outer(f: fn(u32) -> u32) {\n    fn inner() {}\n    inner();\n}\n"
        )
        self.assertEqual(size.functions(text), [(4, "outer", 4), (5, "inner", 1)])

    def test_only_the_cli_sources_count(self):
        code, out, _ = check({
            f"{SRC}/main.rs": "fn main() {}\n",
            "crates/decide-engine/src/lib.rs": "fn long() " + body(200),
            f"{SRC}/nested/deep.rs": "fn long() " + body(200),
        })
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
