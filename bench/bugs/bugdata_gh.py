"""Data for the ported DeepLocalize GitHub programs (bench/bugs/gh_*): generated, never downloaded.

(gol_nn and MovieReviews_Keras are ported on the `bugs` branch, with their data in bugdata.py.)

Kept apart from bugdata.py (the StackOverflow ports' data) so the two sets of ports merge without a
conflict. Every generator takes a seed and draws from its own numpy Generator (bugdata.rng), apart from
the weights' stream.
"""
from __future__ import annotations

import numpy as np
from bugdata import rng, split


# -- kerasma: a stand-in for pima-indians-diabetes.data -----------------------------------------------------
def pima_like(seed: int, n: int = 768, test_size: float = 0.2):
    """768 rows of Pima's 8 raw columns on their own ranges (pregnancies, glucose, blood pressure, skin
    thickness, insulin, BMI, pedigree, age; no scaling, as the original feeds them), onset of diabetes
    (~35% positive) driven by glucose, BMI, age and pedigree. A seeded 80/20 split."""
    r = rng(seed)
    preg = r.poisson(3.8, n).clip(0, 17)
    glucose = r.normal(121, 31, n).clip(44, 199)
    bp = r.normal(69, 12, n).clip(24, 122)
    skin = np.where(r.random(n) < 0.3, 0, r.normal(29, 10, n).clip(7, 99))
    insulin = np.where(r.random(n) < 0.49, 0, r.lognormal(4.8, 0.7, n).clip(14, 846))
    bmi = r.normal(32, 7, n).clip(18, 67)
    pedigree = r.lognormal(-0.95, 0.6, n).clip(0.08, 2.42)
    age = (21 + r.gamma(1.6, 7.5, n)).clip(21, 81)
    logit = 0.035 * (glucose - 121) + 0.09 * (bmi - 32) + 0.03 * (age - 33) + 0.9 * (pedigree - 0.47) - 0.75
    y = (r.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32).reshape(-1, 1)
    x = np.stack([preg, glucose, bp, skin, insulin, bmi, pedigree, age], 1).astype(np.float32)
    return split(x, y, test_size, seed)


# -- Averaging_Neural_Networks: generated exactly as the original does -------------------------------------
def averages(seed: int, n_train: int = 10000, n_test: int = 2000):
    """keras_net.py's generate_dataset (two integers in 0..100 and their mean) scaled by 1/100 as its
    preprocess does; a held-out set of n_test more rows from the same generator."""
    r = rng(seed)

    def gen(k):
        a = r.integers(0, 101, (k, 2)).astype(np.float32)
        return a / 100, (a.mean(1, keepdims=True) / 100).astype(np.float32)
    x, y = gen(n_train)
    xv, yv = gen(n_test)
    return x, y, xv, yv


# -- FacialKeypointsDetection: a stand-in for Kaggle's training.csv ----------------------------------------
# the mean positions (x, y in pixels of a 96x96 image) of Kaggle's 15 keypoints, in training.csv's order
_KP = np.array([[66, 39], [30, 37], [59, 40], [73, 39], [37, 39], [22, 38], [56, 29], [80, 30], [39, 29],
                [16, 30], [48, 62], [63, 76], [33, 76], [48, 73], [48, 82]], dtype=np.float64)


def face_keypoints(seed: int, n: int = 2140, sigma: float = 2.0):
    """n 96x96 grey images in [0, 1] (Kaggle's rows without missing values: 2140), each the 15 keypoints
    drawn as Gaussian spots on a noisy background, the face shifted (+-8 px), scaled (0.9-1.1) and each point
    jittered (+-2 px); targets the 30 coordinates scaled to [-1, 1] as the original's (y - 48) / 48.
    Keras' validation_split=0.2: the last 20% of rows are held out."""
    r = rng(seed)
    shift = r.uniform(-8, 8, (n, 1, 2))
    scale = r.uniform(0.9, 1.1, (n, 1, 1))
    pts = 48 + (_KP[None] - 48) * scale + shift + r.uniform(-2, 2, (n, 15, 2))
    grid = np.arange(96, dtype=np.float64)
    img = 0.15 * r.random((n, 96, 96))
    for k in range(15):
        gx = np.exp(-(grid[None] - pts[:, k, 0:1]) ** 2 / (2 * sigma ** 2))    # (n, 96) over columns
        gy = np.exp(-(grid[None] - pts[:, k, 1:2]) ** 2 / (2 * sigma ** 2))    # (n, 96) over rows
        img += 0.8 * gy[:, :, None] * gx[:, None, :]
    x = np.clip(img, 0, 1).reshape(n, -1).astype(np.float32)
    y = ((pts.reshape(n, 30) - 48) / 48).astype(np.float32)
    cut = int(n * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


# -- Traffic-Sign-Classifier: a stand-in for the German Traffic Sign data (32x32 RGB, 43 classes) -------------
def traffic_signs(seed: int, per_class: int = 200, n_classes: int = 43, test_size: float = 0.2):
    """per_class 32x32 RGB images of each of 43 classes with raw 0..255 values (the model divides by 255
    itself): a class is a fixed random 8x8 glyph, drawn 2x in its own colour at the centre of a grey
    background, shifted +-3 px, its brightness scaled 0.6-1.4, plus N(0, 20) pixel noise. Channels first.
    The classes' glyphs and colours are the same for every seed; the samples are not. A seeded 80/20
    split as the original's train_test_split(test_size=0.2)."""
    fixed = np.random.default_rng(4343)
    glyphs = fixed.random((n_classes, 8, 8)) < 0.5
    colours = fixed.uniform(40, 255, (n_classes, 3))
    r = rng(seed)
    n = per_class * n_classes
    labels = np.repeat(np.arange(n_classes), per_class)
    x = np.empty((n, 3, 32, 32), dtype=np.float32)
    for i, k in enumerate(labels):
        img = np.full((3, 32, 32), r.uniform(60, 160))
        dx, dy = r.integers(-3, 4, 2)
        mask = np.kron(glyphs[k], np.ones((2, 2))).astype(bool)
        patch = img[:, 8 + dy:24 + dy, 8 + dx:24 + dx]
        patch[:, mask] = colours[k][:, None] * r.uniform(0.6, 1.4)
        x[i] = np.clip(img + r.normal(0, 20, img.shape), 0, 255)
    y = np.eye(n_classes, dtype=np.float32)[labels]
    return split(x, y, test_size, seed)
