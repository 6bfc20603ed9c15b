#!/usr/bin/env bash
# Create .venv-verl: a SEPARATE virtual environment for the optional veRL integration
# (src/sqlrl/integrations/verl/). veRL 0.8.0 pins numpy<2, so it cannot share .venv (numpy 2.x).
#
#   scripts/verl-env.sh            # create / update .venv-verl (CPU torch, no vLLM)
#   scripts/verl-env.sh --test     # ... then run the contract tests in it
#
# What is installed: torch==2.13.0 (the CPU wheel; a looser pin pulls a multi-GB CUDA build), veRL 0.8.0
# with its requirements resolved against constraints-verl.txt (exact pins of a working set), then sqlrl
# itself editable with --no-deps plus the few small deps it needs. vLLM is NOT installed: the contract
# tests drive the agent loop with a fake token-level server. On a GPU cluster install vLLM / SGLang
# from veRL's own instructions instead of this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv-verl}
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip >/dev/null
# 1. CPU torch first, so nothing later resolves to a CUDA build.
"${PIP[@]}" install -q "torch==2.13.0"
# 2. veRL and its requirements, pinned to a set known to install and import together.
#    cachetools, uvicorn and fastapi are imported by veRL's agent loop but not declared by the wheel.
"${PIP[@]}" install -q -c constraints-verl.txt "torch==2.13.0+cpu" "verl==0.8.0" cachetools uvicorn fastapi
# 3. sqlrl itself, editable, without its [train] extra (numpy>=2 pins elsewhere do not apply here).
"${PIP[@]}" install -q --no-deps -e .
"${PIP[@]}" install -q -c constraints-verl.txt sqlglot tqdm safetensors gguf pytest pytest-timeout
"${PIP[@]}" check
end=$(date +%s)
echo "verl-env: $VENV ready in $((end - start)) s, $(du -sh "$VENV" | cut -f1)"
"$VENV/bin/python" -c "import verl, torch, numpy; print('verl', verl.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
if [ "${1:-}" = "--test" ]; then
  "$VENV/bin/python" -m pytest -q tests/integrations/test_verl_contract.py tests/training/test_fsdp_export.py tests/integrations/test_verl_launch.py -p no:cacheprovider
fi
