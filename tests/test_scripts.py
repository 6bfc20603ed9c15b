"""The shell scripts parse, and gpu.sh answers an unknown command with its usage and exit code 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.sh")))
def test_shell_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_sh_usage(tmp_path):
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch")}
    r = subprocess.run(
        ["bash", "scripts/gpu.sh", "no-such-command"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 2 and "preflight" in r.stderr and "go DEST" in r.stderr
