"""The `sqlrl` command: one module per subcommand, imported only when run (`--help` loads no torch).
Each module's `cli_main(argv) -> int` parses its own arguments and returns the exit code.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": (
        "sqlrl.cli.experiment:cli_quickstart",
        "run the main job: the quickstart experiment on the embedded demo data",
    ),
    "sql": ("sqlrl.cli.sql", "run one SQL statement in the hardened read-only sandbox"),
    "reward": ("sqlrl.cli.reward", "score a predicted SQL against a gold SQL on a database"),
    "data": ("sqlrl.cli.data", "inspect a Spider-layout folder: audit golds, show the split"),
    "model": ("sqlrl.cli.model", "fetch, convert and cache a model; show its identity"),
    "eval": (
        "sqlrl.cli.eval",
        "run the agent greedily over a split and score it (self-consistency beside it on request)",
    ),
    "audit": (
        "sqlrl.cli.audit",
        "audits: `audit weights` (tensor-level) and `audit leakage` (gold mutation)",
    ),
    "train": ("sqlrl.cli.train", "GRPO training from a TOML config (with --resume)"),
    "sft": (
        "sqlrl.cli.sft",
        "supervised fine-tuning on text-to-SQL golds or debugging-task solutions (with --resume)",
    ),
    "curriculum": (
        "sqlrl.cli.curriculum",
        "staged curriculum on debugging tasks (sft -> single-turn -> multi-turn GRPO), resumable; eval by category",
    ),
    "experiment": (
        "sqlrl.cli.experiment",
        "run the equal-budget arm matrix (Base, GRPO, No-update, validity-only, SFT, ...), resumable",
    ),
    "report": ("sqlrl.cli.report", "apply the evidence gate to an experiment folder and write the report"),
    "compare": (
        "sqlrl.cli.compare",
        "paired comparison of two evaluation runs: difference, CI, McNemar, what settings differ",
    ),
    "seeds": (
        "sqlrl.cli.seeds",
        "one experiment matrix run with several training seeds: checks, per-seed and across-seed comparisons",
    ),
    "export": (
        "sqlrl.cli.export",
        "export a checkpoint to Hugging Face format with its identity hash",
    ),
    "verl-config": (
        "sqlrl.cli.verl_config",
        "write veRL's GRPO config (validated by veRL's own code) from a sqlrl TOML run file",
    ),
}


# what to do after Ctrl-C, for the commands that can continue where they stopped
RESUME_HINTS = {
    "quickstart": "rerun the same command to resume",
    "experiment": "rerun the same command to resume",
    "eval": "rerun the same command to resume",
    "train": "resume with `sqlrl train CONFIG --resume RUN_DIR` (RUN_DIR: the run folder)",
    "sft": "resume with `sqlrl sft ... --resume RUN_DIR` (RUN_DIR: the run folder)",
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


def unknown_command(name: str) -> str:
    """One line for a command that does not exist: the closest command, if any, and where the list is."""
    import difflib

    close = difflib.get_close_matches(name, COMMANDS, n=1, cutoff=0.6)
    hint = f"did you mean `sqlrl {close[0]}`? " if close else ""
    return f"sqlrl: unknown command {name!r}; {hint}`sqlrl --help` lists the commands"


def resume_hint(name: str, rest: list[str]) -> str | None:
    """What to type after Ctrl-C: for `train` and `sft` the interrupted command itself with `--resume
    RUN_DIR` (its `--set` overrides kept: a resume needs the same config), else `RESUME_HINTS`."""
    import shlex

    generic = RESUME_HINTS.get(name)
    if name not in ("train", "sft") or not rest or rest[0].startswith("-"):
        return generic
    args, out, i = [], None, 0
    while i < len(rest):
        arg = rest[i]
        flag, eq, value = arg.partition("=")
        if flag in ("--out", "--resume"):
            if not eq:
                if i + 1 >= len(rest):
                    return generic
                value, i = rest[i + 1], i + 1
            out = value if flag == "--resume" or out is None else out
        else:
            args.append(arg)
        i += 1
    if out is None:
        from pathlib import Path

        out = f"runs/{Path(rest[0]).stem}" + ("-sft" if name == "sft" else "")
    return "resume with `" + shlex.join(["sqlrl", name, *args, "--resume", out]) + "`"


class _ConsoleHandler(logging.Handler):
    """The CLI's output for the library's `logging` records: INFO to stdout, WARNING and above to
    stderr, the message alone (as `print` wrote it). Streams are looked up at emit time, so pytest's
    capture and redirections see them."""

    def emit(self, record: logging.LogRecord) -> None:
        from sqlrl.evaluation.progress import pause_line, resume_line

        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        line = pause_line()  # a progress line drawn on the terminal: the record goes above it
        stream.write(self.format(record) + "\n")
        stream.flush()
        resume_line(line)


def console_logging(level: int = logging.INFO) -> None:
    """Route the `sqlrl` loggers to the console (idempotent). Records still propagate to the root logger,
    which has no handler in a plain CLI run (pytest's caplog attaches one there). A library user who wants
    silence does not call this, or sets `logging.getLogger("sqlrl").setLevel(logging.WARNING)`."""
    root = logging.getLogger("sqlrl")
    if not any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        root.addHandler(_ConsoleHandler())
    root.setLevel(level)


class Terminated(KeyboardInterrupt):
    """SIGTERM during a command: it unwinds as Ctrl-C does (run folders left resumable, worker
    processes stopped by their context managers), and the command exits 143."""


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the block runs in the main thread, the first SIGTERM raises `Terminated` there (later ones
    are ignored, so the unwinding finishes); the previous handler is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console_logging()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from sqlrl.version import __version__

        print(f"sqlrl {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(unknown_command(name), file=sys.stderr)
        return 2
    target = COMMANDS[name][0]
    module_name, _, func_name = target.partition(":")
    module = importlib.import_module(module_name)
    handler = getattr(module, func_name or "cli_main")
    from sqlrl.artifacts import RunFolderError, RunFolderLocked
    from sqlrl.generation.hashing import ModelError

    try:
        with _sigterm_interrupts():
            return int(handler(rest) or 0)
    except (RunFolderLocked, RunFolderError, ModelError) as e:
        print(f"sqlrl {name}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from sqlrl.evaluation.progress import finish_line

        finish_line()  # the last progress state stays on the screen
        hint = resume_hint(name, rest)
        print(f"sqlrl {name}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
