#!/usr/bin/env bash
# Headless Chromium for the one test that renders the HTML report (tests/evidence/test_report.py).
# Run by scripts/test.sh. Changes nothing on the system unless asked: with a chromium on PATH it does
# nothing; without one it says that the rendering test will be skipped and how to get it, and exits 0.
# SQLRL_INSTALL_CHROMIUM=1 installs the Debian package system-wide with apt-get (root only; CI does this).
set -uo pipefail
for name in chromium chromium-browser google-chrome google-chrome-stable chrome; do
  if command -v "$name" >/dev/null 2>&1; then exit 0; fi
done
if [ "${SQLRL_INSTALL_CHROMIUM:-0}" = 1 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium: SQLRL_INSTALL_CHROMIUM=1 needs root and apt-get; install chromium yourself (the report rendering test is skipped)" >&2
    exit 0
  fi
  echo "chromium: installing the Debian package system-wide (apt-get, SQLRL_INSTALL_CHROMIUM=1)" >&2
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); then
    exit 0
  fi
  echo "chromium: apt-get install chromium failed; the report rendering test is skipped" >&2
  exit 0
fi
echo "chromium: none on PATH, so the report rendering test is skipped; to run it, install chromium (e.g. sudo apt-get install chromium) or rerun with SQLRL_INSTALL_CHROMIUM=1 as root" >&2
