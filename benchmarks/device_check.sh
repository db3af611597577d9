#!/usr/bin/env bash
# The GPU checks, as one command on a lent GPU machine (its python3 holds torch; submitit
# travels as a wheel in .whl/, which `pip download submitit==<version> -d .whl` fills):
#   bash benchmarks/device_check.sh [OUT_DIR]
# 1. the survivor's save on a real GPU (tests/fault/test_rescue_gpu.py), 2. bench_gpu.py.
# Each writes its log under OUT_DIR; the exit status is the first failure's.
set -uo pipefail
out=${1:-${OUT:-/tmp/device-check}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" \
    | tee -a "$out/gpu.txt"
status=0
timeout 180 python3 -m pytest -q -p no:cacheprovider -s tests/fault/test_rescue_gpu.py \
    -o addopts="" -W ignore 2>&1 | tee "$out/rescue_gpu.log" || status=$?
timeout "${BENCH_GPU_TIMEOUT_S:-420}" python3 -m benchmarks.bench_gpu --rounds 3 2>&1 | tee "$out/bench_gpu.log"
bench=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$bench
exit "$status"
