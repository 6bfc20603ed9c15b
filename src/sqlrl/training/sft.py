"""`sqlrl sft CONFIG.toml`: supervised fine-tuning on training references, in the agent's answer format.

Data (`data.kind`):
- `text2sql`: each training task (the tasks GRPO samples, gold audit passed) is one example: the
  text-to-SQL agent's single-turn prompt, answered "```sql\n<gold>\n```" + end-of-turn (`sft_data.py`);
  the matrix's `sft` arm (SFT-only control) and `grpo_sft` arm (GRPO from its weights) run this. With
  `sft.trace_turns` = T >= 2: one T-turn trace of the agent's protocol per task (`sft_traces.py`).
- `debug`: each training-split debugging task: the prompt is exactly the single-turn prompt the agent
  builds (`agent.debugging.build_debug_messages`), the target the reference solution as the agent's
  answer (one ```sql block per solution entry) plus end-of-turn. With `sft.submit_turns` = T >= 2 every
  reference appears again after the multi-turn prompt for T turns, answered "SUBMIT" + the same blocks.
Cross-entropy on target tokens only (replies, never observations), averaged over an optimizer step.

What is covered:
- Only training references are used: `data.train_split` must differ from `data.eval_split`, and no
  training task may sit on a database that has evaluation tasks (`check_training_references`,
  `sft_data.check_reference_databases`: a `ValueError` before any model is loaded).
- Every target round-trips: decoding its token ids and parsing them with the agent's parser gives back
  the reference; examples that do not, that exceed the agent's budgets (`max_new_tokens`,
  `max_context_tokens`), or whose gold is unscorable are dropped and counted in run.json (never truncated).
- The run folder is that of `sqlrl train` (`runfolder.py`; curve.jsonl: `sft_loop.py`; the schedule:
  `schedule.py`; a branch point: `sft_branch.py`); `--resume` continues from the last checkpoint.
Not covered: that imitation of references helps; a short CPU run proves nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from sqlrl.artifacts import (
    git_commit,
    holds_run_lock,
    machine_info,
    sha256_file,
    write_json_atomic,
)
from sqlrl.config import Config, ConfigError
from sqlrl.config_tables import SFTConfig
from sqlrl.evaluation.progress import open_part
from sqlrl.training.runfolder import (
    Checkpointer,
    check_run_folder,
    drop_steps_after,
    export_final,
    final_record,
    previous_run,
    restore_latest,
)
from sqlrl.training.sampling import TaskSampler
from sqlrl.training.sessions import Sessions, TrainClock, kept_machines, resumed_seconds
from sqlrl.training.sft_branch import Branch
from sqlrl.training.sft_data import build_text2sql_examples, load_text2sql_sft
from sqlrl.training.sft_data import completion_tail as _completion_tail
from sqlrl.training.sft_loop import SFTCurve, StepLoop, run_steps
from sqlrl.training.sft_loop import answer_loss_sum as answer_loss_sum
from sqlrl.training.sft_loop import collate as collate
from sqlrl.training.sft_loop import sft_step as sft_step
from sqlrl.training.sft_loop import trained_tokens as trained_tokens
from sqlrl.training.trainer import load_trainable, make_optimizer, pad_token_id, seed_and_device

log = logging.getLogger(__name__)


def expected_submission(task) -> tuple[str, ...]:
    """The submission `parse_debug_action` must read from the SFT target of `task`."""
    sol = [s.strip() for s in task.solution_sql if s and s.strip()]
    if task.category == "query":
        return tuple(s.rstrip(";").strip() for s in sol[-1:])
    return tuple(sol)


def sft_target_text(task) -> str:
    """The reference solution as the single-turn agent's answer: one ```sql block per solution entry."""
    return "\n\n".join(f"```sql\n{s}\n```" for s in expected_submission(task))


def check_training_references(tasks, all_tasks, *, train_split: str, eval_split: str) -> None:
    """Refuse any reference that is not from the training split (the evaluation golds are private)."""
    if train_split == eval_split:
        raise ValueError(
            f"data.train_split = data.eval_split = {train_split!r}: the warm start would learn the "
            "references it is evaluated on; use different splits"
        )
    bad = [t.task_id for t in tasks if t.split != train_split]
    if bad:
        raise ValueError(
            f"supervised warm start refused {len(bad)} task(s) outside the training split {train_split!r} "
            f"(e.g. {bad[:3]}): reference solutions of other splits are private evaluation data"
        )
    eval_dbs = {t.public.db_id for t in all_tasks if t.split == eval_split}
    shared = sorted({t.public.db_id for t in tasks} & eval_dbs)
    if shared:
        raise ValueError(
            f"supervised warm start refused: databases {shared[:5]} hold both training tasks and "
            f"{eval_split!r} tasks; the split must be by database"
        )


def build_sft_examples(tasks, tokenizer, budgets, submit_turns: int = 0) -> tuple[list[dict], dict]:
    """Tokenized examples {task_id, category, format, prompt_ids, target_ids} and the drop counts by
    reason. Format "single": the single-turn prompt and answer. With `submit_turns` >= 2, also format
    "submit": the multi-turn prompt for that many turns, answered with SUBMIT and the same sql blocks
    (its drop reasons are prefixed "submit:"); both must parse back to the reference submission."""
    from sqlrl.agent.debugging import ACTION_SUBMIT, build_debug_messages, parse_debug_action
    from sqlrl.agent.prompts import ChatFormat

    if budgets.turns != 1:
        raise ConfigError(
            f"agent.turns = {budgets.turns}: the warm start trains the single-turn answer format; "
            "set agent.turns = 1 (e.g. --set agent.turns=1) and sft.submit_turns for the multi-turn one"
        )
    formats = [("single", budgets, "")]
    if submit_turns:
        if budgets.max_sql_executions < 1:
            raise ConfigError("sft.submit_turns needs agent.max_sql_executions >= 1 (the multi-turn prompt)")
        formats.append(("submit", dataclasses.replace(budgets, turns=submit_turns), "SUBMIT\n"))
    chat = ChatFormat(tokenizer)
    examples, dropped = [], Counter()
    for fmt, b, prefix in formats:
        why = "" if fmt == "single" else f"{fmt}:"
        for t in tasks:
            messages = build_debug_messages(t.public, b)
            target = sft_target_text(t)
            if not target:
                dropped[why + "no_reference"] += 1
                continue
            target = prefix + target
            prompt_ids = chat.prompt_ids(messages)
            tail = _completion_tail(chat, messages, target)
            target_ids = chat.encode(target) + (chat.encode(tail) if tail else [tokenizer.eos_token_id])
            text = tokenizer.decode(target_ids, skip_special_tokens=True)
            act = parse_debug_action(text, multi_turn=b.turns > 1, category=t.category)
            if act.kind != ACTION_SUBMIT or act.submission != expected_submission(t):
                dropped[why + "format_roundtrip"] += 1
                continue
            if len(target_ids) > b.max_new_tokens:
                dropped[why + "answer_over_max_new_tokens"] += 1
                continue
            if len(prompt_ids) + len(target_ids) > b.max_context_tokens:
                dropped[why + "over_max_context_tokens"] += 1
                continue
            examples.append(
                {
                    "task_id": t.task_id,
                    "category": t.category,
                    "format": fmt,
                    "prompt_ids": prompt_ids,
                    "target_ids": target_ids,
                }
            )
    return examples, dict(dropped)


def resolved(cfg: Config, sft: SFTConfig) -> dict:
    """The run's config as config.json holds it; sft.init_steps and init_from are the matrix's grpo_sft
    settings, not this run's, so they are left out (they change none of its steps; a branch export is an
    extra output), and so are the trace_* settings while trace_turns = 0 and lr_schedule, min_lr_ratio
    while the schedule is constant (they change nothing then)."""
    skip = {"init_steps", "init_from"} | (
        {"trace_turns", "trace_kinds", "trace_weights"} if not sft.trace_turns else set()
    )
    if sft.lr_schedule == "constant":
        skip |= {"lr_schedule", "min_lr_ratio"}
    table = {k: v for k, v in dataclasses.asdict(sft).items() if k not in skip}
    return {**cfg.resolve(), "sft": table}


def config_hash(cfg: Config, sft: SFTConfig) -> str:
    import hashlib

    blob = json.dumps(resolved(cfg, sft), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def examples_hash(examples: list[dict]) -> str:
    """sha256 over every example's task, format and token ids, in order: what the sampler's indices
    point at, so a resumed run can check that it trains on the examples it started with."""
    import hashlib

    h = hashlib.sha256()
    for e in examples:
        ids = (e["task_id"], e["format"], list(e["prompt_ids"]), list(e["target_ids"]), e.get("target_mask"))
        h.update(json.dumps(ids, separators=(",", ":")).encode())
    return "sha256:" + h.hexdigest()


def load_sft_tasks(cfg: Config):
    """(training tasks used, all tasks of the file, the file) of `data.kind = "debug"`:
    `data.max_train_tasks` chosen as DebugEnv does."""
    from sqlrl.tasks.data import select_tasks
    from sqlrl.tasks.debugging import load_debug_tasks, resolve_debug_file

    if cfg.data.kind != "debug":
        raise ConfigError(
            f"data.kind = {cfg.data.kind!r}: load_sft_tasks reads debugging tasks; text-to-SQL golds are "
            "read by sft_data.load_text2sql_sft"
        )
    file = resolve_debug_file(cfg.data.path)
    all_tasks = load_debug_tasks(file)
    train = [t for t in all_tasks if t.split == cfg.data.train_split]
    if not train:
        splits = sorted({t.split for t in all_tasks})
        raise ValueError(f"{file}: no tasks with split {cfg.data.train_split!r}; splits there: {splits}")
    return select_tasks(train, cfg.data.max_train_tasks, cfg.run.seed), all_tasks, file


def load_sft_data(cfg: Config, out: Path, sft: SFTConfig | None = None) -> dict:
    """The training references of either data kind, checked to be training data only:
    {tasks, split (split.json), data (path), gold_audit, build(tokenizer, budgets, submit_turns)};
    with `sft.trace_turns` >= 2 (text-to-SQL) `build` makes multi-turn traces (`sft_traces.py`) on
    the real sandbox and records their mix in the returned dict's "trace_mix"."""
    if cfg.data.kind == "text2sql":
        tasks, split, root, audit, source = load_text2sql_sft(cfg, out)
        record: dict = {}

        def build(tokenizer, budgets, submit_turns):
            if sft is None or not sft.trace_turns:
                return build_text2sql_examples(tasks, tokenizer, budgets)
            from sqlrl.training.sft_traces import build_text2sql_traces, trace_env

            with trace_env(cfg, source.gold_cache) as env:
                examples, dropped, mix = build_text2sql_traces(
                    tasks, tokenizer, budgets, sft, env, cfg.run.seed
                )
            record["trace_mix"] = mix
            return examples, dropped

        return {
            "tasks": tasks,
            "split": split,
            "data": root,
            "gold_audit": audit,
            "build": build,
            "record": record,
            "env": source,
        }
    tasks, all_tasks, file = load_sft_tasks(cfg)
    check_training_references(
        tasks, all_tasks, train_split=cfg.data.train_split, eval_split=cfg.data.eval_split
    )
    return {
        "tasks": tasks,
        "split": split_record(cfg, tasks, all_tasks, file),
        "data": str(file),
        "gold_audit": None,
        "build": lambda tok, budgets, submit_turns: build_sft_examples(tasks, tok, budgets, submit_turns),
    }


def split_record(cfg: Config, tasks, all_tasks, file: Path) -> dict:
    """split.json of a warm start: the splits, the task file and its fingerprint, the tasks and databases."""
    return {
        "train_split": cfg.data.train_split,
        "eval_split": cfg.data.eval_split,
        "tasks_file": str(file),
        "train_fingerprint": sha256_file(file),
        "train_tasks": len(tasks),
        "task_ids": [t.task_id for t in tasks],
        "train_db_ids": sorted({t.public.db_id for t in tasks}),
        "eval_db_ids": sorted({t.public.db_id for t in all_tasks if t.split == cfg.data.eval_split}),
    }


def check_sft_settings(cfg: Config, sft: SFTConfig, budgets) -> None:
    """Refuse [sft] settings that do not fit the data kind or the budgets, before any model is loaded."""
    if cfg.data.kind != "text2sql" and sft.trace_turns:
        raise ConfigError(
            f"sft.trace_turns = {sft.trace_turns} builds text-to-SQL traces, but data.kind = {cfg.data.kind!r}; "
            "use sft.submit_turns for debugging tasks, or set sft.trace_turns = 0"
        )
    if cfg.data.kind == "text2sql" and sft.submit_turns:
        raise ConfigError(
            "sft.submit_turns is for debugging tasks; text-to-SQL SFT uses sft.trace_turns for the "
            "multi-turn protocol: set sft.submit_turns = 0"
        )
    if cfg.agent.checker:
        raise ConfigError(
            "agent.checker is set, but SFT examples have no checker turn (they end with the answer), so "
            "the model would be trained on another protocol than it runs: set agent.checker = false for SFT"
        )
    if sft.trace_turns:
        from sqlrl.training.sft_traces import check_trace_budgets

        check_trace_budgets(budgets, sft)


def curve_budgets(cfg: Config, budgets, curve_turns: int | None):
    """The agent budgets of the learning curve: the run's, or those at `curve_turns` turns (the turn budget
    the matrix evaluates an SFT arm at, while it trains single-turn)."""
    from sqlrl.agent.loop import Budgets

    if curve_turns is None or curve_turns == budgets.turns:
        return budgets
    return Budgets.from_config(cfg.replace(agent={"turns": curve_turns}).agent)


def resume_sft(out: Path, built: str, model, optimizer, scheduler, sampler, from_valid: bool):
    """(step, its training seconds, machines of earlier invocations up to it: `sessions.py`) of a resumed
    run: its newest checkpoint restored, steps.jsonl lines after it dropped; refused when the examples
    differ from those it trained on."""
    prev = previous_run(out)
    if prev.get("examples_hash") not in (None, built):
        raise ConfigError(
            f"{out}: the SFT examples built now differ from the ones this run trained on (examples "
            f"hash {built} != {prev['examples_hash']}; e.g. a trace's sandbox observation or the data "
            "changed), so its checkpoint's sampler would point at other examples; train into a new --out"
        )
    side = restore_latest(out, model, optimizer, scheduler, sampler, from_valid=from_valid)
    step = int(side["step"]) if side is not None else 0
    drop_steps_after(out, ("steps.jsonl",), step)
    return step, resumed_seconds(side, prev), kept_machines(prev, step)


def run_record(cfg: Config, sft: SFTConfig, data: dict, built: tuple, budgets: tuple, device, model) -> dict:
    """run.json of an SFT run as it starts, less the kind, command and resumed_from_step `train_sft` adds:
    provenance, data, `built` = (examples, their hash, drop counts), `budgets` = (the run's, the curve's)."""
    examples, examples_hash_, dropped = built
    return {
        "git": git_commit(),
        "machine": machine_info(),
        "device": device,
        "model": model,
        "config_hash": config_hash(cfg, sft),
        "data": data["data"],
        "data_kind": cfg.data.kind,
        "train_tasks": len(data["tasks"]),
        "gold_audit": data["gold_audit"],
        "examples": len(examples),
        "examples_hash": examples_hash_,
        "examples_per_category": dict(Counter(e["category"] for e in examples)),
        "examples_per_format": dict(Counter(e["format"] for e in examples)),
        **data.get("record", {}),
        "dropped": dropped,
        "budgets": budgets[0].to_dict(),
        **({"curve_budgets": budgets[1].to_dict()} if cfg.run.eval_every else {}),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": "running",
    }


@holds_run_lock("out_dir")
def train_sft(
    cfg: Config,
    sft: SFTConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    policy_factory=None,
    progress=True,
    command: list[str] | None = None,
    stop_after: int | None = None,
    deadline: float | None = None,
    resume_from_valid: bool = False,
    curve_turns: int | None = None,
    branch_step: int | None = None,
) -> dict:
    """Run the warm start into `out_dir` (`resume_from_valid`: see `trainer.train`). `policy_factory() ->
    (model, tokenizer, name, identity)` replaces model loading (tests). `deadline` (a `time.monotonic()`
    value) stops cleanly, with a checkpoint, before a step that would probably end after it (the trainer's
    rule). With `run.eval_every` > 0 the learning curve (`sft_loop.SFTCurve`) evaluates at `curve_turns`
    turns (None = agent.turns); its time is run.json's `curve_seconds`, not in `train_seconds`. With
    `branch_step` = N the weights after step N are exported to RUN/branch_step_<N> (`sft_branch.py`; its
    time is run.json's `branch_seconds`, not in `train_seconds`). Returns {steps, finished, final,
    final_identity, base_identity, weights_changed}. `progress`: True for a progress line of its own,
    False, or an experiment's opener (`evaluation.progress.open_part`)."""
    import torch

    from sqlrl.agent.loop import Budgets

    out = Path(out_dir)
    mine = json.loads(json.dumps(resolved(cfg, sft)))
    check_run_folder(out, mine, resume, "sft")

    budgets = Budgets.from_config(cfg.agent)
    check_sft_settings(cfg, sft, budgets)
    eval_budgets = curve_budgets(cfg, budgets, curve_turns)
    data = load_sft_data(cfg, out, sft)
    out.mkdir(parents=True, exist_ok=True)
    tasks = data["tasks"]
    device, gen_dtype = seed_and_device(cfg)
    model, tokenizer, base_name, base_identity = load_trainable(cfg, device, gen_dtype, policy_factory)

    examples, dropped = data["build"](tokenizer, budgets, sft.submit_turns)
    if data["gold_audit"] is not None:
        unscorable = data["gold_audit"]["n"] - data["gold_audit"]["scorable"]
        if unscorable:
            dropped = {"gold_unscorable": unscorable, **dropped}
    if not examples:
        raise ValueError(f"no usable SFT examples among {len(tasks)} training tasks (dropped: {dropped})")
    sampler = TaskSampler(len(examples), cfg.run.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = make_optimizer(
        params,
        sft.lr,
        sft.weight_decay,
        sft.warmup_steps,
        schedule=sft.lr_schedule,
        total_steps=sft.steps,
        min_ratio=sft.min_lr_ratio,
    )

    start_step, prev_s, kept = 0, 0.0, []
    built = examples_hash(examples)
    if resume:
        start_step, prev_s, kept = resume_sft(
            out, built, model, optimizer, scheduler, sampler, resume_from_valid
        )
    else:
        write_json_atomic(out / "config.json", mine)
        write_json_atomic(out / "split.json", data["split"])
    resumed_from = start_step if resume else None
    model_record = {"name": base_name, "base_identity": base_identity}
    run_info = {
        "kind": "sft",
        "command": command or sys.argv,
        **run_record(
            cfg, sft, data, (examples, built, dropped), (budgets, eval_budgets), device, model_record
        ),
        "resumed_from_step": resumed_from,
    }
    record = Sessions(out, run_info, TrainClock(prev_s), start_step, kept)
    record.write(start_step, prev_s)

    every = sft.checkpoint_every or cfg.run.checkpoint_every
    curve = SFTCurve(
        cfg,
        out,
        data.get("env"),
        eval_budgets,
        resumed_from,
        model,
        (tokenizer, base_name, base_identity, gen_dtype),
    )
    # the curve's setup, before the clock starts: in curve_seconds, not taken out of training
    setup_s = curve.seconds
    loop = StepLoop(
        model,
        optimizer,
        scheduler,
        params,
        examples,
        sampler,
        Checkpointer(
            out, model, optimizer, scheduler, sampler, config_hash(cfg, sft), cfg.run.keep_checkpoints, record
        ),
        curve,
        sft,
        pad_token_id(tokenizer),
        device,
        torch.bfloat16 if device == "cuda" else None,
        every,
        Branch(out, branch_step, cfg, sft, tokenizer, base_identity),
    )
    bar = open_part(
        progress, title="sqlrl sft", label="train", kind="step", total=sft.steps, initial=start_step
    )
    record.clock.start(lambda: curve.seconds - setup_s + loop.branch.seconds)
    loop.branch.start(record.clock)
    try:
        with curve:
            last = run_steps(loop, out, start_step, bar, deadline, stop_after)
    finally:  # an error's message starts on a row of its own
        if bar is not None:
            bar.close()
    total_s = record.clock()
    finished = last >= sft.steps
    result: dict = {"steps": last, "finished": finished, "base_identity": base_identity}
    if finished:
        ident = export_final(model, tokenizer, out, step=last, cfg=cfg, base_identity=base_identity)
        result.update(final=str(out / "final"), **final_record(ident, base_identity))
    run_info.update(
        {
            "status": "finished" if finished else "stopped",
            "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record.fields(last, total_s),
            "curve_seconds": round(curve.seconds, 2),
            **loop.branch.run_info(),
            "gpu_minutes": round(total_s / 60.0, 3) if device == "cuda" else None,
            **result,
        }
    )
    write_json_atomic(out / "run.json", run_info)
    return result
