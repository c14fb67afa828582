# Sourced by scripts/gpu-check.sh and scripts/gpu-serving.sh (from the repository root): what both share.

CARRY=out/gpu-carry  # what `python -m benchmarks.gpu_check prepare-carry` packs for a GPU host without network

# The interpreter: $PYTHON, else the checkout's .venv, else python3 (a bare GPU image's own, which holds torch).
if [[ -n "${PYTHON:-}" ]]; then
    py=$PYTHON
elif [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
else
    py=python3
fi
