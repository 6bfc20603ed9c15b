"""`sqlrl --help` and every `sqlrl COMMAND --help` answer with exit 0 without importing torch or
transformers (lazy imports keep --help instant), and the top-level usage lists every command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


CONFIGS = Path(__file__).resolve().parents[1] / "src" / "sqlrl" / "configs"
WRITERS = {  # every command that writes a run folder; RUN is the folder
    "train": ["train", str(CONFIGS / "quickstart.toml"), "--out", "RUN"],
    "train-verl": [
        "train",
        str(CONFIGS / "quickstart.toml"),
        "--engine",
        "verl",
        "--out",
        "RUN",
        "--dry-run",
    ],
    "train-resume": ["train", str(CONFIGS / "quickstart.toml"), "--resume", "RUN"],
    "sft": ["sft", str(CONFIGS / "debug-curriculum.toml"), "--out", "RUN"],
    "sft-resume": ["sft", str(CONFIGS / "debug-curriculum.toml"), "--resume", "RUN"],
    "curriculum": ["curriculum", str(CONFIGS / "debug-curriculum.toml"), "--out", "RUN"],
    "experiment": ["experiment", str(CONFIGS / "quickstart.toml"), "--out", "RUN"],
    "eval": ["eval", "--out", "RUN", "--limit", "2"],
    "eval-debug": ["eval", "--kind", "debug", "--split", "test", "--out", "RUN", "--limit", "2"],
    "audit-leakage": ["audit", "leakage", "--out", "RUN", "--limit", "2"],
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_writer_on_a_folder_another_process_holds_exits_2_naming_it_and_the_pid(
    name, tmp_path, capsys, hold_run_lock
):
    from sqlrl import cli

    run = tmp_path / "run"
    holder = hold_run_lock(run)
    try:
        rc = cli.main([str(run) if x == "RUN" else x for x in WRITERS[name]])
        err = capsys.readouterr().err.strip()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert rc == 2, err
    assert err.startswith("sqlrl ") and "\n" not in err, err
    assert f"run folder {run} is in use by another sqlrl process (PID {holder.pid}," in err
    assert not run.exists()  # the holder made it for its lock and removed it; nothing was written


@pytest.mark.parametrize(
    ("command", "module", "func", "said"),
    [
        (
            "quickstart",
            "sqlrl.cli.experiment",
            "cli_quickstart",
            "interrupted; rerun the same command to resume",
        ),
        ("eval", "sqlrl.cli.eval", "cli_main", "interrupted; rerun the same command to resume"),
        (
            "train",
            "sqlrl.cli.train",
            "cli_main",
            "interrupted; resume with `sqlrl train CONFIG --resume RUN_DIR`",
        ),
        ("sql", "sqlrl.cli.sql", "cli_main", "interrupted"),
    ],
)
def test_ctrl_c_says_how_to_resume(command, module, func, said, monkeypatch, capsys):
    import importlib

    from sqlrl import cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), func, interrupted)
    assert cli.main([command]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"sqlrl {command}: {said}")
    if command == "sql":
        assert err == "sqlrl sql: interrupted"


def test_eval_budget_flags_carry_the_schema_options():
    import argparse

    from sqlrl.agent.loop import Budgets
    from sqlrl.cli.eval import add_budget_args, budgets_from_args

    p = argparse.ArgumentParser()
    add_budget_args(p)
    b = budgets_from_args(p.parse_args(["--schema-sample-values", "3", "--schema-order", "question"]))
    assert (b.schema_sample_values, b.schema_order) == (3, "question")
    assert budgets_from_args(p.parse_args([])) == Budgets()
    assert budgets_from_args(p.parse_args(["--checker"])) == Budgets(checker=True)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--schema-sample-values", "21"])
    assert e.value.code == 2


def test_eval_breakdown_lines_of_a_spider_summary():
    from sqlrl.cli.eval import breakdown_lines

    row = {"n": 0, "correct": 0, "accuracy": None, "excluded": 0}
    summary = {
        "by_hardness": {
            "easy": {"n": 4, "correct": 3, "accuracy": 0.75, "excluded": 1},
            "medium": {"n": 3, "correct": 1, "accuracy": 1 / 3, "excluded": 0},
            "hard": dict(row),
            "extra": {**row, "excluded": 2},
            "unparsed": {"n": 1, "correct": 0, "accuracy": 0.0, "excluded": 0},
        }
    }
    assert breakdown_lines(summary) == [
        "accuracy by Spider hardness: easy 75.0% (3/4, 1 excluded), medium 33.3% (1/3), hard -, "
        "extra - (2 excluded), unparsed 0.0% (0/1)"
    ]
    assert breakdown_lines({"by_hardness": {"easy": dict(row)}}) == []  # nothing scored: no line


SIGTERM_PROBE = """
import importlib, os, signal, sys, time
from sqlrl import cli

before = signal.getsignal(signal.SIGTERM)

def terminated(argv):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    finally:
        print("UNWOUND")  # context managers (run folder lock, worker pools) run their exits

importlib.import_module("sqlrl.cli.{command}").cli_main = terminated
rc = cli.main([{command!r}, "CONFIG"])
print("RESULT", rc, signal.getsignal(signal.SIGTERM) == before)
"""


@pytest.mark.parametrize(
    ("command", "hint"), [("eval", "rerun the same command to resume"), ("train", "--resume")]
)
def test_sigterm_unwinds_as_ctrl_c_does_and_exits_143(command, hint):
    p = subprocess.run(
        [sys.executable, "-c", SIGTERM_PROBE.format(command=command)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.split() == ["UNWOUND", "RESULT", "143", "True"], (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith(f"sqlrl {command}: interrupted; ") and hint in err, err
