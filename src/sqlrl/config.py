"""Run configuration: frozen dataclasses with one doc line per field, loaded from TOML.

A run file has the sections `[model]`, `[data]`, `[agent]`, `[grpo]` and `[run]`; every key is
optional and falls back to the default documented here. Unknown sections or keys, wrong types and
out-of-range values raise `ConfigError` with what is wrong, why, and how to fix it (including the
closest valid key name). Every float field must be finite: `inf` and `nan` are rejected wherever they appear. `resolve()` returns the fully resolved config as a plain dict, which every
run saves as `config.json`; `config_hash()` is the sha256 of that JSON and goes into checkpoints.

Guaranteed: a config that loads is internally consistent (e.g. multi-turn has max_turns >= 2).
Not guaranteed: that the model name or data folder exist; those are checked when the run starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlrl.config_budgets import budget_problems


class ConfigError(ValueError):
    """A configuration problem, with a message that says what, why and how to fix it."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = "qwen2.5-coder-0.5b-instruct"
    """Built-in model name (`sqlrl model list`), a local folder/.gguf path, or a Hugging Face hub id."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Generation dtype; `auto` is bfloat16 on CUDA and float32 on CPU. Training keeps float32 master weights."""
    lora_rank: int = 0
    """LoRA rank; 0 means full fine-tuning."""
    lora_alpha: int = 32
    """LoRA alpha (scale = alpha / rank)."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Module names LoRA adapts."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the update pass."""


@dataclass(frozen=True)
class DataConfig:
    kind: Literal["text2sql", "debug"] = "text2sql"
    """`text2sql`: Spider-layout questions; `debug`: stateful SQL-debugging tasks on pooled replicas (envs.py)."""
    path: str = "embedded"
    """A folder in the official Spider layout, a BIRD folder as downloaded (`sqlrl.tasks.bird`: its root,
    `dev/`, `train/` or mini-dev's folder), or `embedded` for the demo subset shipped in the package."""
    train_split: str = "train"
    """Split to train on: `train` (by-database split of the training file) or a json stem in the folder;
    on BIRD `train.json` is the whole BIRD train file, `train` its by-database part."""
    eval_split: str = "validation"
    """Split to evaluate on: `validation` (held-out databases) or a json stem such as `dev` (Spider's or
    BIRD's dev) or `mini_dev_sqlite` (BIRD mini-dev)."""
    split_seed: int = 0
    """Seed of the by-database train/validation split."""
    val_fraction: float = 0.1
    """Fraction of databases held out for validation."""
    max_train_tasks: int = 0
    """Use at most this many training tasks (0 = all), chosen by a seeded shuffle."""
    max_eval_tasks: int = 0
    """Evaluate on at most this many tasks (0 = the whole split), chosen by a shuffle seeded with
    split_seed (not run.seed, so that every training seed is evaluated on the same tasks)."""
    train_paraphrases: bool = False
    """Also train on Spider-Syn paraphrases: each training example whose `question_syn` differs from its
    question becomes a second task (id `<id>-syn`, same gold and database), added after the
    by-database split and never to the evaluation split; the count is in split.json (`SpiderData.load`)."""


# [agent] settings added after runs were recorded, with the value that behaves as before they existed
RECORDED_IF_SET: dict[str, Any] = {
    "schema_sample_values": 0,
    "schema_order": "file",
    "show_evidence": True,
    "column_descriptions": False,
    "checker": False,
}


@dataclass(frozen=True)
class AgentConfig:
    turns: int = 1
    """1 = single-turn (write SQL, done); >= 2 = multi-turn write -> execute -> check -> rewrite."""
    max_new_tokens: int = 256
    """Token budget for each policy turn."""
    max_sql_executions: int = 3
    """How many `inspect` executions a multi-turn trajectory may run (final scoring not counted)."""
    max_schema_chars: int = 8000
    """Schema text budget; whole CREATE statements are kept in order while they fit, then a truncation line."""
    schema_sample_values: int = 0
    """Example values shown after each table's CREATE: up to this many distinct non-NULL values per
    column, the most frequent first, read from the task's database (0 = none; `sqlrl.tasks.schemainfo`)."""
    schema_order: Literal["file", "question"] = "file"
    """Which statements a schema over max_schema_chars keeps: `file`, the first in file order; `question`,
    tables ranked by overlap of the question's words with their names (and values), with their
    foreign-key partners next (`sqlrl.agent.schemaview`). A schema that fits is shown whole either way."""
    show_evidence: bool = True
    """Show the task's evidence (BIRD's per-question hint; Spider has none) in an `Evidence:` line before
    the question. BIRD reports accuracy both with and without it; the gold never reaches the prompt."""
    column_descriptions: bool = False
    """Add BIRD's column descriptions (`database_description/<table>.csv` beside the database) after each
    table's CREATE, before truncation. Needs schema_order = "file" and schema_sample_values = 0."""
    max_context_tokens: int = 4096
    """Total token budget of a trajectory (prompt + completions + observations)."""
    observation_rows: int = 10
    """Rows of a query result shown to the policy."""
    observation_chars: int = 1500
    """Characters of a query result shown to the policy."""
    sql_timeout_s: float = 5.0
    """Per-execution time limit for policy SQL."""
    checker: bool = False
    """One checker turn after the answer (`sqlrl.agent.loop`, docs/PROMPT.md): its SQL is executed (one of
    max_sql_executions; none left = no check) and the result shown; a FINAL reply with SQL replaces it."""

    # These budgets are the agent's `Budgets` (agent.py): recorded in every trajectory, and two runs
    # are comparable only if they are equal.
    def to_dict(self) -> dict:
        """The budgets as recorded; a setting of `RECORDED_IF_SET` at its default is left out, so a run
        that does not use it records the same budgets as runs made before it existed."""
        out = dataclasses.asdict(self)
        for key, default in RECORDED_IF_SET.items():
            if out[key] == default:
                del out[key]
        return out

    @classmethod
    def from_config(cls, agent_cfg: AgentConfig) -> AgentConfig:
        return cls(**dataclasses.asdict(agent_cfg))

    @property
    def multi_turn(self) -> bool:
        return self.turns > 1


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 30
    """Optimizer steps."""
    prompts_per_step: int = 32
    """Distinct tasks per step."""
    group_size: int = 8
    """Rollouts per task (G)."""
    lr: float = 1e-6
    """AdamW learning rate (0 is only allowed with control = 'no-update')."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up steps, then constant."""
    max_grad_norm: float = 1.0
    """Gradient clipping (global L2 norm)."""
    clip_low: float = 0.2
    """Lower clip ratio epsilon_low of the surrogate."""
    clip_high: float = 0.28
    """Upper clip ratio epsilon_high (clip-higher)."""
    kl_coef: float = 0.0
    """Coefficient of the k3 KL penalty to the frozen base model (0 = no reference model kept)."""
    adv_scale: Literal["std", "none"] = "std"
    """Divide advantages by the group std (GRPO) or not (Dr. GRPO)."""
    loss_agg: Literal["token-mean", "seq-mean"] = "token-mean"
    """Loss aggregation over tokens."""
    micro_batch: int = 8
    """Trajectories per forward/backward pass (gradient accumulation covers the rest)."""
    micro_batch_logit_tokens: int = 0
    """Cap on trajectories x logit columns kept per pass (0 = no cap). The float32 log-prob pass holds
    about this many x vocabulary floats, so long multi-turn trajectories get smaller micro-batches;
    e.g. 16384 x 151,936 (Qwen vocabulary) x 4 bytes = 10 GB. A single longer trajectory still runs alone.
    If a pass runs out of GPU memory anyway, the trainer redoes that step's update with the failing pass's
    size halved as the cap (kept for the rest of the run, after a resume too unless the resume sets a
    cap; `oom_retries` and `micro_batch_logit_tokens_used` in steps.jsonl, `memory_adjustments` in
    run.json); only a single trajectory that does not fit stops it."""
    micro_batch_tokens: int = 0
    """Cap on trajectories x padded length (prompt + completion, the longest of the pass) per pass
    (0 = no cap). A pass's activations grow with all its token columns, prompt included, not only the
    logit ones: Qwen2.5-0.5B without gradient checkpointing saves ~1.8 MB a token (estimate), so
    16384 tokens ~ 30 GB. A single longer trajectory still runs alone. When set, a pass that runs out of
    GPU memory halves this cap instead of `micro_batch_logit_tokens` (recorded the same way)."""
    temperature: float = 1.0
    """Sampling temperature for rollouts."""
    top_p: float = 1.0
    """Nucleus sampling for rollouts."""
    reward: Literal["execution", "validity"] = "execution"
    """`execution`: execution match with the gold; `validity`: 1 when the SQL executes (control arm)."""
    control: Literal["none", "no-update"] = "none"
    """`no-update`: every step runs with learning rate 0 (weights must stay bit-identical)."""
    task_sampling: Literal["epoch", "pass_rate"] = "epoch"
    """Which tasks a step draws: `epoch`, a seeded permutation of the training tasks per epoch;
    `pass_rate`, weighted by each task's estimated pass rate p from its scored rollouts so far,
    weight max(p (1 - p), 0.02), so tasks the policy solves sometimes come more often than tasks it
    always or never solves (`sqlrl.training.sampling`)."""
    dynamic_sampling_rounds: int = 0
    """Dynamic sampling (DAPO): after a step's rollouts, up to this many extra rounds of
    `prompts_per_step` fresh tasks each, until `prompts_per_step` groups with unequal rewards are found;
    the update then uses only those groups (at most `prompts_per_step`). A group whose rewards are all
    equal has zero advantage and teaches nothing; once most tasks are always solved (or never), most
    groups are like that. 0 = off: every sampled group goes into the update. The step's reward,
    accuracy and group metrics stay those of the first round (the sampled distribution); extra rounds
    cost generation time and consume training tasks, and the arms of an experiment may generate
    different amounts (equal steps and update size, not equal generation)."""
    score_timeout_s: float = 1.0
    """Per-statement time limit on a prediction while the reward scores it in GRPO training on
    text-to-SQL tasks; one still running then is scored `timeout` (value 0, as any timeout).
    0 = `agent.sql_timeout_s`, which evaluation, multi-turn tool calls, a custom
    `sqlrl.train(reward=fn)` and debugging tasks always use. The gold is never subject to it (its
    result is cached). 1 s: 1.6-2x the slowest of the 6,904 Spider train golds (0.47-0.63 s on a
    loaded 2-core CPU; the next is 0.14 s: bench/gold_times.py), so a prediction as fast as its gold
    is not cut."""


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    """Seed for task sampling, generation and initialisation."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run; `auto` picks CUDA when available."""
    checkpoint_every: int = 10
    """Save a checkpoint every N steps (and at the end, unless `prune_checkpoints_at_end`)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk."""
    prune_checkpoints_at_end: bool = False
    """After a finished run is exported, delete its checkpoint folders (the manifest stays, marked pruned)."""
    final_dtype: Literal["auto", "float32"] = "auto"
    """Dtype of RUN/final: `auto` = the generation dtype (what every evaluation of the run loads), stored as a patch over the base when smaller; `float32` keeps the master weights."""
    sandbox_workers: int = 2
    """SQL sandbox worker processes."""
    gen_engine: Literal["auto", "static", "fast", "hf"] = "auto"
    """Generation engine: static KV cache + CUDA graphs, the dynamic-cache loop, plain `generate`; auto = static if supported."""
    gen_max_batch: int = 256
    """Largest generation batch (static: KV-cache slots) of the static and fast engines."""
    loggers: tuple[str, ...] = ("tensorboard",)
    """Metric sinks: any of tensorboard, wandb, swanlab (the last two only when installed and asked for)."""
    tracker_project: str = "sqlrl"
    """W&B / SwanLab project name (their own settings, e.g. WANDB_MODE=offline, still apply)."""
    log_rollouts: int = 4
    """Trajectories per step written to rollouts.jsonl (text and token ids) for inspection."""
    log_sql: bool = True
    """Every scored training trajectory's SQL, reward and status written to sql.jsonl (compact, no text)."""
    eval_every: int = 0
    """Learning curve of GRPO and SFT runs: greedy validation accuracy every N steps and at the last step,
    in curve.jsonl (0 = off; Text-to-SQL only; its time is kept out of train_seconds)."""
    eval_tasks: int = 0
    """With eval_every: a seeded subset of this many validation tasks per point (0 = the whole split)."""


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def resolve(self) -> dict:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        import hashlib

        blob = json.dumps(self.resolve(), sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()

    def replace(self, **sections: dict) -> Config:
        """Return a copy with some fields of some sections replaced, validated like a loaded file."""
        raw = self.resolve()
        for name, values in sections.items():
            if name not in raw:
                raise ConfigError(f"unknown section [{name}]")
            raw[name].update(values)
        return from_dict(raw, source="<override>")


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "agent": AgentConfig,
    "grpo": GRPOConfig,
    "run": RunConfig,
}


def field_docs(cls: type) -> dict[str, str]:
    """The doc line under each field, read from the source (used by `--help` style listings)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and i + 1 < len(body):
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
                docs[node.target.id] = str(nxt.value.value).strip()
    return docs


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"{where} = {value!r} is not allowed; choose one of {', '.join(map(repr, args))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        for a in args:
            try:
                return _coerce(value, a, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} = {value!r} has the wrong type; expected {tp}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            key, example = where.rpartition(": ")[2], json.dumps([value])
            raise ConfigError(
                f"{where} must be a list, got {type(value).__name__} {value!r}; write a TOML list, "
                f"e.g. {key} = {example} in the file or --set '{key}={example}'"
            )
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where} must have {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(
                f"{where} = {value!r} is not a finite number; no setting works with inf, nan or a value "
                "beyond the float range, give a finite value"
            )
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def parse_section(cls: type, raw: dict, name: str, source: str) -> Any:
    """The table `raw` as dataclass `cls`: unknown keys and wrong types are one-line ConfigErrors."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [{name}] must be a table of keys, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(known))}"
            raise ConfigError(f"{source}: unknown key {name}.{key}{hint}")
        kwargs[key] = _coerce(value, hints[key], f"{source}: {name}.{key}")
    return cls(**kwargs)


def from_dict(raw: dict, source: str = "<dict>") -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a config is a table of sections")
    for key in raw:
        if key not in SECTIONS:
            close = difflib.get_close_matches(key, SECTIONS, n=1)
            hint = f"; did you mean [{close[0]}]?" if close else f"; sections are {', '.join(SECTIONS)}"
            raise ConfigError(f"{source}: unknown section [{key}]{hint}")
    cfg = Config(
        **{name: parse_section(cls, raw.get(name, {}), name, source) for name, cls in SECTIONS.items()}
    )
    validate(cfg, source)
    return cfg


# Tables of a run file that belong to other commands, not to `Config`: [experiment] (`sqlrl experiment`),
# [sft] (`sqlrl sft`, `sft_from_dict`) and [curriculum] (`sqlrl curriculum`, `curriculum_from_dict`).
COMMAND_TABLES = ("experiment", "sft", "curriculum")


def read_raw(path: str | Path, overrides: list[str] | None = None) -> dict:
    """The TOML file as a dict with `overrides` (`section.key=value`, value parsed as TOML) applied."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist; pass a TOML run file such as configs/quickstart.toml"
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix the syntax at the position shown") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {e.object[e.start : e.start + 1]!r} at offset {e.start}); "
            "TOML files are UTF-8, save the file as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot be read ({e.strerror}); check the path and its permissions"
        ) from None
    for ov in overrides or []:
        apply_override(raw, ov)
    return raw


def load(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a TOML run file; `overrides` are `section.key=value` strings (value parsed as TOML)."""
    raw = read_raw(path, overrides)
    # an experiment / curriculum file is also a run file: those tables belong to their own commands
    for table in COMMAND_TABLES:
        raw.pop(table, None)
    return from_dict(raw, source=str(path))


def apply_override(raw: dict, override: str) -> None:
    if "=" not in override or "." not in override.split("=", 1)[0]:
        raise ConfigError(f"override {override!r} must look like section.key=value, e.g. grpo.steps=10")
    key, value = override.split("=", 1)
    section, name = key.strip().split(".", 1)
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value  # a bare string
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        raise ConfigError(
            f"override {override!r}: {section} is a plain value ({section} = {table!r}) in the file, not a "
            f"[{section}] table; write it as [{section}] with {name} = ... in the file"
        )
    table[name] = parsed


def validate(cfg: Config, source: str = "<config>") -> None:
    g, a, d = cfg.grpo, cfg.agent, cfg.data

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{source}: {msg}")

    need(g.steps >= 1, f"grpo.steps = {g.steps}: at least one step is needed")
    need(g.prompts_per_step >= 1, "grpo.prompts_per_step must be >= 1")
    need(
        g.group_size >= 2,
        f"grpo.group_size = {g.group_size}: GRPO compares rollouts within a group, use >= 2",
    )
    need(g.micro_batch >= 1, "grpo.micro_batch must be >= 1")
    need(
        g.micro_batch_logit_tokens >= 0,
        f"grpo.micro_batch_logit_tokens = {g.micro_batch_logit_tokens}: use 0 (no cap) or a positive token count",
    )
    need(
        g.micro_batch_tokens >= 0,
        f"grpo.micro_batch_tokens = {g.micro_batch_tokens}: use 0 (no cap) or a positive token count, "
        "e.g. 16384 (trajectories x padded sequence length per update pass)",
    )
    need(g.lr >= 0, f"grpo.lr = {g.lr} is negative")
    if g.control == "no-update":
        need(
            g.lr == 0.0,
            f"grpo.control = 'no-update' requires grpo.lr = 0 (got {g.lr}); the control proves "
            "that running the loop without learning changes nothing",
        )
    else:
        need(
            g.lr > 0,
            "grpo.lr = 0 only makes sense for the no-update control; set grpo.control = 'no-update' "
            "or a positive learning rate",
        )
    need(0 <= g.clip_low < 1 and g.clip_high >= 0, "grpo.clip_low must be in [0, 1) and clip_high >= 0")
    need(g.kl_coef >= 0, "grpo.kl_coef must be >= 0")
    need(g.temperature > 0, "grpo.temperature must be > 0 for sampling rollouts (greedy is for evaluation)")
    need(0 < g.top_p <= 1, "grpo.top_p must be in (0, 1]")
    need(g.max_grad_norm > 0, "grpo.max_grad_norm must be > 0")
    need(
        0 <= g.dynamic_sampling_rounds <= 64,
        f"grpo.dynamic_sampling_rounds = {g.dynamic_sampling_rounds} must be in [0, 64] (extra rollout "
        "rounds per step; 0 = off)",
    )
    need(g.score_timeout_s >= 0, "grpo.score_timeout_s must be >= 0 seconds (0 = agent.sql_timeout_s)")
    for problem in budget_problems(
        a.turns, a.max_new_tokens, a.max_context_tokens, a.max_schema_chars, a.max_sql_executions
    ):
        need(False, problem)
    need(a.sql_timeout_s > 0, f"agent.sql_timeout_s = {a.sql_timeout_s} must be > 0 seconds, e.g. 5")
    r = cfg.run
    need(
        r.checkpoint_every >= 1,
        f"run.checkpoint_every = {r.checkpoint_every} must be >= 1 (to checkpoint only at the end, set it to grpo.steps)",
    )
    ok = r.eval_every >= 0 and r.eval_tasks >= 0 and (r.eval_every == 0 or d.kind == "text2sql")
    need(ok, "run.eval_every / eval_tasks must be >= 0 (0 = off / whole split); the curve is text2sql-only")
    need(
        not a.checker or (d.kind == "text2sql" and a.max_sql_executions >= 1),
        f"agent.checker executes the answer once, on text-to-SQL tasks: it needs data.kind = 'text2sql' "
        f"(got {d.kind!r}) and agent.max_sql_executions >= 1 (got {a.max_sql_executions}); "
        "set those or agent.checker = false",
    )
    need(
        0 <= a.schema_sample_values <= 20,
        f"agent.schema_sample_values = {a.schema_sample_values} must be in [0, 20] (0 = no example values)",
    )
    need(
        not a.column_descriptions or (a.schema_order == "file" and a.schema_sample_values == 0),
        "agent.column_descriptions needs agent.schema_order = 'file' and agent.schema_sample_values = 0; "
        "turn one of them off",
    )
    need(
        not d.train_paraphrases or d.kind == "text2sql",
        "data.train_paraphrases needs data.kind = 'text2sql' (Spider-Syn questions); set it to false",
    )
    need(0 < d.val_fraction < 1, f"data.val_fraction = {d.val_fraction} must be in (0, 1)")
    for key in ("max_train_tasks", "max_eval_tasks"):
        n = getattr(d, key)
        need(n >= 0, f"data.{key} = {n} is negative; give a number of tasks, or 0 for all of them")
    need(cfg.model.lora_rank >= 0, "model.lora_rank must be >= 0")
    _validate_sizes(cfg, need)
    for lg in cfg.run.loggers:
        need(
            lg in ("tensorboard", "wandb", "swanlab"),
            f"run.loggers: unknown logger {lg!r}; use tensorboard, wandb or swanlab",
        )


def _validate_sizes(cfg: Config, need) -> None:
    """Counts, sizes and fractions `validate` checks besides the rules between settings."""
    m, a, g, r = cfg.model, cfg.agent, cfg.grpo, cfg.run
    need(
        1 <= r.sandbox_workers <= 256,
        f"run.sandbox_workers = {r.sandbox_workers} must be in [1, 256] (SQL worker processes; e.g. 2)",
    )
    need(r.gen_max_batch >= 1, f"run.gen_max_batch = {r.gen_max_batch} must be >= 1 (sequences, e.g. 256)")
    need(
        all(0 <= b < 1 for b in g.betas),
        f"grpo.betas = {list(g.betas)}: each AdamW beta must be in [0, 1), e.g. [0.9, 0.999]",
    )
    for key, value in [
        ("agent.observation_rows", a.observation_rows),
        ("agent.observation_chars", a.observation_chars),
        ("run.log_rollouts", r.log_rollouts),
        ("grpo.weight_decay", g.weight_decay),
    ]:
        need(value >= 0, f"{key} = {value} is negative; give 0 or more")
    need(m.lora_alpha > 0, f"model.lora_alpha = {m.lora_alpha} must be > 0 (scale = alpha / rank), e.g. 32")
    need(0 <= m.lora_dropout < 1, f"model.lora_dropout = {m.lora_dropout} must be in [0, 1), e.g. 0.0")
    need(
        m.lora_rank == 0 or bool(m.lora_targets),
        "model.lora_targets is empty: LoRA (model.lora_rank > 0) needs module names, e.g. ['q_proj', "
        "'v_proj'], or set model.lora_rank = 0 for full fine-tuning",
    )


def describe(cls: type) -> str:
    """One line per field: name, default, doc (for documentation and errors)."""
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(f"{f.name} = {default!r}  # {docs.get(f.name, '')}")
    return "\n".join(out)
