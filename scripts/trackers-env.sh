#!/usr/bin/env bash
# Create .venv-trackers: a SEPARATE virtual environment with the W&B and SwanLab clients, to test the
# trainer's metric sinks against the real libraries (offline: no account, no network call). They do not
# go into the main .venv: wandb 0.31 needs protobuf < 7, which conflicts with the pins in constraints.txt.
#
#   scripts/trackers-env.sh            # create / update .venv-trackers
#   scripts/trackers-env.sh --test     # ... then run tests/integrations/test_trackers.py in it
#
# What is installed: wandb==0.31.0 and swanlab==0.10.3 with their declared requirements, then sqlrl
# itself editable with --no-deps (the metric sinks need no torch) plus pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv-trackers}
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip >/dev/null
"${PIP[@]}" install -q "wandb==0.31.0" "swanlab==0.10.3" pytest pytest-timeout
"${PIP[@]}" install -q --no-deps -e .
end=$(date +%s)
echo "trackers-env: $VENV ready in $((end - start)) s, $(du -sh "$VENV" | cut -f1)"
"$VENV/bin/python" -c "import wandb, swanlab; print('wandb', wandb.__version__, 'swanlab', swanlab.__version__)"
if [ "${1:-}" = "--test" ]; then
  "$VENV/bin/python" -m pytest -q tests/integrations/test_trackers.py -p no:cacheprovider
fi
