#!/usr/bin/env bash
# Serving on a GPU host (docs/gpu-check.md, "Serving on a GPU host"): requests per second against the number of HTTP
# worker processes, on the null engine and on the model, and the server against its own GPU engine run offline.
#
#   scripts/gpu-serving.sh [--cpu-rehearsal]
#
# Runs from the repository root without installing anything (PYTHONPATH=.pythonpath:.; .pythonpath/glassbox/ links the
# folders as the glassbox packages). It uses the server's dependencies where they import, else the wheels that `python -m benchmarks.gpu_check prepare-carry --serve-deps` left in
# out/gpu-carry/wheels; wrk from PATH, else out/gpu-carry/tools; the model in out/gpu-carry/model, else the built-in
# one ($MODEL names another). Writes frontend-null.json, frontend-model.json, serving.json, serving-multi.json (32
# texts a request) and cpu-share.json (a .log beside each) to $OUT, or to out/gpu-serving when OUT is unset, and
# summary.json: the figures of the "Feed the GPU" table (docs/benchmarks/2026-12-07-engine-link.md) under stable
# names, each beside its target.
# About 6 minutes on a GPU host; each step stops at its own limit.
# --cpu-rehearsal runs the same steps on the CPU in about two minutes, at sizes that only show they run.
# Exit codes: 0 every step finished, 1 a step failed or hit its limit, 2 something it needs is missing.
set -uo pipefail

cd "$(dirname "$0")/.."
source scripts/gpu-common.sh  # CARRY, py
case "${1:-}/$#" in
    /0) device=cuda workers=1,2,4,8,12 connections=256 levels=1,32,256 threads=4 seconds=4 rounds=3 split=8
        multi=8,32 ;;
    --cpu-rehearsal/1) device=cpu workers=0,1 connections=8 levels=1,8 threads=1 seconds=1 rounds=1 split=1 multi=2 ;;
    *) echo "usage: scripts/gpu-serving.sh [--cpu-rehearsal]"; exit 2 ;;
esac
OUT=${OUT:-out/gpu-serving}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/.pythonpath:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! "$py" -c 'import starlette, uvicorn, msgspec, httptools, opentelemetry.sdk' 2>/dev/null; then
    if ! compgen -G "$CARRY/wheels/*.whl" >/dev/null; then
        echo "gpu-serving: the server's dependencies do not import and $CARRY/wheels has none (prepare-carry --serve-deps)"
        exit 2
    fi
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    "$py" -c "import sys; from pathlib import Path; from benchmarks.gpu_check_carry import unpack_wheels; \
unpack_wheels(Path(sys.argv[1]), Path(sys.argv[2]))" "$CARRY/wheels" "$site" || exit 2
    export PYTHONPATH="$site:$PYTHONPATH"
    echo "gpu-serving: using the carried wheels ($CARRY/wheels)"
fi
if ! command -v wrk >/dev/null; then
    if [[ ! -x $CARRY/tools/wrk ]]; then
        echo "gpu-serving: wrk is not installed and $CARRY/tools has none (prepare-carry --serve-deps)"
        exit 2
    fi
    export PATH="$PWD/$CARRY/tools:$PATH" LD_LIBRARY_PATH="$PWD/$CARRY/tools${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu-serving: using the carried wrk ($CARRY/tools)"
fi
model=()
if [[ -n ${MODEL:-} ]]; then
    model=(--model "$MODEL")
elif [[ -f $CARRY/model/model.safetensors ]]; then
    model=(--model "$CARRY/model")
fi

echo "gpu-serving: model ${model[1]:-the built-in model (glassbox model build)}"

failed=0
step() {  # step NAME LIMIT_S ARGS...: one benchmark, its JSON and log under $OUT
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    rm -f "$OUT/$name.json"  # a failed step must not show an earlier run's figures
    timeout -k 10 "$limit" "$py" "$@" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
    local rc=$?
    [[ $rc -ne 0 ]] && { failed=1; echo "$name: exit code $rc (log: $OUT/$name.log)"; tail -n 5 "$OUT/$name.log"; }
    [[ -f $OUT/$name.json ]] && "$py" -c "import json, sys; d = json.load(open(sys.argv[1])); \
print(json.dumps(d.get('median', d.get('by_kind')), indent=None)[:1500])" "$OUT/$name.json"
    return 0
}
for engine in null model; do
    step "frontend-$engine" 240 -m benchmarks.frontend "${model[@]}" --engine "$engine" --workers "$workers" \
        --connections "$connections" --wrk-threads "$threads" --duration "$seconds" --rounds "$rounds"
done
step serving 240 -m benchmarks.serving "${model[@]}" --device "$device" --connections "$levels" \
    --wrk-threads "$threads" --duration "$seconds" --rounds "$((rounds > 2 ? 2 : rounds))"
# 32 texts in each request: the server against the offline engine with as many texts in flight.
step serving-multi 180 -m benchmarks.serving "${model[@]}" --device "$device" --connections "$multi" \
    --wrk-threads "$threads" --duration "$seconds" --rounds 1 --texts-per-request 32
# Where each process's threads spend the CPU at the most workers: the engine process's event loop beside its engine
# thread (they share one GIL), the workers, the supervisor.
step cpu-share 180 -m benchmarks.cpu_share "${model[@]}" --device "$device" --connections "$connections" \
    --wrk-threads "$threads" --duration "$((seconds * 2))" --serve-arg=--workers="$split"
# The issue's figures under stable names, each beside its target (benchmarks/gpu_serving_summary.py).
echo "== summary"
"$py" -m benchmarks.gpu_serving_summary "$OUT" --json "$OUT/summary.json" || failed=1
exit $failed
