"""`sqlrl audit weights` (tensor-level weight audit) and `sqlrl audit leakage` (gold mutation)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sqlrl.artifacts import dumps, lock_run_folder, write_json_atomic
from sqlrl.evidence.leakage import leakage_audit
from sqlrl.evidence.weights import audit_weights


def _format_text(res: dict) -> str:
    lines = [f"weights audit: {'PASSED' if res['passed'] else 'FAILED'}"]
    for k, v in res["verdicts"].items():
        lines.append(f"  {k:22s} {'n/a' if v is None else ('yes' if v else 'NO')}")
    for label, t in res["tensors"].items():
        s = t["summary"]
        lines.append(
            f"  {label}: {s['n_changed']}/{s['n_tensors']} tensors changed, "
            f"{s['n_changed_elements']}/{s['n_elements']} elements, delta_l2={s['delta_l2']}, "
            f"relative={s['relative_change']}, max_abs={s['max_abs_delta']}"
        )
        for r in t["top"][:5]:
            if not r["identical"]:
                lines.append(
                    f"    {r['name']}: delta_l2={r['delta_l2']:.3g} max_abs={r['max_abs_delta']:.3g}"
                )
    for k, v in res["hashes"].items():
        if v:
            lines.append(f"  hash {k:16s} {v}")
    for e in res["errors"]:
        lines.append(f"  error: {e}")
    if res.get("identity") and res["identity"].get("problem"):
        lines.append(f"  identity: {res['identity']['problem']}")
    return "\n".join(lines)


def cli_main(argv: list[str]) -> int:
    """`sqlrl audit weights ...` and `sqlrl audit leakage ...` (forwarded to sqlrl.evidence.leakage)."""
    if argv and argv[0] == "leakage":
        return int(leakage_main(argv[1:]) or 0)
    ap = argparse.ArgumentParser(
        prog="sqlrl audit", description="audits: `weights` (tensor-level), `leakage`"
    )
    sub = ap.add_subparsers(dest="which", required=True)
    sub.add_parser("leakage", help="gold-mutation leakage audit (see `sqlrl audit leakage --help`)")
    w = sub.add_parser("weights", help="tensor-level weight audit; exits 1 when a verdict fails")
    w.add_argument("--base", required=True, help="base model folder (HF safetensors or sqlrl checkpoint)")
    w.add_argument("--trained", required=True, help="trained model folder")
    w.add_argument("--no-update", help="no-update arm model folder (must be bit-identical to base)")
    w.add_argument("--reloaded", help="exported/reloaded model folder whose hash must match the trained hash")
    w.add_argument("--expect-hash", help="expected weights hash of the trained (or reloaded) model")
    w.add_argument("--top-k", type=int, default=10)
    w.add_argument("--all-tensors", action="store_true", help="include the per-tensor list for every tensor")
    w.add_argument("--json", action="store_true", help="print the JSON result")
    w.add_argument("--out", help="write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.out:
        from sqlrl.cli.outdir import check_report_file

        try:
            check_report_file(args.out, "--out")
        except ValueError as e:
            print(f"sqlrl audit weights: {e}", file=sys.stderr)
            return 2
    res = audit_weights(
        args.base,
        args.trained,
        args.no_update,
        reloaded=args.reloaded,
        expect_hash=args.expect_hash,
        top_k=args.top_k,
        full=args.all_tensors,
    )
    if args.json:
        print(dumps(res))
    else:
        print(_format_text(res))
    if args.out:
        try:
            write_json_atomic(args.out, res)
        except OSError as e:  # what `check_report_file` cannot foresee, e.g. a folder that cannot be made
            print(f"sqlrl audit weights: --out {args.out}: cannot write it ({e.strerror})", file=sys.stderr)
            return 2
    if res["errors"] and not res["tensors"]:
        return 2
    return 0 if res["passed"] else 1


def leakage_main(argv: list[str]) -> int:
    from sqlrl.artifacts import check_out_folder
    from sqlrl.cli.eval import add_budget_args, add_runtime_args, budgets_from_args, check_budget_args
    from sqlrl.evaluation.runner import load_policy
    from sqlrl.generation.models import check_model
    from sqlrl.tasks.data import resolve_data_root, select_tasks

    p = argparse.ArgumentParser(
        prog="sqlrl audit leakage", description="Gold-mutation leakage audit (`sqlrl audit leakage`)."
    )
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--data", default="embedded")
    p.add_argument("--split", default="validation")
    p.add_argument("--limit", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for leakage.json")
    add_runtime_args(p)
    add_budget_args(p)
    a = p.parse_args(argv)
    from sqlrl.agent.envs import make_env
    from sqlrl.tasks.bird import open_data

    try:
        check_budget_args(a)
        tasks = select_tasks(open_data(resolve_data_root(a.data)).load(a.split), a.limit, a.seed)
        check_out_folder(a.out, "audit leakage", "a leakage audit")
        if (Path(a.out) / "leakage.json").is_file():
            raise ValueError(
                f"--out {a.out} holds a finished leakage audit (leakage.json), which a rerun would replace; "
                "choose a new --out folder"
            )
    except (ValueError, FileNotFoundError) as e:
        print(f"sqlrl audit leakage: {e}", file=sys.stderr)
        return 2
    check_model(a.model)  # before the output folder exists; ModelError -> one line, exit 2 (cli.main)
    budgets = budgets_from_args(a)
    with lock_run_folder(a.out):  # RunFolderLocked -> exit 2 (cli.main)
        policy = load_policy(a.model, device=a.device, dtype=a.dtype, engine=a.engine)
        with make_env(workers=2, timeout_s=budgets.sql_timeout_s) as env:
            result = leakage_audit(tasks, policy, env.sandbox, budgets, work_dir=a.out)
        write_json_atomic(Path(a.out) / "leakage.json", result)
    print(leakage_line(result, Path(a.out) / "leakage.json"))
    return 0 if result["passed"] else 1


def leakage_line(result: dict, path: Path) -> str:
    """The audit's last line: verdict, tasks, the first trajectory that differs (or that none does),
    static hits, where the result is."""
    verdict = "PASSED" if result["passed"] else "FAILED"
    first = result["first_difference"]
    diff = (
        "no trajectory differs"
        if first is None
        else f"first difference: {json.dumps(first, default=str)[:200]}"
    )
    hits = result["static_check"]["n_hits"]
    return f"leakage audit {verdict}: {result['tasks']} tasks, {diff}, static hits: {hits} -> {path}"
