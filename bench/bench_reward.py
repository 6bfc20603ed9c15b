"""Reward throughput: prediction/gold pairs per second with a warm gold cache, vs a naive scorer.

    python bench/bench_reward.py [--data ../shared/data/spider] [--n 300] [--seed 0] [--workers 2]

Pairs: `--n` Spider training tasks (sampled with `--seed`, golds that do not execute are skipped),
each with two predictions: the gold itself and a perturbation of it (cycled: projection list
reversed, DISTINCT toggled, wrapped with LIMIT 1, ORDER BY direction flipped when there is one).

Measured in the same run on the same pairs:
- sqlrl: `Evaluator(Sandbox, GoldCache)` after one warm-up pass (gold cache warm; the prediction still
  runs through the hardened sandbox every time). Reported with the test-suite metric on (default,
  which may execute DISTINCT-free variants too) and off.
- naive: per pair, open a sqlite3 connection, run gold, run prediction, compare with the same
  `execution_match`, close. No sandbox, no cache, no test-suite metric.
Prints pairs/s for each, the ratio, and an agreement check (both must give the same match verdicts
where both executed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

import sqlglot
from sqlglot import exp

from sqlrl.data import PrivateTask, PublicTask
from sqlrl.goldcache import GoldCache
from sqlrl.reward import Evaluator, execution_match, gold_shape
from sqlrl.sandbox import Sandbox


def perturb(sql: str, i: int) -> str:
    try:
        node = sqlglot.parse_one(sql, read="sqlite")
    except Exception:
        return sql + " LIMIT 1"
    kind = i % 4
    if kind == 0 and isinstance(node, exp.Select) and len(node.expressions) > 1:
        node.set("expressions", list(reversed(node.expressions)))
        return node.sql(dialect="sqlite")
    if kind == 1 and isinstance(node, exp.Select):
        node.set("distinct", None if node.args.get("distinct") else exp.Distinct())
        return node.sql(dialect="sqlite")
    if kind == 2 and node.args.get("order") is not None:
        for o in node.args["order"].expressions:
            o.set("desc", not o.args.get("desc"))
        return node.sql(dialect="sqlite")
    return f"SELECT * FROM ({sql}) LIMIT 1"


def naive_score(db_path: str, gold_sql: str, pred_sql: str) -> bool | None:
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        cur = con.execute(gold_sql)
        g_rows, g_cols = cur.fetchall(), [d[0] for d in cur.description or []]
        try:
            cur = con.execute(pred_sql)
            p_rows, p_cols = cur.fetchall(), [d[0] for d in cur.description or []]
        except sqlite3.Error:
            return False
        return execution_match(g_cols, g_rows, p_cols, p_rows, gold_shape(gold_sql)).match
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "spider"))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="score_many batch size")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    examples = json.load(open(os.path.join(args.data, "train_spider.json")))
    rng = random.Random(args.seed)
    idx = list(range(len(examples)))
    rng.shuffle(idx)

    tasks: list[PrivateTask] = []
    for i in idx:
        if len(tasks) >= args.n:
            break
        e = examples[i]
        db = os.path.join(args.data, "database", e["db_id"], e["db_id"] + ".sqlite")
        if not os.path.isfile(db):
            continue
        tasks.append(
            PrivateTask(
                PublicTask(f"train_spider/{i:05d}", e["db_id"], e["question"], "", "", db), e["query"]
            )
        )
    pairs = [(t, t.gold_sql) for t in tasks] + [(t, perturb(t.gold_sql, k)) for k, t in enumerate(tasks)]

    with Sandbox(workers=args.workers) as sb, GoldCache(workers=args.workers) as gc:
        ev = Evaluator(sb, gc)
        ev_nots = Evaluator(sb, gc, test_suite=False)
        t0 = time.perf_counter()
        warm = [ev.score(p, t) for t, p in pairs]  # warm-up: fills the gold cache (and sandbox conns)
        t_warm = time.perf_counter() - t0
        scored = [(t, p) for (t, p), r in zip(pairs, warm) if r.status != "gold_unscorable"]

        t0 = time.perf_counter()
        ours = [ev.score(p, t) for t, p in scored]
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        [ev_nots.score(p, t) for t, p in scored]
        t_ours_nots = time.perf_counter() - t0
        t0 = time.perf_counter()
        batched = []
        for b in range(0, len(scored), args.batch):
            batched += ev.score_many([(p, t) for t, p in scored[b : b + args.batch]])
        t_batch = time.perf_counter() - t0
        assert [r.value for r in batched] == [r.value for r in ours]

    t0 = time.perf_counter()
    naive = [naive_score(t.public.db_path, t.gold_sql, p) for t, p in scored]
    t_naive = time.perf_counter() - t0

    t0 = time.perf_counter()
    for t, _ in scored:  # the part a warm gold cache saves: connect + run gold + close
        con = sqlite3.connect(f"file:{t.public.db_path}?mode=ro", uri=True)
        con.execute(t.gold_sql).fetchall()
        con.close()
    t_gold_only = time.perf_counter() - t0

    agree = sum(
        1
        for r, m in zip(ours, naive)
        if r.status not in ("timeout", "infra_error") and (r.value == 1.0) == bool(m)
    )
    n = len(scored)
    out = {
        "pairs": n,
        "tasks": len(tasks),
        "excluded_unscorable": len(pairs) - n,
        "warmup_s": round(t_warm, 3),
        "ours_pairs_per_s": round(n / t_ours, 1),
        "ours_no_test_suite_pairs_per_s": round(n / t_ours_nots, 1),
        "ours_score_many_pairs_per_s": round(n / t_batch, 1),
        "naive_pairs_per_s": round(n / t_naive, 1),
        "naive_gold_part_ms_per_pair": round(1000 * t_gold_only / n, 3),
        "naive_total_ms_per_pair": round(1000 * t_naive / n, 3),
        "ours_total_ms_per_pair": round(1000 * t_ours / n, 3),
        "ratio_ours_vs_naive": round(t_naive / t_ours, 2),
        "ratio_ours_no_test_suite_vs_naive": round(t_naive / t_ours_nots, 2),
        "ratio_ours_score_many_vs_naive": round(t_naive / t_batch, 2),
        "gold_self_match": f"{sum(r.value == 1.0 for r in ours[: len(ours) // 2])}/{len(ours) // 2}",
        "match_rate_ours": round(sum(r.value == 1.0 for r in ours) / n, 3),
        "verdict_agreement": f"{agree}/{n}",
        "cpu_count": os.cpu_count(),
        "workers": args.workers,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:36s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
