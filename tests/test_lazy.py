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


BRANCHY_AND_CUSTOM = textwrap.dedent("""
    import torch, torch.nn as nn
    from torch.nn.modules.lazy import LazyModuleMixin
    from torch.nn.parameter import UninitializedParameter

    class Branchy(nn.Module):   # the lazy head runs only when aux=True
        def __init__(self):
            super().__init__(); self.body = nn.Linear(16, 16); self.aux = nn.LazyLinear(3)
        def forward(self, x, aux=False):
            h = self.body(x).relu()
            return (h, self.aux(h)) if aux else h

    class LazyScale(LazyModuleMixin, nn.Module):   # registers a buffer as it materialises
        def __init__(self):
            super().__init__(); self.weight = UninitializedParameter()
        def initialize_parameters(self, x):
            self.weight.materialize((x.shape[-1],)); nn.init.ones_(self.weight)
            self.register_buffer("mask", torch.ones(x.shape[-1]))
        def forward(self, x):
            return x * self.weight * self.mask

    def branchy():
        return Branchy()

    def custom():
        return nn.Sequential(nn.Linear(16, 16), LazyScale(), nn.Linear(16, 4))
""")


def test_a_lazy_model_takes_a_checkpoint_saved_from_it(cli, tmp_path):
    """A review: --checkpoint on a lazy model read the shapes of its uninitialised parameters (exit 4); torch's own
    load hook gives them the checkpoint's."""
    (tmp_path / "lazy.py").write_text(LAZY)
    model = _lazy()
    model(torch.randn(2, 3, 8, 8))
    torch.save(model.state_dict(), tmp_path / "ck.pt")
    r = cli("gradflow", f"{tmp_path}/lazy.py:build", "--checkpoint", tmp_path / "ck.pt", "--device", "cpu", "--json")
    doc = json.loads(r.stdout)
    assert r.code == 0 and doc["checkpoint"][0].endswith("ck.pt: 9 tensors loaded"), (r.code, r.stderr[-500:])
    assert "lazy_modules" not in doc   # the checkpoint materialised them


def test_a_lazy_module_the_inputs_do_not_reach_is_one_clear_line(cli, tmp_path):
    (tmp_path / "more.py").write_text(BRANCHY_AND_CUSTOM)
    r = cli("summary", f"{tmp_path}/more.py:branchy", "-i", "4x16", "--device", "cpu")
    assert r.code == 3 and "lazy module aux still without a shape" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_buffer_a_lazy_module_registers_as_it_materialises_stays(cli, tmp_path):
    """A review: the guard around the materialising forward removed the buffer LazyScale registers in
    initialize_parameters, and the model then raised (exit 3)."""
    (tmp_path / "more.py").write_text(BRANCHY_AND_CUSTOM)
    r = cli("gradflow", f"{tmp_path}/more.py:custom", "-i", "4x16", "--device", "cpu")
    assert r.code == 0, (r.stdout[-500:], r.stderr[-500:])
