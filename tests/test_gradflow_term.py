"""gradflow's `small-term` (diagnostics/gradflow/term.py): a grad/weight ratio read where the parameter acts. A hunt
on libraries beyond the zoo: a healthy spectral-norm discriminator on a batch all of one class (a GAN's real batch)
had its scalar output bias, drawn at ~0.005 by PyTorch's U(±1/√4096), called `exploding-grad` (grad/weight
100-175 from a gradient of 0.5, in 6 of 20 seeds; exit 1). Moved by its own norm it moves the logits by ~1%: the
ratio where it acts is ~2. A term the output is all of keeps the verdict."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import spectral_norm

from torchdiag.api import run


class Discriminator(nn.Module):
    """DCGAN-like, spectral norm on every layer (its power iteration updates a buffer at each train-mode forward),
    the output bias set to a draw of PyTorch's default range."""

    def __init__(self, bias: float = 0.004):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(spectral_norm(nn.Conv2d(3, 32, 4, 2, 1)), nn.LeakyReLU(0.2),
                                 spectral_norm(nn.Conv2d(32, 64, 4, 2, 1)), nn.LeakyReLU(0.2))
        self.fc = spectral_norm(nn.Linear(64 * 8 * 8, 1))
        with torch.no_grad():
            self.fc.bias.fill_(bias)

    def forward(self, x):
        return self.fc(self.net(x).flatten(1))


def _mostly_bias() -> nn.Module:
    """A regression whose output is mostly its bias (0.004 beside a weight term of ~0.003): both far from a target of
    1, both with grad/weight in the hundreds, and neither a small part of the output."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 1)
    with torch.no_grad():
        lin.weight.normal_(0, 1e-3)
        lin.bias.fill_(0.004)
    return lin


def _real_batch():
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return (x, torch.ones(16, 1)), nn.functional.binary_cross_entropy_with_logits


def _row(res, name):
    return next(r for r in res.table("params").rows if r["name"] == name)


def test_a_small_bias_beside_the_logits_it_is_added_to_is_a_small_term():
    (x, y), bce = _real_batch()
    model = Discriminator()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = run("gradflow", model, (x,), target=y, loss=bce)
    row = _row(res, "fc.bias")
    assert row["grad_weight_ratio"] > 100 and row["status"] == "small-term", row
    assert res.exit_code == 0, [f.to_dict() for f in res.findings]
    f = next(f for f in res.findings if f.code == "small-term")
    assert f.severity == "info" and "moves fc's output by" in f.message and "read where it acts the ratio is" in f.message
    acting = float(f.message.split("read where it acts the ratio is ")[1].split(",")[0])
    assert acting < 10, f.message    # ~1% of the logits for its own norm: a ratio of a few
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())   # the user's model untouched


def test_a_bias_the_output_is_all_of_keeps_the_verdict():
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    res = run("gradflow", _mostly_bias(), (x,), target=torch.ones(16, 1), loss=nn.functional.mse_loss,
              optimizer="sgd")
    row = _row(res, "bias")
    assert row["grad_weight_ratio"] > 100 and row["status"] == "exploding-grad", row
    assert res.exit_code == 1
    f = next(f for f in res.findings if f.code == "exploding-grad")
    assert "read where it acts ((root)'s output, moved along its gradient on a copy) the ratio is" in f.message, f.message


class _UsedTwice(Discriminator):
    """The same discriminator whose output bias is also read again, scaled, by the model itself: small beside the
    logits at its own layer, a large part of the model's output."""

    def forward(self, x):
        return self.fc(self.net(x).flatten(1)) + 40 * self.fc.bias


def test_a_parameter_also_used_elsewhere_is_read_where_it_moves_most():
    (x, y), bce = _real_batch()
    res = run("gradflow", _UsedTwice(bias=0.004), (x,), target=y, loss=bce)
    row = _row(res, "fc.bias")
    assert row["grad_weight_ratio"] > 100 and row["status"] == "exploding-grad", row
    f = next(f for f in res.findings if f.code == "exploding-grad" and "fc" in f.where)
    assert "read where it acts ((root)'s output" in f.message, f.message


class _Block(nn.Module):
    """Returns what the model reads (features plus an offset) and a second output, 10⁴ × the features, that the model
    never reads."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.offset = nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        f = self.body(x)
        return f + self.offset, f * 1e4


class _Unread(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head, self.side = _Block(), nn.Linear(16, 4), nn.Linear(8, 4)

    def forward(self, x):
        h, _ = self.block(x)
        return self.head(torch.relu(h)) + 1e3 * self.side(x)   # the model's output: mostly a path the offset is not on


def test_the_reach_is_read_on_the_outputs_the_loss_reads():
    """A review: a module's second output that nothing reads entered the norm its move was compared with, so a
    parameter that moves its module's output by its own share read as a term of 10⁻⁴, and its verdict as small-term.
    Moved against its gradient by EPS of its norm, the offset moves the block's first output by exactly √n·EPS·‖offset‖
    (broadcast over the n rows)."""
    import math

    from torchdiag.api import as_inputs, run_spec
    from torchdiag.core.context import context_for
    from torchdiag.diagnostics import gradflow
    from torchdiag.diagnostics.gradflow.term import reaches

    torch.manual_seed(0)
    model, x = _Unread(), torch.randn(8, 8)
    ctx = context_for(model, run_spec("gradflow", gradflow), loss="auto", target=None)
    got = reaches(model, as_inputs(model, (x,)), ["block.offset"], ctx, lambda work: None, False)["block.offset"]
    with torch.no_grad():
        h = model.block(x)[0]
    assert got.module == "block"
    assert math.isclose(got.reach, math.sqrt(8) * model.block.offset.norm().item() / h.norm().item(), rel_tol=1e-4)


class _Loud(_Unread):
    """The offset 1000× in its effect, added outside its block: SGD's short run takes the loss up 654 → 1.3e3, and
    at the model's output, mostly the side path, its move reads as small."""

    def forward(self, x):
        f = self.block.body(x)
        h, _ = f + self.block.offset * 1000, self.block(x)[1]
        return self.head(torch.relu(h)) + 1e3 * self.side(x)


def test_a_ratio_whose_short_run_raised_the_loss_is_never_a_small_term():
    """A review: the offset read as a small term where it acts while SGD's steps doubled the loss: small-term (info).
    Whatever the reading, a short run whose loss rose keeps the error."""
    torch.manual_seed(0)
    res = run("gradflow", _Loud(), (torch.randn(8, 8),), optimizer="sgd")
    row = _row(res, "block.offset")
    assert row["grad_weight_ratio"] > 100 and row["status"] == "exploding-grad", row
    assert res.exit_code == 1


class _Offset(nn.Module):
    """The bias the output is all of, behind an identity layer, plus a fixed large offset in the model's output:
    small beside the model's output, all of its own module's. `reentrant`: the Linear runs inside
    torch.utils.checkpoint(use_reentrant=True), which runs its forward under no_grad and again in backward."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.lin, self.pre, self.reentrant = _mostly_bias(), nn.Linear(8, 8), reentrant
        with torch.no_grad():
            self.pre.weight.copy_(torch.eye(8))
            self.pre.bias.zero_()

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        z = self.pre(x)
        h = checkpoint(self.lin, z, use_reentrant=True) if self.reentrant else self.lin(z)
        return h + 100 * x[:, :1]


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")   # torch's, in the no_grad passes
def test_a_module_inside_a_reentrant_checkpoint_is_read_at_its_own_output():
    """A review: the checkpointed Linear's forward output had no graph, so its reach was read at the model's output,
    where the offset makes it small, and an exploding bias became small-term (info); its recompute in backward is
    what the loss reads."""
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    for reentrant in (False, True):
        res = run("gradflow", _Offset(reentrant), (x,), target=100 * x[:, :1] + 1, loss=nn.functional.mse_loss,
                  optimizer="sgd")
        row = _row(res, "lin.bias")
        assert row["grad_weight_ratio"] > 100 and row["status"] == "exploding-grad", (reentrant, row)
        assert res.exit_code == 1


def test_the_probe_step_is_sized_by_the_whole_norm_of_a_complex_or_half_parameter():
    """A complex parameter's step was sized by its real part (`.float()` drops the imaginary one, with a warning)."""
    import warnings

    from torchdiag.diagnostics.gradflow.term import _fnorm

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert abs(_fnorm(torch.tensor([3 + 4j, 0j], dtype=torch.complex64)).item() - 5) < 1e-6
        assert abs(_fnorm(torch.tensor([300.0, 400.0], dtype=torch.float16)).item() - 500) < 1e-3  # 2.5e5 > fp16 max
