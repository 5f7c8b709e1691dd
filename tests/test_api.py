"""Python API and torchdiag.testing: same results as the CLI, light import, assertions that fail with findings."""
import subprocess
import sys

import pytest
import torch
from torch import nn

import torchdiag
from torchdiag import testing

from conftest import ROOT, load


def test_import_torchdiag_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, torchdiag, torchdiag.testing; "
                          "print([m for m in ('torch', 'torchinfo', 'fvcore', 'tensorboard') if m in sys.modules])"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_summary_and_flops_from_python(untouched):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    with untouched(model):
        s = torchdiag.summary(model, x)
        f = torchdiag.flops(model, x, backward=True, loss="sum")
    assert s.data["total_params"] == 8 * 16 + 16 + 16 * 2 + 2
    assert f.data["forward_macs"] == 4 * (8 * 16 + 16 * 2)
    assert f.to_dict()["command"] == "flops"


def test_dict_inputs_and_unknown_option():
    model, inputs = load("transformer_lm.py:build")
    r = torchdiag.summary(model, inputs.kwargs)
    assert r.data["total_params"] == 168_192
    with pytest.raises(torchdiag.UsageError, match="unknown option"):
        torchdiag.summary(model, inputs.kwargs, dpeth=2)


def test_assertions_pass_on_healthy_model():
    model, inputs = load("cnn.py:build")
    x = inputs.args[0]
    testing.assert_finite(model, x)
    testing.assert_gradients_flow(model, x)
    testing.assert_can_overfit(model, x, steps=200)
    assert testing.assert_params_under(model, 30_000) == 25_578
    testing.assert_macs_under(model, x, 5e9)


def test_assertions_fail_with_finding_text():
    model, _ = load("two_input.py:build", inputs=["4x3x16x16", "4x12"])
    x = (torch.randn(4, 3, 16, 16), torch.randn(4, 12))
    with pytest.raises(AssertionError, match="no-grad aux_head"):
        testing.assert_gradients_flow(model, x)
    testing.assert_gradients_flow(model, x, allow=["aux_head.*"])
    testing.assert_gradients_flow(model, x, allow="aux_head.*")  # one glob as a string
    with pytest.raises(AssertionError, match="no-grad aux_head"):
        testing.assert_gradients_flow(model, x, allow="nothing.*")
    with pytest.raises(AssertionError, match="parameters > limit"):
        testing.assert_params_under(model, 100)
    broken, binputs = load("broken_nan_forward.py:build")
    with pytest.raises(AssertionError, match="non-finite"):
        testing.assert_finite(broken, binputs.args)


def test_custom_loss_callable():
    model = nn.Linear(3, 1)
    calls = []

    def my_loss(out, target):
        calls.append(target)
        return (out - 1).pow(2).mean()

    r = torchdiag.gradflow(model, torch.randn(5, 3), loss=my_loss)
    assert calls and r.exit_code == 0
