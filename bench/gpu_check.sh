#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (no network there): the `cuda` tests, watch's step-time
# overhead on CUDA (issue 27), the host-sync count of nancheck/gradflow, then the rest of the suite with the GPU
# present. Results go to $OUT (or ./gpu-out). Packages the machine lacks travel as wheels in .whl/ (see
# bench/README.md, "On a GPU").
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
[ "${BENCH:-1}" = 0 ] || timeout 150 python3 bench/bench_watch.py --device cuda --steps 50 --rounds 5 2>&1 | tee "$OUT/bench_watch_cuda.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -30 | tee "$OUT/cuda_tests.txt"
timeout "${SUITE_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -n 14 -m "not cuda and not slow" tests 2>&1 \
  | tail -60 | tee "$OUT/suite_with_gpu.txt"
