"""±inf a model writes as constants (core/fills.py) against ±inf it computes. A zoo row: Grounding DINO pads its class
logits' text axis with `torch.full(..., -inf)` and `masked_fill(-inf)`, and marks invalid box proposals with +inf;
torchdiag's made-up mse terms over them were +inf, every gradient NaN, and nancheck, gradflow and doctor failed a
healthy model. A version that left every ±inf out was reverted (a real overflow passed): only the positions of a
forward in which fills made every non-finite value are left out."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchdiag.api import run as api_run
from torchdiag.core.fills import _mode, classify
from torchdiag.core.loss import Loss


def origins(fn, *args):
    mode = _mode()
    with torch.no_grad(), mode:
        fn(*args)
    return classify(mode.rows)


def test_constants_are_fills_and_arithmetic_is_computed():
    x = torch.randn(3, 4)
    mask = torch.tensor([True, False, True, False])
    made, computed = origins(lambda: x.masked_fill(mask, float("-inf")))
    assert made == {"masked_fill": 6} and not computed
    made, computed = origins(lambda: torch.full((2, 5), float("inf")))
    assert made == {"full": 10} and not computed
    made, computed = origins(lambda: torch.where(mask, x, float("-inf")))
    assert sum(made.values()) and not computed, (made, computed)
    # an overflow, a division by zero, log(0), a NaN made of fills: computed, whatever the constants around them
    for fn in (lambda: (x * 1e9).half(), lambda: x / torch.zeros(4), lambda: torch.log(torch.zeros(3)),
               lambda: torch.full((3,), float("-inf")) - torch.full((3,), float("-inf")),
               lambda: x.masked_fill(mask, float("nan"))):
        made, computed = origins(fn)
        assert computed, (made, computed)
    made, computed = origins(lambda: torch.empty_like(x).fill_(1.0))   # uninitialised memory makes nothing
    assert not made and not computed


def padded_logits():
    x = torch.randn(3, 4)
    return torch.cat([x, torch.full((3, 2), float("-inf"))], 1)


@pytest.mark.parametrize("fn", [lambda p: p.flip(1), lambda p: p.repeat(2, 1), lambda p: p.topk(5, 1).values,
                                lambda p: p.sort(1).values, lambda p: p[:, [0, 4, 4]],
                                lambda p: torch.zeros(3, 6).index_put_((torch.arange(3),), p)],
                         ids=["flip", "repeat", "topk", "sort", "index", "index_put"])
def test_ops_that_copy_pass_fills_on(fn):
    # a review: these copy values, no arithmetic, and were counted as computing the fills they moved
    made, computed = origins(lambda: fn(padded_logits()))
    assert made and not computed, (made, computed)


def test_a_constant_given_as_a_tensor_is_a_fill_and_an_accumulating_write_computes():
    x = torch.randn(3, 4)
    made, computed = origins(lambda: x.masked_fill(x > 0, torch.tensor(float("-inf"))))
    assert made and not computed, (made, computed)
    big = torch.full((3, 4), 3e38)
    made, computed = origins(lambda: big.clone().index_put_((torch.arange(3),), big, accumulate=True))
    assert computed, (made, computed)


class PadToWidth(nn.Module):
    """Class logits masked with -inf and padded to a fixed width with -inf (Grounding DINO's contrastive embedding,
    modeling_grounding_dino.py: masked_fill, then torch.full(-inf) with the logits copied in)."""

    def forward(self, logits):
        logits = logits.masked_fill(torch.tensor([False, False, True], device=logits.device), float("-inf"))
        padded = torch.full((logits.shape[0], 6), float("-inf"), device=logits.device)
        padded[:, :3] = logits
        return padded


class Padded(nn.Module):
    """Two heads, the second's logits padded with -inf (PadToWidth). `overflow`: one channel of the first head scaled
    by 1e9 and cast to float16 (a real fault); `late`: that overflow only from the given call on (a buffer counts)."""

    def __init__(self, overflow: bool = False, late: int = 0):
        super().__init__()
        self.a, self.b, self.pad = nn.Linear(8, 5), nn.Linear(8, 3), PadToWidth()
        self.overflow, self.late = overflow, late
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        first = self.a(x)
        if self.overflow or (self.late and int(self.calls) >= self.late):
            first = (first * torch.tensor([1.0, 1.0, 1.0, 1.0, 1e9], device=x.device)).half().float()
        return first, self.pad(self.b(x))


def codes(res, severity=("error", "warning")):
    return {f.code for f in res.findings if f.severity in severity}


@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor"])
def test_constant_fills_leave_a_healthy_model_healthy(command):
    torch.manual_seed(0)
    res = api_run(command, Padded(), (torch.randn(4, 8),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    assert "(16 values left out: constants the model writes, -inf)" in res.header["loss"], res.header["loss"]
    if command == "nancheck":
        (f,) = [f for f in res.findings if f.code == "inf-fill"]
        assert f.severity == "info" and "full" in f.message and "masked_fill" in f.message


def test_the_left_out_positions_are_the_fills_only():
    from torchdiag.core.fills import Fills

    torch.manual_seed(0)
    first, padded = Padded()(torch.randn(4, 8))
    padded = padded.clone()
    padded[0, 0] = float("inf")   # an overflow the fills' forward did not see: it stays in
    fills = Fills(made={"full": 24}, masks={"output[1]": torch.isinf(Padded()(torch.randn(4, 8))[1])})
    loss = Loss("auto", seed=0, fills=lambda: fills)
    assert loss((first, padded)) == float("inf")
    kept = padded.clone()
    kept[0, 0] = 0.5
    value = loss((first, kept))
    target = loss.extra[0][2]
    by_hand = F.cross_entropy(first, loss.target) + F.mse_loss(torch.where(torch.isinf(kept), target, kept), target)
    assert float(value.detach()) == pytest.approx(float(by_hand.detach()))
    computed = Loss("auto", seed=0, fills=lambda: Fills(made={"full": 24}, computed={"mul": 1}, masks=fills.masks))
    assert computed((first, kept)) == float("inf")   # an op computed a non-finite value: nothing is left out


@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor"])
def test_a_fill_beside_an_overflow_is_no_excuse(command):
    torch.manual_seed(0)
    res = api_run(command, Padded(overflow=True), (torch.randn(4, 8),))
    assert codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"}, [f.code for f in res.findings]
    assert "left out" not in res.header.get("loss", "")


def test_an_overflow_that_starts_after_the_first_step_is_found():
    # the fills' positions are fixed at the first call; an overflow from the copy's third call on is outside them
    torch.manual_seed(0)
    res = api_run("nancheck", Padded(late=3), (torch.randn(4, 8),), steps=5)
    assert "non-finite-output" in codes(res, ("error",)) or "non-finite-loss" in codes(res, ("error",)), \
        [(f.code, f.message) for f in res.findings]
    assert res.data["steps"]["first_non_finite_step"] is not None


def test_overfit_batch_on_a_padded_output_reports_a_late_overflow():
    torch.manual_seed(0)
    healthy = api_run("overfit-batch", Padded(), (torch.randn(4, 8),), steps=40)
    assert "non-finite-loss" not in codes(healthy), [(f.code, f.message) for f in healthy.findings]
    torch.manual_seed(0)
    late = api_run("overfit-batch", Padded(late=10), (torch.randn(4, 8),), steps=40)
    assert codes(late, ("error",)), [(f.code, f.message) for f in late.findings]


def test_activations_call_a_fill_by_design_and_an_overflow_an_error():
    torch.manual_seed(0)
    res = api_run("activations", Padded(), (torch.randn(4, 8),))
    assert "non-finite-activation" not in codes(res), [(f.code, f.message) for f in res.findings]
    assert "inf-fill" in codes(res, ("info",))
    torch.manual_seed(0)
    res = api_run("activations", Padded(overflow=True), (torch.randn(4, 8),))
    assert "non-finite-activation" in codes(res, ("error",)) and "inf-fill" not in codes(res, ("info",))


@pytest.mark.parametrize("command", ["flops", "memory"])
def test_shapes_only_runs_do_not_read_the_outputs_values(command):
    # the first call's read of an output's ±inf raised on meta tensors (flops --backward, memory's estimate)
    opts = {"backward": True} if command == "flops" else {}
    res = api_run(command, Padded().to("meta"), (torch.randn(4, 8, device="meta"),), **opts)
    assert not codes(res, ("error",)) and "left out" not in res.header["loss"], res.header


class AfterTheFill(nn.Module):
    """A review's cases (2026-12-02), each a fault in an op whose input already holds a fill's -inf, which the first
    version did not count (it asked only ops whose inputs were all finite): `cast`, a class ×1e9 cast to float16
    after the mask; `amax` and `logsumexp`, a reduction over a row that is all fills (a sample of only padding: an
    empty set, not a fill); `eval_div`, a division by zero in eval mode only (activations' pass)."""

    def __init__(self, fault: str):
        super().__init__()
        self.a, self.b, self.fault = nn.Linear(8, 5), nn.Linear(8, 6), fault

    def forward(self, x):
        h = self.b(x)
        mask = torch.zeros(h.shape, dtype=torch.bool, device=x.device)
        mask[:, 4:] = True
        if self.fault in ("amax", "logsumexp"):
            mask[0] = True
        h = h.masked_fill(mask, float("-inf"))
        if self.fault == "cast":
            h = (h * torch.tensor([1.0, 1.0, 1.0, 1e9, 1.0, 1.0], device=x.device)).half().float()
        elif self.fault == "amax":
            h = h.amax(1, keepdim=True)
        elif self.fault == "logsumexp":
            h = torch.logsumexp(h, 1, keepdim=True)
        elif self.fault == "eval_div" and not self.training:
            h = h / torch.zeros((), device=x.device)
        return self.a(x), h


@pytest.mark.parametrize("fault", ["cast", "amax", "logsumexp"])
@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor"])
def test_a_fault_in_an_op_given_fills_is_still_a_fault(command, fault):
    torch.manual_seed(0)
    res = api_run(command, AfterTheFill(fault), (torch.randn(4, 8),))
    assert codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"}, [f.code for f in res.findings]
    assert "inf-fill" not in codes(res, ("info",)) and "left out" not in res.header.get("loss", "")


def test_the_fills_forward_runs_in_the_mode_of_the_pass_it_judges():
    from torchdiag.core.context import context_for
    from torchdiag.core.fills import ask
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.run import RunSpec

    torch.manual_seed(0)
    model = AfterTheFill("eval_div")
    ctx = context_for(model, RunSpec(command="nancheck"))
    inputs = ModelInputs((torch.randn(4, 8),))
    assert ask(model, inputs, ctx, training=True).only_fills
    assert not ask(model, inputs, ctx, training=False).only_fills
    assert model.training   # put back


class RandomFill(nn.Module):
    """Fill positions drawn at random in train mode: the fills' forward draws other ones than the judged pass."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 5), nn.Linear(8, 6)

    def forward(self, x):
        h = self.b(x)
        return self.a(x), h.masked_fill(torch.rand(h.shape, device=x.device) < 0.3, float("-inf"))


def test_fills_at_other_positions_than_the_fills_forward_are_not_called_by_design():
    # the loss left only the fills' own forward's positions out: still inf, so the output is an error, as before,
    # not "by design" beside an infinite loss
    torch.manual_seed(0)
    res = api_run("nancheck", RandomFill(), (torch.randn(4, 8),))
    assert {"non-finite-output", "non-finite-loss"} <= codes(res, ("error",)), [f.code for f in res.findings]
    assert "inf-fill" not in codes(res, ("info",))


class RefusesTracing(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 5), nn.Linear(8, 3)

    def forward(self, x):
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("this forward does not run under a dispatch mode")
        return self.a(x), self.b(x).masked_fill(torch.tensor([False, True, True]), float("-inf"))


def test_a_forward_that_cannot_be_traced_keeps_the_verdict_and_says_why():
    torch.manual_seed(0)
    res = api_run("nancheck", RefusesTracing(), (torch.randn(4, 8),))
    assert "non-finite-output" in codes(res, ("error",))
    assert any(n.startswith("the forward's ±Inf not traced to the ops that made them") and "dispatch mode" in n
               for n in res.notes), res.notes


class InPlaceOnAView(Padded):
    """A review's case: points at infinity divided in place through views of one tensor (x[:, :2] /= x[:, 2:]), the
    first version took the division for a view and counted nothing it made."""

    def forward(self, x):
        pts = -x[:, :3].abs() - 1.0
        pts[:, 2:] = 0.0
        pts[:, :2] /= pts[:, 2:]
        return self.a(x), self.pad(self.b(x)) + pts[:, :1]


def test_an_in_place_division_through_a_view_is_computed():
    from torchdiag.core.context import context_for
    from torchdiag.core.fills import ask
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.run import RunSpec

    torch.manual_seed(0)
    model = InPlaceOnAView()
    fills = ask(model, ModelInputs((torch.randn(4, 8),)), context_for(model, RunSpec(command="nancheck")))
    assert fills.computed and not fills.only_fills, (fills.made, fills.computed)
    res = api_run("nancheck", model, (torch.randn(4, 8),))
    assert "non-finite-output" in codes(res, ("error",)) and "inf-fill" not in codes(res, ("info",))


class Banned(nn.Module):
    """Class logits with banned classes masked by a -inf buffer (constrained decoding): a constant the model holds.
    `use`: how the forward reads it, and what else it holds."""

    def __init__(self, use: str = "add"):
        super().__init__()
        self.head, self.use = nn.Linear(8, 10), use
        mask = torch.zeros(10)
        mask[7:] = float("-inf")
        self.register_buffer("banned", mask)
        stats = torch.zeros(10)
        stats[3] = float("inf")   # a checkpoint's overflowed statistic
        self.register_buffer("running_mean", stats)

    def forward(self, x):
        y = self.head(x)
        if self.use == "view":        # a view, then a cast of the buffer first: held under the same name
            return y + self.banned[None].to(y.dtype)
        if self.use == "reduced":     # computed with: a reduction over the buffer's -inf times the logits
            return (y[:, :, None] * self.banned[None, None, :]).sum(1)
        if self.use == "overflow":    # the mask beside an overflow in the same output
            return (y + self.banned).index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(3e38) * 10)
        if self.use == "batch_norm":  # a frozen BatchNorm over the checkpoint's +inf running mean: computed
            return F.batch_norm(y, self.running_mean, torch.ones(10), training=False)
        if self.use == "exp":         # exp of a finite buffer value that overflows, added where the mask is 0
            return y + (self.banned + 100).exp()
        return y + self.banned


def _targets():
    return torch.randint(0, 7, (4,), generator=torch.Generator().manual_seed(0))   # never a banned class


@pytest.mark.parametrize("use", ["add", "view"])
def test_a_mask_buffer_added_to_the_logits_is_a_fill(use):
    torch.manual_seed(0)
    model = Banned(use)
    model.running_mean.zero_()   # only the mask holds ±inf here
    res = api_run("nancheck", model, (torch.randn(4, 8),), target=_targets())
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    (fill,) = [f for f in res.findings if f.code == "inf-fill"]
    assert "of banned" in fill.message and "buffer banned held them" in fill.message, fill.message
    assert [f.where for f in res.findings if f.code == "inf-buffer"] == ["banned"]
    for command in ("gradflow", "doctor"):
        assert not codes(api_run(command, model, (torch.randn(4, 8),), target=_targets()))


def test_a_buffer_the_forward_does_not_carry_keeps_its_error():
    """A review: the mask carried to the output cleared every buffer holding ±inf, an overflowed statistic too."""
    torch.manual_seed(0)
    res = api_run("nancheck", Banned("add"), (torch.randn(4, 8),), target=_targets())
    assert [f.where for f in res.findings if f.code == "non-finite-param"] == ["running_mean"]
    assert [f.where for f in res.findings if f.code == "inf-buffer"] == ["banned"]


@pytest.mark.parametrize("use", ["reduced", "overflow", "batch_norm", "exp"])
def test_a_buffer_computed_with_or_beside_an_overflow_stays_an_error(use):
    # a review: a frozen BatchNorm's (C,) statistic broadcasts onto (N, C) like an added mask; exp of the buffer
    # overflowed where the mask is finite, and both counted as fills
    torch.manual_seed(0)
    res = api_run("nancheck", Banned(use), (torch.randn(4, 8),), target=_targets())
    assert codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"}, [(f.code, f.message) for f in res.findings]
    assert not [f for f in res.findings if f.code == "inf-fill"]


class BanVector(nn.Module):
    """A min-length ban built in the forward: a zeros vector, -inf written at the end-of-sequence id, added to every
    row of the logits (a review: called `non-finite-output` where `logits.masked_fill(m, -inf)` was a fill). `kind`:
    written by an int index (select, copy_), by a tensor index (index_put_); "exp": an overflow written there."""

    def __init__(self, kind: str):
        super().__init__()
        self.head, self.kind = nn.Linear(8, 10), kind

    def forward(self, x):
        ban = torch.zeros(10, device=x.device)
        if self.kind == "int":
            ban[9] = float("-inf")
        elif self.kind == "tensor":
            ban[torch.tensor([8, 9], device=x.device)] = float("-inf")
        else:   # exp of a large activation: computed, in the same place and shape
            ban[9] = -(x.abs().sum() + 100).exp()
        return self.head(x) + ban


@pytest.mark.parametrize("kind", ["int", "tensor"])
def test_a_ban_vector_written_once_and_added_to_every_row_is_a_fill(kind):
    torch.manual_seed(0)
    res = api_run("nancheck", BanVector(kind), (torch.randn(4, 8),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    (fill,) = [f for f in res.findings if f.code == "inf-fill"]
    n = 1 if kind == "int" else 2   # written once; the add puts them on each of the 4 rows
    assert f"holds {4 * n} ±Inf in output: constants written by " in fill.message, fill.message
    assert f"({n} value{'s' if n > 1 else ''}), carried onto {4 * n} positions by the ops after;" in fill.message


def test_an_overflow_written_into_a_ban_vector_stays_an_error():
    torch.manual_seed(0)
    res = api_run("nancheck", BanVector("exp"), (torch.randn(4, 8),))
    assert "non-finite-output" in codes(res, ("error",)), [(f.code, f.message) for f in res.findings]
    assert not [f for f in res.findings if f.code == "inf-fill"]


class OutsiderBesideAFill(nn.Module):
    """A review of the ban vector's bound (/tmp/rev): a ±inf from a plain tensor attribute (outside the forward)
    beside a real fill elsewhere. "prior": a log(0) prior added to the logits, then a padding column written -inf;
    "causal": a causal mask made in the forward inside attention (224 fills), the prior on the logits; "cache": a
    log-probability cache that underflowed, picked by where, beside a ban vector. "twice": the ban vector's logits
    returned twice (fills only)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.head = kind, nn.Linear(16, 10)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        counts = torch.tensor([5.0, 3, 0, 0, 0, 2, 1, 0, 0, 4])
        self.log_prior = torch.log(counts / counts.sum())   # not a buffer: -inf for 5 classes
        self.cache = torch.log(torch.softmax(torch.tensor([[0.0, 1, 2, 3, 200, 300, 400, 500, 600, 700]]), -1))

    def forward(self, x):
        if self.kind == "prior":
            logits = self.head(x) + self.log_prior
            return torch.cat([logits, torch.full((x.shape[0], 1), float("-inf"))], -1)
        if self.kind in ("view", "detach", "data"):   # the prior written into an alias, a padding column beside
            y = torch.cat([self.head(x), torch.zeros(x.shape[0], 1)], -1) * 1.0
            logits = y.view(x.shape[0], 11)   # taken before the write (a second review)
            if self.kind == "view":
                logits[:, :10] = self.log_prior
            elif self.kind == "detach":
                y.detach()[:, :10].copy_(self.log_prior.expand(x.shape[0], 10))
            else:
                y.data[:, :10] = self.log_prior
            logits[:, 10] = float("-inf")
            return logits
        if self.kind in ("numpy", "unread", "foreach", "bits", "f16view"):   # a third review: read from numpy, returned unread, or
            y = self.head(x)                                # added by a foreach op that returns nothing
            ban = torch.zeros(10)
            ban[9] = float("-inf")
            if self.kind == "numpy":
                return y + torch.from_numpy(self.log_prior.numpy().copy()) + ban
            if self.kind == "unread":
                return y + ban, self.log_prior
            if self.kind == "bits":   # a fourth review: the prior kept as int32 bits, viewed back as float32
                return y + self.log_prior.view(torch.int32).clone().view(torch.float32) + ban
            if self.kind == "f16view":   # a fifth: float32 1.00769 is 0x3F80FC00, whose low half is float16's -inf
                s = y.clamp(-1, 1) * 0 + 1.0076904296875
                return torch.cat([y + ban, s.view(torch.float16).float()], -1)
            torch._foreach_add_([y], [self.log_prior])
            return y + ban
        if self.kind == "causal":
            h = x.reshape(2, -1, 16)
            n = h.shape[1]
            h, _ = self.attn(h, h, h, attn_mask=torch.full((n, n), float("-inf")).triu(1), need_weights=False)
            return self.head(h) + self.log_prior
        ban = torch.zeros(10)
        ban[9] = float("-inf")
        if self.kind == "cache":
            use = torch.arange(x.shape[0])[:, None] < x.shape[0] // 2
            return torch.where(use, self.cache, self.head(x)) + ban
        y = self.head(x) + ban
        return y, y * 2


@pytest.mark.parametrize("kind", ["prior", "causal", "cache", "view", "detach", "data", "numpy", "unread", "foreach",
                                  "bits", "f16view"])
def test_a_fill_elsewhere_does_not_excuse_a_plain_attributes_inf(kind):
    # the ban vector's bound first took the most ±inf any tensor of the forward held: one real fill anywhere then
    # excused a log(0) prior or an underflowed cache kept as a plain attribute (a review); an output such a tensor
    # reached counts only what the ops wrote
    torch.manual_seed(0)
    res = api_run("nancheck", OutsiderBesideAFill(kind), (torch.randn(8, 16),))
    assert "non-finite-output" in codes(res, ("error",)), [(f.code, f.message) for f in res.findings]


class PriorHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 10)
        self.log_prior = OutsiderBesideAFill("none").log_prior   # a plain attribute: -inf at 5 classes

    def forward(self, x):
        return self.head(x) + self.log_prior


class PriorInside(nn.Module):
    """A second review: a submodule's output holds a log(0) prior's -inf (20 for 4 rows); the model reads it through
    argmax and returns logits with a ban vector (24 held): the submodule is the origin, and the model's outputs are
    no bound for it."""

    def __init__(self):
        super().__init__()
        self.prior, self.head = PriorHead(), nn.Linear(16, 12)

    def forward(self, x):
        greedy = self.prior(x).argmax(-1)
        ban = torch.zeros(12)
        ban[6:] = float("-inf")
        return self.head(x) + ban, greedy


def test_a_submodules_inf_is_not_bounded_by_the_models_outputs():
    torch.manual_seed(0)
    res = api_run("nancheck", PriorInside(), (torch.randn(4, 16),))
    assert "non-finite-output" in codes(res, ("error",)), [(f.code, f.message) for f in res.findings]


def test_a_ban_vectors_logits_returned_twice_are_fills():
    torch.manual_seed(0)
    res = api_run("nancheck", OutsiderBesideAFill("twice"), (torch.randn(4, 16),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]


def test_held_buffers_count_only_their_own_positions():
    mask = torch.zeros(10)
    mask[7:] = float("-inf")
    y = torch.randn(4, 10)
    for fn, made, computed in [
            (lambda: y + mask, {"add of m": 12}, {}),
            (lambda: torch.where(y > 0, mask, y), None, {}),
            (lambda: (mask + 100).exp(), {"add of m": 3}, {"exp": 7}),   # exp(100) overflows where the mask is 0
            (lambda: y / (mask.clamp(min=-1) + 1), {}, {"div": 12}),  # a division by what it became: computed
            # negating the mask computes with it; a frozen BatchNorm over the result writes no fill (a review's case)
            (lambda: F.batch_norm(y, mask.neg(), torch.ones(10), training=False), {}, {"neg of m": 3}),
            (lambda: F.embedding(torch.tensor([[1, 2]]), mask[None].expand(3, 10)) + 0, None, {})]:
        mode = _mode({id(mask): ("m", "mask")})
        with torch.no_grad(), mode:
            fn()
        got = classify(mode.rows)
        if made is not None:
            assert got[0] == made, got
        assert got[1] == computed, got


class CausalBesideOutsider(nn.Module):
    """A second review (/tmp/rev34): a causal mask buffer inside attention (its fills vanish in the softmax) beside
    an unregistered tensor attribute whose init overflowed to +inf; or a BatchNorm whose running mean overflowed,
    beside a vocabulary mask on the logits."""

    def __init__(self, fault: str):
        super().__init__()
        self.qkv, self.head, self.bn, self.fault = nn.Linear(16, 48), nn.Linear(16, 10), nn.BatchNorm1d(10), fault
        self.register_buffer("causal", torch.full((8, 8), float("-inf")).triu(1))
        mask = torch.zeros(10)
        mask[7:] = float("-inf")
        self.register_buffer("banned", mask)
        self.scale = torch.exp(torch.linspace(0, 100, 10))   # not a buffer: its last value is +inf
        self.bn.running_mean[2] = float("inf")

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        y = self.head(((q @ k.transpose(-1, -2) / 4 + self.causal).softmax(-1) @ v).mean(1))
        return y * self.scale if self.fault == "attribute" else F.batch_norm(
            y, self.bn.running_mean, self.bn.running_var, training=False) + self.banned


@pytest.mark.parametrize("fault", ["attribute", "statistic"])
def test_a_mask_excuses_no_non_finite_value_from_elsewhere(fault):
    torch.manual_seed(0)
    res = api_run("activations", CausalBesideOutsider(fault), (torch.randn(4, 8, 16),))
    assert "non-finite-activation" in codes(res, ("error",)), [(f.code, f.message) for f in res.findings]
    res = api_run("nancheck", CausalBesideOutsider(fault), (torch.randn(4, 8, 16),), target=_targets())
    assert "non-finite-output" in codes(res, ("error",)), [(f.code, f.message) for f in res.findings]
    assert not [f for f in res.findings if f.code == "inf-fill"]


def test_a_mask_buffer_inside_attention_beside_an_unused_odd_buffer_is_traced():
    # a second review: a meta or float8 buffer ended the tracing (an internal error, or no fills at all)
    from torchdiag.core.fills import _state

    model = CausalBesideOutsider("attribute")
    model.register_buffer("odd", torch.tensor([float("inf"), 0.0]).to(torch.float8_e5m2))
    model.register_buffer("meta", torch.zeros(3, device="meta"))
    kinds = {name: kind for name, kind in _state(model).values()}
    assert kinds == {"causal": "mask", "banned": "mask", "bn.running_mean": "alien", "odd": "alien"}, kinds


class MaskedInputs(nn.Module):
    """A third review (/tmp/rev35): healthy models the first forms of the alien rule called faulty. `kind`:
    an additive attention mask given as an input (0 / -inf) beside class logits filled with -inf; learned logits
    padded with -inf (F.pad of a parameter); a finite learned logit concatenated after filled ones; a log-prior slice
    of the input (≤ 0, -inf for impossible classes) added to logits that are also masked. An input with a mask's
    pattern is passed on, neither a fill nor a fault (a fourth review: a log-probability cache that underflowed has
    the same pattern, so it is not called a fill either)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.q, self.o = kind, nn.Linear(8, 8), nn.Linear(8, 4)
        self.extra = nn.Parameter(torch.zeros(1, 3))

    def forward(self, x, mask=None):
        if self.kind == "attention":
            h = ((self.q(x) @ x.transpose(-1, -2) + mask).softmax(-1) @ x).mean(1)
            return self.o(h).masked_fill(torch.tensor([False, False, False, True]), float("-inf"))
        if self.kind == "pad":
            return F.pad(self.extra.expand(x.shape[0], 3), (0, 3), value=float("-inf")) + 0.0 * x[:, :1]
        if self.kind == "cat":
            return torch.cat([self.o(x).masked_fill(torch.tensor([False, True, False, True]), float("-inf")),
                              self.extra.expand(x.shape[0], 3)], 1)
        # "prior": a masked class beside the input's log-prior slice, whose -inf the forward passes on
        return (self.o(x[:, :8]) + x[:, 8:]).masked_fill(torch.tensor([False, False, False, True]), float("-inf"))


@pytest.mark.parametrize("kind", ["attention", "pad", "cat", "prior"])
def test_inputs_and_parameters_beside_fills_are_not_faults(kind):
    torch.manual_seed(0)
    if kind == "attention":
        x, mask = torch.randn(2, 5, 8), torch.zeros(2, 1, 5)
        mask[:, :, 4] = float("-inf")
        inputs: tuple = (x, mask)
    elif kind == "prior":
        prior = torch.log(torch.tensor([[1.0, 0.5, 0.0, 1.0]])).expand(4, 4)
        inputs = (torch.cat([torch.randn(4, 8), prior], 1),)
    else:
        inputs = (torch.randn(4, 8),)
    model = MaskedInputs(kind)
    res = api_run("activations", model, inputs)
    assert "non-finite-activation" not in codes(res, ("error",)), [(f.code, f.message) for f in res.findings]
    res = api_run("nancheck", model, inputs, target=torch.zeros(inputs[0].shape[0], dtype=torch.long))   # class 0
    assert not codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"}, [(f.code, f.message)
                                                                                   for f in res.findings]


def test_an_unused_mask_buffer_beside_fills_is_no_error():
    # a causal mask made in the forward (full -inf, triu) beside a vocabulary mask added to the logits; a second
    # mask buffer the forward does not use was non-finite-param only because other fills existed
    class TwoMasks(Banned):
        def __init__(self):
            super().__init__()
            self.running_mean.zero_()
            spare = torch.zeros(10)
            spare[5:7] = float("-inf")
            self.register_buffer("spare", spare)

        def forward(self, x):
            y = self.head(x)
            causal = torch.triu(torch.full((x.shape[0], x.shape[0]), float("-inf")), 1)
            return (y @ y.t() + causal).softmax(-1) @ y + self.banned

    torch.manual_seed(0)
    res = api_run("nancheck", TwoMasks(), (torch.randn(4, 8),), target=_targets())
    assert not codes(res, ("error",)), [(f.code, f.where, f.message) for f in res.findings]
    assert [f.code for f in res.findings if f.code in ("inf-buffer", "inf-fill")] == ["inf-buffer", "inf-fill"]


@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor", "overfit-batch"])
def test_made_up_class_targets_keep_off_the_classes_a_mask_bans(command):
    """No --batch: torchdiag's random class target landed on a class the mask buffer bans (-inf there), the
    cross-entropy was inf and every gradient NaN: a healthy model failed with non-finite-loss."""
    torch.manual_seed(0)
    model = Banned("add")
    model.running_mean.zero_()
    drawn = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(0))
    assert (drawn >= 7).any()                  # the premise: the seeded draw hits a banned class
    res = api_run(command, model, (torch.randn(8, 8),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    if command == "nancheck":
        moved = int((drawn >= 7).sum())
        assert f"({moved} made-up targets moved off logits the model writes as a constant, -inf)" in \
            res.header["loss"], res.header


def test_only_targets_on_a_banned_class_move():
    torch.manual_seed(0)
    model = Banned("add")
    model.running_mean.zero_()
    from torchdiag.core.fills import Fills
    y = model(torch.randn(8, 8))
    loss = Loss("auto", seed=0)
    loss.fills = lambda: Fills(made={"add of banned": 24}, masks={"output": torch.isinf(y)})
    assert torch.isfinite(loss(y))
    drawn = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(0))
    kept = drawn < 7
    assert torch.equal(loss.target[kept], drawn[kept]) and (loss.target < 7).all()


@pytest.mark.parametrize("use", ["reduced", "overflow", "exp"])
def test_made_up_class_targets_do_not_move_off_a_computed_inf(use):
    torch.manual_seed(0)
    model = Banned(use)
    model.running_mean.zero_()
    res = api_run("nancheck", model, (torch.randn(8, 8),))
    assert codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"}, [(f.code, f.message) for f in res.findings]


@pytest.mark.parametrize("fill", [float("-inf"), "finfo"])
@pytest.mark.parametrize("mask", ["top_k", "input"])
def test_a_mask_computed_from_the_logits_is_no_ban(mask, fill):
    """A review: a forward that keeps its top 3 logits and fills the rest with -inf (sampling code left in training)
    is written by masked_fill like a ban, and made-up targets were moved onto the top 3: PASS, where any real label
    outside them makes the loss inf. A mask whose positions move when the weights do is no class the model bans: the
    targets stay and nancheck fails it. A mask made from the input does not move with the weights: still a ban."""
    class Filtered(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 8)

        def forward(self, x):
            y = self.fc(x)
            banned = y < y.topk(3, 1).values[:, -1:] if mask == "top_k" else x[:, :8] > 0
            return y.masked_fill(banned, torch.finfo(y.dtype).min if fill == "finfo" else fill)

    torch.manual_seed(0)
    res = api_run("nancheck", Filtered(), (torch.randn(4, 10),))
    if mask == "top_k":   # a review: with finfo.min, the positions that stayed masked under shaken weights moved
        assert "moved off" not in res.header["loss"]
        assert codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"} or \
            res.to_dict()["loss_value"] > 1e30, res.header
    else:
        assert not codes(res, ("error",)) and "moved off" in res.header["loss"], res.header


class MaskedVocabLM(nn.Module):
    """A causal LM whose vocabulary mask bans ids 0-3 (special tokens it never predicts), or (computed) whose logit
    for id 3 is log(0)."""

    def __init__(self, computed: bool = False):
        super().__init__()
        self.emb, self.head, self.computed = nn.Embedding(50, 16), nn.Linear(16, 50), computed
        mask = torch.zeros(50)
        mask[:4] = float("-inf")
        self.register_buffer("vocab_mask", mask)

    def forward(self, ids):
        y = self.head(torch.cumsum(self.emb(ids), 1))
        if self.computed:
            return torch.cat([y[..., :3], torch.log(torch.zeros_like(y[..., :1])), y[..., 4:]], -1)
        return y + self.vocab_mask


def _ids():
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    assert (ids[:, 1:] < 4).sum() == 2     # the premise: two next ids are banned ones
    return ids


@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor"])
def test_next_ids_a_vocabulary_mask_bans_are_left_out_of_the_loss(command):
    """The next-token loss over ids the model bans (-inf logits from a registered mask) was inf, every gradient NaN:
    a healthy language model failed. Those positions are left out, and the header says how many."""
    torch.manual_seed(0)
    res = api_run(command, MaskedVocabLM(), (_ids(),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    assert "2 positions left out: their next id is a logit the model writes as a constant (-inf)" in \
        res.header["loss"], res.header


def test_the_next_token_loss_leaves_out_only_the_banned_positions():
    import torch.nn.functional as F

    from torchdiag.core.fills import Fills
    from torchdiag.core.loss import LanguageModel
    torch.manual_seed(0)
    model, ids = MaskedVocabLM(), _ids()
    y = model(ids)
    loss = Loss("auto")
    loss.lm = LanguageModel("input[0]", ids, (50,))
    loss.fills = lambda: Fills(made={"add of vocab_mask": 96}, masks={"output": torch.isinf(y)})
    kept = ids[:, 1:] >= 4
    truth = F.cross_entropy(y[:, :-1][kept], ids[:, 1:][kept])     # by hand, over the kept positions
    assert loss(y).item() == pytest.approx(truth.item(), rel=1e-6)


def test_a_computed_minus_inf_on_a_next_id_keeps_the_loss_inf():
    torch.manual_seed(0)
    ids = _ids()
    assert (ids[:, 1:] == 3).any()
    res = api_run("nancheck", MaskedVocabLM(computed=True), (ids,))
    assert codes(res, ("error",)) & {"non-finite-output", "non-finite-loss"}, [(f.code, f.message) for f in res.findings]


class FiniteBan(nn.Module):
    """Classes 0, 2 and 5 banned with a finite fill (torch.finfo(dtype).min, as OWL-ViT's class head masks queries,
    or -1e9), or (weights) logits scaled by 1e10: extreme, but values the weights make."""

    def __init__(self, fill):
        super().__init__()
        self.fc, self.fill = nn.Linear(10, 8), fill
        ban = torch.zeros(8, dtype=torch.bool)
        ban[[0, 2, 5]] = True
        self.register_buffer("ban", ban)

    def forward(self, x):
        y = self.fc(x)
        if self.fill == "weights":
            return y * 1e10
        return y.masked_fill(self.ban, torch.finfo(y.dtype).min if self.fill == "finfo" else self.fill)


def _drawn_on_ban(n=4, classes=8):
    drawn = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(0))
    return int(sum(int(c) in (0, 2, 5) for c in drawn))


@pytest.mark.parametrize("fill", ["finfo", -1e9])
@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor"])
def test_a_finite_fill_as_extreme_as_inf_keeps_made_up_targets_off(command, fill):
    """A review: finfo.min over banned classes made the made-up cross-entropy inf (3 rows × 3.4e38 overflow the
    mean) and nancheck/gradflow/doctor failed a healthy model; -1e9 gave a loss of 5e8. A finite value that extreme
    which no weight moves is a constant the code wrote: no target is fitted there."""
    moved = _drawn_on_ban()
    assert moved   # the premise: the seeded draw lands on a banned class
    torch.manual_seed(0)
    res = api_run(command, FiniteBan(fill), (torch.randn(4, 10),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    value = f"{torch.finfo(torch.float32).min:g}" if fill == "finfo" else "-1e+09"
    assert f"({moved} made-up targets moved off logits the model writes as a constant, {value})" in \
        res.header["loss"], res.header["loss"]
    if command != "doctor":   # its loss value is the other two's; doctor's JSON has none
        assert res.to_dict()["loss_value"] < 10


class WrittenOtherwise(FiniteBan):
    """Classes 0, 2 and 5 banned with -1e9 or finfo.min written in ways a review found the fills' forward missed: a
    sign flip of the number given (`y - 1e9 * ban`, `(ok - 1) * 1e9`), a (1,)-shaped buffer a where writes, a logit
    bias buffer, a scatter of `full(-1e9)`; a finfo.min key-padding mask repeated over the heads (`.repeat`) or
    added by nn.MultiheadAttention's baddbmm before the banned head."""

    def __init__(self, kind):
        super().__init__(-1e9)
        self.kind = kind
        self.register_buffer("neg", torch.full((1,), -1e9))
        self.register_buffer("bias", torch.zeros(8).masked_fill(self.ban, -1e9))
        self.emb, self.att = nn.Linear(2, 16), nn.MultiheadAttention(16, 2, batch_first=True)
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 8)

    def attend(self, x):
        """5 tokens of 2 features, the last one padding."""
        b = x.shape[0]
        h = self.emb(x.view(b, 5, 2))
        pad = torch.zeros(b, 5, dtype=torch.bool)
        pad[:, -1] = True
        if self.kind == "mha":
            return self.out(self.att(h, h, h, key_padding_mask=pad)[0].mean(1))
        q, k, v = [t.view(b, 5, 2, 8).transpose(1, 2).reshape(b * 2, 5, 8) for t in self.qkv(h).chunk(3, -1)]
        m = torch.zeros(b, 1, 5).masked_fill(pad[:, None], torch.finfo(x.dtype).min).repeat(2, 1, 1)
        o = ((q @ k.transpose(1, 2) / 8 ** 0.5 + m).softmax(-1) @ v).view(b, 2, 5, 8).transpose(1, 2)
        return self.out(o.reshape(b, 5, 16).mean(1))

    def forward(self, x):
        if self.kind in ("mha", "repeat"):
            return self.attend(x).masked_fill(self.ban, -1e9)
        if self.kind == "bfloat16":   # -1e9 rounds to -998,244,352 there; the logits cast to float32 after
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.fc(x).masked_fill(self.ban, -1e9).float()
        y, ban = self.fc(x), self.ban.float()
        return {"sub": lambda: y - 1e9 * ban, "one_minus": lambda: y + (1.0 - ban - 1.0) * 1e9,
                "where_buffer": lambda: torch.where(self.ban, self.neg, y), "bias_buffer": lambda: y + self.bias,
                "scatter": lambda: y.scatter(1, torch.tensor([[0, 2, 5]]).expand(len(y), 3),
                                             torch.full((len(y), 3), -1e9))}[self.kind]()


@pytest.mark.parametrize("kind", ["sub", "one_minus", "where_buffer", "bias_buffer", "scatter", "repeat", "mha",
                                  "bfloat16"])
def test_a_fill_written_otherwise_keeps_made_up_targets_off(kind):
    """A review: each of these healthy models got a loss of 5e8 or inf (overfit-batch failed them: cannot-overfit)."""
    moved = _drawn_on_ban()
    torch.manual_seed(0)
    res = api_run("nancheck", WrittenOtherwise(kind), (torch.randn(4, 10),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    value = f"{float(torch.tensor(-1e9).bfloat16()):g}" if kind == "bfloat16" else "-1e+09"
    assert f"({moved} made-up targets moved off logits the model writes as a constant, {value})" in \
        res.header["loss"], res.header["loss"]
    assert res.to_dict()["loss_value"] < 10


class Offsets(nn.Module):
    """A regression head whose whole output is one extreme constant (a review's loopholes): an offset of 1.7e9 held
    in a tensor the forward makes (`full_like`, a literal, `ones * 1.7e9`), or a clamp with the wrong bound."""

    def __init__(self, kind):
        super().__init__()
        self.fc, self.kind = nn.Linear(10, 1), kind

    def forward(self, x):
        y = self.fc(x)
        return {"full_like": lambda: y + torch.full_like(y, 1.7e9), "literal": lambda: y + torch.tensor([1.7e9]),
                "product": lambda: torch.ones_like(y).mul(1.7e9).add(y), "clamp": lambda: y.clamp(min=1e9)}[self.kind]()


@pytest.mark.parametrize("kind", ["full_like", "literal", "product", "clamp"])
def test_an_output_that_is_one_constant_throughout_bans_nothing(kind):
    torch.manual_seed(0)
    res = api_run("nancheck", Offsets(kind), (torch.randn(4, 10),))
    assert "left out" not in res.header["loss"], res.header["loss"]
    assert res.to_dict()["loss_value"] > 1e15, res.header


class ForcedColumn(nn.Module):
    """Two outputs, the first absorbed by +1.7e9 held in a (1,)-shaped buffer: constant under any weights, and a
    buffer's extreme value is a written number, but a value pushed up bans nothing (a class it forces)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)
        self.register_buffer("base", torch.tensor([1.7e9]))

    def forward(self, x):
        y = self.fc(x)
        return torch.cat([y[:, :1] + self.base, y[:, 1:]], 1)


def test_a_constant_pushed_up_is_no_ban():
    torch.manual_seed(0)
    res = api_run("nancheck", ForcedColumn(), (torch.randn(4, 10),))
    assert "moved off" not in res.header["loss"], res.header["loss"]


class PairCost(nn.Module):
    """A matcher's cost between 5 queries and 5 keys, the last key padding, its cost written as +1e9 by masked_fill."""

    def __init__(self):
        super().__init__()
        self.emb, self.q, self.k = nn.Linear(2, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.emb(x.view(x.shape[0], 5, 2))
        pad = torch.zeros(x.shape[0], 1, 5, dtype=torch.bool)
        pad[..., -1] = True
        return (-(self.q(h) @ self.k(h).transpose(1, 2))).masked_fill(pad, 1e9)


def test_a_positive_number_an_op_writes_is_a_fill():
    """A review: once every constant had to be below 0, a cost matrix's +1e9 padding was in the made-up MSE, whose
    loss was 2e17 (overfit-batch flat-loss). Written by masked_fill, it is left out, whatever its sign (20 positions:
    4 samples x 5 queries x the one padding key); the loss is then of the costs' size, not of 1e9 squared."""
    torch.manual_seed(0)
    model, x = PairCost(), torch.randn(4, 10)
    res = api_run("nancheck", model, (x,))
    assert "20 values left out" in res.header["loss"] and "1e+09" in res.header["loss"], res.header["loss"]
    with torch.no_grad():
        y = model(x)
    assert 0 < res.to_dict()["loss_value"] < 100 < float(y.abs().max())


class AttentionOverCausalBuffer(nn.Module):
    """nn.MultiheadAttention given a registered -inf causal mask (it adds the mask to q·kᵀ with baddbmm), classes 0,
    2, 5 banned with -inf. `overflow`: the keys overflow to inf before the product, so baddbmm computes non-finite
    scores whatever its bias holds."""

    def __init__(self, overflow=False):
        super().__init__()
        self.overflow = overflow
        self.emb, self.mha, self.out = nn.Linear(2, 16), nn.MultiheadAttention(16, 2, batch_first=True), nn.Linear(16, 8)
        self.register_buffer("causal", torch.full((5, 5), float("-inf")).triu(1))
        self.register_buffer("ban", torch.tensor([True, False, True, False, False, True, False, False]))

    def forward(self, x):
        h = self.emb(x.view(x.shape[0], 5, 2))
        k = h * 1e39 if self.overflow else h
        return self.out(self.mha(h, k, h, attn_mask=self.causal)[0].mean(1)).masked_fill(self.ban, float("-inf"))


@pytest.mark.parametrize("overflow", [False, True])
def test_a_causal_buffer_added_by_baddbmm_is_a_fill_when_the_product_is_finite(overflow):
    """A review: the mask buffer's -inf that nn.MultiheadAttention's baddbmm adds to the scores were counted computed,
    and a healthy model with a -inf class ban was non-finite-output and loss errors."""
    torch.manual_seed(0)
    _ban_carried_unless_overflowed(AttentionOverCausalBuffer(overflow), torch.randn(4, 10), overflow)


def _ban_carried_unless_overflowed(model, x, overflow: bool) -> None:
    """nancheck: the -inf class ban is a fill (made-up targets moved off it, no error), unless the product overflowed
    (non-finite-output)."""
    res = api_run("nancheck", model, (x,))
    errors = codes(res, ("error",))
    if overflow:
        assert "non-finite-output" in errors, [(f.code, f.message) for f in res.findings]
        return
    assert not errors, [(f.code, f.message) for f in res.findings]
    assert "moved off" in res.header["loss"] and "-inf" in res.header["loss"], res.header["loss"]


class WrittenOffset(nn.Module):
    """A review's: [timestamp, value] per step, de-normalised by an offset of +1.7e9 on column 0 that an op writes
    (`how`: an index fill, a where, a full then cat; added into a column of the output, or by index_add_: later
    reviews found those excused), or +1e9 held in a buffer beside a healthy -1e9 padding fill of the last step
    ("buffer+pad"). float32 absorbs column 0's prediction: it is 1.7e9 whatever the weights."""

    def __init__(self, how):
        super().__init__()
        self.how, self.fc = how, nn.Linear(10, 2)
        self.register_buffer("offset", torch.tensor([1e9, 0.0]))   # the padding's number, at the other sign

    def forward(self, x):
        y = self.fc(x.view(x.shape[0], 3, 10))
        if self.how == "fill":
            off = torch.zeros(2)
            off[0] = 1.7e9
        elif self.how == "where":
            off = torch.where(torch.arange(2) == 0, 1.7e9, 0.0)
        elif self.how == "full":
            off = torch.cat([torch.full((1,), 1.7e9), torch.zeros(1)])
        elif self.how in ("column set", "column +="):   # written into a view of the output
            y = y.clone()
            if self.how == "column set":
                y[..., 0] = y[..., 0] + torch.full_like(y[..., 0], 1.7e9)
            else:
                y[..., 0] += torch.full_like(y[..., 0], 1.7e9)
            return y
        elif self.how == "index_add_":   # a fifth review: excused
            off = torch.where(torch.arange(2) == 0, 1.7e9, 0.0)
            return y.reshape(-1, 2).index_add_(1, torch.tensor([0]), off[:1].expand(y.shape[0] * 3, 1)).view(-1, 3, 2)
        else:
            pad = torch.zeros(3, 1, dtype=torch.bool)
            pad[-1] = True
            return (y + self.offset).masked_fill(pad, -1e9)
        return y + off


@pytest.mark.parametrize("how", ["fill", "where", "full", "column set", "column +=", "index_add_", "buffer+pad"])
def test_an_offset_pushed_up_to_a_written_number_is_no_fill(how):
    """Once an op's number counted at either sign, these were left out of the made-up loss (loss 0.6, overfit-batch
    silent; beside the padding, the buffer's +1e9 matched the padding's -1e9 by size). An add that pushes a value up
    to such a number is an offset: only values below 0 count then, and the padding stays a fill."""
    torch.manual_seed(0)
    model, x = WrittenOffset(how), torch.randn(4, 30)
    res = api_run("nancheck", model, (x,))
    assert res.to_dict()["loss_value"] > 1e17, res.header["loss"]
    assert "1.7e+09" not in res.header["loss"] and "to 1e+09" not in res.header["loss"], res.header["loss"]
    if how == "buffer+pad":   # 4 samples x the last step x 2 columns written as -1e9: those alone left out
        assert "8 values left out" in res.header["loss"] and "-1e+09)" in res.header["loss"], res.header["loss"]


class TiedHeadWithBan(nn.Module):
    """A review's: a tied head, F.linear(h, emb.weight, vocab_mask), the -inf vocabulary ban a registered buffer
    given as the bias (addmm(mask, h, W.t())). `overflow`: h overflows to inf before the product."""

    def __init__(self, overflow=False):
        super().__init__()
        self.overflow, self.emb, self.fc = overflow, nn.Embedding(8, 16), nn.Linear(16, 16)
        self.register_buffer("vocab_mask", torch.zeros(8).masked_fill(
            torch.tensor([True, False, True, False, False, True, False, False]), float("-inf")))

    def forward(self, ids):
        h = torch.tanh(self.fc(self.emb(ids).mean(1)))
        return F.linear(h * 1e39 if self.overflow else h, self.emb.weight, self.vocab_mask)


@pytest.mark.parametrize("overflow", [False, True])
def test_a_mask_buffer_given_as_a_linears_bias_beside_a_weight_is_carried(overflow):
    """The product's weight, a parameter read from outside the forward, was marked beside the mask, and the mask's
    -inf were counted computed: non-finite-output and loss errors on a healthy model."""
    torch.manual_seed(0)
    _ban_carried_unless_overflowed(TiedHeadWithBan(overflow), torch.randint(0, 8, (4, 6)), overflow)


class HalfBanCastUp(nn.Module):
    """Classes 0, 2, 5 banned with float16's finfo.min in float16, the logits then cast to float32 (as a model run in
    half precision returns float32 logits)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 8)
        self.register_buffer("ban", torch.tensor([True, False, True, False, False, True, False, False]))

    def forward(self, x):
        return self.fc(x).half().masked_fill(self.ban, torch.finfo(torch.float16).min).float()


def test_a_float16_ban_cast_up_to_float32_is_a_fill():
    """A review: -65504 is float16's finfo.min, not float32's; cast up it was no fill, a made-up target landed on it
    and overfit-batch said cannot-overfit and flat-loss on a healthy model."""
    torch.manual_seed(0)
    x = torch.randn(4, 10)
    res = api_run("nancheck", HalfBanCastUp(), (x,))
    assert "moved off" in res.header["loss"] and "-65504" in res.header["loss"], res.header["loss"]
    res = api_run("overfit-batch", HalfBanCastUp(), (x,))
    assert not codes(res, ("error", "warning")), [(f.code, f.message) for f in res.findings]


class CostBesideSelfExcluded(nn.Module):
    """A review's: a matcher's cost matrix padded with +1e9 by masked_fill, beside a second output, a nearest
    distance that excludes each point itself by adding +1e9 on the diagonal."""

    def __init__(self):
        super().__init__()
        self.emb, self.q = nn.Linear(2, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.emb(x.view(x.shape[0], 5, 2))
        pad = torch.zeros(x.shape[0], 1, 5, dtype=torch.bool)
        pad[..., -1] = True
        cost = (-(self.q(h) @ h.transpose(1, 2))).masked_fill(pad, 1e9)
        return cost, (torch.cdist(h, self.q(h)) + 1e9 * torch.eye(5)).amin(-1)


def test_an_add_that_pushes_up_marks_only_the_outputs_it_reaches():
    """A positive add anywhere in the forward put the other output's +1e9 padding back into the loss (2e17)."""
    torch.manual_seed(0)
    res = api_run("nancheck", CostBesideSelfExcluded(), (torch.randn(4, 10),))
    assert "20 values left out" in res.header["loss"], res.header["loss"]
    assert res.to_dict()["loss_value"] < 100


class ParameterLogitBias(nn.Module):
    """Classes 0, 2, 5 banned by a logit bias of -1e9 held as a Parameter, frozen (a buffer in all but name) or
    trained (a bias gone to -1e9: no ban the code wrote)."""

    def __init__(self, frozen):
        super().__init__()
        self.fc = nn.Linear(10, 8)
        ban = torch.tensor([True, False, True, False, False, True, False, False])
        self.logit_bias = nn.Parameter(torch.zeros(8).masked_fill(ban, -1e9), requires_grad=not frozen)

    def forward(self, x):
        return self.fc(x) + self.logit_bias


@pytest.mark.parametrize("frozen", [True, False])
def test_a_frozen_parameter_bans_as_a_buffer_does(frozen):
    """A review: a frozen Parameter's -1e9 was no held number, and the shaken weights moved it: a made-up target on a
    banned class, loss 5e8, overfit-batch cannot-overfit on a healthy model."""
    torch.manual_seed(0)
    res = api_run("nancheck", ParameterLogitBias(frozen), (torch.randn(4, 10),))
    assert ("moved off" in res.header["loss"]) == frozen, res.header["loss"]
    assert (res.to_dict()["loss_value"] < 100) == frozen


class PaddedCost(nn.Module):
    """A sixth review's healthy matcher costs, padded with +1e9 in the usual ways, each zero under the padding
    before the padding is added (an add by position holds no value there to push up)."""

    def __init__(self, how):
        super().__init__()
        self.how, self.emb, self.q = how, nn.Linear(2, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.emb(x.view(x.shape[0], 5, 2))
        cost = -(self.q(h) @ h.transpose(1, 2))
        pad = torch.zeros(x.shape[0], 1, 5, dtype=torch.bool)
        pad[..., -1] = True
        valid = (~pad).float()
        if self.how == "C*valid + (1-valid)*1e9":
            return cost * valid + (1 - valid) * 1e9
        if self.how == "masked zero + pad*1e9":
            return cost.masked_fill(pad, 0) + pad.float() * 1e9
        if self.how == "addcmul":
            return torch.addcmul(pad.float() * 1e9, cost, valid)
        return torch.baddbmm((h.pow(2).sum(-1, keepdim=True) + h.pow(2).sum(-1)[:, None]).masked_fill(pad, 1e9),
                             h, h.transpose(1, 2), alpha=-2)


@pytest.mark.parametrize("how", ["C*valid + (1-valid)*1e9", "masked zero + pad*1e9", "addcmul", "baddbmm distance"])
def test_a_cost_padded_by_an_add_where_it_is_zero_keeps_its_padding_a_fill(how):
    """Read by tensor, an add of padding into a cost that is zero under it counted as an offset (the loss 4e17,
    overfit-batch cannot-overfit); so did addcmul's and baddbmm's."""
    torch.manual_seed(0)
    res = api_run("nancheck", PaddedCost(how), (torch.randn(4, 10),))
    assert "20 values left out" in res.header["loss"], res.header["loss"]
    assert res.to_dict()["loss_value"] < 1e3


class ClippedOverflow(FiniteBan):
    """An overflow on class 1 (+inf whatever the weights, no finite value on the way) nan_to_num clips to the 1e9
    it is given, beside a -1e9 ban: the clipped values are no constants, however fixed they look."""

    def forward(self, x):
        y = self.fc(x)
        clipped = torch.nan_to_num((y[:, 1:2].abs() + 1) * 1e39, posinf=1e9)   # class 1: +inf, then 1e9
        return torch.cat([y[:, :1], clipped, y[:, 2:]], 1).masked_fill(self.ban, -1e9)


def test_a_number_written_over_a_computed_inf_is_no_fill():
    torch.manual_seed(0)
    res = api_run("nancheck", ClippedOverflow(-1e9), (torch.randn(4, 10),))
    assert "moved off" not in res.header["loss"], res.header["loss"]
    assert res.to_dict()["loss_value"] > 1e6, res.header


def test_extreme_values_the_weights_make_are_no_fill():
    torch.manual_seed(0)
    res = api_run("nancheck", FiniteBan("weights"), (torch.randn(4, 10),))
    assert "moved off" not in res.header["loss"], res.header["loss"]


class Extreme(nn.Module):
    """Extreme output values no op wrote as a fill (a review): an overflow clipped by nan_to_num (-finfo.max, every
    weight), a prediction absorbed by an epoch offset of 1.7e9 (float32's spacing there is 128), given as a number or
    held in a buffer."""

    def __init__(self, kind):
        super().__init__()
        self.fc, self.kind = nn.Linear(10, 1), kind
        self.register_buffer("base", torch.tensor(1.7e9))
        if kind == "nan_to_num":
            nn.init.constant_(self.fc.bias, -10.0)

    def forward(self, x):
        y = self.fc(x)
        if self.kind == "nan_to_num":
            return torch.nan_to_num(y * 1e39)
        return y + (1.7e9 if self.kind == "offset" else self.base)


@pytest.mark.parametrize("kind", ["nan_to_num", "offset", "buffer"])
def test_extreme_values_no_op_wrote_as_a_fill_stay_in_the_loss(kind):
    torch.manual_seed(0)
    res = api_run("nancheck", Extreme(kind), (torch.randn(4, 10),))
    assert "left out" not in res.header["loss"], res.header["loss"]
    assert codes(res, ("error",)) or res.to_dict()["loss_value"] > 1e15, res.header


class Heads(nn.Module):
    """Two heads of 8 classes: the second bans classes 0, 2 and 5 with -inf (an auxiliary head masked apart)."""

    def __init__(self, ban_all=False):
        super().__init__()
        self.a, self.b = nn.Linear(10, 8), nn.Linear(10, 8)
        ban = torch.ones(8, dtype=torch.bool) if ban_all else torch.zeros(8, dtype=torch.bool)
        ban[[0, 2, 5]] = True
        self.register_buffer("ban", ban)

    def forward(self, x):
        return self.a(x), self.b(x).masked_fill(self.ban, float("-inf"))


def test_an_auxiliary_heads_own_ban_moves_its_own_targets():
    """A review: the second head's cross-entropy took the first head's made-up target, which landed on a class the
    second one bans: inf, and a healthy two-head model failed."""
    moved = _drawn_on_ban()
    torch.manual_seed(0)
    res = api_run("gradflow", Heads(), (torch.randn(4, 10),))
    assert not codes(res), [(f.code, f.message) for f in res.findings if f.severity != "info"]
    assert f"on output[1] against the same target (but for {moved} made-up targets moved off" in res.header["loss"], \
        res.header["loss"]


def test_nothing_is_said_moved_when_no_target_could_move():
    """A review: "kept off 32 -inf logits" where every class was banned and every target stayed (the loss nan)."""
    torch.manual_seed(0)
    res = api_run("nancheck", Heads(ban_all=True), (torch.randn(4, 10),))
    assert "non-finite-loss" in codes(res, ("error",)) or "non-finite-output" in codes(res, ("error",))
    assert "moved off" not in res.header["loss"] and "kept off" not in res.header["loss"], res.header["loss"]
