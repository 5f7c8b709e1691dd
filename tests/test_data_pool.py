"""data: validation inputs that are also training inputs, told apart as chance or leak (data/pool.py). Truth is
computed here from how each case was drawn, not from the tool."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchdiag.diagnostics.data import Options, context, run_data
from torchdiag.diagnostics.data.pool import Pool, _tail

QUICK = dict(batches=3, sweep=False)


def _run(x, y, xv, yv):
    def loader(a, b):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(a, b), batch_size=64)
    return run_data(loader(x, y), Options(**QUICK), context("cpu"), val=loader(xv, yv))


def _overlap(r):
    found = [f for f in r.findings if f.code == "train-val-overlap"]
    assert len(found) == 1, [(f.code, f.message) for f in r.findings]
    return found[0]


def _pairs(n: int, seed: int) -> torch.Tensor:
    """Pairs of integers in 0..100, divided by 100 (gh_averaging_nn's generator): 10,201 inputs, uniform."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 101, (n, 2), generator=g).float() / 100


def test_a_small_input_space_overlaps_by_chance_and_says_how_much():
    x, xv = _pairs(10_000, 0), _pairs(2_000, 1)
    r = _run(x, x.mean(1, keepdim=True), xv, xv.mean(1, keepdim=True))
    f = _overlap(r)
    truth = 2_000 * (1 - (1 - 1 / 101 ** 2) ** 10_000)   # each validation pair meets one of 10,000 draws
    assert f.severity == "info" and r.exit_code == 0, f.message
    assert r.data["overlap"]["chance_expected"] == pytest.approx(truth, rel=0.05)
    assert r.data["overlap"]["chance_collision"] == pytest.approx(1 / 101 ** 2, rel=0.05)
    assert abs(r.data["overlap"]["val_samples_in_train"] - truth) < 4 * math.sqrt(truth)


def test_copies_on_top_of_a_small_input_space_are_a_leak():
    x, xv = _pairs(10_000, 0), _pairs(2_000, 1)
    xv = torch.cat([xv[:1_500], x[5_000:5_500]])   # 500 validation rows copied from training (a quarter)
    r = _run(x, x.mean(1, keepdim=True), xv, xv.mean(1, keepdim=True))
    assert _overlap(r).severity == "error" and r.exit_code == 1


def _iris_like(n: int, seed: int) -> torch.Tensor:
    """Four correlated measurements to 0.1 (as iris is measured): flowers alike happen, rarely."""
    rs = np.random.RandomState(seed)
    size = rs.normal(0, 1, (n, 1))
    x = np.array([5.8, 3.0, 3.8, 1.2]) + size * np.array([0.6, 0.2, 1.5, 0.6]) + rs.normal(0, 0.15, (n, 4))
    return torch.tensor(np.round(x, 1), dtype=torch.float32)


def test_one_flower_alike_across_a_split_is_chance_ten_copied_are_a_leak():
    data = _iris_like(4_000, 0)
    _, first = np.unique(data.numpy(), axis=0, return_index=True)
    data = data[np.sort(first)]                        # distinct rows only: the twin across is planted
    x, xv = data[:75], torch.cat([data[75:149], data[:1]])
    r = _run(x, torch.zeros(75, dtype=torch.long), xv, torch.zeros(75, dtype=torch.long))
    assert _overlap(r).severity == "info", _overlap(r).message
    xv = torch.cat([data[75:140], data[:10]])
    r = _run(x, torch.zeros(75, dtype=torch.long), xv, torch.zeros(75, dtype=torch.long))
    assert _overlap(r).severity == "error" and r.exit_code == 1


def test_one_hot_columns_cannot_pass_a_leak_as_chance():
    """Two categories of 50, one-hot: columns are 0 nearly always, so their product says two rows agree one time in
    ~50 (truth: 1 in 2,500). The pairs inside each split bound it; 25 rows copied stay a leak."""
    g = torch.Generator().manual_seed(0)

    def draws(n):
        a, b = torch.randint(0, 50, (n,), generator=g), torch.randint(0, 50, (n,), generator=g)
        return torch.cat([torch.nn.functional.one_hot(a, 50), torch.nn.functional.one_hot(b, 50)], 1).float()

    x = draws(100)
    xv = torch.cat([draws(75), x[:25]])
    assert Pool().collision() == 0.0
    r = _run(x, torch.zeros(100, dtype=torch.long), xv, torch.zeros(100, dtype=torch.long))
    assert _overlap(r).severity == "error"
    assert r.data["overlap"]["chance_collision"] < 5e-3


def test_continuous_or_wide_inputs_have_no_chance_of_twins():
    x = torch.randn(500, 8)
    r = _run(x, x.sum(1, keepdim=True), x[:40], x[:40].sum(1, keepdim=True))
    assert _overlap(r).severity == "error" and r.data["overlap"]["chance_collision"] == 0.0
    img = (torch.rand(300, 1, 12, 12) < 0.5).float()   # 144 binary pixels: exact twins are copies
    r = _run(img, torch.zeros(300, dtype=torch.long), img[:5], torch.zeros(5, dtype=torch.long))
    assert _overlap(r).severity == "error" and r.data["overlap"]["chance_collision"] == 0.0


@pytest.mark.parametrize("n,q,k", [(10, 0.3, 4), (75, 7.5e-4, 1), (75, 7.5e-4, 3), (200, 0.5, 120), (30, 0.9, 30)])
def test_the_binomial_tail_is_exact(n, q, k):
    truth = sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k, n + 1))
    assert _tail(n, q, k) == pytest.approx(truth, rel=1e-9) or (k <= n * q and _tail(n, q, k) == 1.0)
