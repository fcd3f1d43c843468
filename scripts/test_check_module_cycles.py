#!/usr/bin/env python3
"""Tests of check-module-cycles.py on small crates written to a temporary folder."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "check-module-cycles.py"


def check(files):
    with tempfile.TemporaryDirectory() as tmp:
        crate = Path(tmp) / "demo"
        for name, text in files.items():
            path = crate / "src" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        run = subprocess.run([sys.executable, str(SCRIPT), str(crate)], capture_output=True, text=True)
        return run.returncode, run.stdout


class Cycles(unittest.TestCase):
    def test_two_modules_using_each_other_are_a_cycle(self):
        code, out = check({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::B;\npub struct A;\n",
            "b.rs": "use crate::a::A;\npub struct B;\n",
        })
        self.assertEqual(code, 1)
        self.assertIn("demo: modules import each other in a cycle: a, b", out)

    def test_a_cycle_through_a_third_module_and_grouped_imports(self):
        code, out = check({
            "lib.rs": "mod a;\nmod b;\nmod c;\n",
            "a.rs": "use crate::{b::B, c};\n",
            "b.rs": "use crate::c::C;\n",
            "c.rs": "use crate::a;\n",
        })
        self.assertEqual(code, 1)
        self.assertIn("a, b, c", out)

    def test_a_cycle_between_submodules_through_super(self):
        code, out = check({
            "lib.rs": "mod layer;\n",
            "layer/mod.rs": "mod x;\nmod y;\n",
            "layer/x.rs": "use super::y::Y;\n",
            "layer/y.rs": "use super::x::X;\n",
        })
        self.assertEqual(code, 1)
        self.assertIn("layer::x, layer::y", out)

    def test_layers_that_only_use_lower_ones_pass(self):
        code, out = check({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::B;\n",
            "b.rs": "pub struct B;\n// crate::a::A in a comment does not count\n#[cfg(test)]\nmod tests { use crate::a; }\n",
        })
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
