"""`sqlrl seeds` refuses folders that are not one matrix run with different training seeds: one training
run under two seeds, a setting with two values where some folders lack it, a folder without run.seed,
Base evaluations that differ. Copies of the committed seed folders, and the synthetic matrix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import read_json, read_jsonl, write_json_atomic, write_jsonl
from sqlrl.evidence.seeds import summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from copy_result import copy_result  # noqa: E402
from make_experiment import make_experiment  # noqa: E402
from test_seeds import seeded  # noqa: E402

SEEDS = "2026-11-29-spider-0.5b-single-turn-seeds"


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("seeds")
    return copy_result(f"{SEEDS}/seed1", root / "seed1"), copy_result(f"{SEEDS}/seed2", root / "seed2")


def _set(d: Path, fn) -> Path:
    meta = read_json(d / "experiment.json")
    fn(meta)
    write_json_atomic(d / "experiment.json", meta)
    return d


def test_the_committed_seeds_are_one_matrix(committed) -> None:
    s = summarize(list(committed), n_boot=200)
    assert s["claim_allowed"], s["problems"]
    assert s["base_evaluations_identical"] is True


def test_one_run_relabelled_with_another_seed_is_refused(committed, tmp_path) -> None:
    seed1, _ = committed
    dup = _set(copy_result(f"{SEEDS}/seed1", tmp_path / "dup"), lambda m: m["config"]["run"].update(seed=5))
    s = summarize([seed1, dup], n_boot=200)
    assert not s["claim_allowed"]
    for arm in ("grpo", "validity"):
        assert (
            f"{seed1} and {dup}: arm '{arm}' has the same final weights: one training run, not two seeds"
            in (s["problems"])
        )
    assert not any("'no_update'" in p for p in s["problems"])  # its weights are the base's in every seed


def test_final_weights_are_read_from_final_identity_json_too(committed, tmp_path) -> None:
    seed1, _ = committed
    dup = _set(copy_result(f"{SEEDS}/seed1", tmp_path / "dup"), lambda m: m["config"]["run"].update(seed=5))
    for arm in ("grpo", "validity"):
        run = read_json(dup / "arms" / arm / "train" / "run.json")
        del run["final_identity"]
        write_json_atomic(dup / "arms" / arm / "train" / "run.json", run)
        rows = list(read_jsonl(dup / "arms" / arm / "eval" / "results.jsonl"))
        rows[0]["final_sql"] = "SELECT 1"
        write_jsonl(dup / "arms" / arm / "eval" / "results.jsonl", rows)
    problems = summarize([seed1, dup], n_boot=200)["problems"]
    assert (
        f"{seed1} and {dup}: arm 'grpo' has the same final weights: one training run, not two seeds"
        in problems
    )
    assert not any("same answers" in p for p in problems)


def test_same_answers_count_only_where_no_final_weights_tell_the_runs_apart(committed, tmp_path) -> None:
    """Same answers with other final weights (a short run, few tasks) are possible: no problem; the same
    answers where one folder records no final weights are the duplicate's only trace."""
    seed1, _ = committed
    dup = _set(copy_result(f"{SEEDS}/seed1", tmp_path / "dup"), lambda m: m["config"]["run"].update(seed=5))
    run = read_json(dup / "arms/grpo/train/run.json")
    run["final_identity"] = "sha256:" + "9" * 64
    write_json_atomic(dup / "arms/grpo/train/run.json", run)
    write_json_atomic(dup / "arms/grpo/train/final/identity.json", {"weights_hash": run["final_identity"]})
    problems = summarize([seed1, dup], n_boot=200)["problems"]
    assert not any("arm 'grpo'" in p for p in problems), problems
    del run["final_identity"]
    write_json_atomic(dup / "arms/grpo/train/run.json", run)
    (dup / "arms/grpo/train/final/identity.json").unlink()
    problems = summarize([seed1, dup], n_boot=200)["problems"]
    assert (
        f"{seed1} and {dup}: arm 'grpo' has the same answers on every task, and no final weights to tell the "
        "runs apart: one training run, not two seeds" in problems
    )


def test_base_evaluations_that_differ_refuse_the_claim(committed, tmp_path) -> None:
    seed1, _ = committed
    seed2 = copy_result(f"{SEEDS}/seed2", tmp_path / "seed2")
    path = seed2 / "arms" / "base" / "eval" / "results.jsonl"
    rows = list(read_jsonl(path))
    rows[1]["final_sql"] = (rows[1]["final_sql"] or "") + " "
    write_jsonl(path, rows)
    s = summarize([seed1, seed2], n_boot=200)
    assert s["base_evaluations_identical"] is False and not s["claim_allowed"]
    assert any(p.startswith("the Base evaluations differ between folders") for p in s["problems"])
    assert not s["rl_over_sft"]["answered"] or not any(
        k["allowed"] for k in s["rl_over_sft"]["kinds"].values()
    )


def test_a_setting_with_two_values_is_a_difference_where_a_folder_lacks_it(tmp_path) -> None:
    a = seeded(tmp_path, 0)
    b, c = seeded(tmp_path, 1, sft={"steps": 5}), seeded(tmp_path, 2, sft={"steps": 6})
    s = summarize([a, b, c], n_boot=200)
    assert not s["claim_allowed"]
    assert f"setting differs between folders: sft.steps: 5 / 6 (absent in {a})" in s["problems"]
    d = seeded(tmp_path, 3, sft={"steps": 5})
    s = summarize([a, b, d], n_boot=200)
    assert s["claim_allowed"], s["problems"]
    assert s["settings_in_some_folders_only"] == ["sft.steps"]
    assert any(f"sft.steps (absent in {a})" in n for n in s["notes"])


def test_a_folder_without_run_seed_is_refused_by_name(tmp_path) -> None:
    dirs = [seeded(tmp_path, k) for k in range(3)]
    _set(dirs[2], lambda m: m["config"]["run"].pop("seed"))
    s = summarize(dirs, n_boot=200)
    assert s["run_seeds"] == [0, 1, None] and not s["claim_allowed"]
    assert f"{dirs[2]}: experiment.json config records no run.seed" in s["problems"]


def test_synthetic_seeds_with_their_own_base_outcomes_are_refused(tmp_path) -> None:
    dirs = []
    for k in range(2):
        d = make_experiment(tmp_path / f"s{k}", synthetic=False, n_tasks=400, seed=k)
        dirs.append(_set(d, lambda m, k=k: m.__setitem__("config", {"run": {"seed": k}})))
    s = summarize(dirs, n_boot=200)
    assert s["base_evaluations_identical"] is False and not s["claim_allowed"]
    assert [r["gate"] for r in s["runs"]] == ["claim", "claim"]


def _base_on(d: Path, accelerator: str, identity: str | None = None) -> None:
    """Record every evaluation of `d` as run on `accelerator` (a seed on another GPU model), and its Base
    weights as `identity`, when given."""
    for path in sorted(d.glob("arms/*/eval/run.json")):
        run = read_json(path)
        run["machine"]["accelerator"] = accelerator
        if identity is not None and path.parts[-3] == "base":
            run["model"]["identity"] = identity
        write_json_atomic(path, run)


def _tamper_base_answer(d: Path) -> None:
    path = d / "arms" / "base" / "eval" / "results.jsonl"
    rows = list(read_jsonl(path))
    rows[1]["final_sql"] = (rows[1]["final_sql"] or "") + " "
    write_jsonl(path, rows)


def test_base_answers_may_differ_between_gpu_models_with_one_base_weights(tmp_path) -> None:
    seed1 = copy_result(f"{SEEDS}/seed1", tmp_path / "seed1")
    seed2 = copy_result(f"{SEEDS}/seed2", tmp_path / "seed2")
    _tamper_base_answer(seed2)
    _base_on(seed2, "NVIDIA H100 80GB HBM3")
    s = summarize([seed1, seed2], n_boot=200)
    assert s["claim_allowed"], s["problems"]
    assert s["base_evaluations_identical"] is False
    assert s["base_devices"] == [
        "nvidia h200 (torch 2.11.0+cu130, cuda 13.0)",
        "nvidia h100 80gb hbm3 (torch 2.11.0+cu130, cuda 13.0)",
    ]
    (note,) = [n for n in s["notes"] if n.startswith("Base evaluated on 2 devices")]
    assert "with the same weights sha256:804c131f7ea5: 1 of 759 tasks' final SQL or status differ" in note


def test_base_answers_that_differ_between_gpu_models_need_one_recorded_identity(tmp_path) -> None:
    seed1 = copy_result(f"{SEEDS}/seed1", tmp_path / "seed1")
    seed2 = copy_result(f"{SEEDS}/seed2", tmp_path / "seed2")
    _tamper_base_answer(seed2)
    _base_on(seed2, "NVIDIA H100 80GB HBM3", identity="sha256:" + "0" * 64)
    s = summarize([seed1, seed2], n_boot=200)
    assert not s["claim_allowed"]
    (p,) = [p for p in s["problems"] if p.startswith("the Base evaluations differ between folders")]
    assert "on different devices" in p and "not recorded as one" in p and "sha256:000000000000" in p
    # the same Base weights on one device must agree answer for answer: three folders, two on the H200
    seed3 = copy_result(f"{SEEDS}/seed1", tmp_path / "seed3")
    _set(seed3, lambda m: m["config"]["run"].__setitem__("seed", 3))
    _tamper_base_answer(seed3)
    _base_on(
        seed2,
        "NVIDIA H100 80GB HBM3",
        identity=read_json(seed1 / "arms/base/eval/run.json")["model"]["identity"],
    )
    s = summarize([seed1, seed2, seed3], n_boot=200)
    assert any(
        p.startswith("the Base evaluations differ between folders on one device (nvidia h200")
        for p in s["problems"]
    ), s["problems"]


def _machine(d: Path, change) -> None:
    path = d / "arms" / "base" / "eval" / "run.json"
    run = read_json(path)
    change(run)
    write_json_atomic(path, run)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.pop("machine"),
        lambda r: r.__setitem__("machine", ["NVIDIA H100"]),
        lambda r: r.__setitem__("machine", {"torch": "2.11.0+cu130", "cuda": "13.0"}),
        lambda r: r["machine"].__setitem__("accelerator", " nvidia h200 "),
        lambda r: r["machine"].__setitem__("accelerator", ""),
        lambda r: r["machine"].pop("cuda"),
    ],
    ids=["no-record", "a-list", "no-accelerator", "spelling", "empty-accelerator", "no-cuda"],
)
def test_base_answers_that_differ_need_a_complete_record_of_another_gpu_model(tmp_path, change) -> None:
    seed1 = copy_result(f"{SEEDS}/seed1", tmp_path / "seed1")
    seed2 = copy_result(f"{SEEDS}/seed2", tmp_path / "seed2")
    _tamper_base_answer(seed2)
    _machine(seed2, change)
    s = summarize([seed1, seed2], n_boot=200)
    assert not s["claim_allowed"]
    assert any(p.startswith("the Base evaluations differ between folders") for p in s["problems"]), s[
        "problems"
    ]


@pytest.mark.parametrize("n", [75, 76])  # 75 of 759 tasks is within 10 %, 76 is not
def test_base_answers_may_differ_between_gpu_models_in_at_most_a_tenth_of_the_tasks(tmp_path, n) -> None:
    seed1 = copy_result(f"{SEEDS}/seed1", tmp_path / "seed1")
    seed2 = copy_result(f"{SEEDS}/seed2", tmp_path / "seed2")
    _base_on(seed2, "NVIDIA H100 80GB HBM3")
    path = seed2 / "arms" / "base" / "eval" / "results.jsonl"
    rows = list(read_jsonl(path))
    for r in rows[:n]:
        r["final_sql"] = (r["final_sql"] or "") + " -- other GPU"
    write_jsonl(path, rows)
    s = summarize([seed1, seed2], n_boot=200)
    bad = [p for p in s["problems"] if p.startswith("the Base evaluations differ between folders")]
    if n == 75:
        assert not bad and any(f"{n} of 759 tasks' final SQL" in x for x in s["notes"]), s["problems"]
    else:
        assert bad and f"{n} of 759 tasks differ, more than 10%" in bad[0], s["problems"]
