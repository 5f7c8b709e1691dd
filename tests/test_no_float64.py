"""A device without float64 (Apple's mps: a cast there raises TypeError). watch stopped at its first step with an
internal error, and doctor, nancheck, activations, attention, gradflow and overfit-batch made float64 tensors on
the model's device. Every float64 torchdiag makes on a device now comes from core.device.wide_float (float32 where
has_float64 says no). Simulated on this machine: has_float64 answers False, and a dispatch mode records each float64
tensor that torchdiag's own code makes (host-side float64 after a move to the CPU, as `data` and `embeddings` do,
is out of this test's reach: on the CPU both look alike)."""
from __future__ import annotations

import collections
import importlib
import json
import random
import sys
import traceback

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = "sample_models/"


class _Float64Made(TorchDispatchMode):
    """Counts ops that return a float64 tensor, by the innermost frame of torchdiag's own code that asked."""

    def __init__(self):
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_flatten(out)[0]):
            own = [f for f in traceback.extract_stack()[:-1]
                   if "torchdiag/" in f.filename.replace("\\", "/") or "/tests/" in f.filename.replace("\\", "/")]
            if own and "/tests/" not in own[-1].filename.replace("\\", "/"):
                self.seen[f"{own[-1].filename.rsplit('torchdiag', 1)[-1]}:{own[-1].lineno} {func}"] += 1
        return out


@pytest.fixture
def no_float64(monkeypatch):
    """has_float64 → False everywhere it is asked; yields the recorder to enter around the run."""
    for name in ("torchdiag.core.gates", "torchdiag.diagnostics.doctor.gated", "torchdiag.diagnostics.gradflow.recheck"):
        importlib.import_module(name)
    for name, mod in list(sys.modules.items()):
        if name.startswith("torchdiag") and hasattr(mod, "has_float64"):
            monkeypatch.setattr(mod, "has_float64", lambda device: False)
    return _Float64Made()


class _Tasks(nn.Module):
    """tests/test_watch_tasks.py's model with 4-layer heads: 28 parameters, two reach-code words at float32's 23
    bits."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.heads = nn.ModuleDict({k: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                                                     nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, n))
                                    for k, n in (("cls", 2), ("reg", 1), ("seg", 2))})

    def forward(self, x, task):
        return self.heads[task](self.body(x))


def _tasks_run():
    """A task drawn per step, the regression's loss ~1e3 times the others' (tests/test_watch_tasks.py's loop)."""
    from torchdiag.diagnostics.watch import Watch

    torch.manual_seed(0)
    rnd = random.Random(0)
    model = _Tasks()
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    w = torch.randn(16, 1) * 30
    with Watch(every=50, replay=False) as watch:
        for _ in range(300):
            task = rnd.choice(["cls", "reg", "seg"])
            x = torch.randn(32, 16)
            out = model(x, task)
            loss = F.mse_loss(out, x @ w) if task == "reg" else F.cross_entropy(out, (x[:, 0] > 0).long())
            opt.zero_grad()
            loss.backward()
            opt.step()
    return watch.result()


def test_watch_runs_in_float32_where_the_device_has_no_float64(no_float64):
    """Before: 'watch stopped at step 0 after an internal error' (a float64 buffer on the device). Now the run is
    watched to the end, and the sets of parameters each step reached read back exactly from 23-bit words."""
    with no_float64:
        r = _tasks_run()
    assert not any("internal error" in n for n in r.notes), r.notes
    assert dict(no_float64.seen) == {}
    assert [f.code for f in r.findings if f.severity != "info"] == [], [(f.code, f.message) for f in r.findings]
    assert any("3 sets of parameters in turns" in n and "at 2 levels of loss" in n for n in r.notes), r.notes


CASES = [
    ("cnn.py:build", "summary"), ("cnn.py:build", "flops"), ("cnn.py:build", "nancheck"),
    ("cnn.py:build", "gradflow"), ("cnn.py:build", "doctor"), ("cnn.py:build", "overfit-batch"),
    ("cnn.py:build", "activations"), ("cnn.py:build", "lr-find"), ("gpt_tiny.py:build", "attention"),
    ("gpt_tiny.py:build", "doctor"), ("gpt_tiny.py:build", "nancheck"), ("gpt_tiny.py:build", "activations"),
    ("broken_nan_forward.py:build", "nancheck"), ("broken_dead_relu.py:build", "gradflow"), ("gpt_tiny.py:build", "gradflow"), ("broken_exploding.py:build", "gradflow"),
    ("broken_grad_vanishing.py:build", "doctor"), ("broken_dead_relu.py:build", "activations"),
    ("broken_nan_after_steps.py:build", "nancheck"), ("by_design_gates.py:cait_like", "gradflow"),
]


@pytest.mark.parametrize("spec, command", CASES, ids=[f"{c}-{s.split('.')[0]}" for s, c in CASES])
def test_commands_make_no_float64_where_the_device_has_none(cli, no_float64, spec, command):
    with no_float64:
        r = cli(command, ROOT + spec, "--json")
    doc = json.loads(r.stdout)
    assert r.code in (0, 1) and "error" not in doc, (r.code, r.stdout[-600:], r.stderr[-600:])
    assert dict(no_float64.seen) == {}


MASKED = """
import torch
import torch.nn as nn


class Mask(nn.Module):   # writes -inf as a constant: core/fills.py reads the model's buffers for such values
    def forward(self, y):
        keep = torch.ones(y.shape[-1], dtype=torch.bool, device=y.device)
        keep[-1] = False
        return y.masked_fill(~keep, float("-inf"))


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))
        self.mask = Mask()

    def forward(self, x):
        return self.mask(self.lin(x) * self.scale)


def build():
    return Masked()


def example_inputs():
    return torch.randn(4, 8)
"""


def test_a_mask_written_as_constants_is_read_without_float64(cli, no_float64, tmp_path):
    """core/fills.py's look at the model's buffers for the values it writes: a float64 copy made on the device."""
    (tmp_path / "masked.py").write_text(MASKED)
    with no_float64:
        r = cli("activations", f"{tmp_path / 'masked.py'}:build", "--json")
    assert r.code in (0, 1) and "error" not in json.loads(r.stdout), (r.code, r.stderr[-600:])
    assert dict(no_float64.seen) == {}


def test_gradcheck_refuses_a_device_without_float64_in_one_line(cli, no_float64):
    r = cli("gradcheck", ROOT + "mlp.py:build", "-i", "2x8")
    assert r.code == 2
    assert "gradcheck compares gradients in float64" in r.stderr and "Traceback" not in r.stderr


def test_gradient_norms_in_float32_do_not_overflow_where_float64_would_not():
    """watch's total gradient norm per step, from per-parameter norms: squared in float32 a 3e20 norm overflows
    (inf, read as a non-finite gradient); scaled by each row's largest first it stays finite."""
    from torchdiag.diagnostics.watch.stats import _row_norms

    rows = torch.tensor([[3e20, 4e20, 0.0], [3.0, 4.0, 0.0], [float("inf"), 1.0, 2.0], [0.0, 0.0, 0.0]])
    assert rows.square().sum(1)[0].isinf()   # the naive float32 way
    got = _row_norms(rows, torch.float32).tolist()
    assert got[0] == pytest.approx(5e20, rel=1e-6) and got[1] == pytest.approx(5.0) and got[3] == 0.0
    assert got[2] == float("inf")
    assert _row_norms(rows, torch.float64).tolist()[:2] == pytest.approx([5e20, 5.0])
