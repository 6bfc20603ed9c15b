"""One arm of the experiment matrix (`matrix.py`): its config, its training and its evaluation.

- `arm_name(kind, turns, context)`: `<kind>[_t<turns>][_c<context>]` (no `_t` for 1 turn, no `_c` when the
  matrix has no context axis); `arm_config(cfg, kind, turns, context)`: the run config of an arm kind in
  that cell (controls set lr 0 or the reward; `context` sets agent.max_context_tokens);
- `run_arm(...)`: train (unless base) and evaluate one arm into `arms/<arm>/{train,eval}`, keeping what
  is finished and resuming an unfinished training run from its last checkpoint. A training run whose
  weights are not in the folder (carried without *.safetensors / *.pt) when they are needed (its
  checkpoints to go on, its final to evaluate or to start grpo_sft from) trains again from the start,
  with one log line (`drop_unloadable`); grpo_sft refuses, in one line, an evaluated sft arm without
  its final weights. grpo_sft's config.json names its start weights by absolute path; after the
  experiment folder moved, that path (and a patch final's `base`) is pointed at the same folder there;
- `grpo_sft` trains GRPO (the `grpo` arm's settings) from SFT weights. With `sft.init_steps = 0` they are
  the `sft` arm's final weights; with `sft.init_steps > 0` the arm first runs its own SFT stage
  (`sft_stage`: [sft] settings, steps = init_steps, the sft arm's seed and single-turn data) in
  `arms/grpo_sft/sft_init`, resumed like any arm, so the `sft` arm is a pure control that can cover
  grpo_sft's whole training time; with `sft.init_from = "control"` no stage: the sft arm exports its
  weights after step init_steps (`training/sft_branch.py`: arms/sft/train/branch_step_<N>) and grpo_sft
  starts from them (`check_branches`: one line when an sft arm past that step lacks it). Its train
  run.json records the SFT start (`init_sft`: run, train_seconds, identity; a branch: also its folder
  and step) and its experiment.json entry names it (`init_run`, `init_branch`); the evidence gate adds
  that time to the GRPO part (`evidence/rltime.py`). With init_from = "control" the sft arm's branch is
  also evaluated like every arm (`eval_branch`: `arms/sft/branch_eval`, once; skipped in one log line
  without its weights), so the report can show what GRPO added to its start; no train time;
- `grpo_checker` is `grpo` with agent.checker = true, in its training rollouts and its evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

from sqlrl.artifacts import read_json, write_json_atomic
from sqlrl.config import Config, ConfigError
from sqlrl.config_tables import SFTConfig
from sqlrl.training.budget import Unfinished, check_time

log = logging.getLogger(__name__)


def cell_suffix(turns: int, context: int | None = None) -> str:
    """The arm-name suffix of a (turns, context) cell: `_t3` for 3 turns, `_c2048` for a context length of the
    `experiment.context_tokens` axis; "" for one turn without a context axis (`context` None)."""
    return ("" if turns == 1 else f"_t{turns}") + ("" if context is None else f"_c{context}")


def arm_name(kind: str, turns: int, context: int | None = None) -> str:
    return kind + cell_suffix(turns, context)


def arm_config(cfg: Config, kind: str, turns: int, context: int | None = None) -> Config:
    agent: dict = {"turns": turns} if context is None else {"turns": turns, "max_context_tokens": context}
    if kind == "no_update":
        return cfg.replace(agent=agent, grpo={"control": "no-update", "lr": 0.0, "reward": "execution"})
    if kind == "validity":
        return cfg.replace(agent=agent, grpo={"control": "none", "reward": "validity"})
    if kind == "sft":  # trained single-turn (the answer format), evaluated with `turns`
        return cfg.replace(agent=agent)
    if kind == "grpo_checker":
        return cfg.replace(agent={**agent, "checker": True}, grpo={"control": "none", "reward": "execution"})
    return cfg.replace(agent=agent, grpo={"control": "none", "reward": "execution"})


def sft_run_config(cfg: Config, turns: int, context: int | None = None) -> Config:
    """The config of an SFT run of the matrix (the sft arm, grpo_sft's own stage): single-turn, with the
    cell's context length (examples over it are dropped and counted)."""
    return arm_config(cfg, "sft", turns, context).replace(agent={"turns": 1})


def own_stage(sft: SFTConfig) -> bool:
    """Whether grpo_sft runs an SFT stage of its own (init_steps > 0 with init_from = "stage")."""
    return sft.init_steps > 0 and sft.init_from == "stage"


def init_dir(out: Path, turns: int, sft: SFTConfig, context: int | None = None) -> Path:
    """The SFT run folder grpo_sft (of the cell) starts from: its own stage, or the sft arm's training."""
    suffix = cell_suffix(turns, context)
    if own_stage(sft):
        return out / "arms" / f"grpo_sft{suffix}" / "sft_init"
    return out / "arms" / f"sft{suffix}" / "train"


def branch_step(sft: SFTConfig) -> int | None:
    """The step after which the sft arm exports its weights for grpo_sft (init_from = "control"), or None."""
    return sft.init_steps if sft.init_from == "control" and sft.init_steps > 0 else None


def init_weights(out: Path, turns: int, sft: SFTConfig, context: int | None = None) -> Path:
    """The weights folder grpo_sft's GRPO run starts from: the SFT run's final, or the sft arm's branch."""
    from sqlrl.training.sft_branch import branch_dir

    run = init_dir(out, turns, sft, context)
    step = branch_step(sft)
    return run / "final" if step is None else branch_dir(run, step)


def _no_branch(out: Path, name: str, branch: Path, sft: SFTConfig) -> str:
    sft_arm = branch.parent.parent.relative_to(out).as_posix()
    return (
        f'arm {name} starts from the sft arm\'s weights at step {sft.init_steps} (sft.init_from = "control"), '
        f"but {branch} is missing (the sft arm ran without that export); delete {out / sft_arm} to rerun "
        "the sft arm, which exports it"
    )


def check_branches(out: Path, cells, arms: tuple[str, ...], sft: SFTConfig) -> None:
    """Before the matrix runs: ConfigError (one line) when a cell's sft arm is past its branch step
    (finished, or a loadable checkpoint at or after it to resume from) without the branch folder that its
    grpo_sft, not finished training, starts from (init_from = "control")."""
    step = branch_step(sft)
    if step is None or "grpo_sft" not in arms:
        return
    for turns, context in cells:
        branch = init_weights(out, turns, sft, context)
        name = arm_name("grpo_sft", turns, context)
        run, gs_run = branch.parent / "run.json", out / "arms" / name / "train" / "run.json"
        saved = [
            int(p.name[5:])
            for p in (branch.parent / "checkpoints").glob("step_*")
            if p.name[5:].isdigit() and _checkpoint_loadable(p)  # one without weights is not resumed from
        ]
        past = (run.is_file() and read_json(run).get("status") == "finished") or max(saved, default=0) >= step
        gs_done = gs_run.is_file() and read_json(gs_run).get("status") == "finished"
        if past and not gs_done and not (branch / "identity.json").is_file():
            raise ConfigError(_no_branch(out, name, branch, sft))


def _opener(plan, what: str, default: bool):
    """The progress handle opener of part `what` of the matrix's plan (`matrix.ArmProgress`), else
    `default` (a line of its own, or none)."""
    return plan.opener(what) if plan is not None else default


def _skip(plan, what: str) -> None:
    if plan is not None:
        plan.skip(what)


def sft_stage(
    cfg: Config,
    sft: SFTConfig,
    stage_dir: Path,
    turns: int,
    name: str,
    command,
    deadline,
    context=None,
    plan=None,
) -> None:
    """Run, resume or keep grpo_sft's own SFT stage (`sft.init_steps` steps) in `stage_dir` (`plan`: the
    matrix's `ArmProgress`, whose "sft_stage" part it reports to)."""
    from sqlrl.generation.device import free_memory
    from sqlrl.training.sft import train_sft

    run_json = stage_dir / "run.json"
    if run_json.exists() and read_json(run_json).get("status") == "finished":
        _skip(plan, "sft_stage")
        log.info(f"[experiment] {name}: its SFT stage finished before, kept")
        return
    check_time(deadline, 60, f"the SFT stage of arm {name}")
    resume = (stage_dir / "config.json").exists()
    log.info(f"[experiment] {name}: {'resuming' if resume else 'running'} its SFT stage -> {stage_dir}")
    stage = dataclasses.replace(sft, steps=sft.init_steps)
    res = train_sft(
        sft_run_config(cfg, turns, context),
        stage,
        stage_dir,
        resume=resume,
        command=command,
        deadline=deadline,
        curve_turns=turns,
        progress=_opener(plan, "sft_stage", True),
    )
    free_memory()
    if not res["finished"]:
        raise Unfinished(f"arm {name}: its SFT stage stopped at step {res['steps']} of {sft.init_steps}")


def _final_loadable(final: Path) -> bool:
    """Whether a run's `final` folder holds the weights it names: dense safetensors, its patch file, or
    (weights not stored twice) the base's, named in identity.json."""
    ident = final / "identity.json"
    if not ident.is_file():
        return False
    data = read_json(ident)
    if data.get("weights_stored") is False:
        return True
    if data.get("weights_stored") == "patch":
        return (final / str(data.get("patch_file") or "patch.safetensors")).is_file()
    return any(final.glob("*.safetensors"))


def _checkpoint_loadable(step_dir: Path) -> bool:
    sidecar = step_dir / "sidecar.json"
    files = (read_json(sidecar).get("files") or {}) if sidecar.is_file() else {}
    return bool(files) and all((step_dir / f).is_file() for f in files)


def missing_weights(run_dir: Path, *, need_final: bool) -> str | None:
    """Why the training run in `run_dir` cannot go on from its files: the weights it needs are not there
    (a folder carried without *.safetensors and *.pt, as `scripts/gpu.sh pack` packs it). A finished run
    needs its final weights only with `need_final`; an unfinished one needs a checkpoint with its files
    (with no checkpoint it starts over anyway). None when nothing is missing or there is no run."""
    if not (run_dir / "config.json").is_file():
        return None
    run = run_dir / "run.json"
    if run.is_file() and read_json(run).get("status") == "finished":
        final = run_dir / "final"
        return None if not need_final or _final_loadable(final) else f"{final} holds no weights"
    steps = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if p.is_dir())
    if steps and not any(_checkpoint_loadable(p) for p in steps):
        return f"the checkpoints in {run_dir / 'checkpoints'} ({', '.join(p.name for p in steps)}) hold no weights"
    return None


def drop_unloadable(
    out: Path,
    name: str,
    kind: str,
    init: Path | None,
    *,
    own_stage: bool,
    eval_done: bool,
    start: Path | None = None,
) -> None:
    """Before arm `name` trains or evaluates: a training run whose weights are not here (with grpo_sft's
    own SFT stage `init`: either of them) is removed, so that the arm trains again from the start, with
    one log line saying why; a grpo_sft that would start from the sft arm's weights (`start`: its final,
    default, or its branch), not here, is refused in one line (retraining an arm that is evaluated is
    not safe)."""
    start = start if start is not None else (init / "final" if init is not None else None)
    train_dir = out / "arms" / name / "train"
    why = missing_weights(train_dir, need_final=not eval_done)
    run = train_dir / "run.json"
    trains = why is not None or not (run.is_file() and read_json(run).get("status") == "finished")
    drop = [train_dir] if why is not None else []
    reasons = [why] if why is not None else []
    if kind == "grpo_sft" and init is not None and trains:
        if own_stage:
            stage_why = missing_weights(init, need_final=True)
            if stage_why is not None:  # GRPO started from the stage's weights: it starts again too
                drop = [init, train_dir]
                reasons.insert(0, stage_why)
        elif (start / "identity.json").is_file() and not _final_loadable(start):
            raise ConfigError(
                f"arm {name} starts from {start}, which holds no weights (a folder carried without "
                f"them); copy them back, or delete {init.parent} and {out / 'arms' / name} to train both again"
            )
    if not drop:
        return
    log.warning(
        f"[experiment] {name}: {'; '.join(reasons)} (a folder carried without its weights?): training the arm "
        "again from the start"
    )
    for folder in drop:
        shutil.rmtree(folder, ignore_errors=True)


def _follow_move(out: Path, train_dir: Path, start: Path) -> None:
    """grpo_sft's run names its start weights (config.json `model.name`, and a patch final's `base`) by
    absolute path; after the experiment folder moved, point them at the same folder under `out` now."""
    rel = "/" + start.relative_to(out.resolve()).as_posix()
    for path, keys in (
        (train_dir / "config.json", ("model", "name")),
        (train_dir / "final/identity.json", ("base",)),
    ):
        if not path.is_file():
            continue
        data = read_json(path)
        holder = data.get(keys[0]) if len(keys) == 2 else data
        old = holder.get(keys[-1]) if isinstance(holder, dict) else None
        if isinstance(old, str) and old != str(start) and Path(old).as_posix().endswith(rel):
            log.info(f"[experiment] the experiment folder moved: {path} now names {start} (was {old})")
            holder[keys[-1]] = str(start)
            write_json_atomic(path, data)


def _record_init(out: Path, train_dir: Path, init: Path, start: Path) -> None:
    """Write into grpo_sft's train run.json which SFT run it started from and that run's train time (for
    a branch of the sft arm: the branch, its step and the run's train time up to it, branch.json's)."""
    from sqlrl.training.sft_branch import read_branch

    run = read_json(train_dir / "run.json")
    if start.name == "final":
        ident = start / "identity.json"
        run["init_sft"] = {
            "run": init.relative_to(out).as_posix(),
            "train_seconds": read_json(init / "run.json").get("train_seconds"),
            "final_identity": read_json(ident).get("weights_hash") if ident.is_file() else None,
        }
    else:
        branch = read_branch(start) or {}
        run["init_sft"] = {
            "run": init.relative_to(out).as_posix(),
            "branch": start.relative_to(out).as_posix(),
            "step": branch.get("step"),
            "train_seconds": branch.get("train_seconds"),
            "identity": branch.get("identity"),
        }
    write_json_atomic(train_dir / "run.json", run)


def train_arm(
    cfg: Config,
    out: Path,
    name: str,
    kind: str,
    turns: int,
    *,
    resume: bool,
    command: list[str] | None,
    deadline: float | None,
    sft: SFTConfig,
    progress,
    context: int | None = None,
    plan=None,
) -> tuple[dict, int]:
    """Train one arm into `arms/<name>/train`: GRPO, SFT (`sft`, single-turn) or GRPO from SFT weights
    (`grpo_sft`); returns (the trainer's result, the arm's steps). `progress`: the training's (True,
    False, or an opener); `plan`: the matrix's `ArmProgress`, for grpo_sft's own SFT stage."""
    from sqlrl.training.sft import train_sft
    from sqlrl.training.trainer import train

    train_dir = out / "arms" / name / "train"
    acfg = arm_config(cfg, kind, turns, context)
    if kind == "sft":
        res = train_sft(
            sft_run_config(cfg, turns, context),
            sft,
            train_dir,
            resume=resume,
            command=command,
            deadline=deadline,
            curve_turns=turns,  # trained single-turn, its curve at the turns the arm is evaluated with
            branch_step=branch_step(sft),  # grpo_sft's start with init_from = "control"
            progress=progress,
        )
        return res, sft.steps
    init = start = None
    if kind == "grpo_sft":
        init, start = init_dir(out, turns, sft, context), init_weights(out, turns, sft, context)
        if own_stage(sft):
            sft_stage(cfg, sft, init, turns, name, command, deadline, context, plan=plan)
        elif branch_step(sft) is not None and not (start / "identity.json").is_file():
            raise ConfigError(_no_branch(out, name, start, sft))
        elif not (start / "identity.json").is_file():
            raise ConfigError(
                f"arm {name} starts from the sft arm's final weights, but {start} holds none; list "
                "sft before grpo_sft in experiment.arms and let it finish, or set sft.init_steps > 0"
            )
        acfg = acfg.replace(model={"name": str(start.resolve())})
    res = train(acfg, train_dir, resume=resume, command=command, deadline=deadline, progress=progress)
    if init is not None:
        _record_init(out, train_dir, init, start)
    return res, acfg.grpo.steps


def run_arm(
    cfg: Config,
    out: Path,
    name: str,
    kind: str,
    turns: int,
    *,
    root: Path,
    n_eval_tasks: int,
    command: list[str] | None,
    deadline: float | None,
    progress=None,
    sft: SFTConfig | None = None,
    context: int | None = None,
) -> dict:
    """Train (unless base) and evaluate one arm, skipping what is finished; returns its experiment.json
    entry (`progress`: the matrix's `ArmProgress`; `context`: the cell's context length, None without a
    context axis, when the entry has no `context_tokens` key)."""
    from sqlrl.agent.loop import Budgets
    from sqlrl.generation.device import free_memory

    sft = sft or SFTConfig()
    arm_dir = out / "arms" / name
    budgets = Budgets.from_config(arm_config(cfg, kind, turns, context).agent)
    entry = {
        "kind": kind,
        "turns": turns,
        **({} if context is None else {"context_tokens": context}),
        "budgets": budgets.to_dict(),
        "train_run": None,
        "eval_run": f"arms/{name}/eval",
    }
    if kind == "grpo_sft":
        entry["init_run"] = init_dir(out, turns, sft, context).relative_to(out).as_posix()
        if branch_step(sft) is not None:
            entry["init_branch"] = init_weights(out, turns, sft, context).relative_to(out).as_posix()
    model_for_eval = cfg.model.name
    if kind != "base":
        train_dir = arm_dir / "train"
        entry["train_run"] = f"arms/{name}/train"
        init = init_dir(out, turns, sft, context) if kind == "grpo_sft" else None
        start = init_weights(out, turns, sft, context) if kind == "grpo_sft" else None
        eval_done = (arm_dir / "eval" / "summary.json").exists()
        drop_unloadable(out, name, kind, init, own_stage=own_stage(sft), eval_done=eval_done, start=start)
        if start is not None:
            _follow_move(out, train_dir, start.resolve())
        run_json = train_dir / "run.json"
        finished = run_json.exists() and read_json(run_json).get("status") == "finished"
        if finished:
            if progress is not None:
                progress.skip_training()
            log.info(f"[experiment] {name}: training finished before, kept")
        else:
            check_time(deadline, 60, f"training arm {name}")
            resume = (train_dir / "config.json").exists()
            log.info(f"[experiment] {name}: {'resuming training' if resume else 'training'} -> {train_dir}")
            res, total = train_arm(
                cfg,
                out,
                name,
                kind,
                turns,
                resume=resume,
                command=command,
                deadline=deadline,
                sft=sft,
                progress=_opener(progress, "train", True),
                context=context,
                plan=progress,
            )
            free_memory()
            if not res["finished"]:
                raise Unfinished(f"arm {name} stopped at step {res['steps']} of {total}")
        from sqlrl.training.export import final_weights

        # the folder, or the base for a No-update arm that stored only its weights' hashes (audited)
        model_for_eval = final_weights(train_dir / "final")
    if (arm_dir / "eval" / "summary.json").exists():
        _skip(progress, "eval")
        log.info(f"[experiment] {name}: evaluation finished before, kept")
    else:
        check_time(deadline, 45, f"evaluating arm {name}")
        log.info(f"[experiment] {name}: evaluating on {n_eval_tasks} tasks -> {arm_dir / 'eval'}")
        opener = _opener(progress, "eval", True)
        evaluate(cfg, model_for_eval, arm_dir / "eval", budgets, root=root, command=command, progress=opener)
    if kind == "sft" and branch_step(sft) is not None:
        entry.update(
            eval_branch(
                cfg, out, name, budgets, sft, root=root, command=command, deadline=deadline, plan=progress
            )
        )
    return entry


def evaluate(cfg: Config, model: str, eval_dir: Path, budgets, *, root: Path, command, progress) -> None:
    """Evaluate `model` greedily into `eval_dir` on the matrix's validation tasks with `budgets`: the one
    evaluation of every arm (and of the sft arm's branch), resumed chunk by chunk by `run_eval`."""
    from sqlrl.evaluation.runner import load_policy, run_eval
    from sqlrl.generation.device import free_memory

    policy = load_policy(
        model,
        device=cfg.run.device,
        dtype=cfg.model.dtype,
        engine=cfg.run.gen_engine,
        max_batch=cfg.run.gen_max_batch,
    )
    run_eval(
        model=model,
        data=str(root),
        split=cfg.data.eval_split,
        out=eval_dir,
        budgets=budgets,
        limit=cfg.data.max_eval_tasks,
        seed=cfg.data.split_seed,  # the eval subset: the same tasks for every training seed
        split_seed=cfg.data.split_seed,
        val_fraction=cfg.data.val_fraction,
        policy=policy,
        sandbox_workers=cfg.run.sandbox_workers,
        command=command,
        progress=progress,
    )
    del policy
    free_memory()


def eval_branch(
    cfg: Config, out: Path, name: str, budgets, sft: SFTConfig, *, root: Path, command, deadline, plan=None
) -> dict:
    """Evaluate the sft arm `name`'s branch weights (after step `sft.init_steps`, grpo_sft's start) like
    the arm itself into `arms/<name>/branch_eval`, once: kept when its summary.json exists, skipped with
    one log line when the branch holds no weights here (a folder carried without them). Not training:
    no part of any train_seconds. Returns the experiment.json keys {branch_eval_run, branch_step} when
    that evaluation exists, else {}. `plan`: the matrix's `ArmProgress` ("branch_eval" part)."""
    from sqlrl.training.export import final_weights
    from sqlrl.training.sft_branch import branch_dir

    step = branch_step(sft)
    eval_dir = out / "arms" / name / "branch_eval"
    keys = {"branch_eval_run": f"arms/{name}/branch_eval", "branch_step": step}
    if (eval_dir / "summary.json").exists():
        _skip(plan, "branch_eval")
        log.info(f"[experiment] {name}: evaluation of its step-{step} branch finished before, kept")
        return keys
    branch = branch_dir(out / "arms" / name / "train", step)
    if not _final_loadable(branch):
        log.warning(
            f"[experiment] {name}: {branch} holds no weights here (absent, or carried without them): "
            "its evaluation is skipped"
        )
        _skip(plan, "branch_eval")
        return {}
    check_time(deadline, 45, f"evaluating the step-{step} branch of arm {name}")
    log.info(f"[experiment] {name}: evaluating its step-{step} branch (grpo_sft's start) -> {eval_dir}")
    opener = _opener(plan, "branch_eval", False)
    evaluate(cfg, final_weights(branch), eval_dir, budgets, root=root, command=command, progress=opener)
    return keys
