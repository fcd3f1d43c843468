"""What the wheel ships besides the native code: the type stubs and the `py.typed` marker, and
stubs that say what the native module takes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Dict, List

import decide
from decide import _native

PACKAGE = Path(decide.__file__).parent


def test_the_wheel_is_typed() -> None:
    # Installed from the wheel, never the source tree (ci.sh runs from tests/).
    assert "site-packages" in str(PACKAGE), PACKAGE
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_native.pyi").is_file()


def stub_parameters() -> Dict[str, List[str]]:
    """Each method of the stub's `Decider`, with its parameter names in order."""
    tree = ast.parse((PACKAGE / "_native.pyi").read_text(encoding="utf-8"))
    decider = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Decider")
    out: Dict[str, List[str]] = {}
    for node in decider.body:
        if isinstance(node, ast.FunctionDef) and not any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            a = node.args
            out[node.name] = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]][1:]
    return out


def test_the_stubs_name_the_native_parameters() -> None:
    stubs = stub_parameters()
    assert set(stubs) == {"__init__", "select", "route", "embed", "rerank"}
    for name, parameters in stubs.items():
        native = _native.Decider if name == "__init__" else getattr(_native.Decider, name)
        assert list(inspect.signature(native).parameters)[-len(parameters) :] == parameters, name


def test_the_stubs_name_every_native_export() -> None:
    tree = ast.parse((PACKAGE / "_native.pyi").read_text(encoding="utf-8"))
    stubbed = {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    stubbed |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    public = {n for n in dir(_native) if not n.startswith("_")} | {"__version__"}
    assert public == stubbed


def test_version() -> None:
    assert decide.__version__ == "0.1.0"
