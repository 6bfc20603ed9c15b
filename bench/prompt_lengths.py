"""First-prompt length in tokens over a split, per schema option: what `agent.schema_sample_values` and
`agent.schema_order` cost against `agent.max_context_tokens`.

    python bench/prompt_lengths.py [--data ../shared/data/spider] [--split validation]
        [--model ~/.cache/sqlrl/models/qwen2.5-coder-0.5b-instruct] [--max-schema-chars 6000]
        [--max-context-tokens 3072] [--max-new-tokens 256] [--values 0,1,3,5]

Single-turn prompt (system + user message, chat template, generation header), the tokenizer of the
model folder. Per option: p50 / p95 / max prompt tokens, how many prompts leave less than
max_new_tokens of max_context_tokens, how many schemas were truncated, the tables (and views) left
out, and how many prompts show every table the gold names (a word match of the table names in the gold
SQL: measurement only, the gold never reaches a prompt).
Defaults are those of configs/spider-0.5b-gpu.toml.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from sqlrl.agent.prompts import ChatFormat, build_messages
from sqlrl.tasks.data import SpiderData

ROOT = Path(__file__).resolve().parents[1]
_CREATE = re.compile(r"(?im)^create\s+(?:virtual\s+)?(?:table|view)\s")


def pct(xs: list[int], q: float) -> int:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--split", default="validation")
    ap.add_argument("--model", default=str(Path.home() / ".cache/sqlrl/models/qwen2.5-coder-0.5b-instruct"))
    ap.add_argument("--max-schema-chars", type=int, default=6000)
    ap.add_argument("--max-context-tokens", type=int, default=3072)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--values", default="0,1,3,5", help="schema_sample_values to measure, comma-separated")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(a.model))
    from sqlrl.tasks.schemainfo import schema_info

    private = SpiderData(a.data).load(a.split)
    tasks = [t.public for t in private]
    names = {t.db_id: [u.name for u in schema_info(t.db_path).units] for t in tasks}
    gold_tables = [
        {n for n in names[t.db_id] if re.search(rf"(?i)(?<![\w.]){re.escape(n)}(?!\w)", p.gold_sql)}
        for t, p in zip(tasks, private)
    ]
    room = a.max_context_tokens - a.max_new_tokens
    print(
        f"{len(tasks)} tasks of {a.split} ({len({t.db_id for t in tasks})} databases), max_schema_chars "
        f"{a.max_schema_chars}, prompt room {room} = max_context_tokens {a.max_context_tokens} - "
        f"max_new_tokens {a.max_new_tokens}"
    )
    print(
        "| schema_sample_values | schema_order | p50 | p95 | max | over room | truncated | tables left out "
        "| gold tables all shown | s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in [int(v) for v in a.values.split(",")]:
        for order in ("file", "question"):
            t0 = time.perf_counter()
            lens, cut, left, recall = [], 0, 0, 0
            for t, want in zip(tasks, gold_tables):
                msgs = build_messages(
                    t,
                    turns=1,
                    max_schema_chars=a.max_schema_chars,
                    schema_sample_values=n,
                    schema_order=order,
                )
                lens.append(len(chat.prompt_ids(msgs)))
                text = msgs[1]["content"]
                cut += "-- [schema truncated:" in text
                left += len(names[t.db_id]) - len(_CREATE.findall(text))
                shown = {
                    n
                    for n in want
                    if re.search(rf"(?im)^create\s+\w+\s+(\S+\s+)*?[\"`\[]?{re.escape(n)}[\"`\]]?\s*\(", text)
                }
                recall += shown == want
            print(
                f"| {n} | {order} | {pct(lens, 0.5)} | {pct(lens, 0.95)} | {max(lens)} | "
                f"{sum(x > room for x in lens)} | {cut} | {left} | {recall} | {time.perf_counter() - t0:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
