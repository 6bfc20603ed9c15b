#!/usr/bin/env bash
# Create .venv-agl: a SEPARATE virtual environment for the optional Agent Lightning integration
# (src/sqlrl/integrations/agl.py). Agent Lightning 1.0.x needs Python >= 3.12; this targets 0.3.x,
# which runs on Python 3.11, and pulls heavy dependencies (litellm[proxy], agentops, opentelemetry)
# that sqlrl's main venv should not carry.
#
#   scripts/agl-env.sh            # create / update .venv-agl
#   scripts/agl-env.sh --test     # ... then run tests/integrations/test_agl_contract.py in it
#
# What is installed: agentlightning==0.3.0 with its declared requirements (no torch, no vLLM, no veRL),
# then sqlrl itself editable with --no-deps plus what the agent, prompts and reward need (sqlglot,
# numpy, tqdm, transformers + tokenizers for the chat template; no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv-agl}
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip >/dev/null
"${PIP[@]}" install -q "agentlightning==0.3.0"
"${PIP[@]}" install -q --no-deps -e .
"${PIP[@]}" install -q sqlglot "numpy>=1.26" tqdm "transformers>=5.0,<6" tokenizers pytest pytest-timeout
end=$(date +%s)
echo "agl-env: $VENV ready in $((end - start)) s, $(du -sh "$VENV" | cut -f1)"
LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "import agentlightning as agl; print('agentlightning', agl.__version__)"
if [ "${1:-}" = "--test" ]; then
  "$VENV/bin/python" -m pytest -q tests/integrations/test_agl_contract.py -p no:cacheprovider
fi
