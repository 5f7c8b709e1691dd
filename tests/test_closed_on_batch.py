"""Zero gradients of the batch alone (a sweep: timm's sehalonet33ts failed gradflow with two zero-grad errors, the
linears of a squeeze-excite block whose 8 ReLU units were all zero on the 2 samples, while 2 of 8 are dead on fresh
samples). After the short training run, fresh draws of torchdiag's own inputs give them a gradient for at least a
quarter of the samples: closed-on-batch, info. A unit closed for every input keeps its error, and so does one shut on
a user's own batch (mixing its entries makes inputs the data may never have: a review's one-hot DNA)."""
import math

import pytest
import torch
from torch import nn

from torchdiag.api import run
from torchdiag.core.inputs import ModelInputs
from torchdiag.core.unreached import open_often


class Squeeze(nn.Module):
    """A gate over the body's features, made by fc1 -> ReLU -> fc2 -> sigmoid. Unit k of the ReLU reads features 2k
    and 2k+1 and opens only where both are 1: each sample of the batch has one of them at -1, so every unit is shut on
    it, while a fresh sample (its features drawn from either sample of the batch) opens unit k with chance 1/4.
    `shut`: the bias far below anything the inputs reach, every unit shut for every input (a real bug)."""

    def __init__(self, shut: bool = False):
        super().__init__()
        self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 3)
        self.fc1, self.act, self.fc2 = nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 8)
        with torch.no_grad():
            self.fc1.weight.zero_()
            for k in range(4):
                self.fc1.weight[k, 2 * k] = self.fc1.weight[k, 2 * k + 1] = 1.0
            self.fc1.bias.fill_(-100.0 if shut else -1.5)

    def forward(self, x):
        return self.head(self.body(x) * torch.sigmoid(self.fc2(self.act(self.fc1(x)))))


BATCH = torch.tensor([[1.0, -1.0] * 4, [-1.0, 1.0] * 4])
GATED = {"fc1.weight", "fc1.bias", "fc2.weight"}   # fc2.bias is added after the ReLU: its gradient flows


def _made_up(x) -> ModelInputs:
    """`x` as torchdiag's own -i inputs are (random values it drew), not a user's batch."""
    return ModelInputs((x,), {}, "--input")


def _grads(model, x) -> dict[str, float]:
    model.zero_grad()
    model(x).square().mean().backward()
    return {n: float(p.grad.abs().max()) for n, p in model.named_parameters()}


def test_the_case_is_real():
    """The batch leaves exactly the gated parameters at zero; a fresh sample with both features of a unit at 1
    gives them a gradient."""
    torch.manual_seed(0)
    model = Squeeze()
    assert {n for n, g in _grads(model, BATCH).items() if g == 0} == GATED
    fresh = torch.tensor([[1.0, 1.0] + [-1.0, 1.0] * 3, [-1.0, 1.0] * 4])
    assert all(_grads(model, fresh)[n] > 0 for n in GATED)


@pytest.mark.parametrize("shut", [False, True], ids=["closed-on-batch", "shut-for-all"])
def test_doctor_says_it_as_gradflow_does(shut):
    torch.manual_seed(0)
    res = run("doctor", Squeeze(shut), _made_up(BATCH))
    codes = {f.code: f for f in res.findings}
    if shut:
        said = " ".join(f.message for f in res.findings if f.code == "param-not-updated")
        assert res.exit_code == 1 and all(n in said for n in GATED) and "closed-on-batch" not in codes
        return
    assert res.exit_code == 0 and "param-not-updated" not in codes, [f.message for f in res.findings]
    assert codes["closed-on-batch"].severity == "info" and all(n in codes["closed-on-batch"].message for n in GATED)


@pytest.mark.parametrize("shut", [False, True], ids=["closed-on-batch", "shut-for-all"])
def test_zero_gradients_of_the_batch_alone_are_info_and_a_unit_shut_for_all_stays_an_error(shut):
    torch.manual_seed(0)
    res = run("gradflow", Squeeze(shut), _made_up(BATCH))
    rows = {r["name"]: r["status"] for r in res.table("params").rows}
    if shut:
        assert res.exit_code == 1 and {n for n, s in rows.items() if s == "zero-grad"} == GATED
        return
    assert res.exit_code == 0 and {n for n, s in rows.items() if s == "closed-on-batch"} == GATED, rows
    found = [f for f in res.findings if f.code == "closed-on-batch"]
    assert len(found) == 1 and found[0].severity == "info"
    assert "fresh batches" in found[0].message and "--batch" in found[0].message
    assert not [f for f in res.findings if f.code == "zero-grad"]
    assert "gradient of zeros on this batch alone" in res.verdict   # zero here is not "healthy magnitudes"


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_a_users_own_batch_keeps_its_error(command):
    """A review: a layer shut for every real one-hot DNA sequence was opened by mixtures of the batch's entries (the
    one-hot columns became counts) and passed. A user's batch is not resampled for this: the verdict stands."""
    torch.manual_seed(0)
    res = run(command, Squeeze(), (BATCH,))
    assert res.exit_code == 1 and "closed-on-batch" not in {f.code for f in res.findings}


def test_the_share_of_batches_needed_grows_with_the_batch_and_large_batches_tell_nothing():
    """As often as a quarter of samples opening it would: a batch opens it when any sample does, so the share of
    batches needed is 1 - 0.75^n. A review: "half the batches" let 1 sample in 50 pass at batch 64; a second: at
    batch 64 a unit open for 5% of samples opens 96% of batches (8 of 8 passed 74% of the time), so no batch past 8
    samples is asked."""
    assert open_often(4, 8, 2) and not open_often(3, 8, 2)          # 1 - 0.75^2 = 0.4375 of 8 = 3.5
    assert open_often(8, 8, 8) and not open_often(7, 8, 8)          # 1 - 0.75^8 = 0.90 of 8 = 7.2
    assert not open_often(8, 8, 9) and not open_often(8, 8, 64)
    assert not open_often(0, 0, 2)
    # closed form: a unit open for 5% of samples, batch 2, passes with P(Binomial(8, 0.0975) >= 4) < 1%
    p = 1 - 0.95 ** 2
    assert sum(math.comb(8, k) * p ** k * (1 - p) ** (8 - k) for k in range(4, 9)) < 0.01


class Underflow(nn.Module):
    """b starts at 0 behind a zero gate g and a factor of 1e-30: its gradient is exactly 0 at initialisation on every
    batch, and ~1e-37 on every batch, this one too, once the short run has opened g (SAM's vision rel_pos, behind
    weights drawn at 1e-10: doctor called them closed-on-batch)."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(8, 8), nn.Linear(8, 4)
        self.g = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        h = self.g * self.a(x)
        return self.head(x + h + 1e-30 * h * h * self.b)


def test_a_zero_every_batch_shares_is_not_closed_on_this_batch():
    """The premise is asked on the trained copy: where this batch gives the gradient fresh batches give, no unit was
    shut for it. Checked in plain torch first: zero on the batch at initialisation, not zero on it after 3 Adam steps."""
    from torchdiag.core.context import context_for
    from torchdiag.core.run import RunSpec
    from torchdiag.core.unreached import closed_on_batch

    torch.manual_seed(0)
    model, x = Underflow(), torch.randn(2, 8)
    assert _grads(model, x)["b"] == 0
    work = Underflow()
    work.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(work.parameters(), 1e-3)
    for _ in range(3):
        opt.zero_grad()
        work(x).square().mean().backward()
        opt.step()
    assert _grads(work, x)["b"] > 0
    ctx = context_for(model, RunSpec("gradflow", caller="python"))
    closed, _, runs = closed_on_batch(model, _made_up(x), ["b"], ctx, 3)
    assert closed == [] and runs == 0
