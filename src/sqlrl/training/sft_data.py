"""Supervised examples from Text-to-SQL training golds, in exactly the agent's single-turn answer format.

Each training task of `data.train_split` of a Spider-layout folder (`data.kind = "text2sql"`) becomes
one example: the prompt is the text-to-SQL agent's single-turn prompt (`prompts.build_messages`,
rendered by `prompts.ChatFormat`), the target "```sql\\n<gold>\\n```" plus the chat template's
end-of-turn token, where <gold> is the gold SQL as the agent's `Parser` returns it (stripped, without
a trailing semicolon): decoding the target ids and parsing them gives back exactly the SQL the gold
audit executed. Examples that do not round-trip, or exceed `agent.max_new_tokens` /
`agent.max_context_tokens`, are dropped and counted (never truncated); tasks whose gold is unscorable
(the gold audit, as for GRPO's training tasks) are dropped and counted as `gold_unscorable`.

Only training golds are used: `data.train_split` must differ from `data.eval_split` and no training
database may hold evaluation tasks (`check_reference_databases`, a `ValueError` before any model
is loaded). The tasks are those the GRPO trainer samples from (`agent.envs.Text2SQLTraining`: same
split, gold audit and `data.max_train_tasks` selection).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def completion_tail(chat, messages: list[dict], target: str) -> str:
    """What the chat template puts after the assistant's text up to and including its end-of-turn token."""
    prompt = chat.render(messages, add_generation_prompt=True)
    full = chat.render(messages + [{"role": "assistant", "content": target}], add_generation_prompt=False)
    if not full.startswith(prompt) or target not in full[len(prompt) :]:
        raise ValueError(
            "the chat template does not render an assistant answer as prompt + answer; the SFT target "
            "cannot be aligned with what the agent generates"
        )
    rest = full[len(prompt) :]
    after = rest[rest.index(target) + len(target) :]
    best = None
    for eos in chat._eos_texts:
        if eos and eos in after:
            i = after.index(eos) + len(eos)
            best = i if best is None else min(best, i)
    return after[:best] if best is not None else ""


def check_reference_databases(
    train_db_ids, eval_db_ids, *, train_split: str, eval_split: str, what: str = "supervised warm start"
) -> None:
    """Refuse training references that could be evaluation golds: equal splits or shared databases."""
    if train_split == eval_split:
        raise ValueError(
            f"data.train_split = data.eval_split = {train_split!r}: the {what} would learn the "
            "references it is evaluated on; use different splits"
        )
    shared = sorted(set(train_db_ids) & set(eval_db_ids))
    if shared:
        raise ValueError(
            f"{what} refused: databases {shared[:5]} hold both training tasks and "
            f"{eval_split!r} tasks; the split must be by database"
        )


def gold_answer_sql(gold_sql: str) -> str:
    """The gold as the agent's parser returns an answer: stripped, without a trailing semicolon."""
    return gold_sql.strip().rstrip(";").strip()


def text2sql_target_text(gold_sql: str) -> str:
    """The single-turn text-to-SQL answer for `gold_sql`: one ```sql block."""
    return f"```sql\n{gold_answer_sql(gold_sql)}\n```"


def build_text2sql_examples(tasks, tokenizer, budgets) -> tuple[list[dict], dict]:
    """Tokenized examples {task_id, category, format, prompt_ids, target_ids} of `PrivateTask`s and the
    drop counts by reason (no_gold, format_roundtrip, answer_over_max_new_tokens, over_max_context_tokens)."""
    from sqlrl.agent.prompts import ChatFormat, Parser, build_messages, prompt_options
    from sqlrl.config import ConfigError

    if budgets.turns != 1:
        raise ConfigError(
            f"agent.turns = {budgets.turns}: supervised fine-tuning trains the single-turn answer format; "
            "set agent.turns = 1 (e.g. --set agent.turns=1)"
        )
    chat = ChatFormat(tokenizer)
    examples, dropped = [], Counter()
    for t in tasks:
        want = gold_answer_sql(t.gold_sql or "")
        if not want:
            dropped["no_gold"] += 1
            continue
        messages = build_messages(t.public, turns=1, **prompt_options(budgets))
        target = text2sql_target_text(t.gold_sql)
        prompt_ids = chat.prompt_ids(messages)
        tail = completion_tail(chat, messages, target)
        target_ids = chat.encode(target) + (chat.encode(tail) if tail else [tokenizer.eos_token_id])
        text = tokenizer.decode(target_ids, skip_special_tokens=True)
        act = Parser.parse(text, multi_turn=False)
        if act.kind != "final" or act.sql != want:
            dropped["format_roundtrip"] += 1
            continue
        if len(target_ids) > budgets.max_new_tokens:
            dropped["answer_over_max_new_tokens"] += 1
            continue
        if len(prompt_ids) + len(target_ids) > budgets.max_context_tokens:
            dropped["over_max_context_tokens"] += 1
            continue
        examples.append(
            {
                "task_id": t.task_id,
                "category": "text2sql",
                "format": "single",
                "prompt_ids": prompt_ids,
                "target_ids": target_ids,
            }
        )
    return examples, dict(dropped)


def load_text2sql_sft(cfg, out: Path) -> tuple[list, dict, str, dict, object]:
    """(training tasks with scorable golds, split.json record, data root, gold audit summary, the
    `Text2SQLTraining` they come from) of a Spider-layout `data.path`; raises `ValueError` for golds
    that could be evaluation golds."""
    from sqlrl.agent.envs import Text2SQLTraining

    d = cfg.data
    if d.train_split == d.eval_split:  # before the gold audit executes anything
        check_reference_databases((), (), train_split=d.train_split, eval_split=d.eval_split)
    data = Text2SQLTraining(cfg, out)
    eval_dbs = data.ds.db_ids(d.eval_split, seed=d.split_seed, val_fraction=d.val_fraction)
    check_reference_databases(
        {t.public.db_id for t in data.tasks}, eval_dbs, train_split=d.train_split, eval_split=d.eval_split
    )
    split = {
        **data.split_info(),
        "eval_split": d.eval_split,
        "task_ids": [t.task_id for t in data.tasks],
        "train_db_ids": sorted({t.public.db_id for t in data.tasks}),
        "eval_db_ids": list(eval_dbs),
    }
    audit = {k: v for k, v in data.gold_audit.items() if k != "per_task"}
    return data.tasks, split, str(data.root), audit, data
