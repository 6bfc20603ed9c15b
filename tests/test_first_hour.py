"""What a newcomer's slips get back: one line saying what, why and how to fix, a non-zero exit, and nothing
of an earlier run overwritten.

Covered: a misspelled command (the closest command named, no usage dump); Ctrl-C in `train` / `sft`
(the exact command to resume, its --set overrides kept); `--resume` with other overrides than the run's
(the --set arguments that restore the run's values, checked to work); `eval`, `audit leakage`,
`experiment` and `quickstart` into a folder holding another kind of run (refused before anything is
written); the experiment's verdict line; a missing data folder named
as a run-file key too; a list setting given a single value (the list to write); the leakage audit's
last line when no trajectory differs; a misspelled built-in model in `model fetch`.
Not covered: a real Ctrl-C in a running model (tests/test_cli.py checks the hint path with a stand-in).
"""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import pytest

from sqlrl import cli
from sqlrl import config as C

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "sqlrl" / "configs"
QUICKSTART = str(CONFIGS / "quickstart.toml")


def test_a_misspelled_command_names_the_closest_one_on_one_line(capsys):
    assert cli.main(["trian", "configs/quickstart.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "sqlrl: unknown command 'trian'; did you mean `sqlrl train`? `sqlrl --help` lists the commands"
    )
    assert cli.main(["zzzz"]) == 2
    assert (
        capsys.readouterr().err.strip() == "sqlrl: unknown command 'zzzz'; `sqlrl --help` lists the commands"
    )


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (
            [
                "train",
                "configs/quickstart.toml",
                "--set",
                "model.name=smollm2-135m-instruct",
                "--out",
                "runs/q",
            ],
            "sqlrl train configs/quickstart.toml --set model.name=smollm2-135m-instruct --resume runs/q",
        ),
        (
            ["train", "configs/quickstart.toml", "--out=runs/q", "--set", "grpo.steps=3"],
            "sqlrl train configs/quickstart.toml --set grpo.steps=3 --resume runs/q",
        ),
        (  # no --out: the default folder; a resumed run interrupted again keeps its folder
            ["train", "configs/quickstart.toml"],
            "sqlrl train configs/quickstart.toml --resume runs/quickstart",
        ),
        (
            ["train", "configs/quickstart.toml", "--resume", "runs/x", "--set", "grpo.steps=3"],
            "sqlrl train configs/quickstart.toml --set grpo.steps=3 --resume runs/x",
        ),
        (
            ["sft", "configs/debug-curriculum.toml", "--set", "model.name='a b'"],
            "sqlrl sft configs/debug-curriculum.toml --set 'model.name='\"'\"'a b'\"'\"'' "
            "--resume runs/debug-curriculum-sft",
        ),
    ],
)
def test_ctrl_c_in_train_prints_the_command_that_resumes(argv, command, monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(f"sqlrl.cli.{argv[0]}"), "cli_main", interrupted)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"sqlrl {argv[0]}: interrupted; resume with `{command}`"
    assert shlex.split(command)[-2:] == ["--resume", command.split()[-1]]


def resolved(overrides: list[str] | None = None) -> dict:
    """The quickstart config as `sqlrl train` compares it with a run's config.json (through JSON)."""
    return json.loads(json.dumps(C.load(QUICKSTART, overrides).resolve()))


def test_resume_with_other_overrides_says_which_set_arguments_restore_the_run(tmp_path):
    from sqlrl.training.runfolder import check_run_folder

    run = tmp_path / "run"
    run.mkdir()
    saved = resolved(['model.name="smollm2-135m-instruct"', "grpo.steps=6", "run.loggers=[]"])
    (run / "config.json").write_text(json.dumps(saved))
    with pytest.raises(C.ConfigError) as e:
        check_run_folder(run, resolved(), resume=True, command="train")
    msg = str(e.value)
    assert "\n" not in msg
    assert "--set 'model.name=\"smollm2-135m-instruct\"' --set grpo.steps=6 --set 'run.loggers=[]'" in msg
    sets = shlex.split(msg.split("the run's values: ")[1].split(")")[0])
    overrides = [sets[i + 1] for i in range(0, len(sets), 2)]
    assert sets[::2] == ["--set"] * 3
    assert check_run_folder(run, resolved(overrides), resume=True, command="train") == []


def _experiment_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "experiment.json").write_text("{}")
    (path / "report.md").write_text("the report")
    return path


def _train_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "run.json").write_text(json.dumps({"steps": 2, "train_seconds": 1.5}))
    return path


@pytest.mark.parametrize(
    ("make", "held"), [(_experiment_folder, "an experiment"), (_train_folder, "a training run")]
)
@pytest.mark.parametrize("command", [["eval"], ["audit", "leakage"]])
def test_eval_and_leakage_audit_refuse_a_folder_of_another_run_untouched(
    make, held, command, tmp_path, capsys
):
    folder = make(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    argv = [*command, "--model", "no-such-model", "--limit", "1", "--out", str(folder)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    name = " ".join(command)
    assert err == (
        f"sqlrl {name}: --out {folder} holds {held}; `sqlrl {name}` would overwrite or mix files into it; "
        "choose a new --out folder"
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def _eval_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"task_ids": ["a"], "model": {"name": "m"}}))
    (path / "results.jsonl").write_text("{}\n")
    return path


@pytest.mark.parametrize(
    ("make", "held"), [(_train_folder, "a training run"), (_eval_folder, "an evaluation")]
)
@pytest.mark.parametrize("command", [["quickstart"], ["experiment", QUICKSTART]])
def test_an_experiment_refuses_a_folder_of_another_run_untouched(make, held, command, tmp_path, capsys):
    folder = make(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert cli.main([*command, "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"sqlrl: --out {folder} holds {held}; `sqlrl {command[0]}` would overwrite or mix files into it; "
        "choose a new --out folder"
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_run_kind_tells_an_evaluation_and_a_leakage_audit_from_other_runs(tmp_path):
    from sqlrl.artifacts import check_out_folder, run_kind

    ev = tmp_path / "ev"
    ev.mkdir()
    assert run_kind(ev) is None and run_kind(tmp_path / "missing") is None
    (ev / "partial.json").write_text("{}")  # an interrupted evaluation: rerunning resumes it
    assert run_kind(ev) is None
    (ev / "run.json").write_text(json.dumps({"task_ids": ["a"], "model": {}}))
    assert run_kind(ev) == "an evaluation"
    check_out_folder(ev, "eval", "an evaluation")  # a rerun of an evaluation is allowed
    with pytest.raises(ValueError, match="holds an evaluation"):
        check_out_folder(ev, "audit leakage", "a leakage audit")
    leak = tmp_path / "leak"
    leak.mkdir()
    (leak / "leakage.json").write_text("{}")
    assert run_kind(leak) == "a leakage audit"
    (leak / "run.json").write_text("not json")
    assert run_kind(leak) == "a training run"


def test_a_missing_data_folder_names_the_run_file_key_too(tmp_path):
    from sqlrl.tasks.data import DataError, SpiderData

    with pytest.raises(DataError) as e:
        SpiderData(tmp_path / "nope")
    assert (
        f"data folder {tmp_path / 'nope'} does not exist; point --data (data.path in a TOML run file) at"
        in str(e.value)
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"point --data \(data.path in a TOML run file\) at the folder"):
        SpiderData(tmp_path / "empty")


def test_a_list_setting_given_one_value_says_what_list_to_write():
    with pytest.raises(C.ConfigError) as e:
        C.load(QUICKSTART, ["run.loggers=tensorboard"])
    assert str(e.value).endswith(
        "run.loggers must be a list, got str 'tensorboard'; write a TOML list, e.g. "
        'run.loggers = ["tensorboard"] in the file or --set \'run.loggers=["tensorboard"]\''
    )
    assert C.load(QUICKSTART, ['run.loggers=["tensorboard"]']).run.loggers == ("tensorboard",)


SMOKE = 'real_run: smoke run: experiment.json has "smoke": true, and smoke runs never become claims'


@pytest.mark.parametrize(
    ("verdict", "line"),
    [
        (
            {"claim_allowed": False, "missing": [SMOKE]},
            "verdict: no claim, as expected: this is a smoke run (experiment.smoke = true), which never "
            "becomes a claim (the report says what each check needs)",
        ),
        (
            {"claim_allowed": False, "missing": [SMOKE, "optimizer_steps: x", "weights_audit: y"]},
            "verdict: no claim, as expected: this is a smoke run (experiment.smoke = true), which never "
            "becomes a claim; 2 other check(s) failed too (the report says what each check needs)",
        ),
        (
            {"claim_allowed": False, "missing": ["controls: no validity arm", "leakage_audit: z"]},
            "verdict: no claim, missing: controls: no validity arm; 1 more (the report says what each check needs)",
        ),
        (
            {"claim_allowed": True, "missing": []},
            "verdict: claim allowed (every evidence check passed; the report has the numbers and caveats)",
        ),
    ],
)
def test_the_experiment_verdict_line_says_why_there_is_no_claim(verdict, line):
    from sqlrl.cli.experiment import verdict_line

    assert verdict_line(verdict) == line


def test_the_leakage_audits_last_line_says_when_nothing_differs(tmp_path):
    from sqlrl.cli.audit import leakage_line

    res = {"passed": True, "tasks": 4, "first_difference": None, "static_check": {"n_hits": 0}}
    out = tmp_path / "leakage.json"
    assert leakage_line(res, out) == (
        f"leakage audit PASSED: 4 tasks, no trajectory differs, static hits: 0 -> {out}"
    )
    res = {**res, "passed": False, "first_difference": {"index": 2, "field": "final_sql"}}
    assert leakage_line(res, out).startswith(
        'leakage audit FAILED: 4 tasks, first difference: {"index": 2, "field": "final_sql"}, static hits: 0'
    )


def test_a_misspelled_builtin_model_in_fetch_reads_as_one_sentence(tmp_path):
    from sqlrl.generation.models import ModelError
    from sqlrl.generation.sources import fetch_model

    with pytest.raises(ModelError) as ei:
        fetch_model("qwen2.5-coder-0.5b-instrct", cache_dir=tmp_path)
    msg = str(ei.value)
    assert "nor a .gguf file (did you mean 'qwen2.5-coder-0.5b-instruct'?); hub ids and local folders" in msg
    assert "?;" not in msg and "\n" not in msg
