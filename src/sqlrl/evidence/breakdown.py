"""Accuracy by Spider hardness, learning curves and self-consistency per arm, as plain data (`breakdown`).

- hardness: each arm's results.jsonl rows joined by task id (`<file stem>/<index>`) with the gold of
  that example in the Spider folder its eval run.json records (or `data`, the `--data` of `sqlrl
  report`), classified by `sqlrl.tasks.hardness` (the official rules); per class n scored, correct,
  accuracy with a percentile bootstrap CI, excluded, and for each arm with a base arm the paired
  difference on the tasks of that class scored in both. A row whose db_id differs from the example's
  means another folder: that arm's hardness is refused with the reason. Without the folder, the
  arm's summary.json `by_hardness` (written by `sqlrl eval`) is shown, marked as such, without CI.
- learning curve: train/curve.jsonl of each trained arm (`run.eval_every` > 0; GRPO and SFT runs alike);
  otherwise the reason (`run.eval_every` = 0 in its train config.json, or no point written); also
  the curve of a grpo_sft arm's own SFT stage (its `init_run`), as "<arm> SFT stage".
- self-consistency: eval/self_consistency.json(l) (`sqlrl eval --self-consistency K`); accuracy and
  pass@k recomputed from the per-task file when present, and the paired difference with the arm's
  greedy results on the tasks scored in both (bootstrap CI, exact McNemar).

What is not: the gold is not re-executed; hardness says nothing about tasks excluded for their gold
beyond their count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlrl.artifacts import json_number
from sqlrl.evaluation.outcome import outcome, scored_rows
from sqlrl.evidence.rundir import Experiment
from sqlrl.tasks.hardness import HARDNESS, UNPARSED, hardness

__all__ = ["breakdown", "gold_of"]


def _read_examples(root: Path, stem: str, cache: dict) -> list | None:
    key = (str(root), stem)
    if key not in cache:
        try:
            raw = json.loads((root / f"{stem}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = None
        cache[key] = raw if isinstance(raw, list) else None
    return cache[key]


def gold_of(results: list[dict], root: Path, cache: dict | None = None) -> tuple[dict[str, str] | None, str]:
    """(task id -> gold SQL for every row of `results`, "") from the Spider folder `root`, or (None, why)."""
    cache = {} if cache is None else cache
    out: dict[str, str] = {}
    for r in results:
        tid = str(r.get("task_id"))
        stem, _, idx = tid.rpartition("/")
        if not stem or not idx.isdigit():
            return None, f"task id {tid!r} is not <file stem>/<index>"
        examples = _read_examples(root, stem, cache)
        if examples is None:
            return None, f"{root / (stem + '.json')} is not a readable list of examples"
        i = int(idx)
        ex = examples[i] if i < len(examples) else None
        if not isinstance(ex, dict) or not isinstance(ex.get("query"), str):
            return None, f"{root / (stem + '.json')} has no example {i} (task {tid})"
        if r.get("db_id") is not None and ex.get("db_id") != r.get("db_id"):
            return None, (
                f"task {tid} is on {r.get('db_id')!r} but example {i} of {root / (stem + '.json')} is on "
                f"{ex.get('db_id')!r}: another data folder"
            )
        out[tid] = ex["query"]
    return out, ""


def _data_root(exp: Experiment, arm: str, data: str | Path | None) -> Path | None:
    from sqlrl.tasks.data import resolve_data_root

    if data is not None:
        return Path(data)
    for src in (exp.eval_run(arm), exp.meta):
        if isinstance(src, dict) and isinstance(src.get("data"), str):
            return resolve_data_root(src["data"])
    return None


def _class_rows(outcomes: dict[str, list[int]], excluded: dict[str, int], **kw: Any) -> dict:
    from sqlrl.evidence import stats

    rows = {}
    for cls in [*HARDNESS, UNPARSED]:
        xs = outcomes.get(cls, [])
        if cls == UNPARSED and not xs and not excluded.get(cls):
            continue
        row = {"n": len(xs), "correct": sum(xs), "accuracy": None, "excluded": excluded.get(cls, 0)}
        if xs:
            ci = stats.accuracy_ci(xs, **kw)
            row.update(accuracy=ci["accuracy"], ci_low=ci["ci_low"], ci_high=ci["ci_high"])
        rows[cls] = row
    return rows


def _arm_hardness(exp: Experiment, arm: str, data: Any, cache: dict, **kw: Any) -> dict:
    results = exp.results(arm)
    if results is None:
        return {"unavailable": "no results.jsonl"}
    root = _data_root(exp, arm, data)
    why = "the eval run.json records no data folder; pass --data"
    if root is not None:
        golds, why = gold_of(results, root, cache)
        if golds is not None:
            outcomes: dict[str, list[int]] = {}
            excluded: dict[str, int] = {}
            classes = {}
            for r in results:
                cls = hardness(golds[str(r["task_id"])]) or UNPARSED
                classes[str(r["task_id"])] = cls
                if outcome(r) is None:
                    excluded[cls] = excluded.get(cls, 0) + 1
                else:
                    outcomes.setdefault(cls, []).append(outcome(r))
            return {"source": str(root), "classes": _class_rows(outcomes, excluded, **kw), "_of": classes}
        if not root.is_dir():
            why = f"data folder {root} not found; pass --data with the Spider folder the arm was evaluated on"
    summary = exp.summary(arm) or {}
    if isinstance(summary.get("by_hardness"), dict):
        return {"source": "summary.json", "classes": summary["by_hardness"], "note": why}
    return {"unavailable": why}


def _paired_by_class(exp: Experiment, a: str, b: str, classes: dict[str, str]) -> dict:
    """Per class: n tasks scored in both arms, diff = acc(b) - acc(a), b-only and a-only wins."""
    ra = {str(r.get("task_id")): outcome(r) for r in exp.results(a) or []}
    rb = {str(r.get("task_id")): outcome(r) for r in exp.results(b) or []}
    out: dict[str, dict] = {}
    for tid in sorted(set(ra) & set(rb) & set(classes)):
        if ra[tid] is None or rb[tid] is None:
            continue
        d = out.setdefault(classes[tid], {"n": 0, "sum_a": 0, "sum_b": 0, "b_only": 0, "a_only": 0})
        x, y = int(bool(ra[tid])), int(bool(rb[tid]))
        d["n"] += 1
        d["sum_a"] += x
        d["sum_b"] += y
        d["b_only"] += int(y and not x)
        d["a_only"] += int(x and not y)
    for d in out.values():
        d["diff"] = (d["sum_b"] - d["sum_a"]) / d["n"]
    return out


def _arm_curve(exp: Experiment, arm: str) -> dict:
    points = exp.curve(arm)
    if points:
        return {"points": sorted((p for p in points if isinstance(p, dict)), key=lambda p: p.get("step", 0))}
    if not exp.has_train(arm):
        return {"reason": "no curve: no train run (no train/run.json)"}
    cfg = exp.train_config(arm)
    every = ((cfg or {}).get("run") or {}).get("eval_every", 0) if isinstance(cfg, dict) else None
    if cfg is None:
        return {"reason": "no curve: the train run has no config.json saying run.eval_every"}
    if not every:
        return {"reason": "no curve: run.eval_every = 0"}
    return {"reason": f"no curve: run.eval_every = {every} but train/curve.jsonl holds no point"}


def _stage_curves(exp: Experiment) -> dict:
    """ "<arm> SFT stage" -> {"points", "of": arm} for each grpo_sft arm that ran its own SFT stage
    (`sft.init_steps` > 0) with a learning curve; a stage that is the sft arm's run is that arm's curve."""
    from sqlrl.evidence.rltime import init_run

    arms = {a.train_dir.resolve() for a in exp.arms.values() if a.train_dir is not None}
    out = {}
    for arm in exp.arms_of("grpo_sft"):
        d, _ = init_run(exp, arm)
        if d is None or d.resolve() in arms:
            continue
        points = [p for p in exp.run_curve(d) or [] if isinstance(p, dict)]
        if points:
            out[f"{arm.name} SFT stage"] = {
                "points": sorted(points, key=lambda p: p.get("step", 0)),
                "of": arm.name,
            }
    return out


def _arm_self_consistency(exp: Experiment, arm: str, **kw: Any) -> dict | None:
    from sqlrl.evidence import stats

    summary = exp.self_consistency(arm)
    rows = exp.self_consistency_results(arm)
    if summary is None and rows is None:
        return None
    s = summary if isinstance(summary, dict) else {}
    out: dict[str, Any] = {
        "k": s.get("k"),
        "temperature": s.get("temperature"),
        "source": "self_consistency.json",
        "n": s.get("n"),
        "accuracy": json_number(s.get("execution_match")),
        "pass_at_k": json_number(s.get("pass_at_k")),
    }
    if rows is not None:
        scored = scored_rows(rows)
        n = len(scored)
        out.update(
            source="self_consistency.jsonl",
            n=n,
            accuracy=sum(outcome(r) for r in scored) / n if n else None,
            pass_at_k=sum(outcome(r, "pass_at_k") == 1 for r in scored) / n if n else None,
        )
        greedy = exp.results(arm)
        if greedy is not None:
            sc_of = {str(r.get("task_id")): outcome(r) for r in rows}
            pairs = [
                (outcome(g), sc_of[str(g.get("task_id"))])
                for g in greedy
                if outcome(g) is not None and sc_of.get(str(g.get("task_id"))) is not None
            ]
            if pairs:
                xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
                boot = stats.paired_bootstrap(xs, ys, **kw)
                mc = stats.mcnemar_exact(xs, ys)
                out["vs_greedy"] = {
                    "n": len(xs),
                    "greedy": sum(xs) / len(xs),
                    "diff": boot["diff"],
                    "ci_low": boot["ci_low"],
                    "ci_high": boot["ci_high"],
                    "p_value": mc.get("p_value"),
                }
    return out


def breakdown(exp: Experiment, base_of: dict[str, str], *, data: str | Path | None = None, **kw: Any) -> dict:
    """{"hardness": arm -> ..., "hardness_vs_base": arm -> class -> paired row, "curves": trained arm ->
    {"points"} or {"reason"}, "self_consistency": arm -> ... (arms with one)}; `kw`: n_boot, seed, ci."""
    cache: dict = {}
    hard = {a: _arm_hardness(exp, a, data, cache, **kw) for a in exp.arms}
    vs_base = {}
    for b, a in base_of.items():
        cls = hard.get(b, {}).get("_of")
        if cls is not None and "_of" in hard.get(a, {}):
            vs_base[b] = _paired_by_class(exp, a, b, cls)
    curves = {a: _arm_curve(exp, a) for a, arm in exp.arms.items() if arm.train_dir is not None}
    curves.update(_stage_curves(exp))
    sc = {a: _arm_self_consistency(exp, a, **kw) for a in exp.arms}
    return {
        "hardness": {a: {k: v for k, v in h.items() if k != "_of"} for a, h in hard.items()},
        "hardness_vs_base": vs_base,
        "curves": curves,
        "self_consistency": {a: s for a, s in sc.items() if s is not None},
    }
