"""`sqlrl experiment CONFIG.toml`: the equal-budget arm matrix, and `sqlrl quickstart` (the main job).

Arms, all with the same model, locked task ids, dataset fingerprint, prompts, turns, token and SQL
budgets and the same number of steps, prompts and rollouts:
- `base`: the model as loaded, no training;
- `grpo`: GRPO with the execution-match reward;
- `no_update`: the same loop with learning rate 0 (weights must stay bit-identical);
- `validity`: GRPO with the validity-only reward (1 when the SQL executes).
Opt-in (`experiment.arms`): `sft`, the SFT-only control (`training/sft.py` on the training golds, budget
in [sft]), and `grpo_sft`, GRPO as `grpo` from SFT weights: the `sft` arm's, or with `sft.init_steps > 0`
its own SFT stage's, so the sft control can cover its whole training time. With `turns = [1, 3]` the matrix is run once per turn budget (arm names get a `_t3` suffix).

Every arm is a normal run folder (train and/or eval) under `arms/<arm>/` (`arms.py`), linked by
`experiment.json`. Then the weight audit (base vs GRPO vs No-update, reloaded identity), the leakage audit (gold
mutation, on a slice of the evaluation tasks, per turn budget) and the report with the evidence gate.

`--seeds 0,1,2` runs the whole matrix once per training seed (`run.seed`; the split stays
`data.split_seed`) into `OUT/seed<k>/`, one after the other under one time budget, then writes
`OUT/seeds.{json,md,html}` with `sqlrl seeds` (`seeds.py`: the across-seed verdict).

The command is resumable: a finished arm (its `summary.json` exists) is skipped, an unfinished
training run resumes from its last checkpoint. This is how long experiments fit into time-limited
sessions. Guaranteed: arms with different budgets, tasks or fingerprints are refused, naming the
difference. Not guaranteed: that a quickstart-sized experiment supports any claim ("no claim" is then
the honest outcome).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sqlrl.artifacts import git_commit, holds_run_lock, machine_info, read_json, write_json_atomic
from sqlrl.config import Config, ConfigError, from_dict
from sqlrl.config_tables import SFTConfig, sft_from_dict
from sqlrl.experiment.arms import arm_config, run_arm

log = logging.getLogger(__name__)

ARM_KINDS = ("base", "grpo", "no_update", "validity", "sft", "grpo_sft")
DEFAULT_ARMS = ("base", "grpo", "no_update", "validity")


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    """Name shown in the report."""
    arms: tuple[str, ...] = DEFAULT_ARMS
    """Arms to run, in order; base, grpo, no_update and validity are needed for a claim, and sft for a
    claim that RL beats supervised fine-tuning. Also: grpo_sft (needs sft before it unless sft.init_steps > 0)."""
    turns: tuple[int, ...] = (1,)
    """Turn budgets; the matrix runs once per value (1 = single-turn)."""
    leakage_tasks: int = 16
    """Evaluation tasks used by the gold-mutation leakage audit (per turn budget)."""
    smoke: bool = False
    """Mark the experiment as a smoke run: the gate will never turn it into a claim."""
    extra: dict = field(default_factory=dict)
    """Free-form notes copied into experiment.json."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The sft arm's training budget: the run file's [sft] table (not a key of [experiment])."""


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> tuple[Config, ExperimentConfig]:
    from sqlrl.config import read_raw

    path = Path(path)
    raw = read_raw(path, overrides)
    exp_raw = raw.pop("experiment", {})
    if not isinstance(exp_raw, dict):
        raise ConfigError(f"{path}: experiment must be an [experiment] table of keys, got {exp_raw!r}")
    sft = sft_from_dict(raw.pop("sft", {}), source=str(path))
    cfg = from_dict(raw, source=str(path))
    known = set(ExperimentConfig.__dataclass_fields__) - {"sft"}
    for k in exp_raw:
        if k not in known:
            raise ConfigError(f"{path}: unknown key experiment.{k}; valid keys: {', '.join(sorted(known))}")
    exp = ExperimentConfig(
        name=str(exp_raw.get("name", path.stem)),
        arms=tuple(exp_raw.get("arms", DEFAULT_ARMS)),
        turns=tuple(int(t) for t in exp_raw.get("turns", (cfg.agent.turns,))),
        leakage_tasks=int(exp_raw.get("leakage_tasks", 16)),
        smoke=bool(exp_raw.get("smoke", False)),
        extra=dict(exp_raw.get("extra", {})),
        sft=sft,
    )
    for arm in exp.arms:
        if arm not in ARM_KINDS:
            raise ConfigError(
                f"{path}: experiment.arms has unknown arm {arm!r}; arms are {', '.join(ARM_KINDS)}"
            )
    if (
        "grpo_sft" in exp.arms
        and sft.init_steps == 0
        and ("sft" not in exp.arms or exp.arms.index("sft") > exp.arms.index("grpo_sft"))
    ):
        raise ConfigError(
            f"{path}: experiment.arms has grpo_sft without sft before it; with sft.init_steps = 0 grpo_sft "
            "starts from the sft arm's final weights: list sft before grpo_sft, or set sft.init_steps > 0"
        )
    if any(t < 1 for t in exp.turns):
        raise ConfigError(f"{path}: experiment.turns must be >= 1")
    if sft.trace_turns and {"sft", "grpo_sft"} & set(exp.arms) and set(exp.turns) != {sft.trace_turns}:
        raise ConfigError(
            f"{path}: sft.trace_turns = {sft.trace_turns} teaches the {sft.trace_turns}-turn protocol, but "
            f"experiment.turns = {list(exp.turns)}; set experiment.turns = [{sft.trace_turns}]"
        )
    return cfg, exp


def _experiment_state(
    cfg: Config,
    exp: ExperimentConfig,
    out: Path,
    *,
    root: Path,
    fingerprint: str,
    eval_tasks: list,
    command: list[str] | None,
) -> dict:
    """experiment.json's content for this run (refused when the folder holds another config; resumed
    with memory-only changes recorded), written once before any arm runs."""
    from sqlrl.training.runfolder import config_changes

    exp_path = out / "experiment.json"
    state = read_json(exp_path) if exp_path.exists() else {}
    mine = json.loads(json.dumps(cfg.resolve()))
    if state and state.get("config") != mine:
        blocking, memory = config_changes(state.get("config") or {}, mine)
        if blocking:
            raise ConfigError(
                f"{out} holds an experiment with a different config (differs in {blocking}); rerun with "
                "the same config to resume, or use a new --out folder"
            )
        # memory-only settings (how an update is split into passes) may change on resume, e.g. after
        # running out of GPU memory; each resumed arm records the change in its own run.json too. (None
        # when the configs differ only by a setting added since, at its old behaviour: `ADDED_KEYS`.)
        if memory:
            log.warning(f"[experiment] resuming with {memory}")
            state.setdefault("resume_changes", []).append(
                {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changes": memory}
            )
    state.update(
        {
            "name": exp.name,
            "config": cfg.resolve(),
            "experiment": {
                "arms": list(exp.arms),
                "turns": list(exp.turns),
                "leakage_tasks": exp.leakage_tasks,
                "extra": exp.extra,
                **({"sft": dataclasses.asdict(exp.sft)} if {"sft", "grpo_sft"} & set(exp.arms) else {}),
            },
            "smoke": exp.smoke,
            "synthetic": False,
            "data": str(root),
            "split": cfg.data.eval_split,
            "fingerprint": fingerprint,
            "tasks": [t.public.task_id for t in eval_tasks],
            "model": {"name": cfg.model.name},
            "git": git_commit(),
            "machine": machine_info(),
            "command": command or sys.argv,
        }
    )
    state.setdefault("arms", {})
    state.setdefault("started", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    write_json_atomic(exp_path, state)
    return state


class ArmProgress:
    """The experiment's progress plan: per turn budget and arm, its training steps (not for base) and
    evaluated tasks, then the leakage audit; one line (`evaluation.progress.Progress`) over all of it."""

    def __init__(self, cfg: Config, exp: ExperimentConfig, n_eval: int, title: str):
        from sqlrl.evaluation.progress import Part, Progress

        self.index: dict[tuple[str, str], int] = {}
        parts: list[Part] = []
        arms = [(t, k) for t in exp.turns for k in exp.arms]
        for i, (turns, kind) in enumerate(arms, 1):
            name = f"{kind}{'' if turns == 1 else f'_t{turns}'}"
            head = f"arm {i} of {len(arms)} {name}:"
            if kind != "base":
                self.index[(name, "train")] = len(parts)
                steps = exp.sft.steps if kind == "sft" and exp.sft is not None else cfg.grpo.steps
                parts.append(Part(f"{head} train", "step", steps))
            self.index[(name, "eval")] = len(parts)
            parts.append(Part(f"{head} evaluate", "task", n_eval))
        for turns in exp.turns:
            self.index[(f"t{turns}", "leakage")] = len(parts)
            parts.append(Part(f"leakage audit (turns {turns}):", "task", 2 * min(exp.leakage_tasks, n_eval)))
        self.line = Progress(title, parts)
        self.arm = ""

    def skip(self, what: str, arm: str | None = None) -> None:
        self.line.skip(self.index[(arm or self.arm, what)])

    def opener(self, what: str, arm: str | None = None):
        i = self.index[(arm or self.arm, what)]
        return lambda total, initial: self.line.open(i, total, initial)


def _leakage_for_turns(cfg: Config, exp: ExperimentConfig, out: Path, turns: int, eval_tasks: list) -> None:
    """The leakage audit of one turn budget with the base model, into leakage[_t<turns>].json (once)."""
    from sqlrl.agent.envs import make_env
    from sqlrl.agent.loop import Budgets
    from sqlrl.evaluation.runner import load_policy
    from sqlrl.evidence.leakage import leakage_audit
    from sqlrl.generation.device import free_memory

    suffix = "" if turns == 1 else f"_t{turns}"
    leak_path = out / f"leakage{suffix}.json"
    if leak_path.exists():
        return
    budgets = Budgets.from_config(arm_config(cfg, "base", turns).agent)
    policy = load_policy(
        cfg.model.name,
        device=cfg.run.device,
        dtype=cfg.model.dtype,
        engine=cfg.run.gen_engine,
        max_batch=cfg.run.gen_max_batch,
    )
    with make_env(workers=cfg.run.sandbox_workers, timeout_s=budgets.sql_timeout_s) as env:
        res = leakage_audit(
            eval_tasks[: exp.leakage_tasks],
            policy,
            env.sandbox,
            budgets,
            work_dir=out / f".leakage{suffix}",
        )
    write_json_atomic(leak_path, res)
    del policy
    free_memory()


def _combine_leakage(out: Path, turns: tuple[int, ...]) -> None:
    """leakage.json: the verdict over every turn budget's audit."""
    parts = {f"t{t}": read_json(out / f"leakage{'' if t == 1 else f'_t{t}'}.json") for t in turns}
    write_json_atomic(
        out / "leakage.json",
        {
            "passed": all(p["passed"] for p in parts.values()),
            "tasks": sum(p["tasks"] for p in parts.values()),
            "first_difference": next(
                (p["first_difference"] for p in parts.values() if p["first_difference"]), None
            ),
            "static_check": {"passed": all(p["static_check"]["passed"] for p in parts.values())},
            "per_turn_budget": {k: {"passed": v["passed"], "tasks": v["tasks"]} for k, v in parts.items()},
        },
    )


def _audit_weights(cfg: Config, exp: ExperimentConfig, out: Path) -> None:
    """weights_audit.json: base vs GRPO vs No-update of the first turn budget, and the reloaded identity."""
    from sqlrl.evidence.weights import audit_weights

    suffix = "" if exp.turns[0] == 1 else f"_t{exp.turns[0]}"
    base_path = load_model_path(cfg.model.name)
    trained = out / "arms" / f"grpo{suffix}" / "train" / "final"
    no_upd = out / "arms" / f"no_update{suffix}" / "train" / "final"
    expect = (
        read_json(trained / "identity.json").get("weights_hash")
        if (trained / "identity.json").exists()
        else None
    )
    wa = audit_weights(
        str(base_path),
        str(trained),
        str(no_upd) if no_upd.exists() else None,
        reloaded=str(trained),
        expect_hash=expect,
    )
    write_json_atomic(out / "weights_audit.json", wa)


def _run_matrix(
    cfg: Config,
    exp: ExperimentConfig,
    out: Path,
    state: dict,
    progress: ArmProgress,
    *,
    root: Path,
    eval_tasks: list,
    command: list[str] | None,
    deadline: float | None,
) -> None:
    """Every arm of every turn budget, then that budget's leakage audit; experiment.json after each arm."""
    for turns in exp.turns:
        suffix = "" if turns == 1 else f"_t{turns}"
        for kind in exp.arms:
            name = f"{kind}{suffix}"
            progress.arm = name
            state["arms"][name] = run_arm(
                cfg,
                out,
                name,
                kind,
                turns,
                root=root,
                n_eval_tasks=len(eval_tasks),
                command=command,
                deadline=deadline,
                progress=progress,
                sft=exp.sft,
            )
            write_json_atomic(out / "experiment.json", state)
        leak = progress.index[(f"t{turns}", "leakage")]
        if (out / f"leakage{suffix}.json").exists():
            progress.line.skip(leak)
        else:
            handle = progress.line.open(leak)
            _leakage_for_turns(cfg, exp, out, turns, eval_tasks)
            handle.update(progress.line.parts[leak].total)


def run_experiment(
    cfg: Config,
    exp: ExperimentConfig,
    out_dir: str | Path,
    *,
    command: list[str] | None = None,
    report: bool = True,
    deadline: float | None = None,
) -> dict:
    """Run (or resume) the arm matrix into `out_dir`: every arm per turn budget, the leakage audits, the
    weight audit, then (with `report`) the report. Returns {"out": ..., "report": write_report's paths}.
    The model name is resolved first (`ModelError` in seconds): a wrong one leaves no folder behind."""
    from sqlrl.generation.models import check_model

    check_model(cfg.model.name)
    return _run_locked(cfg, exp, out_dir, command=command, report=report, deadline=deadline)


@holds_run_lock("out_dir")
def _run_locked(
    cfg: Config,
    exp: ExperimentConfig,
    out_dir: str | Path,
    *,
    command: list[str] | None = None,
    report: bool = True,
    deadline: float | None = None,
) -> dict:
    from sqlrl.tasks.bird import open_data
    from sqlrl.tasks.data import resolve_data_root, select_tasks

    out = Path(out_dir)
    check_free_disk(cfg, exp, out)
    out.mkdir(parents=True, exist_ok=True)
    ds = open_data(root := resolve_data_root(cfg.data.path))
    eval_tasks = select_tasks(
        ds.load(cfg.data.eval_split, seed=cfg.data.split_seed, val_fraction=cfg.data.val_fraction),
        cfg.data.max_eval_tasks,
        cfg.data.split_seed,  # not run.seed: every training seed is evaluated on the same tasks
    )
    if not eval_tasks:
        raise ConfigError(f"evaluation split {cfg.data.eval_split!r} of {root} is empty")
    fingerprint = ds.fingerprint(
        cfg.data.eval_split, seed=cfg.data.split_seed, val_fraction=cfg.data.val_fraction
    )
    state = _experiment_state(
        cfg, exp, out, root=root, fingerprint=fingerprint, eval_tasks=eval_tasks, command=command
    )
    progress = ArmProgress(cfg, exp, len(eval_tasks), title=exp.name)
    try:
        _run_matrix(
            cfg,
            exp,
            out,
            state,
            progress,
            root=root,
            eval_tasks=eval_tasks,
            command=command,
            deadline=deadline,
        )
    finally:
        progress.line.finish()
    _combine_leakage(out, exp.turns)
    if "grpo" in exp.arms:
        _audit_weights(cfg, exp, out)
    state["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(out / "experiment.json", state)
    result = {"out": str(out)}
    if report:
        from sqlrl.evidence.report import write_report

        result["report"] = write_report(out)
    return result


GB = 1e9
DISK_MARGIN = 200_000_000  # evaluation and training logs, report, leakage replicas


def model_parameters(path: Path) -> int | None:
    """Parameter count of a local model folder (its cache manifest, else its safetensors headers)."""
    manifest = path / "manifest.json"
    if manifest.is_file() and read_json(manifest).get("parameter_count"):
        return int(read_json(manifest)["parameter_count"])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shape = h.get_slice(k).get_shape()
                n += math.prod(shape)
    return n


def disk_needed(cfg: Config, exp: ExperimentConfig, params: int) -> tuple[int, str]:
    """(bytes, how) the experiment folder needs at its peak: the final weights of every trained arm but
    No-update (stored as hashes) at their dense size in the final dtype (bfloat16 when generation is
    bfloat16 for sure: `model.dtype` or a CUDA `run.device`; a patch over the base is smaller), plus the
    checkpoints (float32 weights + AdamW state) training keeps."""
    own_stage = "grpo_sft" in exp.arms and exp.sft.init_steps > 0  # grpo_sft's SFT stage: one more run
    stored = (sum(1 for k in exp.arms if k in ("grpo", "validity", "sft", "grpo_sft")) + own_stage) * len(
        exp.turns
    )
    trained = (sum(1 for k in exp.arms if k != "base") + own_stage) * len(exp.turns)
    g, r = cfg.grpo, cfg.run
    half = r.final_dtype == "auto" and (
        cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and r.device == "cuda")
    )
    weights, ckpt = (2 if half else 4) * params, 12 * params
    n_ckpt = sum(1 for s in range(1, g.steps) if s % r.checkpoint_every == 0)
    n_ckpt += 0 if r.prune_checkpoints_at_end else 1
    kept = min(n_ckpt, r.keep_checkpoints)
    # while an arm trains: the finals before it, its checkpoints (one more while a new one is written)
    peak_ckpt = ckpt * min(n_ckpt, kept + 1)
    left_behind = 0 if r.prune_checkpoints_at_end else ckpt * kept * (trained - 1)  # earlier arms
    need = stored * weights + peak_ckpt + left_behind + DISK_MARGIN
    how = (
        f"{stored} stored arm(s) x at most {weights / GB:.1f} GB {'bfloat16' if half else 'float32'} weights"
        + (f", checkpoints {(peak_ckpt + left_behind) / GB:.1f} GB" if peak_ckpt + left_behind else "")
        + f", {DISK_MARGIN / GB:.1f} GB logs"
    )
    return need, how


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def check_free_disk(cfg: Config, exp: ExperimentConfig, out: Path) -> None:
    """ConfigError (one line: needed and free) when the disk holding `out` cannot take the experiment;
    what `out` already holds (a resumed run) counts as written. Skipped for a hub model not yet
    downloaded (its size is unknown)."""
    import shutil

    from sqlrl.generation.models import resolve_model

    resolved = resolve_model(cfg.model.name)
    params = model_parameters(Path(resolved.path)) if resolved.kind != "hub" else None
    if params is None:
        log.warning(f"[experiment] free-disk check skipped: the size of {cfg.model.name} is unknown here")
        return
    need, how = disk_needed(cfg, exp, params)
    need -= folder_bytes(out)
    anchor = out
    while not anchor.exists():
        anchor = anchor.parent
    free = shutil.disk_usage(anchor).free
    if need > free:
        raise ConfigError(
            f"not enough free disk for {out}: the experiment needs {need / GB:.1f} GB more ({how}), "
            f"{free / GB:.1f} GB are free on that disk; free space or pass --out on a larger disk"
        )


def load_model_path(name: str) -> Path:
    from sqlrl.generation.models import resolve_model

    return Path(resolve_model(name))


QUICKSTART = "quickstart.toml"


def packaged_config(name: str) -> Path:
    return Path(str(resources.files("sqlrl") / "configs" / name))
