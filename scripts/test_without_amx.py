#!/usr/bin/env python3
"""Tests of scripts/without-amx: the tile-state request is refused under it, and only that."""

from __future__ import annotations

import errno
import subprocess
import sys
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "without-amx"

# A child that asks for the tiles' state as decide does (arch_prctl(ARCH_REQ_XCOMP_PERM,
# XFEATURE_XTILEDATA)), then reads the permitted features (ARCH_GET_XCOMP_PERM, which the
# filter leaves alone), and prints both errnos.
PROBE = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
req = libc.syscall(158, 0x1023, 18)
req_errno = ctypes.get_errno() if req != 0 else 0
bits = ctypes.c_ulong(0)
get = libc.syscall(158, 0x1022, ctypes.byref(bits))
print(req_errno, 0 if get == 0 else ctypes.get_errno())
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


class WithoutAmx(unittest.TestCase):
    def test_the_tile_request_is_refused_and_other_calls_pass(self):
        done = run(sys.executable, "-c", PROBE)
        self.assertEqual(done.returncode, 0, done.stderr)
        request, get = map(int, done.stdout.split())
        self.assertEqual(request, errno.EPERM)
        self.assertEqual(get, 0)

    def test_children_of_children_inherit_the_filter(self):
        nested = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PROBE!r}])"
        done = run(sys.executable, "-c", nested)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(int(done.stdout.split()[0]), errno.EPERM)

    def test_the_commands_exit_code_comes_back(self):
        self.assertEqual(run(sys.executable, "-c", "raise SystemExit(7)").returncode, 7)

    def test_a_missing_command_is_a_one_line_error(self):
        done = run("no-such-command-here")
        self.assertNotEqual(done.returncode, 0)
        self.assertEqual(done.stderr.strip().count("\n"), 0, done.stderr)
        self.assertIn("without-amx: no-such-command-here:", done.stderr)

    def test_no_command_prints_the_usage_and_fails(self):
        done = run()
        self.assertEqual(done.returncode, 2)
        self.assertIn("Runs a command as a machine without AMX would", done.stdout)


if __name__ == "__main__":
    unittest.main()
