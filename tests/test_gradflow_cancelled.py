"""gradflow's `cancelled` (diagnostics/gradflow/gated._cancelled, term.cancellations): a vanishing gradient read where
the parameter acts. timm's hgnetv2_b2 (healthy) got a `vanishing-grad` warning on a learnable affine's scalar scale
in front of a 1x1 convolution and a BatchNorm (grad/weight 9.7e-8): BatchNorm divides out the scale it sets, and
only eps's share of a gradient reaches it. What it changes at its module's output is orthogonal to the loss's
gradient there (cosine ~1e-9). A real vanishing gradient (a chain of sigmoids) keeps its verdict: there the cosine
is near 1, however small the gradient."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchdiag.api import run


class Gain(nn.Module):
    """A learnable scalar scale and shift of its input (hgnetv2's LearnableAffineBlock, written here)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.shift = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.scale * x + self.shift


def _gain_before_batchnorm(after: bool = False) -> nn.Module:
    """A gain in front of a convolution and a BatchNorm, which cancel its scale (or behind them: `after`, where the
    loss reads it). The convolution's output is large (inputs of RMS 30), so eps's share is tiny."""
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
    body = [conv, Gain()] if after else [Gain(), conv]
    return nn.Sequential(*body, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))


def _batch(scale: float = 20.0):
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, 8, 8, generator=g) * scale, torch.randint(0, 4, (8,), generator=g)


def _cancellations(model, x, names):
    from torchdiag.core.context import context_for
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.run import RunSpec
    from torchdiag.diagnostics.gradflow.term import cancellations

    ctx = context_for(model, RunSpec("gradflow", caller="python"))
    return cancellations(model, ModelInputs((x,)), names, ctx, None, False)


def test_a_weight_on_one_sample_acts_along_its_output_gradient_however_small():
    """Closed form: for o = W x on one sample, W's gradient is g x^T, and moving W along it moves o by g |x|^2: every
    term g_i d_i has one sign and their sum is all of their magnitudes, though the chain of sigmoids leaves g ~1e-10
    of the last layer's."""
    from sample_models.broken_grad_vanishing import build

    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(0))
    got = _cancellations(build(), x, ["0.weight", "2.weight"])
    assert got["0.weight"].module == "0" and abs(got["0.weight"].share - 1) < 1e-3, got
    assert abs(got["2.weight"].share - 1) < 1e-3 and not got["2.weight"].cancelled(), got


@pytest.mark.parametrize("scale", [10.0, 20.0])
def test_a_gain_before_batchnorm_moves_its_output_by_terms_that_cancel(scale):
    x, _ = _batch(scale)
    got = _cancellations(_gain_before_batchnorm(), x, ["0.scale"])["0.scale"]
    assert got.module == "0" and got.share < 1e-6 and got.cancelled(), got
    assert 100 < got.terms <= x.numel(), got   # the input's values, each its own term
    behind = _cancellations(_gain_before_batchnorm(after=True), x, ["1.scale"])["1.scale"]
    assert behind.share > 100 * behind.bound(), behind


def _row(res, name):
    return next(r for r in res.table("params").rows if r["name"] == name)


def test_a_gain_whose_scale_a_following_batchnorm_divides_out_is_cancelled_not_vanishing():
    x, y = _batch()
    model = _gain_before_batchnorm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = run("gradflow", model, (x,), target=y, loss=nn.functional.cross_entropy, strict=True)
    row = _row(res, "0.scale")
    assert row["grad_weight_ratio"] < 1e-7 and row["status"] == "cancelled", row
    assert res.exit_code == 0, [f.to_dict() for f in res.findings]
    f = next(f for f in res.findings if f.code == "cancelled")
    assert f.severity == "info" and f.where == "0.scale" and "of their magnitudes" in f.message, f.to_dict()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())   # the user's model untouched


def test_the_same_gain_behind_the_batchnorm_gets_a_normal_gradient():
    x, y = _batch()
    res = run("gradflow", _gain_before_batchnorm(after=True), (x,), target=y, loss=nn.functional.cross_entropy)
    assert _row(res, "1.scale")["status"] == "ok"


def test_a_chain_of_sigmoids_keeps_its_vanishing_verdict():
    from sample_models.broken_grad_vanishing import build, example_inputs

    res = run("gradflow", build(), example_inputs(), strict=True)
    rows = res.table("params").rows
    assert _row(res, "0.weight")["status"] == "vanishing-grad"
    assert not any(r["status"] == "cancelled" for r in rows)
    assert res.exit_code == 1


class _PaddedTail(nn.Module):
    """An RNN classifier read at the last step of right-padded sequences (3 real steps, 27 of zeros): the gradient
    through 27 steps of a contracting recurrence vanishes (a hostile review: `cancelled`, the move lands on the early
    steps where the loss's gradient is 0)."""

    def __init__(self, cell):
        super().__init__()
        self.rnn, self.head = cell(4, 16, batch_first=True), nn.Linear(16, 4)
        with torch.no_grad():
            self.rnn.weight_hh_l0.mul_(0.5)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class _TwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.main, self.side = nn.Linear(16, 4), nn.Parameter(torch.randn(4, 16) * 0.3)

    def forward(self, x):
        return self.main(x), x @ self.side.t()


class _SideScaledDown(nn.Module):
    """A module returning (main, side), the side added with a mistaken factor of 1e-9."""

    def __init__(self):
        super().__init__()
        self.t = _TwoOut()

    def forward(self, x):
        a, b = self.t(x)
        return a + 1e-9 * b


class _Tiny(torch.autograd.Function):
    """A backward that scales the gradient by 1e-9 (a custom op's bug)."""

    @staticmethod
    def forward(ctx, a):
        return a.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 1e-9


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x):
        return _Tiny.apply(x @ self.w.t())


def _faults():
    g = torch.Generator().manual_seed(0)
    seq = torch.zeros(8, 30, 4)
    seq[:, :3] = torch.randn(8, 3, 4, generator=g)
    labels = torch.randint(0, 4, (8,), generator=g)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    return [(lambda: _PaddedTail(nn.GRU), seq, labels, "rnn.weight_ih_l0"),
            (lambda: _PaddedTail(nn.LSTM), seq, labels, "rnn.weight_ih_l0"), (_SideScaledDown, x, y, "t.side"),
            (lambda: nn.Sequential(_Custom(), nn.Linear(16, 4)), x, y, "0.w")]


@pytest.mark.parametrize("case", range(4))
def test_a_gradient_that_vanishes_before_it_arrives_keeps_its_warning(case):
    """The hostile review's faults, each `cancelled` when the rule inferred the terms' sum from |p| |grad p|: small
    terms are not cancelled ones."""
    build, x, y, name = _faults()[case]
    torch.manual_seed(0)
    res = run("gradflow", build(), (x,), target=y, loss=nn.functional.cross_entropy, strict=True)
    assert _row(res, name)["status"] == "vanishing-grad", _row(res, name)
    assert res.exit_code == 1


class _HotAttention(nn.Module):
    """A learnable inverse temperature far too large: the softmax saturates (a real fault; a second review found it
    `cancelled`: each row's few near-tied logits cancel by the softmax's structure, over ~2 terms)."""

    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.tau = nn.Parameter(torch.tensor([1000.0]))

    def forward(self, x):
        return torch.softmax(self.tau * (self.q(x) @ self.k(x).transpose(-1, -2)), -1) @ self.v(x)


def test_a_saturated_softmax_keeps_its_warning():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 8, 16, generator=g) * 3, torch.randint(0, 4, (8,), generator=g)
    model = nn.Sequential(_HotAttention(), nn.Flatten(), nn.Linear(128, 4))
    res = run("gradflow", model, (x,), target=y, loss=nn.functional.cross_entropy, strict=True)
    assert _row(res, "0.tau")["status"] == "vanishing-grad", _row(res, "0.tau")
    assert res.exit_code == 1


class _Reused(nn.Module):
    """One gain called twice: before a convolution and BatchNorm (its scale divided out), and either before a second
    convolution and BatchNorm (`twice_cancelled`) or inside a saturated sigmoid gate the output needs, where its
    gradient just vanishes (a review: pooled, the gate's small terms hid under the BatchNorm path's large ones)."""

    def __init__(self, twice_cancelled: bool):
        super().__init__()
        torch.manual_seed(0)   # (other draws: Adam moves the gain like the rest, `adaptive-step`, never cancelled)
        self.twice = twice_cancelled
        self.gain = Gain()
        del self.gain.shift   # a shift in the gate would open it within the short training run (by-design-init)
        self.gain.shift = 0.0
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        if twice_cancelled:
            self.conv2 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.conv(self.gain(x)).relu().mean((2, 3))
        if self.twice:
            return self.fc(h + self.conv2(self.gain(x)).relu().mean((2, 3)))
        gate = torch.sigmoid(self.gain(x.mean((1, 2, 3)))[:, None] - 30.0)
        return self.fc(h) * (1 + gate)


@pytest.mark.parametrize("twice_cancelled", [False, True])
def test_a_module_called_twice_is_cancelled_only_when_both_calls_cancel(twice_cancelled):
    x, y = _batch()
    got = _cancellations(_Reused(twice_cancelled), x, ["gain.scale"])["gain.scale"]
    assert len(got.parts) == 2, got   # one reading per call
    # SGD: under Adam the step moves the gain like the rest (`adaptive-step`, decided first), on some CPUs and not on
    # others, its gradient's float32 rounding differing
    res = run("gradflow", _Reused(twice_cancelled), (x,), target=y, loss=nn.functional.cross_entropy, strict=True,
              optimizer="sgd", lr=0.1)
    row = _row(res, "gain.scale")
    assert row["grad_weight_ratio"] < 1e-7, row
    if twice_cancelled:
        assert got.cancelled() and row["status"] == "cancelled" and res.exit_code == 0, (got, row)
    else:   # pooled the terms cancel (share ~1e-8 of ~500 terms); the gate's call alone has a handful that do not
        assert got.share < got.bound() and not got.cancelled(), got
        assert row["status"] == "vanishing-grad" and res.exit_code == 1, row


class _Token(nn.Module):
    """One gain on a class token of 8 values a sample (a part of ~16 terms) and on 64 patches, each then a projection
    and a LayerNorm: both calls cancel (a review: asked for 32 terms, the token's call kept a false warning)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cls = nn.Parameter(torch.randn(1, 1, 8) * 30)
        self.gain = Gain()
        del self.gain.shift
        self.gain.shift = 0.0
        self.proj = nn.Linear(8, 8, bias=False)
        self.ln_c, self.ln_p = nn.LayerNorm(8), nn.LayerNorm(8)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        c = self.ln_c(self.proj(self.gain(self.cls.expand(x.shape[0], -1, -1))))[:, 0]
        return self.head(torch.cat([c, self.ln_p(self.proj(self.gain(x))).mean(1)], 1))


class _Views(nn.Module):
    """Two views through one gain and convolution, their features concatenated along the batch and normalised by one
    BatchNorm (a siamese encoder): neither call cancels alone (each leaves ~1%), both together do (a review)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gain = Gain()
        del self.gain.shift
        self.gain.shift = 0.0
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        views = [x, x.flip(-1) + 0.5 * x.roll(1, 0)]
        h = self.bn(torch.cat([self.conv(self.gain(v)) for v in views], 0)).relu().mean((2, 3))
        return self.fc(sum(h.chunk(2)))


@pytest.mark.parametrize("build, how", [(_Token, {}), (_Views, {"optimizer": "sgd", "lr": 0.1})])
def test_calls_that_cancel_each_alone_or_all_together_are_cancelled(build, how):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, 8, generator=g) * 30 if build is _Token else torch.randn(8, 3, 8, 8, generator=g) * 20
    y = torch.randint(0, 4, (x.shape[0],), generator=g)
    got = _cancellations(build(), x, ["gain.scale"])["gain.scale"]
    assert len(got.parts) == 2 and got.cancelled(), got
    # (under Adam its step moves the gain like the rest, `adaptive-step`, decided before this is asked: the views on
    # every CPU, the token on some, its gradient's float32 rounding differing; the cancellation itself is asked above)
    res = run("gradflow", build(), (x,), target=y, loss=nn.functional.cross_entropy, strict=True, **how)
    said = ("cancelled",) if how else ("cancelled", "adaptive-step")
    assert _row(res, "gain.scale")["status"] in said and res.exit_code == 0, _row(res, "gain.scale")


class _CheckpointedGate(_Reused):
    """_Reused's saturated gate, its call inside a reentrant checkpoint: backward runs it again, and that recompute
    is where its gradient is (a review: matched by count against the call outside, it was dropped: `cancelled`)."""

    def __init__(self):
        super().__init__(twice_cancelled=False)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        h = self.conv(self.gain(x)).relu().mean((2, 3))
        gate = checkpoint(lambda v: torch.sigmoid(self.gain(v.mean((1, 2, 3)))[:, None] - 30.0), x,
                          use_reentrant=True)
        return self.fc(h) * (1 + gate)


class _CheckpointedGateAndMore(_CheckpointedGate):
    """_CheckpointedGate with one more call backward does not run again: under the user's own no_grad (a statistic),
    or inside a second reentrant checkpoint whose output the loss never reads (a second review: matched by count, the
    gated call was dropped again, `cancelled`)."""

    def __init__(self, more: str):
        super().__init__()
        self.more = more

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        if self.more == "dropout, no RNG kept":   # the recompute draws another mask: equal to nothing (a third review)
            self.unused = checkpoint(lambda v: self.gain(v * 2), x, use_reentrant=True)
            h = self.conv(self.gain(x)).relu().mean((2, 3))
            gate = checkpoint(lambda v: torch.sigmoid(self.gain(nn.functional.dropout(v, 0.1).mean((1, 2, 3)))[:, None]
                                                      - 30.0), x, use_reentrant=True, preserve_rng_state=False)
            return self.fc(h) * (1 + gate)
        if self.more == "no_grad":
            with torch.no_grad():
                self.stat = self.gain(x).std()
        else:
            self.unused = checkpoint(lambda v: self.gain(v * 2), x, use_reentrant=True)
        return super().forward(x)


@pytest.mark.parametrize("more", [None, "no_grad", "unused checkpoint", "dropout, no RNG kept"])
def test_a_call_inside_a_reentrant_checkpoint_is_read_from_its_recompute(more):
    x, y = _batch()
    x.requires_grad_(True)   # a reentrant checkpoint's output needs an input that requires grad
    build = _CheckpointedGate if more is None else (lambda: _CheckpointedGateAndMore(more))
    got = _cancellations(build(), x, ["gain.scale"])["gain.scale"]
    assert len(got.parts) == 2 and not got.cancelled(), got
    # SGD: under Adam a gradient of 1.4e-8 against eps 1e-8 is stepped like the rest on some CPUs (`adaptive-step`,
    # a new machine's float32 rounding), which is not what this asks
    res = run("gradflow", build(), (x,), target=y, loss=nn.functional.cross_entropy, strict=True, optimizer="sgd", lr=0.1)
    assert _row(res, "gain.scale")["status"] == "vanishing-grad" and res.exit_code == 1, _row(res, "gain.scale")



class _ComplexScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, dtype=torch.complex64))

    def forward(self, z):
        return self.scale * z


class _ComplexGain(nn.Module):
    """A complex scalar gain on complex features, then |.| and a BatchNorm: the BatchNorm divides out |gain| and the
    modulus its phase (a review: the invariance test's slope took float() of a complex dot, exit 4)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.g, self.bn, self.fc = _ComplexScale(), nn.BatchNorm1d(32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(self.bn(self.g(torch.complex(x[:, :32] * 20, x[:, 32:] * 20)).abs()))


def test_a_complex_gain_that_a_batchnorm_divides_out_is_read_by_its_real_and_imaginary_parts():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 64, generator=g), torch.randint(0, 4, (16,), generator=g)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run("gradflow", _ComplexGain(), (x,), target=y, loss=nn.functional.cross_entropy, strict=True,
                  optimizer="sgd")
    row = _row(res, "g.scale")
    assert row["grad_weight_ratio"] < 1e-7 and row["status"] == "cancelled" and res.exit_code == 0, row
    assert not [w for w in caught if "imaginary" in str(w.message)], [str(w.message) for w in caught]
