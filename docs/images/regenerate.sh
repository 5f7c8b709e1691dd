#!/bin/sh
# Regenerate the documentation pictures with the commands the pages show (run from the repository root).
# tests/test_{activations,gradcam,attention,embeddings,lr_find}.py check that these files still equal what
# the code produces: after changing a picture, run this and commit the PNGs.
set -e
T=${TORCHDIAG:-.venv/bin/torchdiag}
tmp=$(mktemp -d)
$T activations sample_models/cnn.py:build --layer features.0 --images "$tmp/act" > /dev/null
cp "$tmp/act/features.0_features.png" docs/images/activations_features.png
cp "$tmp/act/features.0_filters.png" docs/images/activations_filters.png
$T gradcam sample_models/gradcam_region.py:build --layer features.3 --image docs/images/sample_input.png --out docs/images/gradcam.png > /dev/null
$T attention sample_models/transformer_lm.py:build -i 1x8:int64 --tokens the,cat,sat,on,the,mat,.,EOS --images "$tmp/attn" > /dev/null
cp "$tmp/attn/attention_blocks.0.attn.png" docs/images/attention.png
$T embeddings sample_models/cnn.py:build --layer head.0 --batch sample_models/gradcam_region.py:batch --tb "$tmp/runs" --images "$tmp/emb" > /dev/null
cp "$tmp/emb/embeddings_head.0_pca.png" docs/images/embeddings_pca.png
OMP_NUM_THREADS=1 $T lr-find sample_models/transformer_lm.py:build --optimizer adamw --device cpu --plot docs/images/lr_find.png > /dev/null
rm -rf "$tmp"
echo "docs/images regenerated"
