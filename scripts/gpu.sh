#!/usr/bin/env bash
# How the model and data reach the GPU machine, and the GPU runs, exactly as executed for results/.
# The device machine has no network: the Qwen GGUF travels as 50 MiB parts (carried one per call into
# a scratch folder outside the checkout), Spider as a .tgz, missing wheels (gguf, sqlglot) from .whl/.
#   here:  bash ../shared/tools/parts.sh split qwen.gguf .stage/q50 50M   (part + tree must fit 64 MiB)
#          git archive --format=tar.gz -o .stage/tree.tgz HEAD   (run committed code only, see below)
#          tar czf .stage/spider.tgz -C ../shared/data spider
#          pip download --no-deps --python-version 3.12 ... -d .whl gguf==0.19.0 sqlglot==30.30.0
#   there: bash scripts/gpu.sh stage 00   (carry .stage/q50/part00)   ... one call per part
#          bash scripts/gpu.sh setup      (carry last part, MANIFEST, spider.tgz, .whl)
#          bash scripts/gpu.sh bench | engine BENCH.json | experiment SECONDS | pack DIR [EXPDIRS]
set -euo pipefail
S=${SQLRL_SCRATCH:-/root/sqlrl-scratch}
mkdir -p "$S/parts"
export SQLRL_CACHE=$S/models PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cmd=$1; shift
case "$cmd" in
  stage)
    for n in "$@"; do cp ".stage/q50/part$n" "$S/parts/"; done
    ls -la "$S/parts" | tail -n +2 | awk '{s+=$5} END {print "staged bytes:", s}' ;;
  setup)
    cp .stage/q50/part* .stage/q50/MANIFEST "$S/parts/" 2>/dev/null || true
    cat "$S"/parts/part* > "$S/qwen.gguf"
    want=$(awk '$1=="sha256"{print $2}' "$S/parts/MANIFEST"); got=$(sha256sum "$S/qwen.gguf" | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "sha256 mismatch: want $want got $got" >&2; exit 1; }
    echo "gguf ok $got"; rm -rf "$S/parts"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    tar xzf .stage/spider.tgz -C "$S"
    python3 -m sqlrl.cli model fetch qwen2.5-coder-0.5b-instruct --gguf "$S/qwen.gguf"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv ;;
  tree)
    # unpack the committed tree (.stage/tree.tgz) into $S/tree with the staged data beside it; later
    # calls then run `cd $S/tree && bash scripts/gpu.sh ...`, so uncommitted edits never reach a run
    mkdir -p "$S/tree/.stage" && tar xzf .stage/tree.tgz -C "$S/tree"
    cp .stage/spider.tgz "$S/tree/.stage/" && cp -r .whl "$S/tree/" && echo "tree ready: $S/tree" ;;
  bench)
    python3 bench/bench_generate.py --model qwen2.5-coder-0.5b-instruct --prompts-from "$S/spider" --split train_spider "$@" ;;
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
    python3 -m sqlrl.cli experiment configs/spider-0.5b-gpu.toml --out "$S/${EXP:-exp}" \
      --set "data.path=\"$S/spider\"" --time-budget "$budget" "$@" ;;
  pack)
    dest=$1; shift
    dirs=${*:-exp}
    tar czf "$dest/exp.tgz" -C "$S" --exclude='*.safetensors' --exclude='*.pt' --exclude='.goldcache' \
      --exclude='.gold_real' --exclude='.gold_mutated' --exclude='tokenizer.json' $dirs
    ls -la "$dest" ;;
  *) echo "usage: gpu.sh stage NN|tree|setup|bench|engine BENCH.json|experiment SECONDS|pack DIR [EXPDIRS]" >&2; exit 2 ;;
esac
