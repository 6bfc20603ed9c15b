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


def test_a_self_consistency_eval_stopped_while_sampling_runs_again(tmp_path):
    """Greedy finished (summary.json), self_consistency.json not yet written: the same command with
    --self-consistency is accepted (greedy, then self-consistency); without it, or once written, refused."""
    from sqlrl.cli.outdir import check_eval_out

    done = tmp_path / "ev"
    done.mkdir()
    for name in ("summary.json", "results.jsonl"):
        (done / name).write_text("{}")
    check_eval_out(done, "embedded", self_consistency=True)
    with pytest.raises(ValueError, match="holds a finished evaluation"):
        check_eval_out(done, "embedded")
    (done / "self_consistency.json").write_text("{}")
    with pytest.raises(ValueError, match="holds a finished evaluation"):
        check_eval_out(done, "embedded", self_consistency=True)


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
        (
            ["--turns", "2", "--max-sql-executions", "0"],
            "--max-sql-executions 0: a multi-turn agent (--turns 2) needs max_sql_executions >= 1",
        ),
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


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--timeout", "nan"], "--timeout nan / --workers 2: give a finite --timeout > 0"),
        (["--timeout", "inf"], "--timeout inf / --workers 2: give a finite --timeout > 0"),
        (["--cache", "AFILE"], "is a file, not a folder; give a folder path"),
        (["--cache", "AFILE/sub"], "cannot create the folder (Not a directory"),
    ],
)
def test_data_audit_refuses_a_timeout_or_cache_it_cannot_use(args, said, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    argv = ["data", "audit", *[a.replace("AFILE", str(afile)) for a in args]]
    assert cli.main(argv) == 2
    assert said in one_line(capsys, "sqlrl data audit: error: ")
    assert afile.read_text() == "mine"


@pytest.mark.parametrize("command", ["compare", "report", "seeds"])
def test_a_negative_bootstrap_seed_is_refused(command, tmp_path, capsys):
    argv = {
        "compare": ["compare", str(tmp_path / "a"), str(tmp_path / "b")],
        "report": ["report", str(tmp_path / "e")],
        "seeds": ["seeds", str(tmp_path / "e"), str(tmp_path / "f"), "--out", str(tmp_path / "s")],
    }[command]
    assert cli.main([*argv, "--seed", "-1"]) == 2
    assert one_line(capsys, f"sqlrl {command}: ").endswith("--seed -1: the bootstrap seed must be 0 or more")


def _eval_run(path: Path) -> Path:
    path.mkdir()
    rows = [{"task_id": f"t{i}", "db_id": "d", "correct": i % 2 == 0, "reward": 1.0} for i in range(4)]
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("where", ["a folder", "under a file"])
@pytest.mark.parametrize("command", ["compare", "audit weights"])
def test_a_report_file_path_that_cannot_be_written_is_refused_up_front(command, where, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    target = tmp_path if where == "a folder" else afile / "x.json"
    if command == "compare":
        argv = ["compare", str(_eval_run(tmp_path / "a")), str(_eval_run(tmp_path / "b")), "--json"]
    else:
        argv = [
            "audit",
            "weights",
            "--base",
            str(tmp_path / "no"),
            "--trained",
            str(tmp_path / "no"),
            "--out",
        ]
    assert cli.main([*argv, str(target)]) == 2
    said = "is a folder; give a file path" if where == "a folder" else f"{afile} is a file, not a folder"
    assert said in one_line(
        capsys, f"sqlrl {command}: --{'json' if command == 'compare' else 'out'} {target}"
    )
    assert afile.read_text() == "mine"


@pytest.mark.parametrize("command", ["report", "seeds"])
def test_an_experiment_json_that_is_not_utf8_is_one_line(command, tmp_path, capsys):
    exp = tmp_path / "e"
    exp.mkdir()
    (exp / "experiment.json").write_bytes(b"\xff")
    argv = (
        ["report", str(exp)]
        if command == "report"
        else ["seeds", str(exp), str(tmp_path), "--out", str(tmp_path)]
    )
    assert cli.main(argv) == 2
    assert "experiment.json: not valid JSON ('utf-8' codec can't decode" in one_line(
        capsys, f"sqlrl {command}: "
    )


@pytest.mark.parametrize(
    ("content", "said"), [(b"[1, 2]", "is not a run config"), (b"\xff", "cannot be read")]
)
def test_resume_of_a_folder_whose_config_json_is_not_a_config_is_one_line(content, said, tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_bytes(content)
    assert cli.main(["train", str(CONFIGS / "quickstart.toml"), "--resume", str(run)]) == 2
    assert f"--resume {run}: its config.json {said}" in one_line(capsys, "sqlrl train: ")
    assert [p.name for p in run.iterdir()] == ["config.json"]


def test_a_split_file_nested_too_deeply_is_malformed_not_a_crash(tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(embedded_root(), data)
    (data / "train_spider.json").write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(["data", "split", "--data", str(data)]) == 2
    assert "train_spider.json is malformed: its JSON is nested too deeply" in one_line(
        capsys, "sqlrl data split:"
    )


def test_sql_and_reward_open_a_database_whose_name_is_not_utf8(tmp_path, capsys):
    import os

    src = next((embedded_root() / "database").glob("*/*.sqlite"))
    db = os.fsdecode(os.fsencode(str(tmp_path)) + b"/db\xff.sqlite")
    shutil.copyfile(src, db)
    assert cli.main(["sql", "--db", db, "SELECT 1"]) == 0
    assert cli.main(["reward", "--db", db, "--pred", "SELECT 1", "--gold", "SELECT 1"]) == 0
    assert '"status": "match"' in capsys.readouterr().out


def test_seeds_refuses_folders_without_arms_and_a_folder_given_twice(tmp_path, capsys):
    for name in ("s1", "s2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "experiment.json").write_text("{}")
    s1, s2, out = tmp_path / "s1", tmp_path / "s2", tmp_path / "out"
    assert cli.main(["seeds", str(s1), str(s2), "--out", str(out)]) == 2
    assert "experiment.json lists no arms" in one_line(capsys, f"sqlrl seeds: {s1}: ")
    assert cli.main(["seeds", str(s1), f"{s1}/", "--out", str(out)]) == 2
    assert one_line(capsys, "sqlrl seeds: ").endswith(
        f"{s1}/ is given twice (the same folder); give each seed's experiment folder once"
    )
    assert not out.exists()


@pytest.mark.parametrize("budget", ["nan", "inf", "-5", "0"])
@pytest.mark.parametrize("command", ["experiment", "curriculum"])
def test_a_time_budget_that_is_not_a_positive_number_of_seconds_is_a_usage_error(
    command, budget, tmp_path, capsys
):
    config = CONFIGS / ("quickstart.toml" if command == "experiment" else "debug-curriculum.toml")
    out = tmp_path / "out"
    assert cli.main([command, str(config), "--time-budget", budget, "--out", str(out)]) == 2
    assert "give a finite number of seconds > 0" in one_line(capsys, f"sqlrl {command}: --time-budget ")
    assert not out.exists()


@pytest.mark.parametrize(
    ("sets", "args"),
    [
        (["agent.turns=0"], ["--turns", "0"]),
        (["agent.max_new_tokens=2"], ["--max-new-tokens", "2"]),
        (
            ["agent.max_context_tokens=256", "agent.max_new_tokens=256"],
            ["--max-context-tokens", "256", "--max-new-tokens", "256"],
        ),
        (["agent.max_schema_chars=10"], ["--max-schema-chars", "10"]),
        (["agent.turns=2", "agent.max_sql_executions=0"], ["--turns", "2", "--max-sql-executions", "0"]),
    ],
)
def test_a_budget_is_refused_alike_in_a_run_file_and_on_the_command_line(sets, args, tmp_path, capsys):
    """One rule set (`config_budgets.budget_problems`): the run file's line is the flag's with the setting named."""
    import re

    from sqlrl import config as C

    run_file = tmp_path / "run.toml"
    run_file.write_text("")
    with pytest.raises(C.ConfigError) as e:
        C.load(run_file, sets)
    in_file = str(e.value).split(": ", 1)[1]
    assert cli.main(["eval", "--model", "no-such-model", *args, "--out", str(tmp_path / "run")]) == 2
    on_line = one_line(capsys, "sqlrl eval: ")
    as_flags = re.sub(r"agent\.(\w+) = ", lambda m: "--" + m.group(1).replace("_", "-") + " ", in_file)
    assert as_flags in on_line, (in_file, on_line)


def test_a_finished_leakage_audit_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "audit"
    out.mkdir()
    (out / "leakage.json").write_text('{"passed": true}')
    assert cli.main(["audit", "leakage", "--model", "no-such-model", "--out", str(out)]) == 2
    said = one_line(capsys, "sqlrl audit leakage: ")
    assert f"--out {out} holds a finished leakage audit (leakage.json)" in said
    assert (out / "leakage.json").read_text() == '{"passed": true}' and sorted(
        p.name for p in out.iterdir()
    ) == ["leakage.json"]
