"""The `sqlrl` command. Each subcommand lives in its own module and is imported only when run,
so `sqlrl --help` never loads torch or transformers.

Every subcommand handler is `cli_main(argv: list[str]) -> int` in its module; it parses its own
arguments (so `sqlrl SUB --help` is exact) and returns the process exit code.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": (
        "sqlrl.experiment:cli_quickstart",
        "run the main job: the quickstart experiment on the embedded demo data",
    ),
    "sql": ("sqlrl.sandbox", "run one SQL statement in the hardened read-only sandbox"),
    "reward": ("sqlrl.reward", "score a predicted SQL against a gold SQL on a database"),
    "data": ("sqlrl.data", "inspect a Spider-layout folder: audit golds, show the split"),
    "model": ("sqlrl.models", "fetch, convert and cache a model; show its identity"),
    "eval": ("sqlrl.evaluate", "run the agent greedily over a split and score it"),
    "audit": ("sqlrl.audit", "audits: `audit weights` (tensor-level) and `audit leakage` (gold mutation)"),
    "train": ("sqlrl.trainer", "GRPO training from a TOML config (with --resume)"),
    "sft": ("sqlrl.sft", "supervised warm start on training references of debugging tasks (with --resume)"),
    "curriculum": (
        "sqlrl.curriculum",
        "staged curriculum on debugging tasks (sft -> single-turn -> multi-turn GRPO), resumable; eval by category",
    ),
    "experiment": (
        "sqlrl.experiment",
        "run the equal-budget arm matrix (Base, GRPO, No-update, validity-only)",
    ),
    "report": ("sqlrl.report", "apply the evidence gate to an experiment folder and write the report"),
    "seeds": (
        "sqlrl.seeds",
        "one experiment matrix run with several training seeds: checks, per-seed and across-seed comparisons",
    ),
    "export": (
        "sqlrl.checkpoint:cli_export",
        "export a checkpoint to Hugging Face format with its identity hash",
    ),
    "verl-config": (
        "sqlrl.integrations.verl",
        "write veRL's GRPO config (validated by veRL's own code) from a sqlrl TOML run file",
    ),
}


def _usage() -> str:
    width = max(len(k) for k in COMMANDS)
    lines = [
        "usage: sqlrl COMMAND [ARGS...]",
        "",
        "Train Text-to-SQL agents with GRPO and prove, with checkable evidence, whether training helped.",
        "",
        "commands:",
    ]
    for name, (_, help_) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_}")
    lines += ["", "Run `sqlrl COMMAND --help` for a command's arguments."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from sqlrl import __version__

        print(f"sqlrl {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"sqlrl: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    target = COMMANDS[name][0]
    module_name, _, func_name = target.partition(":")
    module = importlib.import_module(module_name)
    handler = getattr(module, func_name or "cli_main")
    try:
        return int(handler(rest) or 0)
    except KeyboardInterrupt:
        print("sqlrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
