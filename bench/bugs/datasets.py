"""Data for the ported training-bug programs: shipped or synthetic, never downloaded.

The originals load MNIST, CSV files from the poster's disk, etc. Each port says in its meta.json which
stand-in it uses and why. Every generator takes a numpy Generator so a seed fixes the data.
"""
from __future__ import annotations

import numpy as np


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(10_000 + seed)   # the data's own stream, apart from the weights'


def xor4() -> tuple[np.ndarray, np.ndarray]:
    """The four XOR points exactly as the StackOverflow posts write them ([1,1],[1,0],[0,0],[0,1])."""
    x = np.array([[1, 1], [1, 0], [0, 0], [0, 1]], dtype=np.float32)
    y = np.array([[0], [1], [0], [1]], dtype=np.float32)
    return x, y


def xor6() -> tuple[np.ndarray, np.ndarray]:
    """Post 34311586's six rows (XOR with two points repeated)."""
    x = np.array([[1., 1.], [0., 0.], [1., 0.], [0., 1.], [1., 1.], [0., 0.]], dtype=np.float32)
    y = np.array([[0.], [0.], [1.], [1.], [0.], [0.]], dtype=np.float32)
    return x, y


def digits(flat: bool = True, scale: bool = True, size: int = 8, onehot: bool = False,
           test_size: float = 0.25, seed: int = 0):
    """scikit-learn's digits (1797 8x8 images, 10 classes; shipped with the package): the MNIST stand-in.

    `scale=False` keeps the raw 0..16 values (a missing-normalisation bug); `size=28` upsamples each image
    by nearest-neighbour to 28x28 (MNIST's shape; values padded with the border). Returns
    x_train, y_train, x_test, y_test (y as class indices, or one-hot with `onehot=True`).
    """
    from sklearn.datasets import load_digits
    d = load_digits()
    x = d.images.astype(np.float32)                          # (n, 8, 8), 0..16
    if size != 8:
        reps = int(np.ceil(size / 8))
        x = np.kron(x, np.ones((1, reps, reps), dtype=np.float32))[:, :size, :size]
    if scale:
        x = x / 16.0
    else:
        x = x * (255.0 / 16.0)                               # MNIST's raw range 0..255
    y = d.target.astype(np.int64)
    x = x.reshape(len(x), -1) if flat else x[:, None]
    order = rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(len(x) * test_size)
    if onehot:
        y = np.eye(10, dtype=np.float32)[y]
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def multilabel(n: int, n_features: int, n_classes: int, seed: int):
    """sklearn's make_multilabel_classification (what post 38648195 used), split 80/20."""
    from sklearn.datasets import make_multilabel_classification
    from sklearn.model_selection import train_test_split
    x, y = make_multilabel_classification(n_samples=n, n_features=n_features, n_classes=n_classes,
                                          random_state=10_000 + seed)
    return train_test_split(x.astype(np.float32), y.astype(np.float32), test_size=0.2,
                            random_state=seed)


def split(x, y, test_size: float, seed: int):
    from sklearn.model_selection import train_test_split
    return train_test_split(x, y, test_size=test_size, random_state=seed)


def quadratic(seed: int, noise: bool = True):
    """Post 48934338's data: X = 0, 0.1, ..., 4.9; y = 5 X^2 + N(0,1)^3. Held out: the same X, new noise."""
    r = rng(seed)
    x = np.arange(0.0, 5.0, 0.1, dtype=np.float32).reshape(-1, 1)
    y = 5 * x ** 2 + (r.standard_normal((50, 1)) ** 3 if noise else 0)
    y_val = 5 * x ** 2 + (r.standard_normal((50, 1)) ** 3 if noise else 0)
    return x, y.astype(np.float32), x, y_val.astype(np.float32)


def blobs_binary(n: int, n_features: int, seed: int, scale: float = 1.0, offset: float = 0.0,
                 test_size: float = 0.25):
    """A learnable binary problem: y = 1 when a fixed random linear score of x (plus a product term) > 0.

    `scale`/`offset` put the raw features on a large or shifted range (a missing-standardisation bug).
    """
    r = rng(seed)
    x = r.standard_normal((n, n_features)).astype(np.float32)
    w = r.standard_normal(n_features)
    score = x @ w + 0.5 * x[:, 0] * x[:, 1 % n_features]
    y = (score > np.median(score)).astype(np.float32).reshape(-1, 1)
    x = x * scale + offset
    return split(x, y, test_size, seed)


def linear_1d(n: int, seed: int, slope: float = 2.0, intercept: float = 1.0, noise: float = 0.1,
              test_size: float = 0.25):
    """y = slope * x + intercept + noise, x in [0, 10): post 48221692's 'Linear_Data.csv' stand-in."""
    r = rng(seed)
    x = r.uniform(0, 10, (n, 1)).astype(np.float32)
    y = (slope * x + intercept + noise * r.standard_normal((n, 1))).astype(np.float32)
    return split(x, y, test_size, seed)
