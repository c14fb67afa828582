#!/usr/bin/env bash
# The one command that exercises glassbox's GPU-only paths on your GPU host (docs/gpu-check.md).
#
#   scripts/gpu-check.sh [--model DIR] [--json PATH] [--cpu-rehearsal] [--skip-pytest] [--skip-serve] [--oom]
#
# Runs from the repository root without installing anything (PYTHONPATH=.pythonpath:.; .pythonpath/glassbox/ links the
# folders as the glassbox packages). When out/gpu-carry/ travelled
# with the tree (`python -m benchmarks.gpu_check prepare-carry`), its fp16 model is checked by default and its
# pytest bundle is used if this machine has no pytest, and its wheels (--serve-deps) by the end-to-end server check.
# Writes $OUT/gpu-check.json when OUT is set; its "checks" name every check with its status.
# Exit codes: 0 passed, 1 a check failed, 2 no CUDA device, 124 the time limit below was hit.
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/gpu-common.sh  # CARRY, py
LIMIT_S=${GPU_CHECK_LIMIT_S:-420}  # 7 minutes by default; GPU_CHECK_LIMIT_S=0 runs without a limit

export PYTHONPATH="$PWD/.pythonpath:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c 'import pytest' 2>/dev/null && [[ -f $CARRY/pydeps.zip ]]; then
    export PYTHONPATH="$PYTHONPATH:$CARRY/pydeps.zip"
    echo "gpu-check: using the carried pytest bundle $CARRY/pydeps.zip"
fi

args=("$@")
given_model=no
for arg in "$@"; do
    [[ $arg == --model || $arg == --model=* ]] && given_model=yes
done
if [[ $given_model == no && -f $CARRY/model/model.safetensors ]]; then
    args+=(--model "$CARRY/model")
    echo "gpu-check: checking the carried model $CARRY/model"
fi

# -k: if the check ignores the polite signal, stop it for good shortly after.
exec timeout -k 10 "$LIMIT_S" "$py" -m benchmarks.gpu_check "${args[@]}"
