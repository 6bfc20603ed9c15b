"""The [sft] and [curriculum] tables of a run file: `sqlrl sft`, the matrix's sft arms, `sqlrl curriculum`.

Frozen dataclasses with a doc line per field, like `sqlrl.config`'s sections; `sft_from_dict` and
`curriculum_from_dict` read and validate a table (one-line `ConfigError`: what, why, how to fix).

What is covered: every field typed and checked as `sqlrl.config` checks its own sections.
What is not: the run file's other sections (`sqlrl.config.load` drops these tables from them).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal

from sqlrl.config import COMMAND_TABLES, ConfigError, parse_section

__all__ = [
    "TRACE_KINDS",
    "CurriculumConfig",
    "SFTConfig",
    "StageConfig",
    "curriculum_from_dict",
    "sft_from_dict",
]


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 20
    """Optimizer steps (the training references are cycled, seeded). For the matrix's `sft` arm (the
    SFT-only control) choose steps whose training time is at least the `grpo` arm's: the gate refuses the
    RL-over-SFT claim otherwise (run.json train_seconds side by side). configs/spider-0.5b-gpu-sft.toml
    sizes it from a measured 0.78 s per 32-example step on one H200 against GRPO's 153 s."""
    batch_size: int = 4
    """Examples (task, reference solution) per optimizer step."""
    micro_batch: int = 4
    """Examples per forward/backward pass (gradient accumulation covers the rest of a step)."""
    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up steps (step k of them at k/warmup_steps * lr), then lr_schedule."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After the warm-up: `constant` (lr), or a `cosine` / `linear` decay that reaches min_lr_ratio * lr
    at the last step, sft.steps (`training/schedule.py`); grpo_sft's own stage decays over init_steps
    (init_from = "control": grpo_sft starts from the control's weights mid-decay)."""
    min_lr_ratio: float = 0.0
    """Where a cosine / linear decay ends, as a fraction of lr (0 = the last step's update is zero); in [0, 1)."""
    max_grad_norm: float = 1.0
    """Gradient clipping (global L2 norm)."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0 = run.checkpoint_every); SFT steps are short, so checkpoint less often."""
    submit_turns: int = 0
    """Also teach the multi-turn protocol: every training reference appears a second time after the
    multi-turn prompt for this many turns, answered with SUBMIT and the solution (what the agent reads
    as submit_solution). 0 = single-turn examples only. Without it a warm-started model answers a
    multi-turn prompt in the single-turn format, which the agent reads as execute_sql, and never submits."""
    trace_turns: int = 0
    """Text-to-SQL only: 0 = single-turn answer examples; T >= 2 = multi-turn traces in the agent's protocol
    for T turns (`training/sft_traces.py`): replies are training targets, observations the real sandbox's.
    The matrix needs experiment.turns = [T] (GRPO and evaluation at the turn budget the traces teach)."""
    trace_kinds: tuple[str, ...] = ("final", "check", "peek", "repair", "fix_error")
    """Trace kinds mixed when trace_turns >= 2: `final` (FINAL gold at once), `check` (run the gold,
    observe, FINAL), `peek` (SELECT * LIMIT 3 of a table the gold uses, observe, FINAL), `repair` (a
    curriculum mutation of the gold whose result differs, observe, FINAL), `fix_error` (the gold with a
    misspelled column, observe the error, FINAL). Refused with trace_turns = 0 unless left at the default."""
    trace_weights: tuple[float, ...] = (1.0, 1.0, 1.0, 2.0, 1.0)
    """Share of each trace kind (same order and length as trace_kinds; >= 0, normalised): exact counts
    by largest remainder; tasks a kind cannot use go to the kinds that can (run.json `trace_mix`)."""
    init_steps: int = 0
    """The matrix's `grpo_sft` arm: 0 = GRPO starts from the `sft` arm's final weights; > 0 = it first runs
    its own SFT stage (these settings, steps = init_steps, the same seed) in arms/grpo_sft/sft_init, then
    GRPO from that stage's weights, so `sft` is a pure control whose steps can cover grpo_sft's total;
    with init_from = "control", the step of the sft arm's run whose weights grpo_sft starts from."""
    init_from: Literal["stage", "control"] = "stage"
    """With init_steps > 0, where grpo_sft's SFT weights come from: `stage` (its own SFT stage of init_steps
    steps) or `control` (the sft arm's own weights at step init_steps, exported as
    arms/sft/train/branch_step_<N>: no second SFT run; needs sft before grpo_sft and init_steps < steps;
    with a cosine / linear schedule they are the control's weights mid-decay, not those of an N-step run)."""


@dataclass(frozen=True)
class StageConfig:
    name: str = ""
    """Stage name; its run folder is OUT/NN-name (letters, digits, '-' and '_')."""
    kind: Literal["sft", "grpo"] = "grpo"
    """`sft`: supervised warm start on training references (`sqlrl sft`); `grpo`: `sqlrl train`."""
    turns: int = 0
    """agent.turns of this stage (0 = the file's [agent] turns); an sft stage is single-turn (1)."""
    steps: int = 0
    """Optimizer steps of this stage (0 = [sft].steps or [grpo].steps)."""
    set: tuple[str, ...] = ()
    """More `section.key=value` overrides for this stage only, e.g. ["grpo.lr=2e-6"]."""


@dataclass(frozen=True)
class CurriculumConfig:
    stages: tuple[StageConfig, ...] = (
        StageConfig(name="sft", kind="sft", turns=1),
        StageConfig(name="grpo-single", kind="grpo", turns=1),
        StageConfig(name="grpo-multi", kind="grpo", turns=3),
    )
    """Stages in order; each starts from the previous stage's final weights (the first from model.name)."""
    eval_turns: tuple[int, ...] = (1, 3)
    """Turn budgets at which the base model and every stage are evaluated on data.eval_split (greedy)."""
    eval_base: bool = True
    """Also evaluate the base model (the reference every stage is compared with)."""
    smoke: bool = False
    """Mark the run as a smoke run (a few CPU steps prove nothing; the summary says so)."""


_STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def sft_from_dict(raw: Any, source: str = "<dict>") -> SFTConfig:
    """The [sft] table (missing keys take the defaults above), validated."""
    s = parse_section(SFTConfig, raw if raw is not None else {}, "sft", source)

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{source}: {msg}")

    need(s.steps >= 1, f"sft.steps = {s.steps}: at least one step is needed")
    need(
        s.init_steps >= 0,
        f"sft.init_steps = {s.init_steps} must be >= 0 (0 = grpo_sft starts from the sft arm's weights)",
    )
    _check_init_from(s, need)
    need(s.batch_size >= 1, f"sft.batch_size = {s.batch_size} must be >= 1")
    need(s.micro_batch >= 1, f"sft.micro_batch = {s.micro_batch} must be >= 1")
    need(s.lr > 0, f"sft.lr = {s.lr}: the warm start needs a positive learning rate")
    need(s.max_grad_norm > 0, "sft.max_grad_norm must be > 0")
    need(s.warmup_steps >= 0, "sft.warmup_steps must be >= 0")
    _check_schedule(s, need)
    need(
        s.checkpoint_every >= 0,
        f"sft.checkpoint_every = {s.checkpoint_every} must be >= 0 (0 = run.checkpoint_every)",
    )
    need(
        s.submit_turns == 0 or s.submit_turns >= 2,
        f"sft.submit_turns = {s.submit_turns}: 0 (single-turn examples only) or the multi-turn budget, >= 2",
    )
    _check_traces(s, need)
    return s


TRACE_KINDS = ("final", "check", "peek", "repair", "fix_error")


def _check_init_from(s: SFTConfig, need) -> None:
    need(
        s.init_from in ("stage", "control"),
        f'sft.init_from = {s.init_from!r}: choose "stage" (grpo_sft\'s own SFT stage) or "control" '
        "(the sft arm's weights at step init_steps)",
    )
    if s.init_from != "control":
        return
    need(
        0 < s.init_steps < s.steps,
        f'sft.init_from = "control" starts grpo_sft from the sft arm\'s weights at step sft.init_steps = '
        f"{s.init_steps}, which must be a step of that run, 1 .. sft.steps - 1 = {s.steps - 1}; set "
        'init_steps in that range (init_steps = 0: from its final weights, with init_from = "stage")',
    )


def _check_schedule(s: SFTConfig, need) -> None:
    need(
        0.0 <= s.min_lr_ratio < 1.0,
        f"sft.min_lr_ratio = {s.min_lr_ratio}: the decay ends at min_lr_ratio * lr, a fraction in [0, 1); "
        "use e.g. 0.0 or 0.1",
    )
    if s.lr_schedule == "constant":
        need(
            s.min_lr_ratio == 0.0,
            f'sft.min_lr_ratio = {s.min_lr_ratio} changes nothing with sft.lr_schedule = "constant"; '
            'set sft.lr_schedule = "cosine" or "linear", or drop min_lr_ratio',
        )
        return
    for key, steps in (("steps", s.steps), ("init_steps", s.init_steps)):
        need(
            (steps == 0 or s.init_from == "control") and key == "init_steps" or steps > s.warmup_steps,
            f"sft.lr_schedule = {s.lr_schedule!r} decays after the warm-up until sft.{key} = {steps}, but "
            f"sft.warmup_steps = {s.warmup_steps} leaves no step to decay over; lower warmup_steps or "
            f"raise {key}",
        )


def _check_traces(s: SFTConfig, need) -> None:
    need(
        s.trace_turns == 0 or s.trace_turns >= 2,
        f"sft.trace_turns = {s.trace_turns}: 0 (single-turn examples) or the agent's multi-turn budget, >= 2",
    )
    bad = [k for k in s.trace_kinds if k not in TRACE_KINDS]
    need(not bad, f"sft.trace_kinds has unknown kinds {bad}; choose among {list(TRACE_KINDS)}")
    need(
        len(set(s.trace_kinds)) == len(s.trace_kinds) and bool(s.trace_kinds),
        f"sft.trace_kinds = {list(s.trace_kinds)}: list each kind once, at least one",
    )
    need(
        len(s.trace_weights) == len(s.trace_kinds),
        f"sft.trace_weights has {len(s.trace_weights)} entries for {len(s.trace_kinds)} trace_kinds; "
        "give one weight per kind, in the same order",
    )
    need(
        all(w >= 0 for w in s.trace_weights) and sum(s.trace_weights) > 0,
        f"sft.trace_weights = {list(s.trace_weights)}: weights must be >= 0 with a positive sum",
    )
    if s.trace_turns:
        need(
            s.submit_turns == 0,
            "sft.trace_turns (text-to-SQL traces) and sft.submit_turns (debugging tasks) exclude each other; "
            "set one of them to 0",
        )
        need(
            any(k != "final" and w > 0 for k, w in zip(s.trace_kinds, s.trace_weights)),
            "sft.trace_weights give weight only to `final`: no trace would use a second turn; weight "
            "check, peek, repair or fix_error",
        )
    else:
        changed = [
            f"sft.{k} = {list(getattr(s, k))}"
            for k in ("trace_kinds", "trace_weights")
            if tuple(getattr(s, k)) != tuple(getattr(SFTConfig, k))
        ]
        need(
            not changed,
            f"{' and '.join(changed)} with sft.trace_turns = 0: the trace mix only shapes multi-turn traces, "
            "and trace_turns = 0 trains single-turn answers, so it would be ignored; set sft.trace_turns to "
            "the agent's turn budget (>= 2), or remove those keys",
        )


def curriculum_from_dict(raw: Any, source: str = "<dict>") -> CurriculumConfig:
    """The [curriculum] table with its [[curriculum.stages]] array, validated (what, why, how to fix)."""
    raw = dict(raw or {})
    stages_raw = raw.pop("stages", None)
    c = parse_section(CurriculumConfig, raw, "curriculum", source)
    if stages_raw is not None:
        if not isinstance(stages_raw, list) or not stages_raw:
            raise ConfigError(
                f"{source}: curriculum.stages must be a non-empty array of tables; write one "
                '[[curriculum.stages]] block per stage with name = "...", kind = "sft" | "grpo"'
            )
        stages = tuple(
            parse_section(StageConfig, st, f"curriculum.stages[{i}]", source)
            for i, st in enumerate(stages_raw)
        )
        c = dataclasses.replace(c, stages=stages)
    seen: set[str] = set()
    for i, st in enumerate(c.stages):
        where = f"{source}: curriculum.stages[{i}]"
        if not _STAGE_NAME.match(st.name):
            raise ConfigError(
                f"{where}: name {st.name!r} is not a usable folder name; use letters, digits, '-' or '_' "
                '(e.g. name = "grpo-single")'
            )
        if st.name in seen:
            raise ConfigError(
                f"{where}: stage name {st.name!r} is used twice; every stage needs its own folder"
            )
        seen.add(st.name)
        if st.turns < 0 or st.steps < 0:
            raise ConfigError(f"{where}: turns and steps must be >= 0 (0 = the file's default)")
        if st.kind == "sft" and st.turns not in (0, 1):
            raise ConfigError(
                f"{where}: an sft stage trains on the single-turn answer format, so turns must be 1 "
                f"(got {st.turns}); remove `turns` or set turns = 1"
            )
        for ov in st.set:
            key = ov.split("=", 1)[0].strip()
            if "=" not in ov or "." not in key:
                raise ConfigError(f"{where}: set entry {ov!r} must look like section.key=value")
            if key == "model.name":
                raise ConfigError(
                    f"{where}: set = [{ov!r}]: a stage always starts from the previous stage's final weights; "
                    "change model.name at the top of the file to change the base model"
                )
            if key.split(".", 1)[0] in COMMAND_TABLES:
                raise ConfigError(f"{where}: set entry {ov!r}: only run-file sections can be set per stage")
    if not c.eval_turns or any(t < 1 for t in c.eval_turns):
        raise ConfigError(
            f"{source}: curriculum.eval_turns = {list(c.eval_turns)} must be a non-empty list of turns >= 1"
        )
    return c
