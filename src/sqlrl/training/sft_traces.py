"""Multi-turn supervised traces from text-to-SQL training golds, in exactly the agent's multi-turn protocol.

`build_text2sql_traces(tasks, tokenizer, budgets, sft, env, seed)` turns each training task (scorable
gold) into one trace of a kind of `sft.trace_kinds` (`config_tables.TRACE_KINDS`), mixed by
`sft.trace_weights`. Every reply is a training target; every observation is produced by the agent's
own loop: the trace is rolled out by `agent.loop.run_episodes` on the real `Text2SQLEnv` (the sandbox
executes turn 1's SQL, the environment renders the observation, the chat template its delta), with a
`ReplayPolicy` that returns the scripted reply ids. The prompt says `sft.trace_turns` turns.

Kinds: `final` (FINAL gold at turn 1), `check` (run the gold, observe its result, FINAL gold), `peek`
(SELECT * ... LIMIT 3 of a table the gold reads, observe, FINAL gold), `repair` (a mutation of
`tasks.debug_mutate`, kept only when the evaluator scores it as not matching the gold, observe,
FINAL gold), `fix_error` (the gold with one column misspelled, kept only when the sandbox returns an
error, observe it, FINAL gold).

What is covered:
- Each reply parses with the agent's `Parser` to the intended action (inspect, then final) and the
  episode ends `final` with the gold as the agent's answer; traces that do not, that hit the context
  budget, a reply over `agent.max_new_tokens`, or an infrastructure failure are dropped and counted.
- Loss only on reply tokens (`target_mask` = the trajectory's loss mask): observations are never trained.
- The mix: counts per kind by largest remainder of `trace_weights`, constrained kinds first (fix_error,
  repair, peek), each over the tasks still left, so a task a kind cannot use (no mutation, same result,
  no error) goes to the later kinds; `mix` = {requested, built, moved ("kind:why" counts)}. A kind of
  weight 0 gets no task; a task no kind could use is dropped, counted by its last reason.
What is not: that the traces teach the model to use feedback; nothing here has run on a GPU.
"""

from __future__ import annotations

import logging
import random
from collections import Counter

from sqlrl.config import ConfigError
from sqlrl.generation.policy import Generation
from sqlrl.tasks.debug_build import table_columns
from sqlrl.training.sft_data import completion_tail, gold_answer_sql

log = logging.getLogger(__name__)

# Kinds tried first when assigning tasks: those that cannot use every gold.
_CONSTRAINED = ("fix_error", "repair", "peek")


class ReplayPolicy:
    """A policy for one trace: call k of `generate` returns reply k's token ids (a stop, like a real one)."""

    name = "replay"
    identity = None

    def __init__(self, tokenizer, eos_token_ids: list[int], replies: list[list[int]]):
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.replies = replies
        self.calls = 0

    def generate(self, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0, seed=None):
        if len(prompts) != 1:
            raise ValueError(f"ReplayPolicy replays one trace, got a batch of {len(prompts)}")
        ids = self.replies[self.calls] if self.calls < len(self.replies) else []
        self.calls += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [Generation(token_ids=list(ids), logprobs=[0.0] * len(ids), text=text, finish_reason="stop")]


def inspect_reply(sql: str) -> str:
    """A turn that runs `sql` (no FINAL): what the agent reads as `inspect`."""
    return f"```sql\n{sql}\n```"


def final_reply(sql: str) -> str:
    """The answer turn: FINAL and the query in a ```sql block."""
    return f"FINAL\n```sql\n{sql}\n```"


def peek_sql(gold: str, columns: dict, rng: random.Random) -> str | None:
    """SELECT * ... LIMIT 3 of a table the gold reads (None when no table of the database is found)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(gold, read="sqlite")
    except Exception:
        return None
    names = sorted({t.name for t in tree.find_all(exp.Table) if t.name and t.name.lower() in columns})
    if not names:
        return None
    name = rng.choice(names)
    shown = name if name.replace("_", "").isalnum() else '"' + name.replace('"', '""') + '"'
    return f"SELECT * FROM {shown} LIMIT 3"


def misspell_column(gold: str, columns: dict, rng: random.Random) -> str | None:
    """The gold with one column reference renamed to a name no table of the database has (None if none)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(gold, read="sqlite")
    except Exception:
        return None
    known = {c.lower() for cols in columns.values() for c, _ in cols}
    refs = [c for c in tree.find_all(exp.Column) if not isinstance(c.this, exp.Star) and c.name]
    if not refs:
        return None
    col = rng.choice(refs)
    name = col.name
    for new in (name + "s", name[:-1], name + "_name", name + "_id"):
        if new and new.lower() not in known:
            col.set("this", exp.to_identifier(new, quoted=col.this.args.get("quoted", False)))
            try:
                return tree.sql(dialect="sqlite")
            except Exception:
                return None
    return None


def kind_counts(n: int, kinds: tuple[str, ...], weights: tuple[float, ...]) -> dict[str, int]:
    """Exact counts per kind for `n` traces: largest remainder of n * weight / sum (ties by kind order)."""
    total = float(sum(weights))
    if total <= 0:
        return dict.fromkeys(kinds, 0)
    raw = [n * w / total for w in weights]
    counts = [int(x) for x in raw]
    order = sorted(range(len(kinds)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return dict(zip(kinds, counts))


class TraceBuilder:
    """Rolls out scripted traces of one tokenizer on a `Text2SQLEnv` (its sandbox and evaluator)."""

    def __init__(self, tokenizer, budgets, env, seed: int):
        from sqlrl.agent.prompts import ChatFormat, eos_ids

        self.tok = tokenizer
        self.budgets = budgets
        self.env = env
        self.chat = ChatFormat(tokenizer)
        self.eos = eos_ids(tokenizer)
        self.rng = random.Random(seed)
        self._columns: dict[str, dict] = {}
        self._tail: str | None = None

    def columns(self, db_path: str) -> dict:
        if db_path not in self._columns:
            self._columns[db_path] = table_columns(db_path)
        return self._columns[db_path]

    def reply_ids(self, messages: list[dict], text: str) -> list[int]:
        """The token ids a policy stopping after `text` generates: text, then the template's end of turn."""
        if self._tail is None:
            self._tail = completion_tail(self.chat, messages, text)
        tail = self.chat.encode(self._tail) if self._tail else [self.tok.eos_token_id]
        return self.chat.encode(text) + tail

    def first_sql(self, task, kind: str) -> tuple[str | None, str | None]:
        """(turn 1's SQL for `kind`, None) or (None, why the task cannot make this kind)."""
        from sqlrl.tasks.debug_mutate import mutate_query

        gold = gold_answer_sql(task.gold_sql)
        if kind == "check":
            return gold, None
        cols = self.columns(task.public.db_path)
        if kind == "peek":
            sql = peek_sql(gold, cols, self.rng)
            return (sql, None) if sql else (None, "no_table")
        if kind == "fix_error":
            sql = misspell_column(gold, cols, self.rng)
            return (sql, None) if sql else (None, "no_column")
        for _ in range(3):  # repair: a mutation whose result the evaluator does not match to the gold
            m = mutate_query(gold, cols, self.rng)
            if m is None:
                return None, "no_mutation"
            r = self.env.evaluator.score(m[0], task)
            if r.status in ("mismatch", "exec_error"):
                return m[0], None
            if r.status != "match":
                return None, f"score_{r.status}"
        return None, "same_result"

    def trace(self, task, kind: str) -> tuple[dict | None, str | None]:
        """(example, None) or (None, why it was dropped) for one task and kind."""
        from sqlrl.agent.loop import Sampling, run_episodes
        from sqlrl.agent.prompts import build_messages, prompt_options

        gold = gold_answer_sql(task.gold_sql)
        first = None
        if kind != "final":
            first, why = self.first_sql(task, kind)
            if first is None:
                return None, why
        messages = build_messages(task.public, turns=self.budgets.turns, **prompt_options(self.budgets))
        texts = ([inspect_reply(first)] if first is not None else []) + [final_reply(gold)]
        replies = [self.reply_ids(messages, t) for t in texts]
        if any(len(r) > self.budgets.max_new_tokens for r in replies):
            return None, "answer_over_max_new_tokens"
        policy = ReplayPolicy(self.tok, self.eos, replies)
        (tr,) = run_episodes(self.env, [(task.public, 0)], policy, self.budgets, Sampling(), chat=self.chat)
        if tr.infra_error:
            return None, "infra_error"
        if tr.stop_reason == "context_budget":
            return None, "over_max_context_tokens"
        want = ["inspect", "final"] if first is not None else ["final"]
        if [t.action for t in tr.turns] != want or tr.stop_reason != "final" or tr.final_sql != gold:
            return None, "format_roundtrip"
        if first is not None and tr.turns[0].sql != first:
            return None, "format_roundtrip"
        status = (tr.turns[0].sql_result or {}).get("status") if first is not None else None
        if kind == "fix_error" and status == "ok":
            return None, "no_error"
        if kind in ("check", "peek") and status != "ok":
            return None, f"inspect_{status}"
        p = len(tr.prompt_ids)
        return {
            "task_id": task.task_id,
            "category": "text2sql",
            "format": kind,
            "prompt_ids": tr.prompt_ids,
            "target_ids": tr.token_ids[p:],
            "target_mask": tr.loss_mask[p:],
            "observation_status": status,
        }, None


def trace_env(cfg, gold_cache):
    """The environment traces are rolled out in: the run's sandbox workers and statement time limit,
    the execution reward over `gold_cache` (a context manager, `agent.envs.make_env`)."""
    from sqlrl.agent.envs import make_env

    return make_env(
        workers=cfg.run.sandbox_workers,
        timeout_s=cfg.agent.sql_timeout_s,
        gold_cache=gold_cache,
        reward="execution",
        test_suite=False,
    )


def check_trace_budgets(budgets, sft) -> None:
    """Refuse budgets the traces cannot be built under (a `ConfigError`, before any model is loaded)."""
    if sft.trace_turns < 2:
        raise ConfigError(f"sft.trace_turns = {sft.trace_turns}: multi-turn traces need >= 2 turns")
    if budgets.turns not in (1, sft.trace_turns):
        raise ConfigError(
            f"agent.turns = {budgets.turns} but sft.trace_turns = {sft.trace_turns}: the traces teach the "
            "agent at its turn budget; set both to the same value"
        )
    if budgets.max_sql_executions < 1:
        raise ConfigError(
            "sft.trace_turns needs agent.max_sql_executions >= 1: the traces execute turn 1's query"
        )


def build_text2sql_traces(tasks, tokenizer, budgets, sft, env, seed: int) -> tuple[list[dict], dict, dict]:
    """(examples {task_id, category, format = kind, prompt_ids, target_ids, target_mask}, drop counts by
    reason, mix {requested, built, moved: {kind: tasks it could not use}}) of `PrivateTask`s with
    scorable golds; `budgets` is the single-turn run's, traces use `sft.trace_turns` turns."""
    import dataclasses

    check_trace_budgets(budgets, sft)
    b = dataclasses.replace(budgets, turns=sft.trace_turns)

    builder = TraceBuilder(tokenizer, b, env, seed)
    dropped: Counter = Counter()
    pool = []
    for t in tasks:
        if not gold_answer_sql(t.gold_sql or ""):
            dropped["no_gold"] += 1
        else:
            pool.append(t)
    random.Random(seed).shuffle(pool)
    kinds, weights = tuple(sft.trace_kinds), tuple(sft.trace_weights)
    weight = dict(zip(kinds, weights))
    want = kind_counts(len(pool), kinds, weights)
    order = [k for k in _CONSTRAINED if k in kinds] + [k for k in kinds if k not in _CONSTRAINED]
    examples: list[dict] = []
    moved: Counter = Counter()
    last_why: dict[str, str] = {}
    left = pool
    for j, kind in enumerate(order):
        if len(left) == sum(want[k] for k in order[j:]):
            need = want[kind]
        else:  # an earlier kind fell short: the tasks left are shared out by the weights still to come
            need = kind_counts(len(left), tuple(order[j:]), tuple(weight[k] for k in order[j:]))[kind]
        keep = []
        for t in left:
            if need <= 0:
                keep.append(t)
                continue
            ex, why = builder.trace(t, kind)
            if ex is None:
                moved[f"{kind}:{why}"] += 1
                last_why[t.task_id] = why
                keep.append(t)
            else:
                examples.append(ex)
                need -= 1
        left = keep
    for t in left:  # tasks no kind could use: counted by the reason of the last kind tried
        dropped[last_why.get(t.task_id, "no_kind_fits")] += 1
    built = Counter(e["format"] for e in examples)
    mix = {"requested": want, "built": {k: built.get(k, 0) for k in kinds}, "moved": dict(moved)}
    log.info(f"sqlrl sft: {len(examples)} multi-turn traces {mix['built']} (dropped {dict(dropped)})")
    return examples, dict(dropped), mix
