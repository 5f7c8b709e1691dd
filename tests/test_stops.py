"""Where a zero gradient stops (core/stops.py, issue 26): the module that cuts the path, found by measuring the
gradients at every module's input and output, and the zero value inside it that closes it, found by opening it.
Hand-built cases whose cause is known by construction."""
import torch
from torch import nn

from torchdiag.api import run


class FrozenScale(nn.Module):
    """A frozen normalisation's affine part held as buffers (as a frozen BatchNorm does), its scale at 0."""

    def __init__(self, c):
        super().__init__()
        self.register_buffer("weight", torch.zeros(c))
        self.register_buffer("bias", torch.zeros(c))    # also 0 everywhere, but it does not close anything

    def forward(self, x):
        return x * self.weight + self.bias


class FrozenZeroResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.branch = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), FrozenScale(16))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + self.branch(h))


class Round(nn.Module):
    def forward(self, x):
        return torch.round(x)


class RoundedModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.r, self.head = nn.Linear(8, 8), Round(), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.r(self.enc(x)))


class ZeroQueries(nn.Module):
    """DETR's first decoder layer: its value projection reads queries that are zeros by construction."""

    def __init__(self):
        super().__init__()
        self.q, self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x) + self.q(torch.zeros_like(x)))


def errors(res):
    return [f for f in res.findings if f.severity == "error"]


def gradflow(model):
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    res = run("gradflow", model, (torch.randn(4, 8),))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())   # the copy was opened, not this
    return res


def test_a_zero_buffer_that_closes_the_path_is_named():
    res = gradflow(FrozenZeroResidual())
    (f,) = errors(res)
    assert f.code == "zero-grad" and f.where == "branch"
    assert "the gradient stops at branch.2 (FrozenScale)" in f.message
    assert "buffer `weight` is 0 everywhere" in f.message and "`bias`" not in f.message   # the zero that opens it
    assert "non-zero init" in f.hint


def test_a_module_with_a_zero_derivative_op_is_named():
    (f,) = errors(gradflow(RoundedModule()))
    assert f.where == "enc" and "the gradient stops at r (Round)" in f.message
    assert "an op inside it has a zero derivative (`round`)" in f.message


def test_a_zero_derivative_op_outside_any_module_names_the_last_module_passed():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(torch.round(self.enc(x) * 4) / 4)

    (f,) = errors(gradflow(Functional()))
    assert "the gradient stops at a `round` op after enc (Sequential), the last module it passes" in f.message
    assert "the `round` op" in f.hint


def test_a_zero_derivative_op_in_the_owners_own_forward_is_named():
    class SoftmaxOfOne(nn.Module):   # SwiftFormer's additive attention: a softmax over an axis of size 1
        def __init__(self):
            super().__init__()
            self.w_g = nn.Parameter(torch.randn(8, 1))
            self.proj = nn.Linear(8, 3)

        def forward(self, x):
            return self.proj(x * torch.softmax(x @ self.w_g, dim=-1))

    (f,) = errors(gradflow(SoftmaxOfOne()))
    assert f.where == "w_g" and "the gradient stops at a `softmax` op in the forward of (root)" in f.message


def test_a_weight_fed_zeros_is_said_so():
    (f,) = errors(gradflow(ZeroQueries()))
    assert f.where == "q.weight"   # q.bias learns: only the weight multiplies the zeros
    assert "its module q (Linear) gets an input that is 0 everywhere at every call" in f.message


def test_doctor_says_where_the_gradient_stops():
    torch.manual_seed(0)
    res = run("doctor", FrozenZeroResidual(), (torch.randn(4, 8),))
    stuck = [f for f in res.findings if f.code == "param-not-updated"]
    assert {f.where for f in stuck} == {"branch.0.weight", "branch.0.bias"}
    assert all("the gradient stops at branch.2 (FrozenScale)" in f.message for f in stuck)


def test_a_healthy_model_pays_nothing():
    res = gradflow(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    assert not any("zero gradient(s) stop" in n for n in res.notes)
