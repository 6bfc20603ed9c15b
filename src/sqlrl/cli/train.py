"""`sqlrl train`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlrl.config import ConfigError
from sqlrl.generation.models import check_model
from sqlrl.training.checkpoint import CheckpointError
from sqlrl.training.trainer import train


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sqlrl train", description="GRPO training from a TOML run file.")
    p.add_argument("config", help="TOML run file, e.g. configs/quickstart.toml")
    p.add_argument("--out", help="run folder (default runs/<config stem>)")
    p.add_argument(
        "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last complete checkpoint"
    )
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
        help="override a config value, e.g. --set grpo.steps=5 (repeatable)",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument(
        "--engine",
        choices=["sqlrl", "verl"],
        default="sqlrl",
        help="sqlrl: this process (one machine); verl: write veRL's config + data into --out and launch "
        "veRL's main_ppo with sqlrl's agent loop and reward (needs the verl extra, see docs/verl.md)",
    )
    p.add_argument("--gpus-per-node", type=int, default=8, help="--engine verl: GPUs per node")
    p.add_argument("--nnodes", type=int, default=1, help="--engine verl: nodes (a Ray cluster when > 1)")
    p.add_argument(
        "--model-path", help="--engine verl: HF folder of the model for veRL (default: model.name)"
    )
    p.add_argument(
        "--attn-implementation",
        choices=["auto", "flash_attention_2", "sdpa", "eager"],
        default="auto",
        help="--engine verl: actor/ref attention (auto: flash_attention_2 if flash_attn imports, else sdpa)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="--engine verl: write everything, print the command"
    )
    a = p.parse_args(argv)
    from sqlrl import config as C
    from sqlrl.artifacts import dumps

    if a.engine == "verl":
        return _launch_verl(a)

    try:
        cfg = C.load(a.config, a.set)
    except ConfigError as e:
        print(f"sqlrl train: {e}", file=sys.stderr)
        return 2
    if a.print_config:
        print(dumps(cfg.resolve()))
        return 0
    check_model(cfg.model.name)  # before the run folder exists; ModelError -> one line, exit 2 (cli.main)
    out = a.resume or a.out or f"runs/{Path(a.config).stem}"
    try:
        res = train(
            cfg,
            out,
            resume=bool(a.resume),
            command=["sqlrl", "train", *argv],
            resume_from_valid=a.resume_from_valid,
        )
    except (ConfigError, ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"sqlrl train: {e}", file=sys.stderr)
        return 2
    print(
        f"trained {res['steps']} steps -> {out}"
        + (f" (final: {res.get('final_identity')})" if res.get("final") else "")
    )
    return 0


def _launch_verl(a) -> int:
    """`sqlrl train CONFIG --engine verl`: veRL's GRPO trainer (FSDP actor, vLLM rollout, Ray) with sqlrl's
    agent loop and reward, from the same TOML. sqlrl writes the validated config and the datasets into the
    run folder, then runs `python -m verl.trainer.main_ppo` there (veRL is never vendored or re-implemented)."""
    import subprocess

    from sqlrl.artifacts import lock_run_folder
    from sqlrl.cli.verl_config import cli_main as verl_config_main

    out = Path(a.out or f"runs/{Path(a.config).stem}-verl").resolve()
    args = [
        a.config,
        "-o",
        str(out / "verl.yaml"),
        "--write-data",
        str(out / "data"),
        "--gpus-per-node",
        str(a.gpus_per_node),
        "--nnodes",
        str(a.nnodes),
        "--checkpoint-dir",
        str(out / "checkpoints"),
        "--attn-implementation",
        a.attn_implementation,
    ]
    for ov in a.set:
        args += ["--set", ov]
    if a.model_path:
        args += ["--model-path", a.model_path]
    with lock_run_folder(out):  # veRL writes the run folder; RunFolderLocked -> exit 2 (cli.main)
        rc = verl_config_main(args)
        if rc != 0:
            return rc
        cmd = [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            "--config-path",
            str(out),
            "--config-name",
            "verl",
        ]
        print("sqlrl train --engine verl: " + " ".join(cmd))
        if a.dry_run:
            return 0
        return subprocess.call(cmd, cwd=out)
