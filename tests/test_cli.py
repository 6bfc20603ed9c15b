"""`sqlrl --help` and every `sqlrl COMMAND --help` answer with exit 0 without importing torch or
transformers (lazy imports keep --help instant), and the top-level usage lists every command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sqlrl.cli import COMMANDS

PROBE = """
import sys
from sqlrl import cli
try:
    rc = cli.main({argv!r})
except SystemExit as e:
    rc = e.code
heavy = sorted(m for m in ("torch", "transformers", "peft", "accelerate") if m in sys.modules)
print("RESULT", rc or 0, ",".join(heavy) or "-")
"""


def probe(argv: list[str]) -> tuple[int, str, str]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1].split()
    return int(line[1]), line[2], p.stdout


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_command_help_is_light(cmd):
    rc, heavy, out = probe([cmd, "--help"])
    assert rc == 0, out
    assert heavy == "-", f"`sqlrl {cmd} --help` imported {heavy}"
    assert "usage:" in out


def test_top_level_help_lists_every_command():
    rc, heavy, out = probe(["--help"])
    assert rc == 0 and heavy == "-"
    for cmd in COMMANDS:
        assert f"  {cmd} " in out, cmd
