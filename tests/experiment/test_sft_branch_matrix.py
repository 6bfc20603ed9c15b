"""grpo_sft from the sft arm's weights at step init_steps (`sft.init_from = "control"`) in the matrix.

Config checks, the disk estimate and the missing-branch refusal on hand-built folders; one CPU matrix
(the tiny random Qwen2 of test_experiment.py, the embedded Spider slice) that branches, resumes and
refuses a missing branch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.artifacts import write_json_atomic
from sqlrl.experiment.arms import check_branches, init_dir, init_weights
from sqlrl.experiment.matrix import ExperimentConfig, disk_needed, load_experiment, run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


ARMS = "[experiment]\narms = ['base', 'sft', 'grpo_sft']\n"


def test_init_from_control_config_checks(tmp_path):
    p = tmp_path / "e.toml"
    p.write_text(ARMS + "[sft]\nsteps = 680\ninit_steps = 240\ninit_from = 'control'\n")
    assert load_experiment(p)[1].sft.init_from == "control"
    assert T.sft_from_dict({}).init_from == "stage"  # the default: grpo_sft's own stage
    for table, match in (
        ("steps = 240\ninit_steps = 240", r"init_steps = 240, which must be a step of that run, 1 \.\. sft"),
        ("steps = 10\ninit_steps = 0", "init_steps = 0, which must be a step of that run"),
        ("steps = 10\ninit_steps = 3\ninit_from = 'both'", "init_from"),
    ):
        init_from = "" if "init_from" in table else "\ninit_from = 'control'"
        p.write_text(ARMS + f"[sft]\n{table}{init_from}\n")
        with pytest.raises(C.ConfigError, match=match):
            load_experiment(p)
    for arms in ("['base', 'grpo_sft', 'sft']", "['base', 'grpo_sft']"):
        p.write_text(
            f"[experiment]\narms = {arms}\n[sft]\nsteps = 5\ninit_steps = 2\ninit_from = 'control'\n"
        )
        with pytest.raises(
            C.ConfigError, match='with sft.init_from = "control" grpo_sft starts from the sft'
        ):
            load_experiment(p)
    # a decay over sft.steps only: init_steps is no run of its own, so it may sit inside the warm-up
    sft = {"steps": 10, "init_steps": 2, "warmup_steps": 3, "lr_schedule": "cosine"}
    assert T.sft_from_dict({**sft, "init_from": "control"}).init_steps == 2
    with pytest.raises(C.ConfigError, match="until sft.init_steps = 2"):
        T.sft_from_dict(sft)


def test_branch_folders_and_disk(tmp_path):
    sft = T.sft_from_dict({"steps": 5, "init_steps": 2, "init_from": "control"})
    assert init_dir(tmp_path, 3, sft, 2048) == tmp_path / "arms/sft_t3_c2048/train"
    assert init_weights(tmp_path, 3, sft, 2048) == tmp_path / "arms/sft_t3_c2048/train/branch_step_000002"
    stage = T.sft_from_dict({"steps": 5, "init_steps": 2})
    assert init_weights(tmp_path, 1, stage) == tmp_path / "arms/grpo_sft/sft_init/final"
    cfg = C.from_dict(
        {"grpo": {"steps": 2}, "run": {"checkpoint_every": 2, "prune_checkpoints_at_end": True}}
    )
    exp = ExperimentConfig(name="q", arms=("base", "grpo", "sft", "grpo_sft"), sft=sft)
    # 4 GB float32 weights each: the finals of grpo, sft, grpo_sft and the branch, + 0.2 GB logs
    assert disk_needed(cfg, exp, 1_000_000_000)[0] == 16_200_000_000


def test_an_sft_arm_past_its_branch_step_without_the_branch_is_refused_in_one_line(tmp_path):
    sft = T.sft_from_dict({"steps": 5, "init_steps": 2, "init_from": "control"})
    cells, arms = [(1, None)], ("base", "sft", "grpo_sft")
    write_json_atomic(tmp_path / "arms/sft/train/run.json", {"status": "stopped"})

    def checkpoint(step: int, weights: bool = True) -> None:
        d = tmp_path / f"arms/sft/train/checkpoints/step_{step:06d}"
        write_json_atomic(d / "sidecar.json", {"files": {"model.pt": "sha256:..."}})
        if weights:
            (d / "model.pt").write_bytes(b"w")

    checkpoint(1)
    check_branches(tmp_path, cells, arms, sft)  # stopped before step 2: it exports the branch when it resumes
    checkpoint(2, weights=False)
    check_branches(tmp_path, cells, arms, sft)  # carried without weights: no checkpoint to resume after 2
    checkpoint(2)
    with pytest.raises(C.ConfigError, match="branch_step_000002 is missing"):
        check_branches(tmp_path, cells, arms, sft)  # it would resume after step 2, without exporting it
    write_json_atomic(tmp_path / "arms/sft/train/run.json", {"status": "finished"})
    check_branches(tmp_path, cells, ("base", "sft"), sft)  # no grpo_sft: nothing to check
    with pytest.raises(C.ConfigError) as e:
        check_branches(tmp_path, cells, arms, sft)
    branch = tmp_path / "arms/sft/train/branch_step_000002"
    assert str(e.value) == (
        'arm grpo_sft starts from the sft arm\'s weights at step 2 (sft.init_from = "control"), but '
        f"{branch} is missing (the sft arm ran without that export); delete {tmp_path / 'arms/sft'} to "
        "rerun the sft arm, which exports it"
    )
    # a grpo_sft that finished training does not need it any more
    write_json_atomic(tmp_path / "arms/grpo_sft/train/run.json", {"status": "finished"})
    check_branches(tmp_path, cells, arms, sft)


def _tiny_branch_matrix(model_dir):
    """(config, [sft]) of a tiny-model matrix whose grpo_sft branches from the sft arm after step 2 of 3."""
    cfg = C.from_dict(
        {
            "model": {"name": model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 2},
            "agent": {"max_new_tokens": 160, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    sft = T.sft_from_dict(
        {"steps": 3, "init_steps": 2, "init_from": "control", "batch_size": 2, "micro_batch": 2, "lr": 1e-3}
    )
    return cfg, sft


def test_the_progress_plan_times_sft_steps_apart_and_holds_the_branch_evaluation(tmp_path):
    from sqlrl.experiment.matrix import ArmProgress

    cfg, sft = _tiny_branch_matrix(str(tmp_path))
    exp = ExperimentConfig(name="b", arms=("base", "sft", "grpo_sft"), leakage_tasks=1, smoke=True, sft=sft)
    parts = [(p.label, p.kind, p.total, p.rate_key) for p in ArmProgress(cfg, exp, 2, "b").line.parts]
    assert parts == [
        ("arm 1 of 3 base: evaluate", "task", 2, "task"),
        ("arm 2 of 3 sft: train", "step", 3, "sft step"),
        ("arm 2 of 3 sft: evaluate", "task", 2, "task"),
        ("arm 2 of 3 sft: evaluate its step-2 branch", "task", 2, "task"),
        ("arm 3 of 3 grpo_sft: train", "step", 1, "step"),
        ("arm 3 of 3 grpo_sft: evaluate", "task", 2, "task"),
        ("leakage audit (turns 1):", "task", 2, "task"),
    ]
    # grpo_sft with an SFT stage of its own: that stage's steps come first, timed as SFT steps
    own = dataclasses.replace(sft, init_from="stage", steps=3, init_steps=2)
    exp = ExperimentConfig(name="b", arms=("base", "grpo_sft"), leakage_tasks=1, smoke=True, sft=own)
    parts = [(p.label, p.total, p.rate_key) for p in ArmProgress(cfg, exp, 2, "b").line.parts]
    assert parts[1:3] == [
        ("arm 2 of 2 grpo_sft: SFT stage", 2, "sft step"),
        ("arm 2 of 2 grpo_sft: train", 1, "step"),
    ]


@pytest.mark.slow
def test_grpo_sft_trains_from_the_controls_branch_and_resumes(tiny_model_dir, tmp_path, caplog):  # noqa: F811
    from sqlrl.evidence.rltime import rl_training
    from sqlrl.evidence.rundir import Experiment

    cfg, sft = _tiny_branch_matrix(tiny_model_dir)
    exp = ExperimentConfig(
        name="branch", arms=("base", "sft", "grpo_sft"), leakage_tasks=1, smoke=True, sft=sft
    )
    out = tmp_path / "exp"
    progress_log = logging.getLogger("sqlrl.progress")  # the matrix's progress line, off a terminal
    caplog.set_level(logging.INFO, logger="sqlrl.progress")
    progress_log.addHandler(caplog.handler)
    try:
        run_experiment(cfg, exp, out, report=False)
    finally:
        progress_log.removeHandler(caplog.handler)
    # the sft arm's steps and its branch's evaluation are parts of the matrix's one progress line
    lines = [m for m in caplog.messages if m.startswith("[branch] ")]
    assert any(m.startswith("[branch] arm 2 of 3 sft: train step 3 of 3 |") for m in lines)
    assert any(
        m.startswith("[branch] arm 2 of 3 sft: evaluate its step-2 branch task 2 of 2 |") for m in lines
    )
    assert lines[-1].startswith("[branch] leakage audit (turns 1): task 2 of 2 |") and lines[-1].endswith(
        "ETA 0:00"
    )
    branch = out / "arms/sft/train/branch_step_000002"
    ident = json.loads((branch / "identity.json").read_text())
    info = json.loads((branch / "branch.json").read_text())
    sft_run = json.loads((out / "arms/sft/train/run.json").read_text())
    assert ident["step"] == 2 and sft_run["steps"] == 3 and sft_run["branch"]["step"] == 2
    assert not (out / "arms/grpo_sft/sft_init").exists()  # no SFT run of its own
    e = json.loads((out / "experiment.json").read_text())
    assert e["arms"]["grpo_sft"]["init_run"] == "arms/sft/train"
    assert e["arms"]["grpo_sft"]["init_branch"] == "arms/sft/train/branch_step_000002"
    conf = json.loads((out / "arms/grpo_sft/train/config.json").read_text())
    assert conf["model"]["name"] == str(branch.resolve())
    gs_run = json.loads((out / "arms/grpo_sft/train/run.json").read_text())
    assert gs_run["model"]["base_identity"] == ident["weights_hash"] != sft_run["final_identity"]
    assert gs_run["init_sft"] == {
        "run": "arms/sft/train",
        "branch": "arms/sft/train/branch_step_000002",
        "step": 2,
        "train_seconds": info["train_seconds"],
        "identity": ident["weights_hash"],
    }
    # the branch is evaluated like the arms: same tasks, budgets and files, its own weights
    be, se = out / "arms/sft/branch_eval", out / "arms/sft/eval"
    assert (
        e["arms"]["sft"]["branch_eval_run"] == "arms/sft/branch_eval" and e["arms"]["sft"]["branch_step"] == 2
    )
    assert [r["task_id"] for r in _jsonl(be / "results.jsonl")] == [
        r["task_id"] for r in _jsonl(se / "results.jsonl")
    ]
    assert len(_jsonl(be / "trajectories.jsonl")) == len(_jsonl(se / "trajectories.jsonl")) == 2
    be_run, se_run = (json.loads((d / "run.json").read_text()) for d in (be, se))
    assert be_run["budgets"] == se_run["budgets"] and be_run["fingerprint"] == se_run["fingerprint"]
    assert be_run["model"]["identity"] == ident["weights_hash"] != se_run["model"]["identity"]
    assert (be / "summary.json").is_file() and "branch_eval" not in json.dumps(sft_run)  # not training
    be_files = {f: (be / f).read_bytes() for f in ("run.json", "summary.json", "results.jsonl")}
    ex = Experiment(out)
    parts = rl_training(ex, ex.arms["grpo_sft"])
    assert (parts["sft"], parts["branch_step"], parts["from_control"]) == (info["train_seconds"], 2, "sft")
    assert parts["total"] == info["train_seconds"] + gs_run["train_seconds"]

    # resumed after the sft arm finished, grpo_sft not: the sft arm is kept, grpo_sft trains from the branch
    import shutil

    shutil.rmtree(out / "arms/grpo_sft")
    run_experiment(cfg, exp, out, report=False)
    assert json.loads((out / "arms/sft/train/run.json").read_text()) == sft_run
    again = json.loads((out / "arms/grpo_sft/train/run.json").read_text())
    assert again["status"] == "finished" and again["model"]["base_identity"] == ident["weights_hash"]
    assert {f: (be / f).read_bytes() for f in be_files} == be_files  # kept, not evaluated again

    # resumed without the branch's weights (packed without them) and without its evaluation: skipped
    shutil.rmtree(be)
    for w in branch.glob("*.safetensors"):
        w.unlink()
    run_experiment(cfg, exp, out, report=False)
    assert (
        not be.exists()
        and "branch_eval_run" not in json.loads((out / "experiment.json").read_text())["arms"]["sft"]
    )

    # the branch gone while grpo_sft still trains: one line naming the folder and the fix
    shutil.rmtree(out / "arms/grpo_sft")
    shutil.rmtree(branch)
    with pytest.raises(C.ConfigError, match=r"branch_step_000002 is missing .* to rerun the sft arm"):
        run_experiment(cfg, exp, out, report=False)


@pytest.mark.slow
def test_a_matrix_split_over_two_sessions_packed_without_weights(tiny_model_dir, tmp_path):  # noqa: F811
    """configs/spider-0.5b-gpu-final.toml's plan: base, sft, grpo_sft in one session, the folder packed
    without *.safetensors and *.pt (`scripts/gpu.sh pack`), then the full arm list: sft and grpo_sft are
    kept, grpo, no_update and validity train, the weight audit passes and the RL-over-SFT time check
    reads grpo_sft's SFT part from the branch's branch.json (its weights gone)."""
    import dataclasses

    from sqlrl.evidence.gate import check_sft_control
    from sqlrl.evidence.rltime import device_problem, rl_training
    from sqlrl.evidence.rundir import Experiment

    cfg, sft = _tiny_branch_matrix(tiny_model_dir)
    full = ("base", "sft", "grpo_sft", "grpo", "no_update", "validity")
    exp = ExperimentConfig(name="split", arms=full, leakage_tasks=1, smoke=True, sft=sft)
    out = tmp_path / "exp"
    run_experiment(cfg, dataclasses.replace(exp, arms=full[:3]), out, report=False)
    kept = {a: (out / f"arms/{a}/train/run.json").read_text() for a in ("sft", "grpo_sft")}
    packed = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".pt")]
    assert any("branch_step_000002" in str(p) for p in packed)
    for p in packed:
        p.unlink()

    run_experiment(cfg, exp, out)  # with the report, which reads the weightless sft and grpo_sft runs
    assert {a: (out / f"arms/{a}/train/run.json").read_text() for a in kept} == kept
    assert json.loads((out / "verdict.json").read_text())["claim_allowed"] is False  # a smoke run
    for arm in ("grpo", "no_update", "validity"):
        run = json.loads((out / f"arms/{arm}/train/run.json").read_text())
        assert run["status"] == "finished" and run["resumed_from_step"] is None
    e = json.loads((out / "experiment.json").read_text())
    assert list(e["arms"]) == list(full) and e["finished"]
    ex = Experiment(out)
    wa = json.loads((out / "weights_audit.json").read_text())  # audited in session two, on its finals
    assert wa["verdicts"]["no_update_identical"] is True and wa["verdicts"]["reloaded_identity"] is True
    info = json.loads((out / "arms/sft/train/branch_step_000002/branch.json").read_text())
    gs_s = json.loads(kept["grpo_sft"])["train_seconds"]
    for arm in ("grpo_sft", "grpo"):
        parts = rl_training(ex, ex.arms[arm])
        assert device_problem(ex, ex.arms["sft"], ex.arms[arm], parts) is None
    parts = rl_training(ex, ex.arms["grpo_sft"])
    assert (parts["sft"], parts["branch_step"], parts["total"]) == (
        info["train_seconds"],
        2,
        info["train_seconds"] + gs_s,
    )
    # the check itself finds every record (tiny CPU runs may still fail it on time or zero gradients)
    probs = check_sft_control(ex).problems
    assert not [p for p in probs if "device" in p or "not recorded" in p], probs
