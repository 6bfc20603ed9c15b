"""`sqlrl compare`: paired comparison of two evaluation folders, with values derived by hand."""

from __future__ import annotations

import json

import pytest

from sqlrl.cli import main
from sqlrl.evidence.pair import CompareError, compare_runs, format_comparison, setting_differences

# (task, status in A, correct in A, status in B, correct in B); None = the task is absent from that run
ROWS = [
    ("t1", "match", True, "match", True),
    ("t2", "exec_error", False, "match", True),  # repair gain
    ("t3", "mismatch", False, "match", True),  # answer gain
    ("t4", "match", True, "mismatch", False),  # answer loss
    ("t5", "mismatch", False, "mismatch", False),
    ("t6", "exec_error", False, "exec_error", False),
    ("t7", "gold_unscorable", None, "match", True),  # excluded in A: not paired
    ("t8", None, None, "match", True),  # only in B
]


def _write(folder, side: int, budgets: dict, rows=ROWS):
    folder.mkdir(parents=True)
    with open(folder / "results.jsonl", "w") as f:
        for row in rows:
            status, correct = row[1 + 2 * side], row[2 + 2 * side]
            if status is not None:
                f.write(json.dumps({"task_id": row[0], "status": status, "correct": correct}) + "\n")
    run = {"model": {"name": "m", "identity": "sha256:x"}, "fingerprint": "f", "budgets": budgets}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


@pytest.fixture
def runs(tmp_path):
    a = _write(tmp_path / "a", 0, {"turns": 1, "max_new_tokens": 256})
    b = _write(tmp_path / "b", 1, {"turns": 1, "max_new_tokens": 256, "schema_sample_values": 3})
    return a, b


def test_compare_counts_and_tests_by_hand(runs):
    c = compare_runs(*runs, n_boot=2000)
    # paired: t1..t6; A right on t1, t4; B right on t1, t2, t3
    assert c.n == 6 and c.dropped_excluded == 1 and c.unpaired == 1
    assert (c.mean_a, c.mean_b) == (pytest.approx(2 / 6), pytest.approx(3 / 6))
    assert c.diff == pytest.approx(1 / 6, abs=1e-12)
    assert (c.b_only, c.a_only) == (2, 1)
    # McNemar: 3 discordant pairs, min 1: p = 2 * (C(3,0) + C(3,1)) / 2^3 = 1
    assert c.p_value == 1.0
    assert c.ci_low <= 1 / 6 <= c.ci_high and c.ci_low < 0 < c.ci_high
    assert c.repair["repair_part"] == pytest.approx(1 / 6) and c.repair["answer_part"] == 0.0
    # each side over its own scored tasks: A 2 of 6 (t7 excluded), B 5 of 8
    assert (c.a.scored, c.a.correct, c.a.excluded) == (6, 2, 1)
    assert (c.b.scored, c.b.correct, c.b.excluded) == (8, 5, 0)
    assert c.b.accuracy == pytest.approx(5 / 8)
    assert c.differences == {"budgets.schema_sample_values": (None, 3)}


def test_one_sided_gains_give_a_small_exact_p(tmp_path):
    rows = [(f"t{i}", "mismatch", False, "match", True) for i in range(10)]
    rows += [(f"s{i}", "match", True, "match", True) for i in range(5)]
    a = _write(tmp_path / "a", 0, {}, rows)
    b = _write(tmp_path / "b", 1, {}, rows)
    c = compare_runs(a, b, n_boot=500)
    # 10 discordant pairs all one way: p = 2 / 2^10
    assert c.p_value == pytest.approx(2 / 1024, rel=1e-12)
    assert c.diff == pytest.approx(10 / 15) and c.ci_low > 0
    assert c.repair["answer_gains"] == 10 and c.differences == {}
    assert "settings that differ: none recorded" in format_comparison(c)


def test_setting_differences_compare_nested_keys():
    a = {"model": {"name": "x"}, "sampling": {"temperature": 0.0, "seed": 0}, "engine": "static"}
    b = {"model": {"name": "y"}, "sampling": {"temperature": 0.0, "seed": 1}, "engine": "static"}
    assert setting_differences(a, b) == {"model.name": ("x", "y"), "sampling.seed": (0, 1)}


def test_folders_that_cannot_be_compared(tmp_path, runs):
    with pytest.raises(CompareError, match="no results.jsonl"):
        compare_runs(tmp_path / "nowhere", runs[1])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.jsonl").write_text('{"no_task": 1}\n')
    with pytest.raises(CompareError, match="task_id"):
        compare_runs(bad, runs[1])
    other = _write(tmp_path / "other", 0, {}, [("z1", "match", True, "match", True)])
    with pytest.raises(CompareError, match="no task scored in both"):
        compare_runs(other, runs[1])


def test_cli_prints_writes_json_and_fails_cleanly(runs, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main(["compare", str(runs[0]), str(runs[1]), "--n-boot", "300", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "B - A: +16.7 pp" in text and "A right and B wrong: 1" in text
    assert "budgets.schema_sample_values: (not recorded: default) -> 3" in text
    saved = json.loads(out.read_text())
    assert saved["n"] == 6 and saved["b"]["accuracy"] == pytest.approx(0.625)
    assert saved["differences"] == {"budgets.schema_sample_values": [None, 3]}
    assert main(["compare", str(tmp_path / "missing"), str(runs[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sqlrl compare:") and "no results.jsonl" in err[0]


@pytest.mark.parametrize("broken", ["missing", "unreadable"])
def test_a_run_without_run_json_is_not_said_to_share_the_settings(runs, broken):
    """Without a readable run.json on a side, what the runs vary is unknown: never 'none recorded
    (same model, tasks, ...)', and a side's absent settings are not shown as defaults."""
    for folder in runs:
        if broken == "missing":
            (folder / "run.json").unlink()
        else:
            (folder / "run.json").write_text("{not json")
    c = compare_runs(*runs, n_boot=200)
    text = format_comparison(c)
    assert "none recorded" not in text
    assert c.differences == {} and c.no_run_json == ("A", "B")
    assert "settings not compared: no readable run.json in A and B" in text
    (runs[0] / "run.json").write_text(json.dumps({"model": {"name": "m"}, "budgets": {"turns": 1}}))
    c = compare_runs(*runs, n_boot=200)
    assert c.differences == {} and c.no_run_json == ("B",)
    assert "(not recorded: default)" not in format_comparison(c)
