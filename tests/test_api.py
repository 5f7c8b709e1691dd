"""Python API and torchdiag.testing: same results as the CLI, light import, assertions that fail with findings."""
import subprocess
import sys

import pytest
import torch
from torch import nn

import torchdiag
from torchdiag import testing

from support import ROOT, load


@pytest.mark.slow
@pytest.mark.subprocess
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


@pytest.mark.slow
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
    with torch.random.fork_rng():   # seeded: with some draws the unscaled gradient trips exploding-grad
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
    calls = []

    def my_loss(out, target):
        calls.append(target)
        return (out - 1).pow(2).mean()

    r = torchdiag.gradflow(model, torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), loss=my_loss)
    assert calls and r.exit_code == 0


def test_api_result_is_the_one_the_cli_renders(cli):
    """The same Result: the CLI's JSON equals the API result's to_dict() on the same model and inputs."""
    import json

    from support import sample

    model, inputs = load("cnn.py:build")
    doc = torchdiag.flops(model, inputs.args[0]).to_dict()
    cli_doc = cli("flops", sample("cnn.py:build"), "--json").json
    # conv 3→16 and 16→32 (3×3, padding 1) on 32×32 then 16×16 after pooling, linear 2048→10; batch 8
    assert doc["forward_macs"] == cli_doc["forward_macs"] == 8 * (32 * 32 * 16 * 27 + 16 * 16 * 32 * 144 + 2048 * 10)
    assert json.loads(json.dumps(doc["modules"], default=str)) == cli_doc["modules"]


def test_gradcheck_from_python():
    import importlib.util

    from support import sample

    spec = importlib.util.spec_from_file_location("custom_autograd_t", sample("custom_autograd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x, y = torch.randn(3), torch.randn(3)
    assert torchdiag.gradcheck(mod.MulSquare, x, y).exit_code == 0
    bad = torchdiag.gradcheck(mod.WrongMulSquare, x, y)
    assert bad.exit_code == 1 and any(f.where.startswith("input[1]") for f in bad.findings if f.severity == "error")
    assert torchdiag.gradcheck(lambda a: (a ** 3).sum(), torch.randn(4)).exit_code == 0
    with pytest.raises(torchdiag.UsageError, match="takes 2 inputs, got 1"):
        torchdiag.gradcheck(mod.MulSquare, x)


def test_gradcam_and_embeddings_from_python(tmp_path, untouched):
    import numpy as np

    from torchdiag.render.images import save_png

    model, _ = load("gradcam_region.py:build")
    image = save_png((np.random.default_rng(0).uniform(0.3, 1, (32, 32, 3)) * 255).astype(np.uint8), tmp_path / "i.png")
    with untouched(model):
        r = torchdiag.gradcam(model, image, layer="features.3", mean=[0, 0, 0])
    heat = r.artefacts["heatmap"]
    # only rows/cols 16..31 reach the output; two 3×3 convs see 2 pixels further
    assert heat[:14, :].max() == 0 and heat[:, :14].max() == 0
    assert all(i >= 14 for i in np.unravel_index(heat.argmax(), heat.shape))
    model, inputs = load("cnn.py:build")
    e = torchdiag.embeddings(model, inputs.args[0], layer="head.0", logdir=tmp_path / "tb")
    assert e.data["samples"] == 8 and e.data["dim"] == 2048 and (tmp_path / "tb" / "embeddings").is_dir()


def test_overfit_and_macs_assertions_fail_with_finding_text(untouched):
    model = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    broken, binputs = load("broken_cannot_overfit.py:build", inputs=["16x784"])
    with untouched(broken), pytest.raises(AssertionError, match=r"cannot overfit one batch: loss .* in 60 steps") as e:
        testing.assert_can_overfit(broken, binputs.args, steps=60)
    # the findings, with the culprit: BatchMean (module "3") makes every sample's output the same
    assert "\n  identical-outputs 3: every sample of the batch gets the same output" in str(e.value)
    assert "\n  cannot-overfit" in str(e.value)
    x = torch.randn(4, 784)
    macs = 4 * (784 * 64 + 64 * 10)
    assert testing.assert_macs_under(model, x, macs) == macs
    with pytest.raises(AssertionError, match=f"{macs:,} forward MACs > limit {macs - 1:,}"):
        testing.assert_macs_under(model, x, macs - 1)
    with pytest.raises(TypeError, match="give the limit"):
        testing.assert_macs_under(model, x)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_package_is_lazy_but_complete():
    """`import torchdiag` loads nothing heavy, yet every public name and submodule is reachable from it."""
    import subprocess

    code = ("import sys, torchdiag\nassert 'torchdiag.api' not in sys.modules and 'torch' not in sys.modules\n"
            "names = [torchdiag.summary, torchdiag.api.run, torchdiag.testing.assert_finite, torchdiag.UsageError, "
            "torchdiag.Result, torchdiag.render.RenderSpec]\nprint(len(names))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "6", r.stderr


def test_optimizer_keywords_for_a_command_that_takes_no_steps_are_refused():
    """A review: flops(momentum=0.5) said 'applies to sgd only, not adam'; summary(lr=0.1) was ignored."""
    import pytest
    import torch

    from torchdiag.api import run
    from torchdiag.errors import OptionError

    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    for command, given in (("flops", {"momentum": 0.5}), ("summary", {"lr": 0.1})):
        with pytest.raises(OptionError, match="takes no optimizer steps"):
            run(command, model, x, **given)
    assert run("gradflow", model, x, optimizer="sgd", momentum=0.0).exit_code == 0


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.step += 1
        return self.b(torch.relu(self.a(x)))


class _SmallConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def _qat():
    m = _SmallConv().train()
    m.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
    return torch.ao.quantization.prepare_qat(m)


@pytest.mark.parametrize("make,shape", [(_Counter, (4, 8)), (_qat, (2, 3, 8, 8))], ids=["step-counter", "qat"])
@pytest.mark.parametrize("command", ["summary", "flops", "nancheck", "gradflow"])
def test_a_forward_that_writes_buffers_leaves_the_model_as_it_was(untouched, make, shape, command):
    """A sweep: summary and flops left a step-counter buffer at 1 and a fake-quant model's observers changed; on the
    fake-quant model nancheck and gradflow raised (exit 4) putting back observer buffers its first forward had
    resized (min_val (0,) -> (8,)), and left them changed."""
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape)
    with untouched(model):
        r = getattr(torchdiag, command)(model, x)
    assert int(r.exit_code) == 0, [f.to_dict() for f in r.findings]


class _AttrThenBuffer(nn.Module):
    """Its first forward turns a plain attribute into a buffer; a later one reads it either way."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.scale = 2.0
        self.register_buffer("acc", torch.full((4,), -0.0))

    def forward(self, x):
        if not isinstance(self.scale, torch.Tensor):
            del self.scale
            self.register_buffer("scale", torch.tensor(2.0))
        self.acc.mul_(0).add_(0.0)   # -0.0 becomes +0.0: equal as numbers, not as bits
        return self.lin(x) * self.scale


@pytest.mark.parametrize("command", ["summary", "flops", "nancheck", "gradflow"])
def test_a_forward_that_registers_a_buffer_over_an_attribute_is_undone(untouched, command):
    """Reviews: a buffer the forward registers stayed in the state_dict (an unexpected key for a fresh model); removing
    it lost the plain attribute it replaced (the model then raised); a -0.0 set to +0.0 compared equal and kept."""
    model, x = _AttrThenBuffer(), torch.randn(4, 8)
    with untouched(model):
        getattr(torchdiag, command)(model, x)
    assert model.scale == 2.0 and "scale" not in model.state_dict() and torch.signbit(model.acc).all()
    model(x)   # still runs


def test_run_of_a_command_line_only_command_is_a_usage_error():
    """A review: api.run("check", ...) raised ModuleNotFoundError (torchdiag.diagnostics.None)."""
    with pytest.raises(torchdiag.UsageError, match="command line only"):
        torchdiag.api.run("check", torch.nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(torchdiag.UsageError, match="unknown command 'CHECK'"):   # a KeyError before
        torchdiag.api.run("CHECK", torch.nn.Linear(2, 2), torch.randn(1, 2))
    for command, call in (("watch", "torchdiag.watch"), ("data", "torchdiag.data"), ("gradcheck", "torchdiag.gradcheck")):
        with pytest.raises(torchdiag.UsageError, match="takes no model and inputs") as e:   # AttributeError, TypeError
            torchdiag.api.run(command, torch.nn.Linear(2, 2), torch.randn(1, 2))
        assert call in e.value.hint


class _WritesItsWeight(nn.Module):
    """A forward that moves its own trained weight (a hostile review: every command left it moved, unsaid)."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)
        self.ema = nn.Parameter(torch.zeros(3), requires_grad=False)

    def forward(self, x, write="weight"):
        with torch.no_grad():
            (self.l.weight if write == "weight" else self.ema).add_(1.0)
        return self.l(x)


@pytest.mark.parametrize("command", ["nancheck", "gradflow", "summary", "activations"])
def test_a_forward_that_writes_its_own_parameters_is_said(command):
    model, x = _WritesItsWeight(), torch.randn(2, 4)
    before = model.l.weight.detach().clone()
    r = torchdiag.api.run(command, model, x)
    assert not torch.equal(model.l.weight, before)   # the premise: its own forward moved it (not undone: said)
    (f,) = [f for f in r.findings if f.code == "param-written-in-forward"]
    assert f.severity == "info" and f.where == "l.weight", f
    again = torchdiag.api.run(command, nn.Linear(4, 3), x)   # the next run of another model: nothing carried over
    assert not [f for f in again.findings if f.code == "param-written-in-forward"]


def test_state_a_forward_keeps_in_a_frozen_parameter_is_info():
    model = _WritesItsWeight()
    r = torchdiag.api.run("nancheck", model, {"x": torch.randn(2, 4), "write": "ema"})
    (f,) = [f for f in r.findings if f.code == "param-written-in-forward"]
    assert f.severity == "info" and f.where == "ema", f


def test_option_errors_name_the_other_options_in_python_terms():
    # a review: Python callers were told "is the --input-field too" and "--optimizer sgd --momentum M"
    from torchdiag.core.run import optimizer_spec
    from torchdiag.diagnostics.data.options import Options
    from torchdiag.errors import OptionError

    with pytest.raises(OptionError, match=r"target_field: 'a' is the input_field too") as e:
        Options(input_field="a", target_field="a")
    assert "--" not in e.value.message + (e.value.hint or "")
    with pytest.raises(OptionError) as e:
        optimizer_spec(None, momentum=0.5)
    assert e.value.hint == "optimizer sgd with momentum M, or leave momentum out"
