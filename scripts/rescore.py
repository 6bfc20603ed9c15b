"""Re-score committed predictions with the current reward and say which verdicts and figures move.

    python scripts/rescore.py [--data ../shared/data/spider] [--json OUT.json] [PATH ...]

PATH: results folders or files (default: results/). Reads every eval `results.jsonl` (accuracy =
matches / scored tasks, as `sqlrl eval` computes it) and every training `sql.jsonl.gz` (the reward
status of each sampled final SQL) of Spider text-to-SQL tasks; debugging-task files are skipped. A
task is looked up by task_id in the data folder the run used: the embedded subset when its config
says `embedded`, else `--data`; a row whose db_id disagrees is reported as unmatched, never guessed.
Prints, per file, how many verdicts changed (split into golds with a top-level ORDER BY ...
LIMIT/OFFSET and the rest) and the accuracy before and after; `--json` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from sqlrl.reward.cut import cut_query
from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import SpiderData, embedded_root
from sqlrl.tasks.goldcache import GoldCache

EXCLUDED = ("gold_unscorable", "infra_error")


def read_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def uses_embedded(path: Path) -> bool:
    for d in path.parents:
        for name in ("config.json", "experiment.json"):
            f = d / name
            if f.is_file():
                text = f.read_text()
                return '"path": "embedded"' in text or "sqlrl/data/embedded" in text
    return False


def gold_cuts(tasks: list) -> dict:
    """How many golds have a top-level ORDER BY with LIMIT/OFFSET, and how many of those get a cut."""
    from sqlrl.reward.cut import fetch_cuts

    out: Counter = Counter(golds=len(tasks))
    shaped = [t for t in tasks if cut_query(t.gold_sql) is not None]
    out["order_by_limit_or_offset"] = len(shaped)
    out["hidden_sort_key"] = sum(cut_query(t.gold_sql).extra_keys > 0 for t in shaped)
    with Sandbox() as sb, GoldCache(executor=sb) as gc:
        golds = {(t.db_path, t.gold_sql): gc.get(t.db_path, t.gold_sql) for t in shaped}
        out["distinct_database_gold_pairs"] = len(golds)
        golds = {k: g for k, g in golds.items() if g.scorable}
        out["scorable"] = len(golds)
        cuts = fetch_cuts(golds, lambda items: gc.get_many(items, progress=False))
    for c in cuts.values():
        out["no_cut" if c is None else "cut_with_ties_across" if c.pools else "cut_no_ties_across"] += 1
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=["results"])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "spider"))
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--golds", action="store_true", help="also say how many --data golds have a cut, and why not"
    )
    a = ap.parse_args()
    files: list[Path] = []
    for p in map(Path, a.paths):
        files += sorted(p.rglob("results.jsonl")) + sorted(p.rglob("sql.jsonl.gz")) if p.is_dir() else [p]
    tasks = {False: {}, True: {}}
    for emb, root in ((False, Path(a.data)), (True, embedded_root())):
        if (root / "train_spider.json").is_file():
            tasks[emb] = {t.task_id: t for t in SpiderData(root).load("train_spider.json")}
    plan: list[tuple[Path, list[tuple[dict, object]], int]] = []
    pairs: dict[tuple[str, str, str], object] = {}
    for f in files:
        rows = read_rows(f)
        if not rows or str(rows[0].get("task_id", "")).startswith("debug/"):
            continue
        table = tasks[uses_embedded(f)]
        keep, unmatched = [], 0
        for r in rows:
            t = table.get(r.get("task_id"))
            if t is None or t.db_id != r.get("db_id"):
                unmatched += 1
                continue
            keep.append((r, t))
            pairs.setdefault((t.db_path, t.gold_sql, r.get("final_sql") or ""), t)
        plan.append((f, keep, unmatched))
    print(
        f"{len(files)} files, {len(pairs)} distinct (database, gold, prediction) pairs to score",
        file=sys.stderr,
    )
    verdict: dict[tuple[str, str, str], tuple[str, float | None]] = {}
    keys = list(pairs)
    with Sandbox() as sb, GoldCache(executor=sb) as gc:
        ev = Evaluator(sb, gc)
        for i in range(0, len(keys), 512):
            chunk = keys[i : i + 512]
            for k, r in zip(chunk, ev.score_many([(k[2] or None, pairs[k]) for k in chunk])):
                verdict[k] = (r.status, r.value)
            print(f"  scored {min(i + 512, len(keys))}/{len(keys)}", file=sys.stderr)
    report = []
    for f, keep, unmatched in plan:
        changed: Counter = Counter()
        changed_tasks: set[str] = set()
        examples = []
        before = after = scored_b = scored_a = 0
        for r, t in keep:
            status, _ = verdict[(t.db_path, t.gold_sql, r.get("final_sql") or "")]
            old = r.get("status")
            was = bool(r["correct"]) if "correct" in r else old == "match"
            now = status == "match"
            if old not in EXCLUDED:
                scored_b += 1
                before += was
            if status not in EXCLUDED:
                scored_a += 1
                after += now
            if was != now or (old in EXCLUDED) != (status in EXCLUDED):
                kind = "limit" if cut_query(t.gold_sql) is not None else "other"
                changed[kind] += 1
                changed_tasks.add(t.task_id)
                if len(examples) < 5:
                    examples.append(
                        {
                            "task_id": t.task_id,
                            "from": old,
                            "to": status,
                            "gold": t.gold_sql,
                            "pred": r.get("final_sql"),
                        }
                    )
        entry = {
            "file": str(f),
            "rows": len(keep),
            "unmatched": unmatched,
            "changed_limit": changed["limit"],
            "changed_other": changed["other"],
            "changed_tasks": len(changed_tasks),
            "accuracy_before": round(before / scored_b, 4) if scored_b else None,
            "accuracy_after": round(after / scored_a, 4) if scored_a else None,
            "scored_before": scored_b,
            "scored_after": scored_a,
            "examples": examples,
        }
        report.append(entry)
        print(
            f"{f}: {len(keep)} rows ({unmatched} unmatched), changed {changed['limit']} LIMIT/OFFSET + "
            f"{changed['other']} other ({len(changed_tasks)} tasks); accuracy {entry['accuracy_before']} -> {entry['accuracy_after']}"
        )
    if a.golds:
        report.append({"golds": gold_cuts(list(tasks[False].values()))})
        print(json.dumps(report[-1]))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
