#!/usr/bin/env bash
# veRL environments, both from the versions in scripts/verl-gpu.lock (veRL 0.9.1, vLLM 0.24.0, Ray 2.60.0,
# transformers 5.9.0; scripts/verl-gpu.in says why).
#
# Here, a CPU venv for the contract tests (.venv-verl; veRL's transformers<5.11 pin keeps it out of .venv):
#   scripts/verl-env.sh            # create / update .venv-verl (CPU torch, no vLLM)
#   scripts/verl-env.sh --test     # ... then run the contract tests in it
# It installs torch==2.13.0 (the CPU wheel; a looser pin pulls a multi-GB CUDA build), veRL and transformers
# at the lock's versions with the rest pinned by constraints-verl.txt, then sqlrl editable with --no-deps
# plus the few small deps it needs. vLLM is not installed: the contract tests use a fake token-level server.
#
# The GPU machine (no network; every call carries the working tree plus at most 64 MiB in all):
#   here:  scripts/verl-env.sh --gpu-fetch DIR               # download the lock's files into DIR (outside
#                                                             # the repo), check bytes + sha256
#          scripts/verl-env.sh --gpu-pack DIR OUT [SIZE]      # tar them, split into OUT/partNN of SIZE (18M)
#                                                             # + OUT/MANIFEST (sha256 of the tar and the lock)
#   there: scripts/verl-env.sh --gpu-install PARTS TARGET     # join PARTS/part*, check, pip install --target
# VERL_GPU_EXTRA=1 adds the lock's extra rows (kernel packages for paths the run does not take, ~1 GB).
# scripts/gpu.sh verl stage|install|preflight wraps these for the device calls; docs/verl.md, "GPU environment".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOCK=${VERL_LOCK:-scripts/verl-gpu.lock}
extra=(); [ "${VERL_GPU_EXTRA:-0}" = 1 ] && extra=(--extra)
lock() { "$PY" scripts/verl_lock.py "$@"; }
die() { echo "verl-env: $*" >&2; exit 2; }

gpu_pack() {  # DIR OUT [SIZE]
  local dir=$1 out=$2 size=${3:-18M} tar
  lock check "$LOCK" "$dir" ${extra[@]+"${extra[@]}"} || die "the files in $dir do not match $LOCK (scripts/verl-env.sh --gpu-fetch $dir)"
  mkdir -p "$out"; rm -f "$out"/part* "$out/MANIFEST"
  tar=$(mktemp -d)/verl-wheels.tar
  # a fixed member order, owner and time: the same files give the same archive
  lock files "$LOCK" ${extra[@]+"${extra[@]}"} > "$tar.list"
  tar -cf "$tar" -C "$dir" --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -T "$tar.list"
  split -b "$size" -d -a 2 "$tar" "$out/part"
  { echo "name verl-wheels.tar"; echo "bytes $(stat -c %s "$tar")"; echo "sha256 $(sha256sum "$tar" | cut -d' ' -f1)"
    echo "parts $(ls "$out"/part* | wc -l)"; echo "lock $(sha256sum "$LOCK" | cut -d' ' -f1)"
    echo "extra ${VERL_GPU_EXTRA:-0}"; } > "$out/MANIFEST"
  rm -rf "$(dirname "$tar")"
  cat "$out/MANIFEST"
}

gpu_install() {  # PARTS TARGET
  local parts=$1 target=$2 want got work n
  [ -s "$parts/MANIFEST" ] || die "$parts/MANIFEST missing (carry it with the last part)"
  n=$(awk '$1=="parts"{print $2}' "$parts/MANIFEST")
  [ "$(ls "$parts"/part* 2>/dev/null | wc -l)" = "$n" ] || die "$parts holds $(ls "$parts"/part* 2>/dev/null | wc -l) of $n parts: stage the missing ones"
  want=$(awk '$1=="lock"{print $2}' "$parts/MANIFEST"); got=$(sha256sum "$LOCK" | cut -d' ' -f1)
  [ "$want" = "$got" ] || die "the parts were packed from another lock ($want), this tree's $LOCK is $got: re-pack"
  [ "$(awk '$1=="extra"{print $2}' "$parts/MANIFEST")" = "${VERL_GPU_EXTRA:-0}" ] || die "the parts were packed with VERL_GPU_EXTRA=$(awk '$1=="extra"{print $2}' "$parts/MANIFEST"): set the same here"
  work=$(mktemp -d); cat "$parts"/part* > "$work/verl-wheels.tar"
  want=$(awk '$1=="sha256"{print $2}' "$parts/MANIFEST"); got=$(sha256sum "$work/verl-wheels.tar" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { rm -rf "$work"; echo "verl-env: joined parts give sha256 $got, MANIFEST says $want" >&2; exit 1; }
  mkdir "$work/w" && tar -xf "$work/verl-wheels.tar" -C "$work/w" && rm "$work/verl-wheels.tar"
  lock check "$LOCK" "$work/w" ${extra[@]+"${extra[@]}"} || { rm -rf "$work"; exit 1; }
  mkdir -p "$target"; target=$(cd "$target" && pwd)
  mapfile -t files < <(lock files "$LOCK" ${extra[@]+"${extra[@]}"})
  # --no-deps: exactly the lock's files; --no-build-isolation: a source archive builds with the machine's setuptools
  (cd "$work/w" && "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation \
    --upgrade --target "$target" "${files[@]}")
  rm -rf "$work"
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
  lock device "$LOCK" || die "a package the lock expects from this machine is missing (see above)"
  local checked unmet; checked=$("$PY" -m pip check 2>&1 || true)
  # VERL_ALLOW_UNMET=1: report them and go on (the files are installed by then)
  unmet=$(printf '%s\n' "$checked" | lock pipcheck "$LOCK") || {
    echo "verl-env: unmet requirements of the set (not overrides of the lock):" >&2; echo "$unmet" >&2
    [ "${VERL_ALLOW_UNMET:-0}" = 1 ] || exit 1; }
  # the modules the run imports (VERL_IMPORT_CHECK: another list, e.g. in tests)
  "$PY" -c "import importlib, sys
for m in sys.argv[1:]:
    mod = importlib.import_module(m); print(m, getattr(mod, '__version__', ''))" ${VERL_IMPORT_CHECK:-verl vllm ray transformers torch}
  echo "verl-env: installed ${#files[@]} files into $target; run with PYTHONPATH=$target:..."
}

case "${1:-}" in
  --gpu-fetch) [ $# = 2 ] || die "usage: --gpu-fetch DIR"; lock fetch "$LOCK" "$2" ${extra[@]+"${extra[@]}"}; exit $? ;;
  --gpu-pack) [ $# -ge 3 ] || die "usage: --gpu-pack DIR OUT [SIZE]"; gpu_pack "$2" "$3" "${4:-18M}"; exit 0 ;;
  --gpu-install) [ $# = 3 ] || die "usage: --gpu-install PARTS TARGET"; gpu_install "$2" "$3"; exit 0 ;;
  ""|--test) ;;
  *) die "unknown option $1; use --test, --gpu-fetch DIR, --gpu-pack DIR OUT [SIZE] or --gpu-install PARTS TARGET" ;;
esac

VENV=${VENV:-.venv-verl}
VERL=$(lock version "$LOCK" verl); TRANSFORMERS=$(lock version "$LOCK" transformers)
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip >/dev/null
# 1. CPU torch first, so nothing later resolves to a CUDA build.
"${PIP[@]}" install -q "torch==2.13.0"
# 2. veRL and transformers at the lock's versions, the rest pinned to a set known to install together.
#    cachetools, uvicorn and fastapi are imported by veRL's agent loop but declared only in its verl-core extra.
"${PIP[@]}" install -q -c constraints-verl.txt "torch==2.13.0+cpu" "verl==$VERL" "transformers==$TRANSFORMERS" \
  cachetools uvicorn fastapi
# 3. sqlrl itself, editable, without its [train] extra (its transformers pin elsewhere does not apply here).
"${PIP[@]}" install -q --no-deps -e .
"${PIP[@]}" install -q -c constraints-verl.txt sqlglot tqdm safetensors gguf pytest pytest-timeout
"${PIP[@]}" check
end=$(date +%s)
echo "verl-env: $VENV ready in $((end - start)) s, $(du -sh "$VENV" | cut -f1)"
"$VENV/bin/python" -c "import verl, torch, numpy, transformers; print('verl', verl.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__, 'transformers', transformers.__version__)"
if [ "${1:-}" = "--test" ]; then
  "$VENV/bin/python" -m pytest -q tests/integrations/test_verl_contract.py tests/training/test_fsdp_export.py tests/integrations/test_verl_launch.py \
    tests/integrations/test_verl_gpu_env.py tests/integrations/test_verl_ray_nodes.py tests/test_slurm_example.py \
    -p no:cacheprovider
fi
