"""Lazy modules (nn.LazyConv2d, LazyBatchNorm2d, LazyLinear) hold uninitialised parameters until their first forward.
A sweep: nancheck, doctor, overfit-batch, memory and gradcheck raised an internal error (exit 4) on such a model, and
gradflow left a lazy BatchNorm's running stats changed. Every command now materialises them with one eval-mode forward
first (core/lazy.py), says so, and leaves nothing else changed."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn as nn

import torchdiag

LAZY = textwrap.dedent("""
    import torch, torch.nn as nn
    def build():
        return nn.Sequential(nn.LazyConv2d(8, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
    def example_inputs():
        return (torch.randn(4, 3, 8, 8) * 3 + 2,)
""")


def _lazy():
    torch.manual_seed(0)
    return nn.Sequential(nn.LazyConv2d(8, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))


@pytest.mark.parametrize("command", ["summary", "nancheck", "gradflow", "doctor", "overfit_batch"])
def test_a_lazy_model_is_materialised_and_its_stats_left_as_initialised(command):
    model, x = _lazy(), torch.randn(4, 3, 8, 8) * 3 + 2
    rng = torch.random.get_rng_state()
    extra = {"steps": 20} if command == "overfit_batch" else {}
    r = getattr(torchdiag, command)(model, (x,), **extra)
    bn = model[1]
    assert type(bn) is nn.BatchNorm2d and model[4].weight.shape == (4, 8 * 6 * 6)
    # the forward that materialised it ran in eval mode: the running stats are the initial 0 and 1, none counted
    assert torch.equal(bn.running_mean, torch.zeros(8)) and torch.equal(bn.running_var, torch.ones(8))
    assert int(bn.num_batches_tracked) == 0 and model.training
    assert "materialised" in r.header["lazy_modules"] and "0, 1, 4" in r.header["lazy_modules"]
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert r.exit_code != 4


@pytest.mark.parametrize("command", ["nancheck", "doctor", "overfit-batch", "memory", "gradcheck", "gradflow"])
def test_every_command_runs_on_a_lazy_model_from_the_command_line(cli, tmp_path, command):
    (tmp_path / "lazy.py").write_text(LAZY)
    extra = ["-i", "1x3x4x4"] if command == "gradcheck" else []
    r = cli(command, f"{tmp_path}/lazy.py:build", "--device", "cpu", "--json", *extra)
    doc = json.loads(r.stdout)
    assert r.code in (0, 1), (r.code, r.stdout[-600:], r.stderr[-600:])
    assert "materialised" in doc["lazy_modules"]
