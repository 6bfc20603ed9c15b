"""`sqlrl sft`: supervised fine-tuning on training references (text-to-SQL golds or debugging tasks)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlrl.config import ConfigError
from sqlrl.generation.models import check_model
from sqlrl.training.checkpoint import CheckpointError
from sqlrl.training.sft import train_sft


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sqlrl sft",
        description="Supervised fine-tuning on training references in the agent's single-turn answer format: "
        'text-to-SQL golds ([data] kind = "text2sql") or debugging-task solutions (kind = "debug"); '
        "the [sft] table sets steps, batch size, learning rate.",
    )
    p.add_argument(
        "config", help="TOML run file, e.g. configs/spider-0.5b-gpu-sft.toml or configs/debug-curriculum.toml"
    )
    p.add_argument("--out", help="run folder (default runs/<config stem>-sft)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument(
        "--resume-from-valid",
        action="store_true",
        help="with --resume: if the newest checkpoint is corrupt, resume from the newest valid older one",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable)",
    )
    a = p.parse_args(argv)
    from sqlrl import config as C
    from sqlrl import config_tables as T

    try:
        raw = C.read_raw(a.config, a.set)
        sft = T.sft_from_dict(raw.pop("sft", {}), source=a.config)
        for table in C.COMMAND_TABLES:
            raw.pop(table, None)
        cfg = C.from_dict(raw, source=a.config)
        if cfg.agent.turns != 1:  # the warm start is single-turn whatever the file's RL turns are
            cfg = cfg.replace(agent={"turns": 1})
        check_model(cfg.model.name)  # before the run folder exists
        out = a.resume or a.out or f"runs/{Path(a.config).stem}-sft"
        res = train_sft(
            cfg,
            sft,
            out,
            resume=bool(a.resume),
            command=["sqlrl", "sft", *argv],
            resume_from_valid=a.resume_from_valid,
        )
    except (ConfigError, ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"sqlrl sft: {e}", file=sys.stderr)
        return 2
    print(
        f"sft {res['steps']} steps -> {out}"
        + (
            f" (final: {res.get('final_identity')}, weights changed: {res.get('weights_changed')})"
            if res.get("final")
            else ""
        )
    )
    return 0
