#!/usr/bin/env python3
"""Tests of manifest.py --template: the earlier stages' tables, in order, from small manifests in a
temporary folder (the delta is the committed one, read for its sha256 and storage only)."""
import subprocess
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "manifest.py"
ROOT = HERE.parent.parent
DELTA = ROOT / "models" / "decide-tools-minilm" / "delta.safetensors"


def trained(path: Path, seed: int, base: str, data: str):
    path.write_text(
        "[scoring]\nlexical_weight = 0.3\n\n"
        f'[training]\nbase = "{base}"\ndata = "{data}"\ndata_sha256 = "{seed:064x}"\n'
        f"seed = {seed}\nepochs = 1\nfrozen_layers = 2\n"
    )


class Template(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = Path(self.tmp.name)
        self.root = root
        (root / "built").mkdir()
        (root / "built" / "config.json").write_text('{"num_hidden_layers": 6}')
        trained(root / "stage1.toml", 1, "all-MiniLM-L6-v2", "/data/train.jsonl")
        trained(root / "stage2.toml", 2, "/work/stage1-model", "/data/adapt.jsonl")
        trained(root / "stage3.toml", 3, "/work/assembled", "/data/adapt3.jsonl")

    def tearDown(self):
        self.tmp.cleanup()

    def template(self, *earlier):
        args = [sys.executable, str(SCRIPT), "--template", "--name", "m", "--base", "all-MiniLM-L6-v2",
                "--delta", str(DELTA), "--trained", str(self.root / "stage3.toml"), "--dir",
                str(self.root / "built")]
        for name in earlier:
            args += ["--earlier", str(self.root / name)]
        return subprocess.run(args, capture_output=True, text=True)

    def test_each_earlier_stage_is_a_table_oldest_first(self):
        out = self.template("stage1.toml", "stage2.toml")
        self.assertEqual(out.returncode, 0, out.stderr)
        doc = tomllib.loads(out.stdout)
        self.assertEqual(doc["training"]["seed"], 3)
        self.assertEqual(doc["training"]["stage1"]["seed"], 1)
        self.assertEqual(doc["training"]["stage2"]["seed"], 2)
        # Paths on the training machine stay out; a model's name stays in.
        self.assertNotIn("base", doc["training"])
        self.assertNotIn("base", doc["training"]["stage2"])
        self.assertEqual(doc["training"]["stage1"]["base"], "all-MiniLM-L6-v2")
        self.assertNotIn("data", doc["training"]["stage1"])
        self.assertIn("registry", out.stdout.split("\nname = ")[0])
        self.assertIn("[training.stage1]", out.stdout)
        self.assertLess(out.stdout.index("[training.stage1]"), out.stdout.index("[training.stage2]"))

    def test_one_earlier_stage_gives_no_second_table(self):
        out = self.template("stage1.toml")
        self.assertEqual(out.returncode, 0, out.stderr)
        doc = tomllib.loads(out.stdout)
        self.assertEqual(doc["training"]["stage1"]["seed"], 1)
        self.assertNotIn("stage2", doc["training"])
        self.assertNotIn("registry", out.stdout)

    def test_no_earlier_stage_gives_no_stage_table(self):
        out = self.template()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertNotIn("stage1", tomllib.loads(out.stdout)["training"])

    def test_three_earlier_stages_are_three_tables_and_four_are_refused(self):
        trained(self.root / "stage0.toml", 4, "/work/assembled", "/data/adapt0.jsonl")
        out = self.template("stage1.toml", "stage2.toml", "stage0.toml")
        self.assertEqual(out.returncode, 0, out.stderr)
        doc = tomllib.loads(out.stdout)
        self.assertEqual([doc["training"][f"stage{k}"]["seed"] for k in (1, 2, 3)], [1, 2, 4])
        header = " ".join(out.stdout.split("\nname = ")[0].replace("#", " ").split())
        self.assertIn("each tool of a named server read with the server's name", header)
        out = self.template("stage1.toml", "stage2.toml", "stage0.toml", "stage0.toml")
        self.assertEqual(out.returncode, 2)
        self.assertIn("--earlier", out.stderr)

    def test_a_model_trained_to_read_servers_says_so(self):
        path = self.root / "stage3.toml"
        path.write_text(path.read_text().replace(
            "lexical_weight = 0.3\n", "lexical_weight = 0.3\ntool_server = true\n"))
        out = self.template("stage1.toml")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIs(tomllib.loads(out.stdout)["scoring"]["tool_server"], True)
        path.write_text(path.read_text().replace("tool_server = true", 'tool_server = "yes"'))
        out = self.template("stage1.toml")
        self.assertEqual(out.returncode, 2)
        self.assertIn("scoring.tool_server is not true or false", out.stderr)

    def test_a_missing_earlier_manifest_is_named(self):
        out = self.template("stage1.toml", "nowhere.toml")
        self.assertEqual(out.returncode, 2)
        # The notes on the paths left out come first; the error is one line naming the file.
        self.assertRegex(out.stderr.strip().splitlines()[-1], r"^manifest\.py: .*nowhere\.toml: ")


if __name__ == "__main__":
    unittest.main()
