"""`sqlrl curriculum CONFIG.toml`: a staged curriculum on debugging tasks, then evaluation by category.

The run file is a normal run file (`[data]` kind = "debug") plus `[sft]` (the warm start) and
`[curriculum]` with `[[curriculum.stages]]` (config.py); by default `sft` -> `grpo-single` (agent.turns
= 1) -> `grpo-multi` (agent.turns = 3). Output folder `OUT`:

    OUT/curriculum.json            resolved config (run file + [sft] + [curriculum]), task file, stage records
    OUT/tasks/debug_tasks.jsonl    only when the task file has no `data.eval_split` tasks: the same tasks
                                   re-split by database, so evaluation databases are never trained on
    OUT/NN-<stage>/                the stage's own run folder (`sqlrl sft` or `sqlrl train` layout, final/)
    OUT/evals/<model>-t<turns>/    `sqlrl eval --kind debug` run folders: base and every stage, greedy
    OUT/eval_by_category.json/.md  solved rate and mean test-pass fraction per category, per model and turns

What is covered:
- Stage k starts from stage k-1's exported `final/` weights, checked: the weights hash the stage recorded
  at load time must equal the previous stage's `final/identity.json`.
- Resumable: a rerun skips a finished stage after checking its config.json, the sha256 of every file of
  its `final/` and the identity chain; an unfinished stage resumes from its last checkpoint; an
  evaluation whose folder holds the same model identity, task ids and budgets is not repeated. A
  changed config (beyond memory-only settings) is an error.
- The warm start only sees training-split references; evaluation scores each trajectory after it ended,
  with the hidden tests.

What is not: that any stage helps; a smoke run (`curriculum.smoke`) only shows the machinery runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from sqlrl import config as C
from sqlrl.artifacts import (
    RUN_LOCK_FILE,
    git_commit,
    holds_run_lock,
    machine_info,
    read_json,
    read_jsonl,
    sha256_file,
    write_json_atomic,
)
from sqlrl.config import Config, ConfigError
from sqlrl.config_tables import CurriculumConfig, SFTConfig, StageConfig, curriculum_from_dict, sft_from_dict
from sqlrl.training.export import final_weights
from sqlrl.training.runfolder import config_changes, final_record

log = logging.getLogger(__name__)


def load_curriculum(
    path: str | Path, overrides: list[str] | None = None
) -> tuple[Config, SFTConfig, CurriculumConfig]:
    raw = C.read_raw(path, overrides)
    sft = sft_from_dict(raw.pop("sft", {}), source=str(path))
    cur = curriculum_from_dict(raw.pop("curriculum", {}), source=str(path))
    raw.pop("experiment", None)
    cfg = C.from_dict(raw, source=str(path))
    check_curriculum(cfg, cur, str(path))
    return cfg, sft, cur


def check_curriculum(cfg: Config, cur: CurriculumConfig, source: str = "<config>") -> None:
    if cfg.data.kind != "debug":
        raise ConfigError(
            f'{source}: data.kind = {cfg.data.kind!r}: the curriculum runs on debugging tasks; set [data] kind = "debug"'
        )
    if cfg.data.train_split == cfg.data.eval_split:
        raise ConfigError(
            f"{source}: data.train_split = data.eval_split = {cfg.data.train_split!r}: stages would train on the "
            "tasks (and, for sft, the references) they are evaluated on; use different splits"
        )


def resolved(cfg: Config, sft: SFTConfig, cur: CurriculumConfig) -> dict:
    return json.loads(
        json.dumps({**cfg.resolve(), "sft": dataclasses.asdict(sft), "curriculum": dataclasses.asdict(cur)})
    )


def stage_folder(out: Path, i: int, stage: StageConfig) -> Path:
    return out / f"{i + 1:02d}-{stage.name}"


def stage_configs(
    cfg: Config, sft: SFTConfig, stage: StageConfig, init_model: str
) -> tuple[Config, SFTConfig]:
    """The run config (and [sft]) of one stage: model.name = the previous stage's final weights, the stage's
    turns / steps, then its `set` overrides."""
    raw = json.loads(json.dumps({**cfg.resolve(), "sft": dataclasses.asdict(sft)}))
    raw["model"]["name"] = init_model
    if stage.kind == "sft":
        raw["agent"]["turns"] = 1
    elif stage.turns:
        raw["agent"]["turns"] = stage.turns
    if stage.steps:
        raw["sft" if stage.kind == "sft" else "grpo"]["steps"] = stage.steps
    for ov in stage.set:
        C.apply_override(raw, ov)
    where = f"curriculum stage {stage.name!r}"
    s = sft_from_dict(raw.pop("sft"), source=where)
    scfg = C.from_dict(raw, source=where)
    if stage.kind == "sft" and scfg.agent.turns != 1:
        raise ConfigError(f"{where}: an sft stage is single-turn; do not set agent.turns in its `set`")
    return scfg, s


def prepare_tasks(cfg: Config, out: Path) -> tuple[Path, dict]:
    """The task file every stage and evaluation uses, and how it was obtained (see the module docstring)."""
    from sqlrl.tasks.data import split_by_database
    from sqlrl.tasks.debugging import load_debug_tasks, resolve_debug_file, save_debug_tasks

    src = resolve_debug_file(cfg.data.path)
    tasks = load_debug_tasks(src)
    d = cfg.data
    if any(t.split == d.eval_split for t in tasks):
        return src.resolve(), {
            "tasks_file": str(src.resolve()),
            "source": str(src.resolve()),
            "resplit": False,
        }
    train_dbs, val_dbs = split_by_database([t.public.db_id for t in tasks], d.split_seed, d.val_fraction)
    val = set(val_dbs)
    new = [
        dataclasses.replace(t, split=d.eval_split if t.public.db_id in val else d.train_split) for t in tasks
    ]
    dest = out / "tasks" / "debug_tasks.jsonl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    save_debug_tasks(new, tmp)
    if dest.exists() and sha256_file(dest) != sha256_file(tmp):
        tmp.unlink()
        raise ConfigError(
            f"{dest} exists with different tasks; this output folder belongs to another run, use a new --out"
        )
    tmp.replace(dest)
    return dest.resolve(), {
        "tasks_file": str(dest.resolve()),
        "source": str(src.resolve()),
        "source_fingerprint": sha256_file(src),
        "resplit": True,
        "rule": f"split_by_database(seed={d.split_seed}, val_fraction={d.val_fraction}) over the file's databases",
        "train_db_ids": train_dbs,
        "eval_db_ids": val_dbs,
    }


def _verify_final(folder: Path) -> dict:
    ident_p = folder / "final" / "identity.json"
    if not ident_p.is_file():
        raise ConfigError(
            f"{folder}: run.json says finished but final/identity.json is missing; delete {folder} to redo the stage"
        )
    ident = read_json(ident_p)
    for name, rec in (ident.get("files") or {}).items():
        p = folder / "final" / name
        if not p.is_file() or p.stat().st_size != rec["bytes"] or sha256_file(p) != rec["sha256"]:
            raise ConfigError(
                f"{folder}/final/{name} does not match identity.json (missing or changed); "
                f"delete {folder} to redo the stage"
            )
    return ident


def finished_stage(folder: Path, expected_config: dict, init_identity: str | None) -> dict | None:
    """The record of a finished stage after checking config, final files and identity chain; None if the
    stage has not finished."""
    if not (folder / "run.json").is_file() or read_json(folder / "run.json").get("status") != "finished":
        return None
    saved = read_json(folder / "config.json")
    diff, _ = config_changes(saved, expected_config)  # memory-only settings may differ
    if diff:
        raise ConfigError(
            f"{folder} finished with a different config ({diff}); use a new --out or delete {folder} to redo it"
        )
    info = read_json(folder / "run.json")
    base = (info.get("model") or {}).get("base_identity")
    if init_identity is not None and base != init_identity:
        raise ConfigError(
            f"{folder} started from weights {base}, but the previous stage's final weights are {init_identity}; "
            f"delete {folder} (and later stages) to redo it"
        )
    ident = _verify_final(folder)
    changed = final_record(ident, base)["weights_changed"]  # in the final's dtype, not against a float32 base
    return {
        "base_identity": base,
        "final_identity": ident["weights_hash"],
        "weights_changed": changed,
        "steps": info.get("steps"),
    }


def _stage_metrics(folder: Path, kind: str) -> dict:
    rows = list(read_jsonl(folder / "steps.jsonl")) if (folder / "steps.jsonl").exists() else []
    key = "loss" if kind == "sft" else "reward_mean"
    vals = [r.get(key) for r in rows]
    out = {f"{key}_per_step": vals, "steps_logged": len(rows)}
    if kind == "grpo":
        out["accuracy_per_step"] = [r.get("accuracy") for r in rows]
    return out


def _default_policy(model_name: str, cfg: Config):
    from sqlrl.evaluation.runner import load_policy

    return load_policy(model_name, device=cfg.run.device, dtype=cfg.model.dtype, engine=cfg.run.gen_engine)


@holds_run_lock("out")
def run_debug_eval(
    *,
    tasks,
    policy,
    budgets,
    out: Path,
    provenance: dict,
    sandbox_workers: int = 2,
) -> dict:
    """Greedy evaluation of private debugging `tasks`; writes a `sqlrl eval` run folder whose summary.json
    has `by_category` (debugagent.category_table). Returns the summary."""
    from sqlrl.evaluation.debugging import category_table, evaluate_debug, write_debug_eval_run

    with tempfile.TemporaryDirectory(prefix="sqlrl-evalpool-") as pool_root:
        trajs, results, summary = evaluate_debug(
            tasks, policy, budgets, pool_root=pool_root, workers=sandbox_workers
        )
    summary["by_category"] = category_table(results)
    write_debug_eval_run(out, trajs, results, summary, provenance)
    return summary


def _resume_changes(out: Path, rec_p: Path, full: dict) -> list:
    """The resume-change records of an existing curriculum folder, plus this invocation's (memory-only)
    changes; a new folder must be empty (or hold only tasks/). A blocking change is a ConfigError."""
    if not rec_p.exists():
        if any(p.name not in ("tasks", RUN_LOCK_FILE) for p in out.iterdir()):
            raise ConfigError(f"{out} is not empty and holds no curriculum.json; choose a new --out folder")
        return []
    earlier = read_json(rec_p)
    blocking, memory = config_changes(earlier.get("config") or {}, full)
    if blocking:
        raise ConfigError(
            f"{out} holds a curriculum with a different config (differs in {blocking}); rerun with "
            "the same config to resume, or use a new --out folder"
        )
    changes = earlier.get("resume_changes") or []
    if memory:  # memory-only settings may change on resume; recorded below and in each stage's run
        log.warning(f"[curriculum] resuming with {memory}")
        changes.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changes": memory})
    return changes


def _factory_for(policy_factory, name: str):
    """`policy_factory` bound to one model name (None without a factory)."""
    return (lambda: policy_factory(name)) if policy_factory is not None else None


def _run_stage(stage, folder: Path, scfg: Config, ssft: SFTConfig, resume: bool, kw: dict) -> None:
    """Train one stage (sft or grpo) into `folder`; raise unless it finished (`Unfinished` when the
    deadline stopped it)."""
    from sqlrl.training.budget import Unfinished
    from sqlrl.training.sft import train_sft
    from sqlrl.training.trainer import train

    log.warning(f"[curriculum] {folder.name}: {'resume' if resume else 'start'} ({stage.kind})")
    deadline = kw["deadline"]
    if stage.kind == "sft":
        kw = {k: v for k, v in kw.items() if k != "evaluator_factory"}
        res = train_sft(scfg, ssft, folder, resume=resume, **kw)
    else:
        res = train(scfg, folder, resume=resume, **kw)
    if not res.get("finished") and deadline is not None and time.monotonic() + 60 > deadline:
        raise Unfinished(f"stage {folder.name} stopped at step {res.get('steps')} (checkpointed)")
    if not res.get("finished"):
        raise RuntimeError(
            f"stage {folder.name} stopped before its last step; rerun the same command to resume"
        )


def run_stages(
    cfg: Config, sft: SFTConfig, cur: CurriculumConfig, out: Path, record: dict, **kw
) -> str | None:
    """Run (or skip, when finished and checked) every stage in order, each from the previous stage's
    final weights; appends each stage to `record["stages"]` and rewrites curriculum.json. Returns the
    base weights' identity. `kw`: policy_factory, progress, command, evaluator_factory, deadline,
    resume_from_valid."""
    from sqlrl.training import budget
    from sqlrl.training.sft import resolved as sft_resolved

    policy_factory, command = kw.pop("policy_factory"), kw.pop("command")
    init_model, init_identity = cfg.model.name, None
    base_identity = None
    for i, stage in enumerate(cur.stages):
        folder = stage_folder(out, i, stage)
        scfg, ssft = stage_configs(cfg, sft, stage, init_model)
        if stage.kind == "sft":
            expected = json.loads(json.dumps(sft_resolved(scfg, ssft)))
        else:
            expected = json.loads(json.dumps(scfg.resolve()))
        done = finished_stage(folder, expected, init_identity)
        ts = time.perf_counter()
        if done is not None:
            status = "skipped (finished before; config, final/ files and identity chain checked)"
            log.warning(f"[curriculum] {folder.name}: {status}")
        else:
            budget.check_time(kw["deadline"], 60, f"stage {folder.name}")
            resume = (folder / "config.json").is_file()
            stage_kw = {
                **kw,
                "policy_factory": _factory_for(policy_factory, init_model),
                "command": [*(command or ["sqlrl", "curriculum"]), f"# stage {folder.name}"],
            }
            _run_stage(stage, folder, scfg, ssft, resume, stage_kw)
            done = finished_stage(folder, expected, init_identity)
            assert done is not None
            status = "resumed" if resume else "ran"
        if base_identity is None:
            base_identity = done["base_identity"]
        record["stages"].append(
            {
                "index": i + 1,
                "name": stage.name,
                "kind": stage.kind,
                "turns": scfg.agent.turns,
                "steps": done["steps"],
                "folder": folder.name,
                "init_model": init_model,
                "base_identity": done["base_identity"],
                "final_identity": done["final_identity"],
                "weights_changed": done["weights_changed"],
                "status": status,
                "seconds_this_invocation": round(time.perf_counter() - ts, 2),
                **_stage_metrics(folder, stage.kind),
            }
        )
        write_json_atomic(out / "curriculum.json", record)
        init_model, init_identity = final_weights(folder / "final"), done["final_identity"]
    return base_identity


def evaluate_models(
    cfg: Config, cur: CurriculumConfig, out: Path, models: list, eval_tasks, tasks_file: Path, **kw
) -> dict:
    """Greedy debug evaluation of every (label, model path, identity) at every `curriculum.eval_turns`
    budget into OUT/evals/<label>-t<turns>; a folder that already holds the same model identity, task
    ids and budgets is reused. Returns {"t<turns>": {label: summary}}. `kw`: policy_factory, command,
    deadline."""
    from sqlrl.agent.loop import Budgets
    from sqlrl.generation.device import pick_device
    from sqlrl.training import budget

    policy_factory, command, deadline = kw["policy_factory"], kw["command"], kw["deadline"]
    task_ids = [t.task_id for t in eval_tasks]
    evals: dict[str, dict] = {}
    for label, model_name, identity in models:
        policy = None
        for turns in cur.eval_turns:
            ev = out / "evals" / f"{label}-t{turns}"
            budgets = dataclasses.replace(Budgets.from_config(cfg.agent), turns=turns)
            if (ev / "summary.json").is_file() and (ev / "run.json").is_file():
                prev = read_json(ev / "run.json")
                if (
                    (prev.get("model") or {}).get("identity") == identity
                    and prev.get("task_ids") == task_ids
                    and prev.get("budgets") == json.loads(json.dumps(budgets.to_dict()))
                ):
                    evals.setdefault(f"t{turns}", {})[label] = read_json(ev / "summary.json")
                    continue
            budget.check_time(deadline, 45, f"evaluating {label} at {turns} turn(s)")
            if policy is None:
                log.warning(f"[curriculum] evaluating {label} ({model_name})")
                if policy_factory is not None:
                    from sqlrl.generation.policy import HFPolicy

                    m, tok, name, ident = policy_factory(model_name)
                    policy = HFPolicy(m, tok, engine="hf", name=name, identity=ident)
                else:
                    policy = _default_policy(model_name, cfg)
                if identity is not None and policy.identity != identity:
                    raise RuntimeError(
                        f"{model_name}: loaded weights hash {policy.identity} != recorded identity {identity}"
                    )
            prov = {
                "command": command or sys.argv,
                "git": git_commit(),
                "machine": machine_info(),
                "kind": "debug",
                "model": {"name": label, "path": model_name, "identity": policy.identity},
                "data": str(tasks_file),
                "split": cfg.data.eval_split,
                "fingerprint": sha256_file(tasks_file),
                "task_ids": task_ids,
                "budgets": budgets.to_dict(),
                "sampling": {"temperature": 0.0, "seed": 0},
                "device": pick_device(cfg.run.device),
            }
            run_debug_eval(
                tasks=eval_tasks,
                policy=policy,
                budgets=budgets,
                out=ev,
                provenance=prov,
                sandbox_workers=cfg.run.sandbox_workers,
            )
            evals.setdefault(f"t{turns}", {})[label] = read_json(ev / "summary.json")
        del policy
    return evals


def eval_report_md(result: dict, models: list, cur: CurriculumConfig) -> str:
    """eval_by_category.md: the category tables per turn budget, then the stages."""
    from sqlrl.evaluation.debugging import category_table_md

    md = [
        "# Curriculum evaluation by category",
        "",
        f"Split `{result['eval_split']}` ({result['n_eval_tasks']} tasks: "
        + ", ".join(f"{c} {n}" for c, n in result["eval_tasks_per_category"].items())
        + "), greedy. Cell: solved/scored (accuracy = solved rate), mean fraction of hidden tests passed.",
    ]
    if cur.smoke:
        md += ["", f"**Smoke run.** {result['note']}."]
    for tk, per in result["by_category"].items():
        md += [
            "",
            f"## {tk[1:]} turn(s)",
            "",
            category_table_md([(label, per[label]) for label, _, _ in models]),
        ]
    md += [
        "",
        "## Stages",
        "",
        "| stage | kind | turns | steps | weights changed |",
        "| --- | --- | --- | --- | --- |",
    ]
    md += [
        f"| {s['name']} | {s['kind']} | {s['turns']} | {s['steps']} | {s['weights_changed']} |"
        for s in result["stages"]
    ]
    return "\n".join(md) + "\n"


STAGE_SUMMARY_KEYS = ("name", "kind", "turns", "steps", "base_identity", "final_identity", "weights_changed")


@holds_run_lock("out_dir")
def run_curriculum(
    cfg: Config,
    sft: SFTConfig,
    cur: CurriculumConfig,
    out_dir: str | Path,
    *,
    policy_factory=None,
    progress: bool = True,
    command: list[str] | None = None,
    evaluator_factory=None,
    deadline: float | None = None,
    resume_from_valid: bool = False,
) -> dict:
    """Run (or resume) every stage, then the evaluation by category. `policy_factory(model_name) ->
    (model, tokenizer, name, identity)` replaces model loading for training and evaluation (tests).
    `resume_from_valid`: a stage whose newest checkpoint is corrupt resumes from the newest valid older
    one (`trainer.train`'s `resume_from_valid`) instead of raising `CheckpointError`.
    `deadline` (a `time.monotonic()` value): stages stop cleanly with a checkpoint and evaluations are
    not started when time is short; `experiment.Unfinished` is raised, and rerunning resumes."""
    from sqlrl.tasks.data import select_tasks
    from sqlrl.tasks.debugging import load_debug_tasks

    check_curriculum(cfg, cur)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    full = resolved(cfg, sft, cur)
    rec_p = out / "curriculum.json"
    earlier_changes = _resume_changes(out, rec_p, full)
    tasks_file, tasks_info = prepare_tasks(cfg, out)
    cfg = cfg.replace(data={"path": str(tasks_file)})
    record = {
        "config": full,
        "smoke": cur.smoke,
        "command": command or sys.argv,
        "git": git_commit(),
        "machine": machine_info(),
        "tasks": {**tasks_info, "fingerprint": sha256_file(tasks_file)},
        "stages": [],
        "status": "running",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if earlier_changes:
        record["resume_changes"] = earlier_changes
    write_json_atomic(rec_p, record)

    t0 = time.perf_counter()
    base_identity = run_stages(
        cfg,
        sft,
        cur,
        out,
        record,
        policy_factory=policy_factory,
        progress=progress,
        command=command,
        evaluator_factory=evaluator_factory,
        deadline=deadline,
        resume_from_valid=resume_from_valid,
    )

    # ---- evaluation by category: base and every stage, same tasks, same budgets, greedy ----
    all_tasks = load_debug_tasks(tasks_file)
    eval_tasks = select_tasks(
        [t for t in all_tasks if t.split == cfg.data.eval_split],
        cfg.data.max_eval_tasks,
        cfg.data.split_seed,  # not run.seed: every training seed is evaluated on the same tasks
    )
    if not eval_tasks:
        raise ConfigError(f"{tasks_file}: no {cfg.data.eval_split!r} tasks to evaluate on")
    models = [("base", cfg.model.name, base_identity)] if cur.eval_base else []
    for st in record["stages"]:
        models.append((st["name"], final_weights(out / st["folder"] / "final"), st["final_identity"]))
    evals = evaluate_models(
        cfg,
        cur,
        out,
        models,
        eval_tasks,
        tasks_file,
        policy_factory=policy_factory,
        command=command,
        deadline=deadline,
    )
    result = {
        "smoke": cur.smoke,
        "note": "smoke run: a few CPU steps on a handful of tasks; these numbers show the machinery runs, not that training helps"
        if cur.smoke
        else "",
        "eval_split": cfg.data.eval_split,
        "tasks_file": str(tasks_file),
        "fingerprint": sha256_file(tasks_file),
        "n_eval_tasks": len(eval_tasks),
        "eval_tasks_per_category": {
            c: sum(t.category == c for t in eval_tasks) for c in ("query", "management", "personalization")
        },
        "eval_task_ids": [t.task_id for t in eval_tasks],
        "models": [{"label": a, "path": b, "identity": c} for a, b, c in models],
        "by_category": {
            tk: {label: s.get("by_category") for label, s in per.items()} for tk, per in evals.items()
        },
        "stages": [{k: st[k] for k in STAGE_SUMMARY_KEYS} for st in record["stages"]],
    }
    write_json_atomic(out / "eval_by_category.json", result)
    (out / "eval_by_category.md").write_text(eval_report_md(result, models, cur), encoding="utf-8")
    record.update(
        status="finished",
        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        seconds=round(time.perf_counter() - t0, 2),
    )
    write_json_atomic(rec_p, record)
    return result
