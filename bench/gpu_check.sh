#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (no network there): watch's step-time overhead on CUDA
# (issue 27), the `cuda` tests, a probe of where memory's allocator/tensor gap comes from, then the rest of the
# suite with the GPU present. Results go to $OUT (or ./gpu-out), each test named as it ends (-rA and a JUnit file),
# so a run cut short by its time limit still says what failed. Every stage is bounded by what is left of BUDGET
# seconds (default 560), so the script ends inside one device call.
# Packages the machine lacks travel as wheels in .whl/ (bench/README.md, "On a GPU"): torchinfo, fvcore and its
# iopath/yacs/termcolor, and pytest 9 with xdist/timeout/pluggy (tests/conftest.py builds pytest 9's CallSpec).
#   BENCH=0 skips the benchmark; SUITE_MARK picks the suite's tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); (( l < ${1:-9999} )) && echo $(( l > 5 ? l : 5 )) || echo "$1"; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ nvidia-smi -L; python3 -c "import torch, pytest; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'pytest', pytest.__version__)";
  python3 -m torchdiag summary sample_models/mlp.py:build --device cuda | tail -3; } 2>&1 | tee "$OUT/device.txt"
# a test that hangs is stopped alone (pytest-timeout, where installed) instead of the whole run at its limit
PER_TEST=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 100" || echo "")
if [ "${BENCH:-1}" != 0 ]; then
  timeout "$(left 110)" python3 bench/bench_watch.py --device cuda --steps 50 --rounds 5 > "$OUT/bench_watch_cuda.txt" 2>&1
  echo "bench_watch rc=$?" >> "$OUT/bench_watch_cuda.txt"
fi
timeout "$(left 130)" python3 -m pytest -rA -p no:cacheprovider -n 8 $PER_TEST -m cuda tests --junitxml "$OUT/cuda.xml" \
  > "$OUT/cuda_tests.txt" 2>&1
# memory's allocator step peak against its tensor-level peak, with cuDNN on and off (the gap the cuda test bounds)
for cudnn in True False; do for spec in cnn.py:build:256x3x32x32 mlp.py:build:256x784; do
  echo "== cudnn=$cudnn $spec"
  timeout "$(left 30)" python3 -c "import sys, torch; torch.backends.cudnn.enabled = $cudnn; from torchdiag.cli.app import main; sys.argv[0] = 'torchdiag'; main()" \
    memory "sample_models/${spec%:*}" -i "${spec##*:}" --device cuda --json 2>/dev/null | python3 -c "
import json, sys; t = sys.stdin.read()
try: d = json.loads(t); c = d['cuda']; print('tensor peak', d['peak_bytes'], 'allocator step peak', c['step_peak_allocated_bytes'], 'ratio %.3f' % (c['step_peak_allocated_bytes'] / d['peak_bytes']))
except Exception: print(t[-800:])"
done; done > "$OUT/memory_probe.txt" 2>&1
timeout "$(left 9999)" python3 -m pytest -rfE -v -p no:cacheprovider -n 14 --dist loadscope $PER_TEST \
  -m "${SUITE_MARK:-not cuda and not slow}" tests --junitxml "$OUT/suite.xml" > "$OUT/suite_with_gpu.txt" 2>&1
cat "$OUT/memory_probe.txt"; grep -h "overhead\|%" "$OUT/bench_watch_cuda.txt" | tail -15
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.txt" "$OUT/suite_with_gpu.txt" | tail -60
