"""Bad user input to the `sqlrl` commands: one line naming what, why and how to fix it, exit 2, no
traceback, and nothing written or replaced. None of these tests loads a model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sqlrl import cli
from sqlrl.tasks.data import embedded_root

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "sqlrl" / "configs"


def one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(prefix) and "\n" not in err and "Traceback" not in err, err
    return err


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _finished_eval(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"task_ids": ["a"], "model": {"name": "m"}}))
    (path / "summary.json").write_text("{}")
    (path / "results.jsonl").write_text("{}\n")
    return path


def _experiment_arm_eval(path: Path) -> Path:
    path.mkdir()
    (path / "experiment.json").write_text("{}")
    _finished_eval(path / "arms" / "grpo" / "eval")
    return path / "arms" / "grpo" / "eval"


def _experiment_arms(path: Path) -> Path:
    _experiment_arm_eval(path)
    return path / "arms"


def _other_files(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    return path


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_finished_eval, "holds a finished evaluation; `sqlrl eval` would replace it; choose another --out"),
        (_experiment_arm_eval, "is inside the experiment folder"),
        (_experiment_arms, "is inside the experiment folder"),
        (_other_files, "is not empty and holds no unfinished evaluation (it has notes.txt)"),
    ],
)
def test_eval_refuses_a_folder_it_would_replace_or_mix_into(make, said, tmp_path, capsys):
    out = make(tmp_path / "run")
    before = snapshot(tmp_path)
    assert cli.main(["eval", "--model", "no-such-model", "--limit", "1", "--out", str(out)]) == 2
    assert said in one_line(capsys, f"sqlrl eval: --out {out} ")
    assert snapshot(tmp_path) == before


def test_eval_accepts_a_new_folder_and_an_unfinished_evaluation(tmp_path):
    from sqlrl.cli.outdir import check_eval_out

    check_eval_out(tmp_path / "new", "embedded")
    part = tmp_path / "part"
    part.mkdir()
    for name in ("partial.json", "trajectories.partial.jsonl", ".partial.json.x1.tmp", ".sqlrl.lock"):
        (part / name).write_text("{}")
    (part / ".goldcache").mkdir()
    check_eval_out(part, "embedded")


def test_eval_and_experiment_refuse_an_out_in_or_being_a_data_folder(tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(embedded_root(), data)
    before = snapshot(data)
    for out in (data, data / "runs" / "ev"):
        argv = ["eval", "--model", "no-such-model", "--data", str(data), "--limit", "1", "--out", str(out)]
        assert cli.main(argv) == 2
        assert "data folder" in one_line(capsys, f"sqlrl eval: --out {out} is ")
    experiment = ["experiment", str(CONFIGS / "quickstart.toml"), "--set", "model.name='no-such-model'"]
    experiment += ["--set", f"data.path={json.dumps(str(data))}"]
    assert cli.main([*experiment, "--out", str(data / "exp")]) == 2
    assert f"inside the data folder {data} (data.path)" in one_line(capsys, "sqlrl: --out ")
    assert snapshot(data) == before and not (data / "exp").exists()


WRITERS = {
    "eval": ["eval", "--model", "smollm2-135m-instruct", "--limit", "1"],
    "train": ["train", str(CONFIGS / "quickstart.toml")],
    "sft": ["sft", str(CONFIGS / "debug-curriculum.toml")],
    "experiment": ["experiment", str(CONFIGS / "quickstart.toml")],
}


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize("kind", ["file", "dangling link", "under a file"])
def test_an_out_that_cannot_be_a_folder_is_one_line(name, kind, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    out = {"file": afile, "dangling link": tmp_path / "link", "under a file": afile / "sub"}[kind]
    if kind == "dangling link":
        out.symlink_to(tmp_path / "missing")
    rc = cli.main([*WRITERS[name], "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    said = {"file": "is a file, not a folder", "dangling link": "which does not exist"}
    assert f"--out {out}" in err and said.get(kind, "cannot create the run folder") in err, err
    assert afile.read_text() == "mine" and not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--turns", "0"], "--turns 0: the agent needs at least one turn"),
        (["--limit", "-3"], "--limit -3: give the number of tasks to evaluate, or 0 for all of them"),
        (["--max-new-tokens", "2"], "--max-new-tokens 2: a turn needs at least 8 tokens"),
        (["--max-context-tokens", "100", "--max-new-tokens", "100"], "must exceed --max-new-tokens 100"),
        (["--max-schema-chars", "10"], "--max-schema-chars 10: give 200 or more"),
        (["--turns", "2", "--max-sql-executions", "0"], "--max-sql-executions 0: give 0 or more, and 1"),
    ],
)
@pytest.mark.parametrize("command", [["eval"], ["audit", "leakage"]])
def test_eval_budgets_no_evaluation_can_run_with_are_refused(command, args, said, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main([*command, "--model", "no-such-model", *args, "--out", str(out)]) == 2
    assert said in one_line(capsys, f"sqlrl {' '.join(command)}: ")
    assert not out.exists()


def test_a_negative_task_limit_is_refused():
    from sqlrl.tasks.data import select_tasks

    with pytest.raises(ValueError, match="a task limit of -3 is negative"):
        select_tasks([1, 2, 3, 4], -3, 0)
    assert select_tasks([1, 2, 3, 4], 0, 0) == [1, 2, 3, 4]


def test_train_refuses_a_bad_value_before_its_run_folder_exists(tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["train", str(CONFIGS / "quickstart.toml"), "--out", str(out), "--set", "run.sandbox_workers=0"]
    assert cli.main(argv) == 2
    assert "run.sandbox_workers = 0 must be in [1, 256]" in one_line(capsys, "sqlrl train: ")
    assert not out.exists()
