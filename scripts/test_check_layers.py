#!/usr/bin/env python3
"""Tests of check-layers.py on small engine trees written to a temporary folder.

Each tree has every module of the script's LAYERS (empty), a docs/architecture.md whose layer
table matches them, and the files a test writes on top.
"""
import contextlib
import importlib.util
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

SCRIPT = Path(__file__).resolve().parent / "check-layers.py"
_spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)

# Modules the trees hold as folders (`x/mod.rs`); the rest are files (`x.rs`).
FOLDERS = {"backend", "answering", "scoring"}
SRC = "crates/decide-engine/src"


def doc_text(extra=""):
    rows = "\n".join(
        f"| {name} | {', '.join(f'`{m}/`' if m in FOLDERS else f'`{m}.rs`' for m in modules)} | ... |"
        for name, modules in layers.LAYERS)
    return (f"# Architecture\n\n## decide-engine in layers\n\nIn `{SRC}/`, bottom first:\n\n"
            f"| layer | modules | what it holds |\n|---|---|---|\n{rows}\n{extra}")


@contextlib.contextmanager
def tree_of(files, doc=None):
    """A repository root holding the engine tree with `files` on top, and the doc."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tree = {"lib.rs": "".join(f"mod {m};\n" for _, ms in layers.LAYERS for m in ms)}
        for _, modules in layers.LAYERS:
            for m in modules:
                tree[f"{m}/mod.rs" if m in FOLDERS else f"{m}.rs"] = ""
        tree.update(files)
        for name, text in tree.items():
            path = root / SRC / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (root / "docs").mkdir()
        (root / "docs/architecture.md").write_text(doc if doc is not None else doc_text())
        yield root


def check(files, doc=None):
    with tree_of(files, doc) as root:
        run = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)
        return run.returncode, run.stdout + run.stderr


def check_with_leaks(files, leaks):
    """The layer check's problems and notes on `files` with KNOWN_LEAKS set to `leaks`, run in
    this process: the script's own list may be empty."""
    with tree_of(files) as root, mock.patch.dict(layers.KNOWN_LEAKS, leaks, clear=True):
        return layers.layer_violations(root / SRC, lambda p: p.relative_to(root).as_posix())


class Layers(unittest.TestCase):
    def test_a_tree_in_layer_order_passes(self):
        code, out = check({
            "scoring/mod.rs": "mod builder;\nuse crate::backend::Backend;\nuse crate::{lexical, answering::Scorer};\n",
            "scoring/builder.rs": "use super::Engine;\nuse crate::registry::{self, Manifest};\n",
            "needs_tool.rs": "use crate::calibration::sigmoid;\n",
            "bench.rs": "use crate::scoring::Engine;\n",
        })
        self.assertEqual(code, 0, out)

    def test_a_new_upward_import_fails(self):
        code, out = check({"answering/mod.rs": "mod plan;\n", "answering/plan.rs": "\nuse crate::scoring::Engine;\n"})
        self.assertEqual(code, 1)
        self.assertIn(f"{SRC}/answering/plan.rs:2: answering (layer answering) uses scoring (layer scoring, higher)", out)
        self.assertEqual(out.count(": answering (layer"), 1, out)

    def test_upward_through_a_reexport_a_group_and_super(self):
        code, out = check({
            "lib.rs": "mod scoring;\nmod tokenize;\npub use scoring::{Engine, Scores as S};\n"
                      + "".join(f"mod {m};\n" for _, ms in layers.LAYERS for m in ms if m not in ("scoring", "tokenize")),
            "tokenize.rs": "use crate::{error::Result,\n    S};\n",
            "registry.rs": "fn f() { super::lexical::bm25(); }\n",
            "backend/mod.rs": "mod encoder;\n",
            "backend/encoder.rs": "use super::super::answering::Scorer;\n",
        })
        self.assertEqual(code, 1)
        self.assertIn(f"{SRC}/tokenize.rs:1: tokenize (layer tokenization) uses scoring", out)
        self.assertIn(f"{SRC}/registry.rs:1: registry (layer models) uses lexical", out)
        self.assertIn(f"{SRC}/backend/encoder.rs:1: backend (layer backend) uses answering", out)
        self.assertNotIn("uses error", out)

    def test_a_known_leak_passes_only_where_it_is_known(self):
        leaks = {("backend/mod.rs", "registry"): "why", ("backend/mod.rs", "tokenize"): "why"}
        problems, notes = check_with_leaks(
            {"backend/mod.rs": "mod config;\nuse crate::registry::Build;\nfn f(r: Vec<crate::tokenize::TokenRow>) {}\n"},
            leaks)
        self.assertEqual((problems, notes), ([], []))
        problems, notes = check_with_leaks({
            "backend/mod.rs": "mod config;\nuse crate::registry::Build;\n",
            "backend/config.rs": "use crate::registry::Build;\n",
        }, leaks)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn(f"{SRC}/backend/config.rs:1: backend (layer backend) uses registry", problems[0])
        # The one that is gone is noted, so that the list is kept to the leaks still there.
        self.assertEqual(notes, ["note: the known leak backend/mod.rs -> tokenize is gone: take it out of KNOWN_LEAKS"])

    def test_a_leak_fails_without_an_entry(self):
        code, out = check({"backend/mod.rs": "use crate::registry::Build;\n"})
        self.assertEqual(code, 1)
        self.assertIn(f"{SRC}/backend/mod.rs:1: backend (layer backend) uses registry", out)

    def test_comments_strings_tests_and_inline_modules_do_not_count(self):
        code, out = check({
            "backend/mod.rs": (
                "// use crate::scoring::Engine;\n/// [`crate::Engine`]\n"
                "const S: &str = \"crate::scoring::x\";\nconst C: char = '{';\n"
                "mod inner { use super::Backend; fn f() { self::g(); } }\n"
                "#[cfg(test)]\nfn helper() { crate::scoring::Engine::new(); }\n"
                "pub struct P { #[cfg(test)] x: crate::lexical::Bm25, y: u32 }\n"
                "#[cfg(test)]\nmod tests { use crate::scoring::Engine; }\n"
            ),
            "registry.rs": "mod stamp { use super::FileStamp; }\nuse crate::needs_tool::NeedsTool;\n",
        })
        self.assertEqual(code, 0, out)

    def test_a_module_in_no_layer_fails(self):
        code, out = check({"shiny.rs": "use crate::error::Result;\n"})
        self.assertEqual(code, 1)
        self.assertIn("module shiny is in no layer", out)

    def test_the_doc_table_must_match_the_layers(self):
        doc = doc_text().replace("| lexical |", "| bm25 |")
        code, out = check({}, doc)
        self.assertEqual(code, 1)
        self.assertIn("docs/architecture.md:9: the engine's layer table", out)

    def test_a_module_the_doc_names_must_exist(self):
        extra = ("\n## decide-server\n\nIn `crates/decide-server/src/`: `lib.rs`, `gone.rs`, `/v1/select`,"
                 " `models/<name>/`, `playground.html`\n\n## Checks\n\n`gone.rs` and `crates/decide-engine/src/backend/kernels.rs`\n")
        with_server = {"../../decide-server/src/lib.rs": ""}
        code, out = check(with_server, doc_text(extra))
        self.assertEqual(code, 1)
        self.assertIn("names `gone.rs` (crates/decide-server/src/gone.rs), which does not exist", out)
        self.assertIn("names `crates/decide-engine/src/backend/kernels.rs`", out)
        self.assertEqual(out.count("which does not exist"), 2, out)
        code, out = check({**with_server, "backend/kernels.rs": "", "../../decide-server/src/gone.rs": ""},
                          doc_text(extra))
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
