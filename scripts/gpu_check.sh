#!/usr/bin/env bash
# The GPU checks of docs/gpu.md in one pass, each step bounded so that one hang cannot eat the rest:
#   1. the nccl code paths agree with a plain run (benchmarks/nccl_paths.py);
#   2. the test suite with the GPU visible (pytest-xdist and pytest-timeout);
#   3. the full-size recipes take real steps (benchmarks/recipe_steps.py);
#   4. the EMA update against timm's and torch's (benchmarks/run.py).
# Logs go to $OUT (default gpu-check/). Run from the repository root on a CUDA machine whose python3 has
# torch, torchvision, timm, typer>=0.29 (with its pydantic and annotated-doc), rich, pyyaml, scikit-learn,
# pytest, soundfile, jiwer, espeakng-loader, kornia and kornia-rs (the image recipes' views; `python3 -m pip
# install --no-deps WHEELS` adds missing ones to that python, but only the wheels given); PYTHONPATH may add
# the rest.
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
step() {  # step SECONDS LOG CMD...: run CMD bounded, its output to LOG and (the tail) to the terminal; 0 skips it
    local limit=$1 log=$2; shift 2
    if [ "$limit" = 0 ]; then echo "== skipped: $*"; return; fi
    echo "== $* (at most ${limit} s)"
    timeout "$limit" "$@" >"$OUT/$log" 2>&1
    echo "== exit $? after $SECONDS s in all"
    tail -n "${TAIL:-25}" "$OUT/$log"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, torch.cuda.get_device_name())"
  nproc; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step "${NCCL_S:-50}" nccl.txt $PY benchmarks/nccl_paths.py polyak-r50 --preset tiny
step "${TEST_S:-300}" tests.txt $PY -m pytest -o addopts= -v --tb=short -n "${JOBS:-14}" -p no:cacheprovider --timeout 100 -rfE tests
step "${RECIPE_S:-300}" recipes.txt $PY benchmarks/recipe_steps.py ${RECIPE_ARGS:-} --json "$OUT/recipes.json"
step "${BENCH_S:-40}" bench.txt $PY benchmarks/run.py
