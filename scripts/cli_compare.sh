#!/usr/bin/env bash
# Before/after comparison of the `sqlrl` CLI's outputs (for refactors that must not change behaviour).
#
#   SQLRL_SRC=/path/to/src [PY=python] bash scripts/cli_compare.sh OUTDIR
#   diff /work/cmp-before/digest.txt /work/cmp-after/digest.txt
#
# Runs a fixed set of CLI commands, each in its own folder OUTDIR/NN-name/ (cwd of the command) with
# stdout, stderr, rc, cmd and wall_s, plus whatever files the command wrote there; then writes
# OUTDIR/digest.txt with scripts/cli_compare_normalize.py (times, dates, paths, versions removed).
# Depends only on the CLI hook `from sqlrl.cli import main` (the console-script target), never on
# module paths inside sqlrl. Needs the model smollm2-135m-instruct in the sqlrl cache
# (`sqlrl model fetch smollm2-135m-instruct`). CPU only; about 10-15 minutes on 2 cores.
#
# Env: SQLRL_SRC  source tree put first on PYTHONPATH (default: this repo's src/)
#      PY         python with sqlrl's dependencies (default: this repo's .venv/bin/python)
#      CMP_DATA   shared inputs: a copy of the embedded Spider demo + the tiny TOMLs (default /work/cmp-data)
#      CMP_RESULTS  results folder for `report --check` / `seeds` (default: this repo's results/)
#      SKIP_HEAVY=1 skip eval/train/experiment (quick determinism checks)
#      START_AT=NAME keep OUTDIR's steps before the one named NAME (e.g. experiment-tiny) and run from it
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: SQLRL_SRC=SRC [PY=python] $0 OUTDIR" >&2; exit 2; }
OUT=$(realpath -m "$1")
SRC=$(realpath "${SQLRL_SRC:-$here/src}")
PY=${PY:-$here/.venv/bin/python}
DATA=${CMP_DATA:-/work/cmp-data}
RESULTS=$(realpath "${CMP_RESULTS:-$here/results}")
NORMALIZE="$here/scripts/cli_compare_normalize.py"
export PYTHONPATH="$SRC" COLUMNS=100 PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false TZ=UTC LC_ALL=C.UTF-8
export CUDA_VISIBLE_DEVICES=""

if [ -z "${START_AT:-}" ] && [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "$OUT exists and is not empty; use a fresh folder" >&2
  exit 2
fi
mkdir -p "$OUT" "$DATA"

imported=$("$PY" -c 'import sqlrl, os; print(os.path.dirname(os.path.dirname(os.path.realpath(sqlrl.__file__))))')
if [ "$imported" != "$SRC" ]; then
  echo "sqlrl is imported from $imported, not $SRC" >&2
  exit 2
fi
{
  echo "src=$SRC"; echo "py=$PY"; echo "data=$DATA"; echo "results=$RESULTS"
  echo "git=$(git -C "$SRC" rev-parse HEAD 2>/dev/null) dirty=$(git -C "$SRC" status --porcelain 2>/dev/null | wc -l)"
  echo "started=$(date -u +%FT%TZ)"
} >"$OUT/env.txt"

# The demo data as a plain folder at a path that is the same for both runs.
if [ ! -f "$DATA/spider_demo/train_spider.json" ]; then
  emb=$("$PY" -c 'from sqlrl.data import embedded_root; print(embedded_root())' 2>/dev/null) ||
    emb="$SRC/sqlrl/embedded/spider_demo"
  cp -r "$emb" "$DATA/spider_demo"
fi
DEMO="$DATA/spider_demo"
DB="$DEMO/database/activity_1/activity_1.sqlite"

# Tiny run files (rewritten each time with the same content).
cat >"$DATA/tiny.toml" <<'EOF'
# cli_compare.sh: tiny `sqlrl train` run (SmolLM2-135M, CPU, 2 steps); validity reward so that
# some group has reward variance and the weights really change.
[model]
name = "smollm2-135m-instruct"

[data]
path = "embedded"
train_split = "train"
eval_split = "validation"
max_train_tasks = 8
max_eval_tasks = 4

[agent]
turns = 1
max_new_tokens = 64
max_schema_chars = 1000
max_context_tokens = 1024

[grpo]
steps = 2
prompts_per_step = 3
group_size = 4
lr = 1e-5
micro_batch = 2
temperature = 0.7
reward = "validity"

[run]
seed = 0
device = "cpu"
checkpoint_every = 1
keep_checkpoints = 1
prune_checkpoints_at_end = true
loggers = []
EOF
cat >"$DATA/tiny-exp.toml" <<'EOF'
# cli_compare.sh: tiny `sqlrl experiment` (all four arms, SmolLM2-135M, CPU, 2 steps each).
[experiment]
name = "cmp-tiny"
arms = ["base", "grpo", "no_update", "validity"]
turns = [1]
leakage_tasks = 2
smoke = true

[model]
name = "smollm2-135m-instruct"

[data]
path = "embedded"
train_split = "train"
eval_split = "validation"
max_train_tasks = 8
max_eval_tasks = 4

[agent]
turns = 1
max_new_tokens = 64
max_schema_chars = 1000
max_context_tokens = 1024

[grpo]
steps = 2
prompts_per_step = 2
group_size = 4
lr = 1e-5
micro_batch = 2
temperature = 0.7

[run]
seed = 0
device = "cpu"
checkpoint_every = 1
keep_checkpoints = 1
prune_checkpoints_at_end = true
loggers = []
EOF

n=0
# run NAME ARGS... : one CLI call in OUT/NN-NAME (its cwd)
run() {
  local name=$1; shift
  n=$((n + 1))
  local d; d="$OUT/$(printf '%02d' "$n")-$name"
  if [ -n "${START_AT:-}" ]; then  # resume an interrupted capture: keep the steps before START_AT
    [ "$name" = "$START_AT" ] && START_AT= || return 0
    rm -rf "$d"
  fi
  mkdir -p "$d"
  printf '%q ' sqlrl "$@" >"$d/cmd"
  local t0; t0=$(date +%s.%N)
  (cd "$d" && "$PY" -c 'import sys; from sqlrl.cli import main; sys.exit(main())' "$@" >stdout 2>stderr </dev/null)
  echo $? >"$d/rc"
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f\n", b-a}' >"$d/wall_s"
  printf '%-40s rc=%s %ss\n' "$(basename "$d")" "$(cat "$d/rc")" "$(cut -c1-6 "$d/wall_s")" >&2
}

# --- command surface
run help --help
run unknown-command no-such-command
for c in quickstart sql reward data model eval audit train sft curriculum experiment report seeds export verl-config; do
  run "help-$c" "$c" --help
done
for c in "data audit" "data split" "model fetch" "model info" "model list" "audit weights" "audit leakage"; do
  # shellcheck disable=SC2086
  run "help-${c// /-}" $c --help
done

# --- sql / reward (cheap, no model)
run sql-ok sql --db "$DB" --json "SELECT count(*) FROM Faculty"
run sql-rows sql --db "$DB" --json "SELECT rank, count(*) FROM Faculty GROUP BY rank ORDER BY rank"
run sql-text sql --db "$DB" --show-rows 3 "SELECT FacID, Lname FROM Faculty ORDER BY FacID"
run sql-error sql --db "$DB" --json "SELECT nope FROM Faculty"
run sql-syntax sql --db "$DB" --json "SELEC 1"
run sql-forbidden sql --db "$DB" --json "DELETE FROM Faculty"
run sql-forbidden-attach sql --db "$DB" --json "ATTACH DATABASE 'x.db' AS x"
run sql-two-statements sql --db "$DB" --json "SELECT 1; SELECT 2"
run sql-maxrows sql --db "$DB" --json --max-rows 5 "SELECT * FROM Faculty"
run sql-missing-db sql --db "$DATA/no-such.sqlite" --json "SELECT 1"
run reward-match reward --db "$DB" --json --gold "SELECT count(*) FROM Faculty" --pred "SELECT COUNT(*) FROM faculty"
run reward-match-order reward --db "$DB" --json --gold "SELECT Lname FROM Faculty ORDER BY Lname" --pred "SELECT Lname FROM Faculty ORDER BY Lname"
run reward-mismatch reward --db "$DB" --json --gold "SELECT count(*) FROM Faculty" --pred "SELECT count(*) FROM Student"
run reward-error reward --db "$DB" --json --gold "SELECT count(*) FROM Faculty" --pred "SELECT nope FROM Faculty"
run reward-empty reward --db "$DB" --json --gold "SELECT count(*) FROM Faculty" --pred ""
run reward-validity reward --db "$DB" --json --kind validity --gold "SELECT count(*) FROM Faculty" --pred "SELECT count(*) FROM Student"
run reward-text reward --db "$DB" --gold "SELECT count(*) FROM Faculty" --pred "SELECT count(*) FROM Faculty"

# --- data
run data-audit-embedded data audit --json
run data-audit-folder data audit --data "$DEMO" --json
run data-audit-validation data audit --data "$DEMO" --split validation --json --per-task
run data-audit-text data audit --data "$DEMO"
run data-split-embedded data split --json
run data-split-folder data split --data "$DEMO" --json --seed 1 --val-fraction 0.25
run data-split-text data split --data "$DEMO"
run model-list model list
run model-info model info smollm2-135m-instruct
run train-print-config train "$DATA/tiny.toml" --print-config
run train-bad-config train "$DATA/no-such.toml"

# --- committed results: report --check on every folder (and seed sub-folders), seeds
for d in "$RESULTS"/*/ "$RESULTS"/*/seed*/; do
  [ -d "$d" ] || continue
  rel=${d#"$RESULTS"/}; rel=${rel%/}
  run "check-${rel//\//--}" report --check "$d"
done
run seeds-0.5b-3 seeds --out seeds-out "$RESULTS/2026-11-29-spider-0.5b-single-turn-v3" \
  "$RESULTS/2026-11-29-spider-0.5b-single-turn-seeds/seed1" "$RESULTS/2026-11-29-spider-0.5b-single-turn-seeds/seed2"
run seeds-0.5b-4 seeds --out seeds-out "$RESULTS/2026-11-29-spider-0.5b-single-turn-v3" \
  "$RESULTS/2026-11-29-spider-0.5b-single-turn-seeds/seed1" "$RESULTS/2026-11-29-spider-0.5b-single-turn-seeds/seed2" \
  "$RESULTS/2026-12-01-spider-0.5b-single-turn-seed3"
run seeds-quickstart-cpu seeds --out seeds-out "$RESULTS/2026-11-29-quickstart-seeds-cpu/seed0" \
  "$RESULTS/2026-11-29-quickstart-seeds-cpu/seed1"
run report-v3-rewrite report --out report-out "$RESULTS/2026-11-29-spider-0.5b-single-turn-v3"

# --- model runs (heavy; one at a time)
if [ "${SKIP_HEAVY:-0}" != 1 ]; then
  run eval-smollm2 eval --model smollm2-135m-instruct --data "$DEMO" --split validation --limit 8 \
    --device cpu --out run
  run train-tiny train "$DATA/tiny.toml" --out run
  run experiment-tiny experiment "$DATA/tiny-exp.toml" --out exp
  exp_dir=$(ls -d "$OUT"/*-experiment-tiny/exp)
  run report-tiny-check report --check "$exp_dir"
  run report-tiny report --out report-out "$exp_dir"
fi

echo "finished=$(date -u +%FT%TZ)" >>"$OUT/env.txt"
"$PY" "$NORMALIZE" "$OUT" "--sub=$SRC=<SRC>" "--sub=$DATA=<DATA>" "--sub=$RESULTS=<RESULTS>" \
  "--sub=$(dirname "$SRC")=<REPO>" "--sub=$HOME=<HOME>" >"$OUT/digest.txt"
echo "digest: $OUT/digest.txt ($(wc -l <"$OUT/digest.txt") lines)" >&2
