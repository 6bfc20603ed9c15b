"""Every command in README.md runs as written on a fresh clone.

The README's ```bash and ```python blocks are parsed here, so a command added to the README is covered
without editing this file. Each command runs in a folder laid out like a fresh clone (``configs``,
``scripts``, ``src`` and ``constraints.txt`` linked in, nothing else; ``runs/`` is created by the commands)
with ``sqlrl`` being this checkout's CLI, one after the other in README order (later commands use what
earlier ones wrote, e.g. ``sqlrl export runs/q``). Commands that run a model are ``slow`` (the tiny
SmolLM2-135M, fetched from PyPI on first use). ``CHECKED_ONLY`` lists, with the reason, the few commands
that need a GPU, the full Spider data, a served model or tens of minutes: for those the test checks that
the command exists (``--help``), that its input files exist and that its TOML files load.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# command prefix -> why it is checked (exists, arguments, input files) instead of run
CHECKED_ONLY = {
    "bash scripts/headline.sh": "needs a GPU and the full Spider data (about an hour)",
    "python3 -m venv": "installs the package, then the 10-30 min quickstart, which "
    "tests/experiment/test_e2e_smollm.py runs with the tiny model",
    "bash scripts/test.sh": "is the command that runs this test",
    "sqlrl experiment configs/spider-0.5b-gpu.toml": "needs a GPU and the full Spider data",
    "sqlrl experiment configs/spider-0.5b-gpu-sft.toml": "needs a GPU and the full Spider data",
    "sqlrl sft configs/spider-0.5b-gpu-sft.toml": "needs a GPU and the full Spider data "
    "(tests/training/test_sft_text2sql.py runs SFT with the tiny model)",
    "sqlrl report runs/exp": "needs the GPU experiment's folder (tests/evidence runs the report)",
    "sqlrl seeds runs/exp": "needs the GPU experiments' folders (tests/evidence/test_seeds.py)",
    "sqlrl eval --endpoint": "needs a served model (tests/evaluation covers the client on a fake server)",
    "sqlrl curriculum": "tens of minutes on a CPU (tests/training/test_e2e_curriculum.py runs a small one)",
}
MODEL_FREE = ("sqlrl data ", "sqlrl sql ", "sqlrl reward ")  # seconds, no model: not `slow`


def readme_commands(text: str) -> list[tuple[str, str]]:
    """(language, command) for every command in the README's ```bash blocks (one per line, comment-only
    and blank lines skipped) and every ```python block (the whole block is one command)."""
    out = []
    for lang, body in re.findall(r"^```(bash|python)\n(.*?)^```", text, flags=re.S | re.M):
        if lang == "python":
            out.append((lang, body))
            continue
        for line in body.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append((lang, line.strip()))
    return out


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def _checked_only(cmd: str) -> str | None:
    return next((why for prefix, why in CHECKED_ONLY.items() if cmd.startswith(prefix)), None)


def _param(lang: str, cmd: str):
    slow = lang == "python" or not (cmd.startswith(MODEL_FREE) or _checked_only(cmd))
    label = cmd.split("\n")[-2][:60] if lang == "python" else cmd[:60]
    marks = (
        [pytest.mark.slow, pytest.mark.timeout(3600)] if slow else []
    )  # minutes each; more on shared cores
    return pytest.param(lang, cmd, id=label, marks=marks)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A folder laid out like a fresh clone, with a `sqlrl` on PATH that is this checkout's CLI."""
    d = tmp_path_factory.mktemp("clone")
    for name in ("configs", "scripts", "src", "constraints.txt"):
        (d / name).symlink_to(ROOT / name)
    bin_dir = d / ".bin"
    bin_dir.mkdir()
    (bin_dir / "sqlrl").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sqlrl.cli "$@"\n')
    (bin_dir / "sqlrl").chmod(0o755)
    return d


def _env(clone: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SQLRL_CACHE"}  # the README's ~/.cache/sqlrl
    env["PATH"] = f"{clone / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["TQDM_DISABLE"] = "1"
    return env


def _check_only(cmd: str, clone: Path) -> None:
    """The command exists, its input files exist (relative to the clone) and its TOML files load."""
    from sqlrl.config import read_raw

    words = shlex.split(cmd, comments=True)
    if words[0] == "bash":
        r = subprocess.run(["bash", "-n", words[1]], cwd=clone, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return
    if words[0] == "python3":  # the install line: its files, and the command it ends with
        assert (ROOT / "constraints.txt").is_file() and (ROOT / "pyproject.toml").is_file()
        words = words[words.index("&&", len(words) - 3) + 1 :]
    sub = [w for w in words[1:3] if re.fullmatch(r"[a-z][a-z-]*", w)]
    r = subprocess.run(
        [*words[:1], *sub, "--help"], cwd=clone, env=_env(clone), capture_output=True, text=True
    )
    assert r.returncode == 0, f"{' '.join([*words[:1], *sub])} --help: {r.stderr[-2000:]}"
    for w in words[1:]:
        if w.startswith(("configs/", "scripts/", "src/")):
            assert (clone / w).exists(), f"{w} does not exist in a fresh clone"
        if w.endswith(".toml"):
            read_raw(clone / w)


@pytest.mark.parametrize(("lang", "cmd"), [_param(lang, cmd) for lang, cmd in COMMANDS])
def test_readme_command_runs_as_written(clone, lang, cmd):
    why = _checked_only(cmd) if lang == "bash" else None
    if why is not None:
        _check_only(cmd, clone)
        return
    if lang == "python":
        script = clone / "readme_api.py"
        script.write_text(cmd, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-c", cmd]
    r = subprocess.run(argv, cwd=clone, env=_env(clone), capture_output=True, text=True, timeout=3500)
    assert r.returncode == 0, f"{cmd}\nexit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_readme_has_the_commands_this_test_knows():
    """The parser sees every block (a new block style would otherwise be silently untested), and every
    CHECKED_ONLY entry still matches a README command (a stale entry would hide nothing)."""
    text = README.read_text(encoding="utf-8")
    fenced = re.findall(r"^```(\w*)\n", text, flags=re.M)
    assert set(fenced) <= {"bash", "python", ""}, fenced  # "" closes a block or is the Files tree
    assert sum(lang == "python" for lang, _ in COMMANDS) == fenced.count("python")
    cmds = [c for lang, c in COMMANDS if lang == "bash"]
    for prefix in CHECKED_ONLY:
        assert any(c.startswith(prefix) for c in cmds), f"CHECKED_ONLY entry {prefix!r} matches no command"
    assert all(c.startswith(("sqlrl ", "bash ", "python3 ")) for c in cmds), cmds


def test_readme_first_commands_are_the_main_job_and_the_tests():
    """The README's first command block is what a new user runs first: the main job on embedded
    defaults, then the test command (which `.ci/run` calls)."""
    first = next(c for lang, c in COMMANDS if lang == "bash")
    bash_cmds = [c for lang, c in COMMANDS if lang == "bash"]
    assert first.endswith("sqlrl quickstart"), first
    assert bash_cmds[1] == "bash scripts/test.sh", bash_cmds[:2]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
