"""`sqlrl eval`: the agent greedily over a split, scored (Text-to-SQL or debugging tasks).

Its last lines: the overall accuracy, then accuracy by Spider hardness of the gold (easy / medium / hard /
extra, the official classification; any gold it cannot parse as `unparsed`) and, on BIRD splits, by BIRD
difficulty with BIRD's own metric beside ours (`breakdown_lines`, from summary.json)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlrl.agent.loop import Budgets
from sqlrl.artifacts import git_commit, lock_run_folder, machine_info, sha256_file
from sqlrl.cli.outdir import check_eval_out
from sqlrl.evaluation.runner import load_endpoint_policy, load_policy, run_eval
from sqlrl.evaluation.vote import run_self_consistency
from sqlrl.generation.models import check_model
from sqlrl.training.curriculum import run_debug_eval


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    """Where and how the policy runs (shared by `sqlrl eval` and `sqlrl audit leakage`)."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--engine", default="auto", choices=["auto", "static", "fast", "hf"])


def _sample_values(text: str) -> int:
    n = int(text)
    if not 0 <= n <= 20:
        raise argparse.ArgumentTypeError(f"{n} is not in [0, 20] (example values per column; 0 = none)")
    return n


def add_budget_args(p: argparse.ArgumentParser) -> None:
    d = Budgets()
    p.add_argument("--turns", type=int, default=d.turns, help="1 = single-turn; >= 2 = multi-turn")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--max-sql-executions", type=int, default=d.max_sql_executions)
    p.add_argument("--max-schema-chars", type=int, default=d.max_schema_chars)
    p.add_argument("--max-context-tokens", type=int, default=d.max_context_tokens)
    p.add_argument(
        "--schema-sample-values",
        type=_sample_values,
        default=d.schema_sample_values,
        help="example values per column after each table's CREATE (agent.schema_sample_values; 0 = none)",
    )
    p.add_argument(
        "--schema-order",
        choices=["file", "question"],
        default=d.schema_order,
        help="which tables a schema over --max-schema-chars keeps (agent.schema_order)",
    )
    p.add_argument(
        "--no-evidence",
        dest="show_evidence",
        action="store_false",
        help="leave BIRD's evidence out of the prompt (agent.show_evidence = false)",
    )
    p.add_argument(
        "--column-descriptions",
        action="store_true",
        help="add BIRD's database_description/*.csv text to the schema (agent.column_descriptions)",
    )
    p.add_argument(
        "--checker",
        action="store_true",
        help="one checker turn after the answer: its result is shown and a FINAL reply may replace it "
        "(agent.checker; one of --max-sql-executions; text-to-SQL only)",
    )


def check_budget_args(a) -> None:
    """Refuse budgets (and `--limit`) no evaluation can run with, by `config_budgets.budget_problems`' rules (those
    of a run file), naming the flags: ValueError, one line."""
    from sqlrl.config_budgets import budget_problems

    def flag(field: str, value) -> str:
        return f"--{field.replace('_', '-')} {value}"

    problems = budget_problems(
        a.turns, a.max_new_tokens, a.max_context_tokens, a.max_schema_chars, a.max_sql_executions, show=flag
    )
    if a.limit < 0:
        problems.append(f"--limit {a.limit}: give the number of tasks to evaluate, or 0 for all of them")
    if problems:
        raise ValueError(problems[0])


def budgets_from_args(a) -> Budgets:
    return Budgets(
        turns=a.turns,
        max_new_tokens=a.max_new_tokens,
        max_sql_executions=a.max_sql_executions,
        max_schema_chars=a.max_schema_chars,
        max_context_tokens=a.max_context_tokens,
        schema_sample_values=a.schema_sample_values,
        schema_order=a.schema_order,
        show_evidence=a.show_evidence,
        column_descriptions=a.column_descriptions,
        checker=a.checker,
    )


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sqlrl eval", description="Run the agent greedily over a split and score it."
    )
    p.add_argument(
        "--model", default="qwen2.5-coder-0.5b-instruct", help="built-in name, local path or hub id"
    )
    p.add_argument(
        "--data", default="embedded", help="Spider-layout folder (default: the embedded demo subset)"
    )
    p.add_argument(
        "--split", default="validation", help="json stem (e.g. dev) or train/validation (by database)"
    )
    p.add_argument(
        "--limit", type=int, default=0, help="evaluate a seeded subset of this many tasks (0 = all)"
    )
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.1)
    add_runtime_args(p)
    p.add_argument(
        "--endpoint",
        help="evaluate a served model: base URL of an OpenAI-compatible server (e.g. http://127.0.0.1:8000); "
        "--model is then the served model name",
    )
    p.add_argument(
        "--tokenizer", help="with --endpoint: where the chat template comes from (default: --model)"
    )
    add_budget_args(p)
    p.add_argument(
        "--self-consistency",
        type=int,
        default=0,
        metavar="K",
        help="also sample K answers per task, execute them and answer with the majority result; reported "
        "beside greedy in self_consistency.json (0 = off; K times the generation)",
    )
    p.add_argument(
        "--sc-temperature", type=float, default=0.7, help="sampling temperature of --self-consistency"
    )
    p.add_argument(
        "--kind",
        default="text2sql",
        choices=["text2sql", "debug"],
        help="debug: SQL-debugging tasks (--data: embedded, a folder with debug_tasks.jsonl, or the .jsonl; "
        "--split: the tasks' split field); results per category (query / management / personalization)",
    )
    a = p.parse_args(argv)
    if a.checker and (a.kind == "debug" or a.max_sql_executions < 1):
        p.error("--checker executes the answer once: it needs --kind text2sql and --max-sql-executions >= 1")
    if a.column_descriptions and (a.schema_sample_values or a.schema_order != "file"):
        p.error(
            "--column-descriptions needs --schema-order file and --schema-sample-values 0; drop one of them"
        )
    try:
        check_budget_args(a)
        check_eval_out(a.out, a.data, self_consistency=bool(a.self_consistency))
    except ValueError as e:
        print(f"sqlrl eval: {e}", file=sys.stderr)
        return 2
    if not a.endpoint:
        check_model(a.model)  # before the run folder exists; ModelError -> one line, exit 2 (cli.main)
    if a.kind == "debug":
        return debug_eval_cli(a, ["sqlrl", "eval", *argv])
    if a.self_consistency == 1 or a.self_consistency < 0 or not a.sc_temperature > 0:
        print(
            "sqlrl eval: --self-consistency K needs K >= 2 (0 = off) and --sc-temperature > 0",
            file=sys.stderr,
        )
        return 2
    try:
        policy = load_endpoint_policy(a.endpoint, a.model, a.tokenizer) if a.endpoint else None
        if policy is None and a.self_consistency:  # loaded once for both evaluations
            policy = load_policy(a.model, device=a.device, dtype=a.dtype, engine=a.engine)
        tasks = {  # the same tasks for greedy and self-consistency
            "data": a.data,
            "split": a.split,
            "out": a.out,
            "budgets": budgets_from_args(a),
            "limit": a.limit,
            "seed": a.seed,
            "split_seed": a.split_seed,
            "val_fraction": a.val_fraction,
        }
        out = run_eval(
            model=a.model,
            device=a.device,
            dtype=a.dtype,
            engine=a.engine,
            policy=policy,
            command=["sqlrl", "eval", *argv],
            **tasks,
        )
        sc = None
        if a.self_consistency:
            sc = run_self_consistency(
                policy=policy, k=a.self_consistency, temperature=a.sc_temperature, **tasks
            )
    except (ValueError, FileNotFoundError, RuntimeError) as e:  # ModelError, PolicyInfraError included
        print(f"sqlrl eval: {e}", file=sys.stderr)
        return 2
    s = out.summary
    em = s["execution_match"]
    print(
        f"n={s['n']} execution_match={em:.4f} executable_rate={s['executable_rate']:.4f} "
        f"excluded={s['excluded']} -> {a.out}"
        if em is not None
        else f"no scorable tasks; excluded={s['excluded']}"
    )
    for line in breakdown_lines(s):
        print(line)
    if sc is not None and sc.summary["execution_match"] is not None:
        v = sc.summary
        print(
            f"self-consistency (k={v['k']}, temperature {v['temperature']}): n={v['n']} "
            f"execution_match={v['execution_match']:.4f} pass@{v['k']}={v['pass_at_k']:.4f} (greedy above)"
        )
    return 0


def _class_cell(name: str, row: dict, bird: bool = False) -> str:
    """`easy 50.0% (1/2)`; `hard -` when no task of the class was scored; excluded tasks counted apart."""
    if not row.get("n"):
        return f"{name} -" + (f" ({row['excluded']} excluded)" if row.get("excluded") else "")
    extra = (
        f"; BIRD metric {100 * row['bird_accuracy']:.1f}%"
        if bird and row.get("bird_accuracy") is not None
        else ""
    )
    excl = f", {row['excluded']} excluded" if row.get("excluded") else ""
    return f"{name} {100 * row['accuracy']:.1f}% ({row['correct']}/{row['n']}{excl}{extra})"


def breakdown_lines(summary: dict) -> list[str]:
    """Accuracy by Spider hardness and (BIRD splits) by BIRD difficulty, one line each, from summary.json."""
    out = []
    hard = summary.get("by_hardness") or {}
    if any(r.get("n") or r.get("excluded") for r in hard.values()):
        out.append("accuracy by Spider hardness: " + ", ".join(_class_cell(k, r) for k, r in hard.items()))
    diff = summary.get("by_difficulty") or {}
    if diff:
        out.append(
            "accuracy by BIRD difficulty: " + ", ".join(_class_cell(k, r, bird=True) for k, r in diff.items())
        )
    return out


def debug_eval_cli(a, command: list[str]) -> int:
    """`sqlrl eval --kind debug ...`: greedy evaluation of debugging tasks, printed and saved by category."""
    from sqlrl.evaluation.debugging import category_table_md
    from sqlrl.generation.device import pick_device
    from sqlrl.tasks.data import select_tasks
    from sqlrl.tasks.debugging import load_debug_tasks, resolve_debug_file

    with lock_run_folder(a.out):  # taken before the model loads; RunFolderLocked -> exit 2 (cli.main)
        try:
            file = resolve_debug_file(a.data)
            all_tasks = load_debug_tasks(file)
            tasks = select_tasks([t for t in all_tasks if t.split == a.split], a.limit, a.seed)
            if not tasks:
                splits = sorted({t.split for t in all_tasks})
                raise ValueError(
                    f"{file}: no tasks with split {a.split!r} (splits there: {splits}); pass --split, or use "
                    "`sqlrl curriculum`, which re-splits a file without evaluation tasks by database"
                )
            if a.endpoint:
                policy = load_endpoint_policy(a.endpoint, a.model, a.tokenizer)
            else:
                policy = load_policy(a.model, device=a.device, dtype=a.dtype, engine=a.engine)
            budgets = budgets_from_args(a)
            prov = {
                "command": command,
                "git": git_commit(),
                "machine": machine_info(),
                "kind": "debug",
                "model": {
                    "name": getattr(policy, "name", a.model),
                    "identity": getattr(policy, "identity", None),
                },
                "data": str(file),
                "split": a.split,
                "limit": a.limit,
                "task_ids": [t.task_id for t in tasks],
                "fingerprint": sha256_file(file),
                "budgets": budgets.to_dict(),
                "sampling": {"temperature": 0.0, "seed": a.seed},
                "device": pick_device(a.device),
            }
            summ = run_debug_eval(
                tasks=tasks, policy=policy, budgets=budgets, out=Path(a.out), provenance=prov
            )
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"sqlrl eval: {e}", file=sys.stderr)
            return 2
        print(category_table_md([(str(prov["model"]["name"]), summ["by_category"])]))
        print(f"n={summ['n']} solved_rate={summ['solved_rate']} excluded={summ['excluded']} -> {a.out}")
        return 0
