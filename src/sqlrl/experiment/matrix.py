"""`sqlrl experiment CONFIG.toml`: the equal-budget arm matrix, and `sqlrl quickstart` (the main job).

Arms, with the same model, tasks, fingerprint, prompts, budgets, steps, prompts and rollouts: `base`
(no training), `grpo` (execution-match reward), `no_update` (learning rate 0: weights stay
bit-identical), `validity` (validity-only reward: 1 when the SQL executes). Opt-in (`experiment.arms`):
`sft`, the SFT-only control (`training/sft.py` on the training golds, budget in [sft]), and `grpo_sft`,
GRPO as `grpo` from SFT weights: the `sft` arm's final, its own SFT stage's (`sft.init_steps > 0`) or
the sft arm's at step init_steps (`sft.init_from = "control"`), so sft can cover its whole training time; `grpo_checker`, GRPO as `grpo` with agent.checker =
true in training and evaluation (docs/PROMPT.md, "Checker turn"), held to base and the controls as grpo. The matrix runs once per cell of its axes:
`turns = [1, 3]` (arm names get a `_t3` suffix) times `context_tokens = [2048, 4096]`
(agent.max_context_tokens per cell, arm names get `_c2048`; empty = the agent's own, no suffix).

Every arm is a normal run folder (train and/or eval) under `arms/<arm>/` (`arms.py`), linked by
`experiment.json`. The weight audit (base vs GRPO vs No-update, reloaded identity) of a cell once its
grpo and no_update arms are done, the leakage audit (gold mutation, on a slice of the evaluation tasks)
after each cell, then the report with the evidence gate.

`--seeds 0,1,2` runs the whole matrix once per training seed (`run.seed`; the split stays
`data.split_seed`) into `OUT/seed<k>/`, one after the other under one time budget, then writes
`OUT/seeds.{json,md,html}` with `sqlrl seeds` (`seeds.py`: the across-seed verdict).

Resumable: a finished arm (its `summary.json` exists) is skipped, an unfinished training run resumes
from its last checkpoint. Guaranteed: arms with different budgets, tasks or fingerprints are refused,
naming the difference. Not guaranteed: that a quickstart-sized experiment supports any claim ("no
claim" is then the honest outcome).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sqlrl.artifacts import git_commit, holds_run_lock, machine_info, read_json, write_json_atomic
from sqlrl.config import Config, ConfigError, from_dict, parse_section
from sqlrl.config_tables import SFTConfig, sft_from_dict
from sqlrl.experiment.arms import (
    arm_config,
    arm_name,
    branch_step,
    cell_suffix,
    check_branches,
    own_stage,
    run_arm,
)
from sqlrl.experiment.disk import GB, check_free_disk, disk_needed  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

ARM_KINDS = ("base", "grpo", "no_update", "validity", "sft", "grpo_sft", "grpo_checker")
DEFAULT_ARMS = ("base", "grpo", "no_update", "validity")


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    """Name shown in the report."""
    arms: tuple[str, ...] = DEFAULT_ARMS
    """Arms to run, in order; base, grpo, no_update and validity are needed for a claim, and sft for a
    claim that RL beats supervised fine-tuning. Also: grpo_sft (needs sft before it unless sft.init_steps > 0
    with sft.init_from = "stage"),
    grpo_checker (grpo with agent.checker = true)."""
    turns: tuple[int, ...] = (1,)
    """Turn budgets; the matrix runs once per value (1 = single-turn)."""
    context_tokens: tuple[int, ...] = ()
    """Context lengths (agent.max_context_tokens); the matrix runs once per value and turn budget, arm names
    get a `_c<tokens>` suffix. Empty: the agent's own max_context_tokens, no suffix."""
    leakage_tasks: int = 16
    """Evaluation tasks used by the gold-mutation leakage audit (per cell: turn budget and context)."""
    smoke: bool = False
    """Mark the experiment as a smoke run: the gate will never turn it into a claim."""
    extra: dict = field(default_factory=dict)
    """Free-form notes copied into experiment.json."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The sft arm's training budget: the run file's [sft] table (not a key of [experiment])."""

    def cells(self) -> list[tuple[int, int | None]]:
        """The matrix's (turns, context) cells in run order; context None without a context axis."""
        return [(t, c) for t in self.turns for c in (self.context_tokens or (None,))]


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
    # types as in a run file's tables (no coercion: "false" is not a boolean, 1.9 not a turn count)
    typed = parse_section(
        ExperimentConfig,
        {k: v for k, v in exp_raw.items() if k not in ("context_tokens", "extra")},
        "experiment",
        str(path),
    )
    extra = exp_raw.get("extra", {})
    if not isinstance(extra, dict):
        raise ConfigError(
            f'{path}: experiment.extra must be a table of notes, e.g. extra = {{ note = "..." }}; got {extra!r}'
        )
    exp = dataclasses.replace(
        typed,
        name=exp_raw.get("name", path.stem),
        turns=typed.turns if "turns" in exp_raw else (cfg.agent.turns,),
        context_tokens=_context_axis(exp_raw.get("context_tokens", []), cfg, path),
        extra=dict(extra),
        sft=sft,
    )
    for key, values, example in (("arms", exp.arms, list(DEFAULT_ARMS)), ("turns", exp.turns, [1, 3])):
        if not values:
            raise ConfigError(f"{path}: experiment.{key} is empty; list at least one, e.g. {key} = {example}")
    if exp.leakage_tasks < 1:
        raise ConfigError(
            f"{path}: experiment.leakage_tasks = {exp.leakage_tasks}: the leakage audit needs at least one "
            "task; give a positive count, e.g. 16"
        )
    for arm in exp.arms:
        if arm not in ARM_KINDS:
            raise ConfigError(
                f"{path}: experiment.arms has unknown arm {arm!r}; arms are {', '.join(ARM_KINDS)}"
            )
    if (
        "grpo_sft" in exp.arms
        and (sft.init_steps == 0 or sft.init_from == "control")
        and ("sft" not in exp.arms or exp.arms.index("sft") > exp.arms.index("grpo_sft"))
    ):
        raise ConfigError(
            f"{path}: experiment.arms has grpo_sft without sft before it; "
            + (
                "with sft.init_steps = 0 grpo_sft starts from the sft arm's final weights: list sft before "
                "grpo_sft, or set sft.init_steps > 0"
                if sft.init_from != "control"
                else f'with sft.init_from = "control" grpo_sft starts from the sft arm\'s weights at step '
                f'{sft.init_steps}: list sft before grpo_sft, or set sft.init_from = "stage"'
            )
        )
    if "grpo_checker" in exp.arms and cfg.agent.checker:
        raise ConfigError(
            f"{path}: experiment.arms has grpo_checker (grpo with agent.checker = true) but agent.checker is "
            "already true for every arm, so no arm runs without the checker; set agent.checker = false"
        )
    if any(t < 1 for t in exp.turns):
        raise ConfigError(f"{path}: experiment.turns must be >= 1")
    for key, values in (("turns", exp.turns), ("arms", exp.arms)):
        dup = sorted({v for v in values if list(values).count(v) > 1}, key=str)
        if dup:
            raise ConfigError(
                f"{path}: experiment.{key} = {list(values)} lists {dup} twice: each value makes its own "
                "arms and run folders, list it once"
            )
    if sft.trace_turns and {"sft", "grpo_sft"} & set(exp.arms) and set(exp.turns) != {sft.trace_turns}:
        raise ConfigError(
            f"{path}: sft.trace_turns = {sft.trace_turns} teaches the {sft.trace_turns}-turn protocol, but "
            f"experiment.turns = {list(exp.turns)}; set experiment.turns = [{sft.trace_turns}]"
        )
    return cfg, exp


def _context_axis(value, cfg: Config, path: Path) -> tuple[int, ...]:
    """experiment.context_tokens as a tuple of ints, or ConfigError saying what is wrong and how to fix it."""
    where = f"{path}: experiment.context_tokens"
    if not isinstance(value, list | tuple) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in value
    ):
        raise ConfigError(f"{where} must be a list of whole token counts, e.g. [2048, 4096]; got {value!r}")
    if any(c <= 0 for c in value):
        raise ConfigError(f"{where} = {list(value)}: every context length must be a positive token count")
    if len(set(value)) < len(value):
        dup = sorted({c for c in value if list(value).count(c) > 1})
        raise ConfigError(
            f"{where} = {list(value)} lists {dup} twice: each value makes its own arms, list it once"
        )
    low = [c for c in value if c <= cfg.agent.max_new_tokens]
    if low:
        raise ConfigError(
            f"{where} = {list(value)}: {low} cannot hold the prompt and one reply of agent.max_new_tokens = "
            f"{cfg.agent.max_new_tokens} tokens; use context lengths above {cfg.agent.max_new_tokens}"
        )
    return tuple(value)


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
    _check_sft_change(state, exp, out)
    # the [sft] settings its sft arms trained with stay recorded through a session whose arms do not use them
    uses_sft = {"sft", "grpo_sft"} & set(exp.arms)
    sft = dataclasses.asdict(exp.sft) if uses_sft else (state.get("experiment") or {}).get("sft")
    # a matrix resumed with other arms (one seed split over sessions) records every arm it has had
    earlier = (state.get("experiment") or {}).get("arms") or []
    state.update(
        {
            "name": exp.name,
            "config": cfg.resolve(),
            "experiment": {
                "arms": list(dict.fromkeys([*earlier, *exp.arms])),
                "turns": list(exp.turns),
                **({"context_tokens": list(exp.context_tokens)} if exp.context_tokens else {}),
                "leakage_tasks": exp.leakage_tasks,
                "extra": exp.extra,
                **({"sft": sft} if sft else {}),
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
    state.pop("finished", None)  # set again when this run completes: a stop now leaves it unfinished
    write_json_atomic(exp_path, state)
    return state


def _check_sft_change(state: dict, exp: ExperimentConfig, out: Path) -> None:
    """On resume, [sft] settings other than those experiment.json records: refused while an arm that
    trained with them (sft, grpo_sft) has a folder, else allowed and recorded in `resume_changes` (so
    `delete arms/sft, raise sft.steps, rerun` works). A key an older folder lacks counts as its default."""
    old = (state.get("experiment") or {}).get("sft")
    if not isinstance(old, dict) or not {"sft", "grpo_sft"} & set(exp.arms):
        return
    new, default = (json.loads(json.dumps(dataclasses.asdict(c))) for c in (exp.sft, SFTConfig()))
    changes = [
        f"sft.{k}: {old.get(k, default.get(k))} -> {v}"
        for k, v in new.items()
        if old.get(k, default.get(k)) != v
    ]
    if not changes:
        return
    names = [arm_name(k, t, c) for t, c in exp.cells() for k in ("sft", "grpo_sft") if k in exp.arms]
    started = [n for n in names if (out / "arms" / n).exists()]
    if started:
        raise ConfigError(
            f"{out}: the [sft] settings differ from the ones its arms {started} trained with ({changes}); "
            f"delete {', '.join(str(out / 'arms' / n) for n in started)} to rerun them with the new settings, "
            "or resume with the old ones"
        )
    log.warning(f"[experiment] resuming with {changes} (no sft or grpo_sft arm has run yet)")
    state.setdefault("resume_changes", []).append(
        {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changes": changes}
    )


def arm_names(exp: ExperimentConfig) -> list[str]:
    """Every arm name of the matrix, cell by cell in run order (`arms.arm_name`)."""
    return [arm_name(kind, turns, context) for turns, context in exp.cells() for kind in exp.arms]


def finished_matrix(out: Path, exp: ExperimentConfig) -> bool:
    """Whether `out/experiment.json` records a finished run holding every arm of `exp` (a matrix finished
    with fewer arms or cells than asked for now is not finished)."""
    path = Path(out) / "experiment.json"
    state = read_json(path) if path.is_file() else {}
    return bool(state.get("finished")) and set(arm_names(exp)) <= set(state.get("arms") or {})


class ArmProgress:
    """The experiment's progress plan: per cell (turn budget, context) and arm, its training steps (not for
    base; grpo_sft's own SFT stage first), timed apart from GRPO steps (`pace`), and evaluated tasks, then
    the cell's leakage audit; one line (`evaluation.progress.Progress`)."""

    def __init__(self, cfg: Config, exp: ExperimentConfig, n_eval: int, title: str):
        from sqlrl.evaluation.progress import Part, Progress

        self.index: dict[tuple[str, str], int] = {}
        parts: list[Part] = []
        arms = [(t, c, k) for t, c in exp.cells() for k in exp.arms]
        sft = exp.sft or SFTConfig()  # run_arm's default too
        for i, (turns, context, kind) in enumerate(arms, 1):
            name = arm_name(kind, turns, context)
            head = f"arm {i} of {len(arms)} {name}:"
            if kind == "grpo_sft" and own_stage(sft):
                self.index[(name, "sft_stage")] = len(parts)
                parts.append(Part(f"{head} SFT stage", "step", sft.init_steps, pace="sft step"))
            if kind == "sft":
                self.index[(name, "train")] = len(parts)
                parts.append(Part(f"{head} train", "step", sft.steps, pace="sft step"))
            elif kind != "base":
                self.index[(name, "train")] = len(parts)
                parts.append(Part(f"{head} train", "step", cfg.grpo.steps))
            self.index[(name, "eval")] = len(parts)
            parts.append(Part(f"{head} evaluate", "task", n_eval))
            if kind == "sft" and branch_step(sft) is not None:
                self.index[(name, "branch_eval")] = len(parts)
                parts.append(Part(f"{head} evaluate its step-{branch_step(sft)} branch", "task", n_eval))
        for turns, context in exp.cells():
            self.index[(_cell_key(turns, context), "leakage")] = len(parts)
            what = f"turns {turns}" + ("" if context is None else f", context {context}")
            parts.append(Part(f"leakage audit ({what}):", "task", 2 * min(exp.leakage_tasks, n_eval)))
        self.line = Progress(title, parts)
        self.arm = ""

    def skip(self, what: str, arm: str | None = None) -> None:
        self.line.skip(self.index[(arm or self.arm, what)])

    def skip_training(self, arm: str | None = None) -> None:
        """A trained arm kept from before: its training parts (grpo_sft's own SFT stage too) are done."""
        for what in ("sft_stage", "train"):
            if (arm or self.arm, what) in self.index:
                self.skip(what, arm)

    def opener(self, what: str, arm: str | None = None):
        i = self.index[(arm or self.arm, what)]
        return lambda total, initial: self.line.open(i, total, initial)


def _cell_key(turns: int, context: int | None) -> str:
    """A cell's key in leakage.json's `per_turn_budget` and the progress plan: `t3`, `t3_c2048`."""
    return f"t{turns}" + ("" if context is None else f"_c{context}")


def _leakage_for_cell(
    cfg: Config,
    exp: ExperimentConfig,
    out: Path,
    turns: int,
    context: int | None,
    eval_tasks: list,
    progress=True,
) -> None:
    """The leakage audit of one cell with the base model, into leakage<suffix>.json (once; `_t3_c2048`).
    With a grpo_checker arm it runs with agent.checker on: the turns before the answer are those of every
    other arm, and the checker turn (which executes the prediction) is audited too. `progress`: as
    `leakage_audit` (the experiment passes its line's handle)."""
    from sqlrl.agent.envs import make_env
    from sqlrl.agent.loop import Budgets
    from sqlrl.evaluation.runner import load_policy
    from sqlrl.evidence.leakage import leakage_audit
    from sqlrl.generation.device import free_memory

    suffix = cell_suffix(turns, context)
    leak_path = out / f"leakage{suffix}.json"
    if leak_path.exists():
        return
    kind = "grpo_checker" if "grpo_checker" in exp.arms else "base"
    budgets = Budgets.from_config(arm_config(cfg, kind, turns, context).agent)
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
            progress=progress,
        )
    write_json_atomic(leak_path, res)
    del policy
    free_memory()


def _combine_leakage(out: Path, cells: list[tuple[int, int | None]]) -> None:
    """leakage.json: the verdict over every cell's audit (`per_turn_budget` keyed `t1`, `t1_c2048`, ...)."""
    parts = {_cell_key(t, c): read_json(out / f"leakage{cell_suffix(t, c)}.json") for t, c in cells}
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


def _audit_weights(cfg: Config, exp: ExperimentConfig, out: Path, now: set[str] | None = None) -> None:
    """weights_audit.json: base vs GRPO vs No-update of the cells keyed in `now` (every cell when None;
    other cells' earlier audits kept), and the reloaded identity (`weightaudit.audit_cells`)."""
    from sqlrl.experiment.weightaudit import audit_cells

    cells = [(_cell_key(t, c), cell_suffix(t, c)) for t, c in exp.cells()]
    audit_cells(load_model_path(cfg.model.name), out, cells, now)


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
    """Every arm of every cell (experiment.json after each), a cell's weight audit once its grpo and
    no_update arms are done (finished in an earlier session too: every arm passes here), then its
    leakage audit."""
    from sqlrl.experiment.weightaudit import audit_point

    check_branches(out, exp.cells(), exp.arms, exp.sft)
    for turns, context in exp.cells():
        suffix = cell_suffix(turns, context)
        for kind in exp.arms:
            name = arm_name(kind, turns, context)
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
                context=context,
            )
            write_json_atomic(out / "experiment.json", state)
            if kind == audit_point(exp.arms):  # while their weights are surely here
                _audit_weights(cfg, exp, out, now={_cell_key(turns, context)})
        leak = progress.index[(_cell_key(turns, context), "leakage")]
        if (out / f"leakage{suffix}.json").exists():
            progress.line.skip(leak)
        else:
            handle = progress.line.open(leak)
            _leakage_for_cell(cfg, exp, out, turns, context, eval_tasks, progress=handle)
            part = progress.line.parts[leak]
            if part.done < part.total:  # tasks the audit did not roll out: the part is still finished
                handle.update(part.total - part.done)


def run_experiment(
    cfg: Config,
    exp: ExperimentConfig,
    out_dir: str | Path,
    *,
    command: list[str] | None = None,
    report: bool = True,
    deadline: float | None = None,
) -> dict:
    """Run (or resume) the arm matrix into `out_dir`: every arm per cell, the leakage audits, the
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
    from sqlrl.tasks.goldcache import no_bars

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
        with no_bars():  # the matrix's line is the progress: no gold audit draws a bar inside it
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
    _combine_leakage(out, exp.cells())
    state["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(out / "experiment.json", state)
    result = {"out": str(out)}
    if report:
        from sqlrl.evidence.report import write_report

        result["report"] = write_report(out)
    return result


def load_model_path(name: str) -> Path:
    from sqlrl.generation.models import resolve_model

    return Path(resolve_model(name))


QUICKSTART = "quickstart.toml"


def packaged_config(name: str) -> Path:
    return Path(str(resources.files("sqlrl") / "configs" / name))
