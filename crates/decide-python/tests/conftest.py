"""Shared fixtures: one loaded default model for the whole run, the repository's examples, and
the `decide` binary to compare answers with."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import decide

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="session")
def decider() -> decide.Decider:
    # The default model, built by models/fetch; a missing model fails the run (it names
    # models/fetch), it never skips it.
    return decide.Decider()


def example(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def mcp_tools() -> Dict[str, Any]:
    """examples/tools.json: an MCP `tools/list` result of 27 tools."""
    tools: Dict[str, Any] = example("tools.json")
    return tools


@pytest.fixture(scope="session")
def openai_tools() -> List[Dict[str, Any]]:
    tools: List[Dict[str, Any]] = example("tools-openai.json")
    return tools


@pytest.fixture(scope="session")
def conversation() -> List[Dict[str, Any]]:
    messages: List[Dict[str, Any]] = example("conversation.json")
    return messages


def cli_path() -> Optional[Path]:
    """The `decide` binary: $DECIDE_CLI (ci.sh sets it, and then it must exist), else none."""
    given = os.environ.get("DECIDE_CLI")
    if not given:
        return None
    path = Path(given)
    if not path.is_file():
        raise FileNotFoundError(f"DECIDE_CLI={given}: no such file (build it with cargo test)")
    return path


class Cli:
    """Runs `decide` from the repository root, as a user would."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(self, *args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [str(self.path), *args], cwd=REPO, capture_output=True, text=True, timeout=300
        )

    def json(self, *args: str) -> Any:
        done = self.run(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def error(self, *args: str) -> str:
        """The one line `decide` prints for an error, without its `error: ` prefix."""
        done = self.run(*args)
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1, done.stderr
        return lines[0][len("error: ") :]


@pytest.fixture(scope="session")
def cli() -> Cli:
    path = cli_path()
    if path is None:
        pytest.skip("set DECIDE_CLI to the decide binary to compare with it (ci.sh does)")
    return Cli(path)
