"""`sqlrl export`: a sqlrl or veRL FSDP checkpoint, or a run's final folder stored as a patch over its
base, to a plain Hugging Face folder with its identity."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sqlrl.training.checkpoint import SIDECAR, CheckpointError, load_latest, open_checkpoint
from sqlrl.training.export import export_hf, model_from_checkpoint
from sqlrl.training.fsdp_export import FSDPExportError, export_fsdp_checkpoint


def out_problem(source: str | Path, out: str | Path) -> str | None:
    """Why `out` may not receive an export of `source` (None when it may): a file or a symbolic link to
    nothing (`artifacts.check_out_path`, as for every run folder); the source itself, a folder inside it
    or one holding it; a folder with anything but an earlier export (its identity.json names a
    source_checkpoint; a run's final/ names none), which an export replaces whole."""
    from sqlrl.artifacts import RunFolderError, check_out_path, read_json

    try:
        check_out_path(out)
    except RunFolderError as e:
        return str(e)
    src, dst = Path(source).resolve(), Path(out).resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        return f"{out} is {source} or overlaps it: an export replaces its folder whole; pass -o a new folder"
    if dst.is_dir() and any(dst.iterdir()):
        try:
            ident = read_json(dst / "identity.json") if (dst / "identity.json").is_file() else None
            earlier = isinstance(ident, dict) and bool(ident.get("source_checkpoint"))
        except (OSError, ValueError):
            earlier = False
        if not earlier:
            return f"{out} is a folder that is not empty and not an earlier export; pass -o a new folder"
    return None


def _refuse(source: str, out: str) -> int | None:
    problem = out_problem(source, out)
    if problem is None:
        return None
    print(f"sqlrl export: {problem}", file=sys.stderr)
    return 2


def cli_main(argv: list[str]) -> int:
    """`sqlrl export CKPT -o HF_DIR [--base MODEL]`: a sqlrl checkpoint (or run folder, or a patch final
    folder) -> HF folder.
    A veRL FSDP checkpoint (or veRL run folder) is handed to `integrations.fsdp_export` instead."""
    first = next((a for a in argv if not a.startswith("-")), None)
    if first is not None:
        fsdp_cli = fsdp_main
        from sqlrl.training.fsdp_export import is_fsdp_checkpoint

        if is_fsdp_checkpoint(first):
            return fsdp_cli(argv)
    ap = argparse.ArgumentParser(
        prog="sqlrl export",
        description="Export a sqlrl checkpoint (a step_NNNNNN folder, or a run folder: its latest valid "
        "checkpoint), or a run's final/ folder (also one stored as a patch over its base), to Hugging Face format "
        "with identity.json (weights hash).",
    )
    ap.add_argument("checkpoint", help="checkpoint folder (step_NNNNNN) or run folder")
    ap.add_argument("-o", "--out", required=True, help="output Hugging Face folder")
    ap.add_argument("--base", help="base model (needed for LoRA checkpoints; tokenizer source otherwise)")
    ap.add_argument("--no-merge", action="store_true", help="LoRA: save the adapter only, do not merge")
    ap.add_argument("--no-verify", action="store_true", help="skip sha256 verification of checkpoint files")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if (refused := _refuse(args.checkpoint, args.out)) is not None:
        return refused
    path = Path(args.checkpoint)
    if (path / "identity.json").is_file() and not (path / SIDECAR).is_file():
        return _export_final(path, args.out)  # a run's final/: dense, a patch, or hashes of the base
    if args.base:
        from sqlrl.generation.models import check_model

        check_model(args.base)  # before anything is loaded or written; ModelError -> exit 2 (cli.main)
    try:
        if (path / SIDECAR).is_file():
            info = open_checkpoint(path, verify=not args.no_verify)
        else:
            info = load_latest(path, verify=not args.no_verify)
            if info is None:
                hint = f"; export its final weights with `sqlrl export {path / 'final'} -o DIR`"
                hint = hint if (path / "final" / "identity.json").is_file() else ""
                print(f"sqlrl export: no checkpoint in {path}{hint}", file=sys.stderr)
                return 2
        model, tokenizer = model_from_checkpoint(info, base=args.base)
        if tokenizer is None:
            print("sqlrl export: warning: no tokenizer (none in checkpoint, no --base)", file=sys.stderr)
        identity = export_hf(
            model,
            tokenizer,
            args.out,
            merge_lora=not args.no_merge,
            source_checkpoint=info.path.resolve(),
            step=info.step,
            source_weights_hash=info.weights_hash,
        )
    except CheckpointError as e:
        print(f"sqlrl export: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 -- unloadable base / unreadable files: report, exit 2
        print(f"sqlrl export: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(
        f"exported step {info.step} from {info.path} to {args.out}  weights_hash={identity['weights_hash']}"
    )
    return 0


def _export_final(path: Path, out: str) -> int:
    """A run's final folder (dense, a patch over its base, or the hashes of an unchanged base) -> a plain
    HF folder whose weights hash is the one the final folder records."""
    from sqlrl.artifacts import read_json
    from sqlrl.generation.models import load_model
    from sqlrl.training.export import final_weights

    recorded = read_json(path / "identity.json")
    try:
        loaded = load_model(final_weights(path))  # a patch: base hash and rebuilt hash checked
        if loaded.identity != recorded.get("weights_hash"):
            raise ValueError(
                f"{path} loads with weights hash {loaded.identity}, not the recorded "
                f"{recorded.get('weights_hash')}; its files or its base changed"
            )
        identity = export_hf(
            loaded.model,
            loaded.tokenizer,
            out,
            source_checkpoint=path.resolve(),
            step=recorded.get("step"),
            source_weights_hash=recorded["weights_hash"],
        )
    except Exception as e:  # noqa: BLE001 -- missing or changed base, unreadable files: report, exit 2
        print(f"sqlrl export: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    how = (
        f"a patch over {recorded.get('base')}"
        if recorded.get("weights_stored") == "patch"
        else "final weights"
    )
    print(f"exported {path} ({how}) to {out}  weights_hash={identity['weights_hash']}")
    return 0


def fsdp_main(argv: list[str] | None = None) -> int:
    """`sqlrl export FSDP_CKPT -o HF_DIR [--base-config DIR] [--dtype bfloat16]`."""
    ap = argparse.ArgumentParser(
        prog="sqlrl export",
        description="Export a veRL FSDP checkpoint (actor folder, global_step_N folder, or run folder: the "
        "latest step) to Hugging Face format with identity.json (weights hash).",
    )
    ap.add_argument("checkpoint", help="veRL checkpoint folder")
    ap.add_argument("-o", "--out", required=True, help="output Hugging Face folder")
    ap.add_argument(
        "--base-config", "--base", dest="base_config", help="config/tokenizer source if not saved"
    )
    ap.add_argument("--dtype", help="cast the weights (e.g. bfloat16); default: keep the saved dtype")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if (refused := _refuse(args.checkpoint, args.out)) is not None:
        return refused
    try:
        identity = export_fsdp_checkpoint(
            args.checkpoint, args.out, base_config=args.base_config, dtype=args.dtype
        )
    except FSDPExportError as e:
        print(f"sqlrl export: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 -- unreadable files, bad config: report, exit 2
        print(f"sqlrl export: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    f = identity["fsdp"]
    print(
        f"exported veRL FSDP{f['fsdp_version'] or ''} step {identity['step']} ({f['world_size']} shards) from "
        f"{f['actor_dir']} to {args.out}  weights_hash={identity['weights_hash']}"
    )
    return 0
