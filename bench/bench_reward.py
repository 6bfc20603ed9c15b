"""Reward throughput: prediction/gold pairs per second with a warm gold cache, vs a naive scorer.

    python bench/bench_reward.py [--data ../shared/data/spider] [--rounds 5] [--rounds-c 15]
        [--tasks-a 150] [--tasks-b 32] [--group 8] [--batch 256] [--seed 0] [--workers 2]

Workloads, in rounds: (a) all-distinct: per task the gold and one perturbation (projection reversed,
DISTINCT toggled, ORDER BY flipped, or LIMIT 1), no prediction repeats; (b) GRPO-shaped: `--tasks-b`
tasks x `--group` samples, the first 4 samples of a group repeating SQL as a logged GRPO group did
(ROLLOUTS below; samples 5-8 all new, so duplicates are a lower bound); (c) the logged rollouts
themselves (144 real final SQL), the same pairs every round, each round's SQL with its own trailing
blanks (r + 1) so no statement is found prepared in a worker's cache. In (a) and (b) every round uses
tasks no other round (and no warm-up) used. The scorers take turns in a round (who goes first
alternates); golds, their DISTINCT-free variants and shapes are cached before timing.
Scorers, on the same pairs: ours, `Evaluator(Sandbox, GoldCache).score_many` in batches of
`--batch` (pairs scored in the sandbox workers), with and without de-duplication (`memo_entries=0`,
separate sandboxes; identical rewards checked), measured COLD (a fresh sandbox each round, each
database opened once per worker) and STEADY (one sandbox for all rounds after an untimed warm-up, as
in training); naive (`reward_scorers.naive_score`).
Printed: median pairs/s per scorer, the ratio of medians and its per-round range, verdict agreement
(wherever ours did not time out), de-duplication counts, STEADY's CPU per pair of this process and
of the workers (Linux, /proc/PID/schedstat), and (unless `--no-floor`) the floor: the naive steps
timed one by one and the executions ours cannot avoid (each distinct prediction and its
DISTINCT-free variant) run bare on open connections and through the sandbox's hardened path in this
process; "best ratio possible" = naive per pair / (bare per pair / 2 cores).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import sys
from collections import OrderedDict, defaultdict
from pathlib import Path

import sqlglot
from sqlglot import exp

from reward_scorers import (
    cpu_delta,
    cpu_snapshot,
    floor_round,
    floor_summary,
    time_naive,
    time_ours,
)
from sqlrl.reward.shape import gold_shape, remove_distinct
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = "results/2026-11-29-spider-0.5b-single-turn/arms/*/train/rollouts.jsonl.gz"


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


def variants(gold: str, k: int) -> list[str]:
    """`k` distinct SQL texts for one task: the gold, its perturbations, then LIMIT-wrapped variants."""
    out = list(dict.fromkeys([gold] + [perturb(gold, j) for j in range(4)]))
    m = 2
    while len(out) < k:
        v = f"SELECT * FROM ({gold}) LIMIT {m}"
        if v not in out:
            out.append(v)
        m += 1
    return out[:k]


def duplicate_patterns(root: Path) -> tuple[list[list[int]], dict]:
    """Per logged GRPO group: for each sample (in sample order), the index of the first sample with the
    exact same final SQL. Plus a summary of the evidence."""
    groups: dict[tuple, list[tuple[int, str]]] = defaultdict(list)
    files = sorted(root.glob(ROLLOUTS))
    for f in files:
        arm = f.parts[-3]
        with gzip.open(f, "rt") as fh:
            for line in fh:
                d = json.loads(line)
                groups[(arm, d["step"], d["task_id"])].append((int(d["sample"]), d.get("final_sql") or ""))
    patterns = []
    for key in sorted(groups):
        sqls = [s for _, s in sorted(groups[key])]
        patterns.append([sqls.index(s) for s in sqls])
    samples = sum(len(p) for p in patterns)
    distinct = sum(len(set(p)) for p in patterns)
    info = {
        "files": [str(f.relative_to(root)) for f in files],
        "groups": len(patterns),
        "samples": samples,
        "distinct": distinct,
        "group_sizes": sorted({len(p) for p in patterns}),
    }
    return patterns, info


def logged_rollouts(root: Path, data: str) -> list[tuple[str, PrivateTask, str | None]]:
    """The logged GRPO rollouts: (arm, task, the model's final SQL), in (arm, step, sample) order."""
    examples = json.load(open(os.path.join(data, "train_spider.json")))
    rows = []
    for f in sorted(root.glob(ROLLOUTS)):
        with gzip.open(f, "rt") as fh:
            for line in fh:
                d = json.loads(line)
                i = int(d["task_id"].split("/")[1])
                e = examples[i]
                db = os.path.abspath(os.path.join(data, "database", e["db_id"], e["db_id"] + ".sqlite"))
                pub = PublicTask(d["task_id"], e["db_id"], e["question"], "", "", db)
                rows.append(
                    ((f.parts[-3], d["step"], d["sample"]), PrivateTask(pub, e["query"]), d["final_sql"])
                )
    return [(key[0], t, sql) for key, t, sql in sorted(rows, key=lambda r: r[0])]


def load_tasks(data: str, seed: int) -> list[PrivateTask]:
    examples = json.load(open(os.path.join(data, "train_spider.json")))
    idx = list(range(len(examples)))
    random.Random(seed).shuffle(idx)
    tasks = []
    for i in idx:
        e = examples[i]
        db = os.path.join(data, "database", e["db_id"], e["db_id"] + ".sqlite")
        if os.path.isfile(db):
            pub = PublicTask(f"train_spider/{i:05d}", e["db_id"], e["question"], "", "", os.path.abspath(db))
            tasks.append(PrivateTask(pub, e["query"]))
    return tasks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rounds-c", type=int, default=15, help="rounds for (c), which is small (144 pairs)")
    ap.add_argument("--tasks-a", type=int, default=150, help="tasks per round, workload (a)")
    ap.add_argument("--tasks-b", type=int, default=32, help="tasks (groups) per round, workload (b)")
    ap.add_argument("--group", type=int, default=8, help="samples per task, workload (b)")
    ap.add_argument("--batch", type=int, default=256, help="pairs per score_many call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-floor", action="store_true", help="skip the single-process floor analysis")
    return ap.parse_args(argv)


class Workloads:
    """The pairs of each round: tasks are taken in order, so no two rounds (nor the warm-up) share one."""

    def __init__(self, tasks: list[PrivateTask], patterns: list[list[int]], group: int):
        self.tasks, self.patterns, self.group = tasks, patterns, group
        self.pos = 0
        self.pat_i = 0
        self.real: list = []  # the logged rollouts' pairs, workload (c)

    def take(self, n: int) -> list[PrivateTask]:
        got = self.tasks[self.pos : self.pos + n]
        self.pos += n
        if len(got) < n:
            raise SystemExit("not enough Spider tasks for these --rounds/--tasks-*")
        return got

    def a(self, ts: list[PrivateTask]) -> list:
        seen, pairs = set(), []
        for k, t in enumerate(ts):
            for p in (t.gold_sql, perturb(t.gold_sql, k)):
                if (t.public.db_path, p) not in seen:
                    seen.add((t.public.db_path, p))
                    pairs.append((t, p))
        return pairs

    def b(self, ts: list[PrivateTask]) -> list:
        pairs = []
        for t in ts:
            pat = self.patterns[self.pat_i % len(self.patterns)]
            self.pat_i += 1
            slots = pat[: self.group] + list(range(len(pat), self.group))  # samples 5..8: new SQL
            texts = variants(t.gold_sql, self.group)
            first = {s: j for j, s in enumerate(dict.fromkeys(slots))}
            pairs += [(t, texts[first[s]]) for s in slots]
        return pairs

    def c(self, _: list) -> list:
        return list(self.real)


class Bench:
    """One run's shared state: arguments, gold cache, the STEADY sandboxes, the floor's connections."""

    def __init__(self, args: argparse.Namespace, gc: GoldCache, sb: Sandbox, sb_off: Sandbox, src: Workloads):
        self.args, self.gc, self.steady, self.src = args, gc, (sb, sb_off), src
        self.real_runs: list[int] = []  # pairs per arm of (c): one Evaluator per arm
        self.floor_conns: dict = {}
        self.floor_hard = {"conns": OrderedDict(), "cfg": dict(sb._cfg), "deadline": _sandbox_deadline()}

    def fresh_sandbox(self, pairs: list) -> Sandbox:
        """A cold sandbox: workers started and each database of the round opened once per worker
        (SELECT 1: no schema read, no statement prepared, no gold shipped), nothing else warm."""
        s = Sandbox(workers=self.args.workers)
        dbs = sorted({t.public.db_path for t, _ in pairs})
        s.execute_many([(db, "SELECT 1") for db in dbs for _ in range(self.args.workers)])
        return s

    def measure(self, name: str, make, n_tasks: int) -> dict:
        """All rounds of one workload; its summary."""
        args, gc = self.args, self.gc
        n_rounds = args.rounds_c if name == "c" else args.rounds
        if name == "c":
            # steady state for (c): one pair of sandboxes for all its rounds, warmed up by one untimed
            # round of the same pairs (a training run's first step)
            steady = (Sandbox(workers=args.workers), Sandbox(workers=args.workers))
            warm_pairs = make([])
            time_ours(steady[0], gc, warm_pairs, args.batch, self.real_runs)
            time_ours(steady[1], gc, warm_pairs, args.batch, self.real_runs, memo_entries=0)
        else:
            steady = self.steady  # warmed up on tasks no round uses
        acc: dict = {
            "rows": defaultdict(list),
            "agree": {"cold": 0, "steady": 0},
            "total": {"cold": 0, "steady": 0},
            "identical": {"cold": 0, "steady": 0},
            "cold_eq_steady": 0,
            "memo": {},
            "n_pairs": 0,
            "distinct": 0,
            "floor": {},
            "cpu": {"parent": 0.0, "workers": 0.0, "wall": 0.0, "pairs": 0},
        }
        for r in range(n_rounds):
            pairs = make(self.src.take(n_tasks))
            if name == "c":
                pairs = [(t, p if p is None else p + " " * (r + 1)) for t, p in pairs]
            self.round(acc, r, pairs, self.real_runs if name == "c" else [len(pairs)], steady)
        if name == "c":
            for s_ in steady:
                s_.close()
        return summarize(acc, n_rounds)

    def round(self, acc: dict, r: int, pairs: list, runs: list[int], steady: tuple) -> None:
        """One round: every scorer on `pairs`, in turns (the order reverses every other round)."""
        args, gc, cpu = self.args, self.gc, acc["cpu"]
        acc["n_pairs"] += len(pairs)
        start = 0
        for size in runs:
            acc["distinct"] += len({(t.public.db_path, p) for t, p in pairs[start : start + size]})
            start += size
        cold = (self.fresh_sandbox(pairs), self.fresh_sandbox(pairs))
        order = ["naive", "cold", "cold_off", "steady", "steady_off"]
        if r % 2:
            order.reverse()
        got = {}
        for who in order:
            if who == "naive":
                dt, got[who] = time_naive(pairs)
            else:
                mode = who.split("_")[0]
                off = who.endswith("_off")
                s_ = (cold if mode == "cold" else steady)[1 if off else 0]
                kw = {"memo_entries": 0} if off else {}
                snap = cpu_snapshot(s_) if who == "steady" else None
                dt, got[who], st_ = time_ours(s_, gc, pairs, args.batch, runs, **kw)
                if snap is not None:  # where STEADY's time goes: CPU of the parent and the workers
                    par, wrk = cpu_delta(s_, snap)
                    cpu["parent"] += par
                    cpu["workers"] += wrk
                    cpu["wall"] += dt
                    cpu["pairs"] += len(pairs)
                if not off:
                    acc["memo"][mode] = st_
            acc["rows"][who].append(len(pairs) / dt)
        for s_ in cold:
            s_.close()
        if not args.no_floor:
            floor_round(pairs, self.floor_conns, acc["floor"], runs, self.floor_hard)
        for mode in ("cold", "steady"):
            acc["identical"][mode] += sum(
                a.to_dict() == b.to_dict() for a, b in zip(got[mode], got[mode + "_off"])
            )
            for rw, m in zip(got[mode], got["naive"]):
                if rw.status in ("timeout", "infra_error", "gold_unscorable"):
                    continue
                acc["total"][mode] += 1
                acc["agree"][mode] += (rw.value == 1.0) == bool(m)
        acc["cold_eq_steady"] += sum(a.to_dict() == b.to_dict() for a, b in zip(got["cold"], got["steady"]))


def _sandbox_deadline():
    from sqlrl.sql.engine import Deadline

    return Deadline()


def summarize(acc: dict, n_rounds: int) -> dict:
    """A workload's figures from its rounds' accumulators."""
    rows, cpu, n_pairs = acc["rows"], acc["cpu"], acc["n_pairs"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    res = {
        "rounds": n_rounds,
        "pairs_per_round": n_pairs // n_rounds,
        "distinct_sql_share": round(acc["distinct"] / n_pairs, 3),
        "naive_pairs_per_s": round(med["naive"], 1),
        "floor": floor_summary(acc["floor"]),
        "cold_equals_steady": f"{acc['cold_eq_steady']}/{n_pairs}",
        # STEADY (de-duplication on), all rounds: CPU per pair of the bench process (the parent)
        # and of the sandbox workers (summed, /proc/PID/schedstat), and wall time
        "steady_cpu_us_per_pair": {
            k: round(cpu[k] / cpu["pairs"] * 1e6, 1) for k in ("parent", "workers", "wall")
        }
        if cpu["pairs"]
        else None,
    }
    for mode in ("cold", "steady"):
        per_round = [o / n for o, n in zip(rows[mode], rows["naive"])]
        memo = acc["memo"][mode]
        res[mode] = {
            "ours_pairs_per_s": round(med[mode], 1),
            "ours_memo_off_pairs_per_s": round(med[mode + "_off"], 1),
            "ratio": round(med[mode] / med["naive"], 2),
            "ratio_memo_off": round(med[mode + "_off"] / med["naive"], 2),
            "ratio_per_round_min_max": [round(min(per_round), 2), round(max(per_round), 2)],
            "memo_on_equals_memo_off": f"{acc['identical'][mode]}/{n_pairs}",
            "verdict_agreement_with_naive": f"{acc['agree'][mode]}/{acc['total'][mode]}",
            "memo_last_round": {
                "duplicate_hits": memo["duplicate_hits"],
                "sandbox_executions": memo["executions"],
            },
        }
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    patterns, evidence = duplicate_patterns(ROOT)
    if not patterns:
        print(f"no GRPO rollouts found under {ROOT / ROLLOUTS}", file=sys.stderr)
        return 2
    all_tasks = load_tasks(args.data, args.seed)
    rng = random.Random(args.seed)
    rng.shuffle(patterns)

    # one sandbox per scorer: a statement prepared by one scorer's run must not be found in SQLite's
    # statement cache by the other's (its connections stay open and warm, as in training)
    with (
        Sandbox(workers=args.workers) as sb,
        Sandbox(workers=args.workers) as sb_off,
        GoldCache(workers=args.workers) as gc,
    ):
        # golds that execute; their results and DISTINCT-free variants go into the gold cache now
        golds = gc.get_many([(t.public.db_path, t.gold_sql) for t in all_tasks], progress=False)
        tasks = [t for t, g in zip(all_tasks, golds) if g.scorable]
        gc.get_many([(t.public.db_path, remove_distinct(t.gold_sql)) for t in tasks], progress=False)
        excluded = len(all_tasks) - len(tasks)
        # the gold's shape (sqlglot parse: top-level ORDER BY, LIMIT, sort keys) is part of the cached
        # gold for both scorers: parsed here, once per gold, so neither scorer pays for it in a round
        for t in tasks:
            gold_shape(t.gold_sql)
        src = Workloads(tasks, patterns, args.group)

        # warm-up on tasks no measured round uses: sandbox workers up, connections and page cache warm
        warm = src.a(src.take(32))
        time_ours(sb, gc, warm, args.batch)
        time_ours(sb_off, gc, warm, args.batch, memo_entries=0)
        time_naive(warm)

        logged = logged_rollouts(ROOT, args.data)
        real_golds = gc.get_many([(t.public.db_path, t.gold_sql) for _, t, _ in logged], progress=False)
        logged = [x for x, g in zip(logged, real_golds) if g.scorable]
        src.real = [(t, p) for _, t, p in logged]
        arms = list(dict.fromkeys(a for a, _, _ in logged))
        gc.get_many([(t.public.db_path, remove_distinct(t.gold_sql)) for t, _ in src.real], progress=False)
        for t, _ in src.real:
            gold_shape(t.gold_sql)
        bench = Bench(args, gc, sb, sb_off, src)
        bench.real_runs = [sum(1 for a, _, _ in logged if a == arm) for arm in arms]
        results = {}
        for name, make, n_tasks in (("a", src.a, args.tasks_a), ("b", src.b, args.tasks_b), ("c", src.c, 0)):
            results[name] = bench.measure(name, make, n_tasks)

    out = {
        "evidence_for_b": {
            **evidence,
            "logged_samples_repeating_an_earlier_one": evidence["samples"] - evidence["distinct"],
            "assumed_for_samples_5_to_8": "all new SQL (lower bound on duplicates)",
        },
        "tasks_excluded_unscorable_gold": excluded,
        "rounds": args.rounds,
        "rounds_c": args.rounds_c,
        "batch": args.batch,
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "workloads": results,
    }
    out["target_10x"] = {
        k: {m: ("met" if v[m]["ratio"] >= 10 else "NOT met") for m in ("cold", "steady")}
        for k, v in results.items()
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print_report(out, args)
    return 0


def print_report(out: dict, args: argparse.Namespace) -> None:
    ev = out["evidence_for_b"]
    excluded = out["tasks_excluded_unscorable_gold"]
    print(
        f"evidence for (b): {ev['groups']} logged GRPO groups ({ev['samples']} samples, first 4 of 8 per "
        f"group) in {len(ev['files'])} files {ROLLOUTS}: {ev['distinct']} distinct SQL, "
        f"{ev['logged_samples_repeating_an_earlier_one']} samples repeat an earlier one exactly; "
        "samples 5-8 of each group assumed all new (lower bound on duplicates)"
    )
    print(
        f"rounds {args.rounds} ((c): {args.rounds_c}; medians shown), batch {args.batch} pairs per score_many, "
        f"{args.workers} sandbox workers, {os.cpu_count()} CPUs, "
        f"{excluded} tasks skipped (unscorable gold)"
    )
    print(
        "two measurements of ours on the same pairs in every round, against the same naive timing:\n"
        "  COLD:   a fresh sandbox every round (workers started and each database opened once per worker\n"
        "          before timing; schemas unread, no statement prepared, no gold shipped)\n"
        "  STEADY: one sandbox for all rounds, as in a training run (one Sandbox + Evaluator per run),\n"
        "          warmed up by an untimed round; (a)/(b): every round has new tasks, hence new golds\n"
        "          and new SQL; (c): the same pairs every round, each round's SQL with its own trailing\n"
        "          blanks so no statement is found already prepared"
    )
    labels = {
        "a": "(a) all-distinct predictions",
        "b": f"(b) GRPO-shaped {args.tasks_b} tasks x {args.group}",
        "c": "(c) the logged rollouts themselves (real model SQL, 3 arms x 12 groups of 4)",
    }
    for k, v in out["workloads"].items():
        print(
            f"\n{labels[k]}: {v['pairs_per_round']} pairs per round, {v['distinct_sql_share']:.1%} distinct (within a run)"
        )
        print(f"  {'naive (connect, gold, pred, compare)':<40} {v['naive_pairs_per_s']:>9.1f} pairs/s")
        for mode in ("cold", "steady"):
            m_ = v[mode]
            tag = mode.upper()
            lo, hi = m_["ratio_per_round_min_max"]
            mm = m_["memo_last_round"]
            for label, text in (
                ("ours  Evaluator.score_many", f"{m_['ours_pairs_per_s']:>9.1f} pairs/s"),
                ("ours  de-duplication off", f"{m_['ours_memo_off_pairs_per_s']:>9.1f} pairs/s"),
                (
                    "ratio ours / naive",
                    f"{m_['ratio']:>9.2f}x  (per round {lo}-{hi}x; de-duplication off "
                    f"{m_['ratio_memo_off']}x)  target 10x: {out['target_10x'][k][mode]}",
                ),
                ("rewards de-dup on == off", m_["memo_on_equals_memo_off"]),
                ("verdicts agree with naive", m_["verdict_agreement_with_naive"]),
                (
                    "de-duplication, last round",
                    f"{mm['duplicate_hits']} repeats answered from a pair scored in the same call, "
                    f"{mm['sandbox_executions']} sandbox executions",
                ),
            ):
                print(f"  {tag + ' ' + label:<40} {text}")
        print(f"  {'rewards cold == steady':<40} {v['cold_equals_steady']}")
        c_ = v.get("steady_cpu_us_per_pair")
        if c_:
            need = v["naive_pairs_per_s"] and 1e6 / v["naive_pairs_per_s"] / 10
            print(
                f"  {'STEADY CPU per pair, all rounds':<40} parent {c_['parent']:.0f} us + workers "
                f"{c_['workers']:.0f} us (both cores: wall >= {(c_['parent'] + c_['workers']) / 2:.0f} us); "
                f"measured wall {c_['wall']:.0f} us; 10x needs wall <= {need:.0f} us"
            )
        print_floor(v["floor"])


def print_floor(f: dict | None) -> None:
    """The floor analysis lines of one workload."""
    if f:
        st = f["naive_steps_us_per_pair"]
        print(
            f"  {'floor, one process, all rounds':<40} naive {f['naive_us_per_pair']:.0f} us/pair = "
            + " + ".join(f"{k} {st[k]:.0f}" for k in ("connect", "gold", "pred", "compare", "close"))
        )
        print(
            f"  {'':<40} bare execution on open connections "
            f"{f['bare_pred_us_per_pair'] + f['bare_variant_us_per_pair']:.0f} us/pair (distinct "
            f"predictions {f['bare_pred_us_per_pair']:.0f} + DISTINCT-free variants "
            f"{f['bare_variant_us_per_pair']:.0f})"
        )
        print(
            f"  {'':<40} best ratio possible on 2 cores (zero overhead, "
            f"perfect split) {f['max_ratio_2_cores']}x"
        )
        if f.get("hardened_us_per_pair"):
            print(
                f"  {'':<40} the same executions through the sandbox's hardened path (pre-check, "
                f"authorizer, limits, deadline, capped fetch; in one process, no IPC, no scoring) "
                f"{f['hardened_us_per_pair']:.0f} us/pair: best ratio possible with it "
                f"{f['max_ratio_2_cores_hardened']}x"
            )


if __name__ == "__main__":
    sys.exit(main())
