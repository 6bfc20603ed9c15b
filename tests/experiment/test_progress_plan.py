"""The matrix's progress plan against `run_arm`: every arm part is opened and closed, or skipped, once per
session, fresh or resumed, in every SFT layout and cell layout (else the ETA keeps counting it).

Training and evaluation are stubs that report to the handle they are given and write the files `run_arm`
reads; the plan (`ArmProgress`) and `run_arm` are the real ones."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.artifacts import write_json_atomic
from sqlrl.experiment import arms
from sqlrl.experiment.matrix import ArmProgress, ExperimentConfig

ARMS = ("base", "sft", "grpo_sft", "grpo", "no_update", "validity")


def _report(progress, total: int) -> None:
    assert callable(progress), f"a part drew a line of its own ({progress!r}), not the plan's"
    handle = progress(total, 0)
    handle.update(total)
    handle.close()


def _finished_run(folder: Path, steps: int, progress, branch: int | None = None) -> dict:
    from sqlrl.training.sft_branch import branch_dir

    _report(progress, steps)
    for d in [folder / "final"] + ([branch_dir(folder, branch)] if branch else []):
        d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(d / "identity.json", {"weights_stored": False})
    write_json_atomic(folder / "config.json", {})
    write_json_atomic(folder / "run.json", {"status": "finished"})
    return {"finished": True, "steps": steps}


@pytest.fixture
def stubbed(monkeypatch):
    import sqlrl.generation.device as device
    import sqlrl.training.export as export
    import sqlrl.training.sft as sft_mod
    import sqlrl.training.trainer as trainer

    def evaluate(cfg, model, eval_dir, budgets, *, root, command, progress):
        _report(progress, 2)
        write_json_atomic(Path(eval_dir) / "summary.json", {})

    monkeypatch.setattr(export, "final_weights", str)
    monkeypatch.setattr(device, "free_memory", lambda: None)
    monkeypatch.setattr(arms, "drop_unloadable", lambda *a, **k: None)
    monkeypatch.setattr(arms, "_follow_move", lambda *a, **k: None)
    monkeypatch.setattr(arms, "_record_init", lambda *a, **k: None)
    monkeypatch.setattr(arms, "_final_loadable", lambda folder: (folder / "identity.json").is_file())
    monkeypatch.setattr(arms, "evaluate", evaluate)
    monkeypatch.setattr(
        sft_mod,
        "train_sft",
        lambda cfg, sft, out, **kw: _finished_run(
            Path(out), sft.steps, kw["progress"], kw.get("branch_step")
        ),
    )
    monkeypatch.setattr(
        trainer, "train", lambda cfg, out, **kw: _finished_run(Path(out), cfg.grpo.steps, kw["progress"])
    )


SFT_LAYOUTS = (
    {"steps": 3},  # grpo_sft from the sft arm's final weights
    {"steps": 3, "init_steps": 2, "init_from": "stage"},  # its own SFT stage
    {"steps": 3, "init_steps": 2, "init_from": "control"},  # the sft arm's step-2 branch
)


@pytest.mark.parametrize(
    "sft_table,turns,contexts", list(itertools.product(SFT_LAYOUTS, [(1,), (1, 3)], [(), (1024, 2048)]))
)
def test_every_arm_part_is_closed_fresh_and_resumed(stubbed, tmp_path, sft_table, turns, contexts):
    cfg = C.from_dict({"model": {"name": "tiny"}, "data": {"path": "embedded"}, "grpo": {"steps": 5}})
    exp = ExperimentConfig(
        name="p",
        arms=ARMS,
        turns=turns,
        context_tokens=contexts,
        leakage_tasks=1,
        smoke=True,
        sft=T.sft_from_dict(sft_table),
    )
    for session in ("fresh", "resumed"):
        plan = ArmProgress(cfg, exp, 2, "p")
        for t, c in exp.cells():
            for kind in exp.arms:
                plan.arm = arms.arm_name(kind, t, c)
                arms.run_arm(
                    cfg,
                    tmp_path,
                    plan.arm,
                    kind,
                    t,
                    root=tmp_path,
                    n_eval_tasks=2,
                    command=None,
                    deadline=None,
                    progress=plan,
                    sft=exp.sft,
                    context=c,
                )
        open_parts = [p.label for p in plan.line.parts if not p.closed and not p.label.startswith("leakage")]
        assert open_parts == [], session
