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
    x, y = make_multilabel_classification(n_samples=n, n_features=n_features, n_classes=n_classes,
                                          random_state=10_000 + seed)
    return split(x.astype(np.float32), y.astype(np.float32), 0.2, seed)


def split(x, y, test_size: float, seed: int):
    """A seeded random split: x_train, y_train, x_test, y_test (the order every port's data() returns)."""
    order = np.random.default_rng(20_000 + seed).permutation(len(x))
    n_test = int(round(len(x) * test_size))
    te, tr = order[:n_test], order[n_test:]
    return x[tr], y[tr], x[te], y[te]


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


def uniform_two_class(n: int, seed: int, onehot: bool, test_size: float = 0.25):
    """Post 50306988's generator: class A ~ U(0.2, 0.4)^2, class B ~ U(0.5, 0.7)^2 (the buggy script wrote
    low=0.7, high=0.5, which numpy samples the same way). onehot: two one-hot columns (classes 1, 2 encoded);
    else one 0/1 column."""
    r = rng(seed)
    a = r.uniform(0.2, 0.4, (n, 2))
    b = r.uniform(0.5, 0.7, (n, 2))
    x = np.concatenate([a, b]).astype(np.float32)
    lab = np.concatenate([np.zeros(n), np.ones(n)]).astype(np.int64)
    y = np.eye(2, dtype=np.float32)[lab] if onehot else lab.astype(np.float32).reshape(-1, 1)
    return split(x, y, test_size, seed)


def constant_rows(n_per_class: int, n_test_per_class: int, dim: int = 128):
    """Post 31880720: rows of all ones (label 1) and all zeros (label 0)."""
    def make(k):
        x = np.concatenate([np.ones((k, dim)), np.zeros((k, dim))]).astype(np.float32)
        y = np.concatenate([np.ones(k), np.zeros(k)]).astype(np.float32).reshape(-1, 1)
        return x, y
    x, y = make(n_per_class)
    xv, yv = make(n_test_per_class)
    return x, y, xv, yv


def linear_big(n_train: int, n_test: int, seed: int, normalise_weights: bool):
    """Post 33969059's get_data: x ~ U(0, 10000)^3, y = x . ws + xno (test rows with noise 0.4 on xno).
    The correct script divides ws and xno by their largest magnitude (normalise_weights)."""
    r = rng(seed)
    ws, xno = np.array([2.0, 1.0, 0.5]), 2.2
    if normalise_weights:
        mx = max(abs(ws).max(), abs(xno))
        ws, xno = ws / mx, xno / mx

    def get(count, rweight):
        xt = 10000 * r.random((count, 3))
        noise = rweight * (r.random(count) - 0.5)
        return xt.astype(np.float32), (xt @ ws + xno + noise).reshape(-1, 1).astype(np.float32)
    x, y = get(n_train, 0.0)
    xv, yv = get(n_test, 0.4)
    return x, y, xv, yv


def binary_codes(dim: int, seed: int, shuffle_targets: bool):
    """Post 39217567: the 2^dim binary codes as inputs; targets the same codes (an autoencoder), or a random
    permutation of them (the buggy post's `random.shuffle(y)`). Held out = the same codes (there are no others)."""
    x = np.array([[float(b) for b in format(i, f"0{dim}b")] for i in range(2 ** dim)], dtype=np.float32)
    y = x[rng(seed).permutation(len(x))] if shuffle_targets else x.copy()
    return x, y, x, y


def titanic_like(seed: int, n: int = 891):
    """A stand-in for Kaggle's Titanic train.csv as post 31627380 prepares it: 10 columns, label-encoded
    categoricals and raw Age/Fare (no scaling), survival driven by sex, class and age. Keras'
    validation_split=0.2 takes the last 20% of rows."""
    r = rng(seed)
    pclass = r.choice([0, 1, 2], n, p=[0.24, 0.21, 0.55])
    sex = r.integers(0, 2, n)
    age = np.clip(r.normal(30, 14, n), 0.4, 80)
    sibsp = r.poisson(0.5, n)
    parch = r.poisson(0.4, n)
    fare = np.exp(r.normal(2.7 + 0.8 * (2 - pclass), 0.7, n))
    name = r.permutation(n)
    ticket = r.integers(0, 681, n)
    cabin = np.where(pclass == 0, r.integers(1, 148, n), 0)
    embarked = r.choice([0, 1, 2, 3], n, p=[0.002, 0.19, 0.09, 0.718])
    logit = 2.5 * sex - 0.9 * pclass - 0.03 * (age - 30) - 0.2 * sibsp - 0.4
    survived = (r.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    x = np.stack([pclass, name, sex, age, sibsp, parch, ticket, fare, cabin, embarked], 1).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[survived]
    cut = int(n * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def tanh_regression(n: int, seed: int, test_size: float = 0.25):
    """Post 48251943's 'Book1.csv' (2 input columns, 1 target) is not public: a stand-in target in (-1, 1)
    (the correct script's tanh output says the target lies there), y = tanh(x . w), x ~ N(0, 1)^2."""
    r = rng(seed)
    x = r.standard_normal((n, 2)).astype(np.float32)
    y = np.tanh(x @ np.array([1.5, -1.0])).reshape(-1, 1).astype(np.float32)
    return split(x, y, test_size, seed)


def standardised(splits):
    """sklearn's StandardScaler fitted on the training split (what the correct scripts add)."""
    x, y, xv, yv = splits
    mu, sd = x.mean(0), x.std(0) + 1e-8
    return (x - mu) / sd, y, (xv - mu) / sd, yv


def one_feature(n: int, seed: int):
    """Post 45442843's dataset.csv (one raw feature, a boolean target) is not public: x ~ N(50, 20), the
    target true when x + N(0, 5) > 55. Split as the post does: the first 80% train, the rest test."""
    r = rng(seed)
    x = r.normal(50, 20, (n, 1)).astype(np.float32)
    y = ((x[:, 0] + r.normal(0, 5, n)) > 55).astype(np.float32).reshape(-1, 1)
    cut = int(n * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def scaled(splits):
    """preprocessing.scale over the whole x (what post 45442843's fix does before splitting)."""
    x, y, xv, yv = splits
    allx = np.concatenate([x, xv])
    mu, sd = allx.mean(0), allx.std(0) + 1e-8
    return (x - mu) / sd, y, (xv - mu) / sd, yv


def adult_like(n: int, seed: int):
    """A stand-in for UCI Adult (adult.data) as post 47724077 feeds it: 14 raw numeric columns (label-encoded
    categoricals, age, fnlwgt ~ 1e5, capital gain/loss up to ~1e4, hours), income >50K as two one-hot
    classes (about 24% positive). 80/20 split (the post evaluates on its training data)."""
    r = rng(seed)
    age = r.integers(17, 90, n)
    edu_num = r.integers(1, 17, n)
    hours = np.clip(r.normal(40, 12, n), 1, 99)
    gain = np.where(r.random(n) < 0.08, r.exponential(8000, n), 0)
    loss = np.where(r.random(n) < 0.05, r.exponential(1800, n), 0)
    fnlwgt = r.normal(190000, 105000, n).clip(12000, 1.5e6)
    sex = r.integers(0, 2, n)
    cats = [r.integers(0, k, n) for k in (9, 16, 7, 15, 6, 5, 42)]   # workclass, education, marital, ...
    logit = 0.04 * (age - 38) + 0.35 * (edu_num - 10) + 0.03 * (hours - 40) + 0.0003 * gain + 0.8 * sex - 1.6
    y = (r.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    x = np.stack([age, cats[0], fnlwgt, cats[1], edu_num, cats[2], cats[3], cats[4], cats[5], sex, gain,
                  loss, hours, cats[6]], 1).astype(np.float32)
    return split(x, np.eye(2, dtype=np.float32)[y], 0.2, seed)


def iris(scale: bool):
    """scikit-learn's iris (shipped), one-hot targets, split 50/50 with random_state=2 as post 51930566 does;
    scale: StandardScaler fitted on all rows first (the fix)."""
    from sklearn.datasets import load_iris
    d = load_iris()
    x = d["data"].astype(np.float32)
    if scale:
        x = (x - x.mean(0)) / x.std(0)
    y = np.eye(3, dtype=np.float32)[d["target"]]
    order = np.random.RandomState(2).permutation(len(x))
    te, tr = order[:75], order[75:]
    return x[tr], y[tr], x[te], y[te]


def quartic(scale: bool):
    """Post 52800582: x = -100, -99.5, ..., 99.5 and y = x^4 (400 points), raw or both standardised.
    Held out = the same points (the post fits and plots on them). Returns also y's raw std."""
    x = np.arange(-100, 100, 0.5).reshape(-1, 1)
    y = x ** 4
    if scale:
        x = (x - x.mean()) / x.std()
        y = (y - y.mean()) / y.std()
    return x.astype(np.float32), y.astype(np.float32), x.astype(np.float32), y.astype(np.float32)


def binary_multilabel(n: int, n_features: int, seed: int, flat: bool):
    """Post 50481178: make_multilabel_classification with one class, 4 features; 80/20 split. flat: the
    labels as a vector of 0/1 (for sparse categorical cross-entropy) instead of a column."""
    from sklearn.datasets import make_multilabel_classification
    x, y = make_multilabel_classification(n_samples=n, n_features=n_features, n_classes=1,
                                          random_state=10_000 + seed)
    y = y.astype(np.float32)
    return split(x.astype(np.float32), y.reshape(-1) if flat else y.reshape(-1, 1), 0.2, seed)


def iris_split(minmax: bool, seed: int):
    """scikit-learn's iris (shipped) raw or min-max scaled, one-hot targets, a seeded 80/20 split."""
    from sklearn.datasets import load_iris
    d = load_iris()
    x = d["data"].astype(np.float32)
    if minmax:
        x = (x - x.min(0)) / (x.max(0) - x.min(0))
    return split(x, np.eye(3, dtype=np.float32)[d["target"]], 0.2, seed)


def digits_labels_scaled(seed: int):
    """Post 59325381's buggy preparation on the digits stand-in: images /16 (MNIST's /255), 1x28x28, and the
    TRAINING labels divided by 255 too (the bug: sparse cross-entropy then reads them as class 0); the
    test labels untouched."""
    x, y, xv, yv = digits(flat=False, size=28, seed=seed)
    return x, (y / 255.0).astype(np.float32), xv, yv.astype(np.float32)


def game_of_life(n_train: int, n_val: int, seed: int, size: int = 3):
    """gol_nn's own generator: random size x size fields (alive with p 0.5), the target the next state under
    Conway's rules on a torus; inputs wrap-padded to (size+2)^2, channels first (N, 1, H+2, W+2)."""
    r = rng(seed)

    def make(n):
        f = (r.random((n, 1, size, size)) < 0.5).astype(np.int32)
        nb = np.zeros_like(f)
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                if dx or dy:
                    nb += np.roll(np.roll(f, dx, 3), dy, 2)
        y = np.logical_or(nb == 3, np.logical_and(f, nb == 2)).astype(np.float32)
        x = np.pad(f, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="wrap").astype(np.float32)
        return x, y
    x, y = make(n_train)
    xv, yv = make(n_val)
    return x, y, xv, yv


def blobs_onehot(n: int, n_features: int, seed: int, scale: float, offset: float):
    """blobs_binary with the label as two one-hot columns (LabelEncoder + to_categorical)."""
    x, y, xv, yv = blobs_binary(n, n_features, seed, scale=scale, offset=offset)
    eye = np.eye(2, dtype=np.float32)
    return x, eye[y[:, 0].astype(int)], xv, eye[yv[:, 0].astype(int)]


def bag_of_words(n_train: int, n_val: int, n_test: int, seed: int, vocab: int = 10000, length: int = 120):
    """IMDB (keras.datasets.imdb, num_words=10000, multi-hot) cannot be downloaded: reviews of `length` words
    drawn from a Zipf-like vocabulary, 300 'positive' and 300 'negative' words made 4x likelier in reviews
    of that label; multi-hot over `vocab` words. Returns train, validation (the project validates on the
    first 10000 training reviews) and test splits: x, y, x_val, y_val, x_test, y_test."""
    r = rng(seed)
    base = 1.0 / np.arange(1, vocab + 1) ** 0.9
    words = r.permutation(np.arange(50, vocab))
    pos, neg = words[:300], words[300:600]

    def make(n):
        y = r.integers(0, 2, n)
        x = np.zeros((n, vocab), dtype=np.float32)
        for i in range(n):
            p = base.copy()
            p[pos if y[i] else neg] *= 4.0
            x[i, r.choice(vocab, length, p=p / p.sum())] = 1.0
        return x, y.astype(np.float32).reshape(-1, 1)
    x, y = make(n_train)
    xv, yv = make(n_val)
    xt, yt = make(n_test)
    return x, y, xv, yv, xt, yt


def keypoint_faces(n: int, seed: int, size: int = 96, points: int = 15):
    """Kaggle's facial-keypoints training.csv cannot be downloaded: size x size grey images (flattened, in
    [0, 1]) of `points` Gaussian spots whose centres are the targets, 2 * points coordinates scaled to
    [-1, 1] as the project scales them ((y - 48) / 48). 80/20 split (Keras' validation_split=.2)."""
    r = rng(seed)
    y = r.uniform(-0.8, 0.8, (n, 2 * points)).astype(np.float32)
    grid = np.arange(size, dtype=np.float32)
    x = np.zeros((n, size, size), dtype=np.float32)
    for i in range(n):
        cx = (y[i, 0::2] * 48 + 48)[:, None]
        cy = (y[i, 1::2] * 48 + 48)[:, None]
        gx = np.exp(-((grid[None, :] - cx) ** 2) / 18.0)        # (points, size)
        gy = np.exp(-((grid[None, :] - cy) ** 2) / 18.0)
        x[i] = np.clip(np.einsum("pi,pj->ij", gy, gx), 0, 1)
    x = (x + 0.05 * r.standard_normal(x.shape)).clip(0, 1).reshape(n, -1).astype(np.float32)
    cut = int(n * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def class_templates(n: int, n_classes: int, seed: int, shape=(3, 32, 32), test_size: float = 0.2,
                    labels: str = "onehot"):
    """A learnable image stand-in (GTSRB's 43 classes of 32x32 RGB signs cannot be downloaded): each class
    a fixed smooth random template, each image its class's template plus noise, raw 0..255 values (the
    model rescales, as the project's Lambda does). Seeded 80/20 split (random_state as the project)."""
    r = np.random.default_rng(7)                       # the classes are the same for every seed
    c, h, w = shape
    coarse = r.uniform(0, 255, (n_classes, c, -(-h // 4), -(-w // 4)))
    templates = np.kron(coarse, np.ones((1, 1, 4, 4)))[:, :, :h, :w]
    rs = rng(seed)
    y = rs.integers(0, n_classes, n)
    x = (0.6 * templates[y] + 0.4 * rs.uniform(0, 255, (n, c, h, w))).astype(np.float32)
    target = np.eye(n_classes, dtype=np.float32)[y] if labels == "onehot" else y.astype(np.float32).reshape(-1, 1)
    return split(x, target, test_size, seed)


def scalar_to_class(n: int, n_classes: int, seed: int):
    """Post 58609115's export78.csv is not public; the script feeds ONE float column and predicts one of 69
    one-hot columns: x ~ U(0, 1), the class floor(x * n_classes) with 10% of the labels resampled at random.
    Seeded 80/20 split (the post's 1767 training rows of 2209)."""
    r = rng(seed)
    x = r.random((n, 1)).astype(np.float32)
    c = np.minimum((x[:, 0] * n_classes).astype(int), n_classes - 1)
    flip = r.random(n) < 0.1
    c[flip] = r.integers(0, n_classes, flip.sum())
    return split(x, np.eye(n_classes, dtype=np.float32)[c], 0.2, seed)


def housing_like(n: int, seed: int, n_features: int = 13):
    """Kaggle's Melbourne housing data cannot be downloaded: `n_features` standardised numeric columns (the
    project standardises every column it keeps, the price too) and a standardised price that depends on
    them non-linearly. Keras' validation_split=0.2: the last 20% of rows are held out."""
    r = rng(seed)
    x = r.standard_normal((n, n_features)).astype(np.float32)
    w = r.standard_normal(n_features) / np.sqrt(n_features)
    price = np.exp(0.6 * (x @ w)) + 0.3 * x[:, 0] * x[:, 1] + 0.1 * r.standard_normal(n)
    y = ((price - price.mean()) / price.std()).astype(np.float32).reshape(-1, 1)
    cut = int(n * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]
