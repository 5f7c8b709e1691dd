#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (no network there): the `cuda` tests, watch's step-time
# overhead on CUDA (issue 27), then the rest of the suite with the GPU present. Results go to $OUT (or ./gpu-out),
# each test named as it ends (-rA and a JUnit file), so a run cut short by its time limit still says what failed.
# Packages the machine lacks travel as wheels in .whl/ (bench/README.md, "On a GPU"): torchinfo, fvcore and its
# iopath/yacs/termcolor, and pytest 9 (tests/conftest.py builds pytest 9's CallSpec).
#   BENCH=0 skips the benchmark; SUITE_TIMEOUT (s) bounds the suite; SUITE_MARK picks its tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; } | tee "$OUT/device.txt"
# a test that hangs is stopped alone (pytest-timeout, where installed) instead of the whole run at its limit
PER_TEST=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 120" || echo "")
if [ "${BENCH:-1}" != 0 ]; then
  timeout 150 python3 bench/bench_watch.py --device cuda --steps 50 --rounds 5 > "$OUT/bench_watch_cuda.txt" 2>&1
fi
timeout 150 python3 -m pytest -rA -p no:cacheprovider -n 8 $PER_TEST -m cuda tests --junitxml "$OUT/cuda.xml" \
  > "$OUT/cuda_tests.txt" 2>&1
timeout "${SUITE_TIMEOUT:-300}" python3 -m pytest -rfE -v -p no:cacheprovider -n 14 $PER_TEST \
  -m "${SUITE_MARK:-not cuda and not slow}" tests --junitxml "$OUT/suite.xml" > "$OUT/suite_with_gpu.txt" 2>&1
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.txt" "$OUT/suite_with_gpu.txt" | tail -40
