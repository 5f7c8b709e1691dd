#!/usr/bin/env bash
# Verdicts on a lent GPU against the same commands on that machine's CPU (same torch): doctor, gradflow and nancheck
# at default settings on torchvision, timm, sample and Hugging Face models (the zoo's configs: carry build/corpus-hf),
# 8 runs at a time, bounded by BUDGET seconds (default 250); bench/gpu_verdicts.py prints SAME/DIFF per pair.
#   run: bash bench/gpu_verdicts.sh   (carry .whl and build/corpus-hf; bench/README.md, "On a GPU")
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p $OUT/z
SPECS="torchvision:resnet18 torchvision:mobilenet_v3_small torchvision:vit_b_16 torchvision:convnext_tiny torchvision:efficientnet_b0 timm:resnet50 timm:vit_small_patch16_224 timm:convnext_nano sample_models/cnn.py:build sample_models/transformer_lm.py:build sample_models/gpt_tiny.py:build"
for m in bart bert clip gpt2 llama roberta swin t5 vit whisper; do SPECS="$SPECS hf:build/corpus-hf/$m"; done
for s in $SPECS; do for c in doctor gradflow nancheck; do for d in cuda cpu; do echo "$s $c $d"; done; done; done > /tmp/jobs
job() { n=$(echo "$1_$2_$3" | tr ':/.' '___'); OMP_NUM_THREADS=2 timeout 150 python3 -m torchdiag $2 $1 --device $3 --json > $OUT/z/$n.json 2>/tmp/$n.err; echo "$1 $2 $3 $?" >> $OUT/z/rc.txt; }
export -f job
timeout "${BUDGET:-250}" xargs -P 8 -L 1 bash -c 'job $0 $1 $2' < /tmp/jobs
python3 bench/gpu_verdicts.py $OUT/z
