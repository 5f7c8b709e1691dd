"""overfit-batch: verdicts on healthy and broken-by-construction models, checked causes, CLI contract."""
import copy
import math
import sys
import textwrap

import pytest

from support import load, sample

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from torchdiag.api import run as api_run  # noqa: E402
from torchdiag.core.run import DEFAULT_LR  # noqa: E402


def overfit(model, x, **options):
    """overfit-batch through the Python API (the run contract: loss, seed, optimizer, amp from the RunSpec)."""
    return api_run("overfit-batch", model, x, **options)


def codes(result):
    return [f.code for f in result.findings]


def finding(result, code):
    return next(f for f in result.findings if f.code == code)


def seeded_targets(n, classes, seed=0):
    """The random class targets core/loss.py makes for an (N, C) output, built independently."""
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))


# --- healthy models pass with the defaults -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name,inputs,classification", [
    ("mlp.py:build", None, True),
    ("cnn.py:build", ["8x3x32x32"], True),
    ("resnet.py:build", None, True),
    ("rnn.py:build", None, True),
    ("transformer_lm.py:build", None, False),   # its own loss (output['loss'])
])
def test_healthy_models_pass_with_defaults(name, inputs, classification, untouched):
    torch.manual_seed(0)
    model, x = load(name, inputs=inputs)
    with untouched(model):
        r = overfit(model, x)
    assert r.data["passed"] is True and r.exit_code == 0, r.verdict
    assert "cannot-overfit" not in codes(r)
    losses = r.series["loss"]
    assert len(losses) == r.data["steps"] + 1 and len(r.series["grad_norm"]) == r.data["steps"]
    assert r.data["steps"] < 500 and r.data["steps_to_target"] == r.data["steps"]
    assert losses[-1] <= 0.01 * losses[0] and r.data["final_loss"] == losses[-1]
    # stopped at the first step that met the target, not later
    assert all(v > 0.01 * losses[0] or (r.series.get("accuracy") or [0] * len(losses))[i] < 1
               for i, v in enumerate(losses[:-1]))
    if classification:
        assert r.data["final_accuracy"] == 1.0 and r.header["loss_rule"].startswith("cross_entropy on output")
    else:
        assert "output['loss']" in r.header["loss_rule"] and r.data["final_accuracy"] is None


def test_initial_loss_and_first_grad_norm_match_independent_computation():
    torch.manual_seed(1)
    model, x = load("mlp.py:build")
    r = overfit(model, x, steps=3, target_ratio=1e-9)
    out = model(*x.args)                                   # mlp: train == eval (no dropout/BN)
    ce = F.cross_entropy(out, seeded_targets(16, 10, seed=0))
    assert r.data["initial_loss"] == pytest.approx(float(ce.detach()), rel=1e-6)
    ce.backward()
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    assert r.series["grad_norm"][0] == pytest.approx(norm, rel=1e-5)
    assert r.series["learning_rate"] == [1e-3] * 3 and r.data["steps"] == 3 and len(r.series["loss"]) == 4
    # a budget of 3 steps is too small to judge: the loss still falling is not-overfit-yet (a sweep's check run)
    assert r.data["passed"] is False and "not-overfit-yet" in codes(r)


@pytest.mark.parametrize("steps", [1, 2])
def test_a_budget_of_one_or_two_steps_whose_loss_fell_is_not_overfit_yet(steps):
    """A sweep: `--steps 1` on a healthy digits-sized MLP (loss 2.31 -> 2.29, ten classes over 64 samples) was
    cannot-overfit (exit 1) with identical-outputs, "collapsed in training": a fresh head's near-uniform answers
    read as a collapse to the label entropy. One step whose loss fell is as short as the docs' under-20 rule says."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(64, 64, generator=g), torch.arange(64) % 10
    r = overfit(model, x, steps=steps, target=y)
    assert r.data["passed"] is False and r.exit_code == 0, [f.to_dict() for f in r.findings]
    assert codes(r) == ["not-overfit-yet"] and r.verdict.startswith("NOT YET"), r.verdict


def test_one_step_that_raises_the_loss_says_loss_rose():
    """A review: `--steps 1` whose loss rose 138x got cannot-overfit with "no mechanical cause found"; two steps said
    loss-rose."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x = torch.rand(64, 64, generator=torch.Generator().manual_seed(0))
    r = overfit(model, x, steps=1, optimizer="sgd", lr=50.0)
    assert r.series["loss"][1] > 1.1 * r.series["loss"][0], r.series["loss"]
    assert "loss-rose" in codes(r), [f.to_dict() for f in r.findings]


def test_a_float64_model_overfits_and_its_norm_is_its_own():
    """A sweep: a float64 model raised (exit 4): its gradient norm was asked in float32, a narrowing torch refuses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    x = torch.randn(4, 8, dtype=torch.float64)
    r = overfit(model, x, steps=3, target_ratio=1e-9)
    out = model(x)
    F.cross_entropy(out, seeded_targets(4, 4, seed=0)).backward()
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    assert r.series["grad_norm"][0] == pytest.approx(norm, rel=1e-6)


class _Reversal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class _TwoHeads(torch.nn.Module):
    """Logits, and a second output no training can fit to a random target: two copies of one tensor, or a domain
    head behind a gradient reversal (the trunk is trained to defeat it)."""

    def __init__(self, second: str):
        super().__init__()
        self.second = second
        self.trunk, self.cls, self.dom = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4), torch.nn.Linear(32, 2)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        if self.second == "copies":
            return self.cls(h), self.dom(h)[:, :1].expand(-1, 2)
        if self.second == "batch-mean":   # a fault: the head sees the batch's mean, the same for every sample
            return self.cls(h), self.dom(h.mean(0, keepdim=True).expand_as(h))
        if self.second == "temperature":   # by design: a learned constant, the same for every sample
            return self.cls(h), self.dom(torch.ones_like(h[:1])).expand(x.shape[0], -1)
        if self.second == "mean-time-first":   # the fault, its output (T, N, C): the batch is dimension 1
            return self.cls(h), self.dom(h.mean(0, keepdim=True).expand_as(h)).unsqueeze(0).expand(3, -1, -1)
        if self.second == "whitened":   # refuses a batch of one sample repeated (its covariance is singular)
            spread = torch.linalg.cholesky(torch.cov(self.trunk(x)[:, :3].T)).diagonal().log().sum()
            return self.cls(h), self.dom(h.mean(0, keepdim=True).expand_as(h) * spread)
        return {"logits": self.cls(h), "domain": self.dom(_Reversal.apply(h))}


@pytest.mark.parametrize("second", ["copies", "reversal", "batch-mean", "temperature", "mean-time-first", "whitened"])
def test_memorised_on_the_first_output_when_the_others_random_targets_are_out_of_reach(second):
    """A sweep: a domain-adversarial model and one returning a tensor twice were cannot-overfit ("no mechanical cause
    found"): the auto loss adds mse on the other outputs against random targets those outputs cannot reach. The
    first output's own term is judged; the others are said. A review: a second head that sees only the batch's mean
    passed that way; an output the same for every sample that depends on the batch is a fault, and the error stands
    (a second review: a learned temperature, the same whatever the batch, is not)."""
    torch.manual_seed(0)
    model, x = _TwoHeads(second), torch.randn(4, 8)
    r = overfit(model, x, steps=600)
    if second in ("batch-mean", "mean-time-first"):   # a review: a sequence-first output's batch is dimension 1
        assert "cannot-overfit" in codes(r) and finding(r, "identical-outputs").where == "output[1]", codes(r)
        return
    if second == "whitened":   # a review: the repeated batch raised out of the guard (exit 4); not told, not blamed
        assert r.exit_code == 0 and "identical-outputs" not in codes(r), [g.to_dict() for g in r.findings]
        return
    f = finding(r, "other-outputs-unfitted")
    assert r.data["passed"] and r.exit_code == 0 and "cannot-overfit" not in codes(r), [g.to_dict() for g in r.findings]
    assert f.severity == "info" and r.verdict.startswith("PASS: the batch is memorised on output"), r.verdict
    out = model(x)   # the first output on the untrained model: the term's start, computed by hand
    logits = out[0] if isinstance(out, tuple) else out["logits"]
    start = float(F.cross_entropy(logits, seeded_targets(4, 4)))
    assert f"{start:.6g} →" in f.message, f.message


class _Ranged(torch.nn.Module):
    """Outputs that keep to a range: normalised embeddings per position (a retrieval model's multi-vector output), a
    channel-first descriptor map normalised over channels (SuperPoint), a softmax per position."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "channels":
            self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 8, 1))
        else:
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))

    def forward(self, x):
        y = self.net(x)
        return F.normalize(y, dim=1 if self.kind == "channels" else -1) if self.kind != "softmax" else y.softmax(-1)


def _simplex_by_hand(t):
    """Each row's nearest distribution, by bisection on the threshold theta of max(t - theta, 0) summing to 1."""
    lo, hi = t.min(-1, keepdim=True).values - 1, t.max(-1, keepdim=True).values
    for _ in range(100):
        mid = (lo + hi) / 2
        over = (t - mid).clamp_min(0).sum(-1, keepdim=True) > 1
        lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
    return (t - (lo + hi) / 2).clamp_min(0)


@pytest.mark.parametrize("kind,shape", [("unit", (2, 6, 8)), ("channels", (2, 3, 6, 6))])
def test_ranged_outputs_against_torchdiags_own_target_pass_at_the_floor_of_their_range(kind, shape):
    """A sweep: ColQwen2's unit-length rows levelled at 0.65 x the start against the made-up N(0, 1) target and were
    cannot-overfit. No output in the range gets closer to the target than the target's projection onto it: the floor
    is mse(projection, target), computed here by hand (a review: a channel-first normalisation and a softmax were
    given a box's lower floor and failed); reached, the batch is memorised as far as the range allows."""
    torch.manual_seed(0)
    model, x = _Ranged(kind), torch.randn(*shape)
    r = overfit(model, x)
    out_shape = tuple(model(x).shape)
    t = torch.randn(out_shape, generator=torch.Generator().manual_seed(0))
    near = F.normalize(t, dim=1 if kind == "channels" else -1) if kind != "softmax" else _simplex_by_hand(t)
    floor = float(F.mse_loss(near, t))
    f = finding(r, "made-target-out-of-range")
    assert r.exit_code == 0 and f.severity == "info" and r.data["floor"] == pytest.approx(floor, rel=1e-4), r.verdict
    assert r.data["final_loss"] - floor <= 0.01 * (r.data["initial_loss"] - floor)


def test_a_softmax_output_against_torchdiags_own_target_is_judged_by_the_simplex():
    """A review: a softmax per position was given the [0, 1] box's floor (0.54 where the simplex's is 0.68). The floor
    is each target row's distance to its nearest distribution (by hand: bisection on the threshold)."""
    from torchdiag.core.loss import Loss
    from torchdiag.diagnostics.overfit_batch.causes import made_target_floor

    torch.manual_seed(0)
    model, x = _Ranged("softmax"), torch.randn(2, 6, 8)
    loss = Loss("auto", seed=0)
    out = model(x)
    loss(out)
    t = torch.randn(tuple(out.shape), generator=torch.Generator().manual_seed(0))
    got = made_target_floor(out, loss)
    assert got["kind"].startswith("rows that are distributions")
    assert got["floor"] == pytest.approx(float(F.mse_loss(_simplex_by_hand(t), t)), rel=1e-5)



def test_a_range_read_at_the_end_holds_only_where_the_start_kept_to_it():
    """A hunt: GLPN's depth (10 x sigmoid) started near 5, its made-up target pushed every value into 0, and the end's
    values "kept to [0, 1]": a floor of a range the model never had. The same end values from a start in [0, 1] keep
    that range's floor (the target's distance to [0, 1], by hand)."""
    from torchdiag.core.loss import Loss
    from torchdiag.diagnostics.overfit_batch.causes import made_target_floor

    out = torch.rand(4, 16, 16) * 0.3
    loss = Loss("mse", seed=0)
    loss(out)
    t = loss.target.float()
    kept = made_target_floor(out, loss, start=(0.02, 0.97))
    assert kept["kind"] == "[0, 1]"
    assert kept["floor"] == pytest.approx(float(F.mse_loss(t.clamp(0, 1), t)), rel=1e-5)
    positive = made_target_floor(out, loss, start=(4.7, 5.2))   # never [0, 1]: no value below 0 is all it kept to
    assert positive["kind"].startswith("[0, ∞)")
    assert positive["floor"] == pytest.approx(float(F.mse_loss(t.clamp(min=0), t)), rel=1e-5)
    signed = made_target_floor(out, loss, start=(-0.5, 0.9))   # a start below 0: [-1, 1], never [0, 1]
    assert signed["kind"] == "[-1, 1]"
    assert made_target_floor(out * 20, loss, start=(-3.0, 4.0)) is None   # signed at the start: no range at all


def test_a_positive_regression_head_fits_the_made_up_target_as_far_as_its_range_allows():
    """A hunt: a regression head ending in softplus (a count or a scale: no value below 0) levelled at half its start
    against the N(0, 1) target torchdiag drew, and was a cannot-overfit error (exit 1). Its floor is the target's
    distance to [0, inf): by hand, mse(clamp(t, min=0), t)."""
    from torchdiag.api import run

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1), torch.nn.Softplus())
    res = run("overfit-batch", model, (torch.randn(8, 16),))
    assert res.exit_code == 0 and res.data["passed"], [f.message for f in res.findings]
    f = next(f for f in res.findings if f.code == "made-target-out-of-range")
    assert f.severity == "info" and "keeps to [0, ∞)" in f.message, f.message
    # a review: the example of a real target it cannot fit named a final sigmoid or tanh
    assert "signed regression target behind a final ReLU, softplus" in f.message and "sigmoid" not in f.message


class _RangedFirst(torch.nn.Module):
    """DPT's shape: a first output of a fixed range (a tanh map, or a LayerNorm's rows) beside a tanh output with
    weights of its own (a pooler). Faults of the pooler: it sees the batch's mean (`stuck`), its weight is frozen at
    zero (`frozen`: one value for every sample), it reads only its bias and a trace of the input (`bias`)."""

    def __init__(self, first: str, bug: str = ""):
        super().__init__()
        self.first, self.bug = first, bug
        self.trunk = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU())
        self.head = torch.nn.Linear(256, 16)
        self.pool = torch.nn.Linear(256, 4) if bug != "bias" else torch.nn.Parameter(torch.zeros(4))
        self.norm = torch.nn.LayerNorm(16) if first == "layernorm" else None
        if bug == "frozen":
            with torch.no_grad():
                self.pool.weight.requires_grad_(False).zero_()

    def forward(self, x):
        h = self.trunk(x)
        y = torch.tanh(self.head(h)) if self.first == "tanh" else self.norm(self.head(h))
        if self.bug == "stuck":
            return y, torch.tanh(self.pool(h.mean((0, 1)))).expand(x.shape[0], -1)
        if self.bug == "bias":
            return y, torch.tanh(self.pool + 1e-3 * x[:, 0, :4])
        return y, torch.tanh(self.pool(h.mean(1)))


def _tanh_floor(t):
    """mse(clamp(t, -1, 1), t): the nearest [-1, 1] map to the target, by hand."""
    return float(((t.abs() - 1).clamp_min(0) ** 2).mean())


def test_outputs_of_ranges_are_each_judged_against_their_own_floor():
    """A sweep: transformers' DPT (a LayerNorm's rows beside a tanh pooler) was a false cannot-overfit: the made-up
    loss has a term per output and no floor was read for either. Each term is judged against its own output's
    floor, computed here by hand (the second output's target is seeded k = 1 after the first's), the first within
    the target ratio, the other within a tenth of its fall. Reviews: a floor summed over the terms let a head that
    sees the batch's mean hide in the sum; the first's floor alone let a frozen or bias-only second head pass."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8)
    model = _RangedFirst("tanh")
    r = overfit(model, x, steps=600)
    shapes = [tuple(t.shape) for t in model(x)]
    floors = [_tanh_floor(torch.randn(shape, generator=torch.Generator().manual_seed(k))) for k, shape in enumerate(shapes)]
    f = finding(r, "made-target-out-of-range")
    assert r.exit_code == 0 and r.data["passed"] and f.severity == "info", [g.to_dict() for g in r.findings]
    assert [t["floor"] for t in r.data["terms"]] == pytest.approx(floors, rel=1e-4)
    assert r.verdict.startswith("PASS: the batch is memorised as far as each output's range allows"), r.verdict
    for bug in ("stuck", "frozen"):
        bad = overfit(_RangedFirst("tanh", bug), x, steps=600)
        assert not bad.data["passed"] and not bad.verdict.startswith("PASS"), (bug, bad.verdict)
        assert "made-target-out-of-range" not in codes(bad) and "other-outputs-unfitted" not in codes(bad), bug
        assert any("output[1]" in n and "% of the way to 0 " in n for n in bad.notes), bad.notes   # how far each went


def test_a_run_whose_terms_are_all_at_their_floors_stops_at_the_budget():
    """A new user's tiny BERT (a LayerNorm's rows beside a tanh pooler) had both terms at their floors at step 152 and
    ran on to the 5,000-step cap (87 s) for the verdict it had there: without --steps, a run whose every term is at
    its own floor stops at the default budget instead of being extended. Its pass is the same."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8)
    r = overfit(_RangedFirst("tanh"), x)
    assert r.exit_code == 0 and r.data["passed"], [g.to_dict() for g in r.findings]
    assert r.verdict.startswith("PASS: the batch is memorised as far as each output's range allows"), r.verdict
    at, steps = r.data["steps_to_target"], r.data["steps"]
    assert steps == 500 * math.ceil(max(at, 1) / 500), (at, steps)   # the first budget (of 500 more) past it
    bad = overfit(_RangedFirst("tanh", "frozen"), x, steps=None)   # a term short of its floor still runs on
    assert not bad.data["passed"] and bad.data["steps"] > 500, bad.data["steps"]


def test_terms_at_their_floors_at_one_step_pass_though_the_last_step_wandered():
    """A sweep: CANINE at --steps 300 had both terms within the target ratio of their fall to their floors at step
    281, then Adam's oscillation left the last step's first term 1.2% of the way above its floor: cannot-overfit
    (error). One loss is judged where it first reaches the target; so are several terms, all at the same step.
    Hand-built curves: terms that reach their goals only at different steps still fail."""
    from types import SimpleNamespace

    from torchdiag.diagnostics.overfit_batch.report import _at_term_floors
    from torchdiag.results import Result

    floors = [{"kind": "[-1, 1]", "floor": 0.2}, None]   # goals: 0.2 + 0.018 for the first, 0.01 for the second

    labels = ("output[0]", "output[1]")

    def judged(steps):
        curve = SimpleNamespace(first_terms=[("output[0]", 2.0), ("output[1]", 1.0)], reached_at=None, step=len(steps) - 1,
                                term_steps=[(k, labels, torch.tensor(s)) for k, s in enumerate(steps) if len(s) == 2],
                                losses=[sum(s) for s in steps],
                                last_terms=[(k, torch.tensor(v)) for k, v in zip(("output[0]", "output[1]"), steps[-1])])
        result = Result("overfit-batch")
        passed = _at_term_floors(result, SimpleNamespace(sharded=False), curve,
                                 SimpleNamespace(target_ratio=0.01, target_loss=None), floors)
        return passed, result

    passed, result = judged([[2.0, 1.0], [0.5, 0.3], [0.215, 0.009], [0.24, 0.008]])
    assert passed and result.data["steps_to_target"] == 2 and "at step 2 of 3" in result.verdict, result.verdict
    assert [t["end"] for t in result.data["terms"]] == pytest.approx([0.215, 0.009])
    passed, result = judged([[2.0, 1.0], [0.5, 0.3], [0.215, 0.02], [0.24, 0.008]])
    assert not passed and "passed" not in result.data and "at one step" in result.notes[0], result.notes
    passed, _ = judged([[2.0, 1.0], [0.19, 0.009], [0.21, 0.05]])   # below the first's floor counts as at it
    assert passed
    # a review: what was reached and then lost by the last step (a box output scaled down, a head given noise) is
    # no pass: the last step must keep each term within KEPT x its goal (a single loss stops where it reaches it)
    passed, result = judged([[2.0, 1.0], [0.215, 0.009], [1.1, 0.05]])
    assert not passed and "lost by the last step" in result.notes[0], result.notes
    # a step whose loss left an output out (no gradient path for a while) is no row of the others: a review's crash
    passed, result = judged([[2.0, 1.0], [0.5, 0.3], [0.4], [0.215, 0.009], [0.22, 0.02]])
    assert passed and result.data["steps_to_target"] == 3, result.data


class _MaskAndDepth(torch.nn.Module):
    """A sigmoid mask beside a regression head (depth), each with a memory per sample and token. Faults of the head:
    a 7-wide bottleneck under its 8 channels (`rank`), one of its channels always 0 (`dead`)."""

    def __init__(self, bug: str = ""):
        super().__init__()
        self.bug = bug
        self.p, self.q = (torch.nn.Parameter(torch.zeros(4, 12, 64)) for _ in range(2))
        self.inp, self.dinp, self.mask = torch.nn.Linear(8, 64), torch.nn.Linear(8, 64), torch.nn.Linear(64, 8)
        self.depth = torch.nn.Sequential(torch.nn.Linear(64, 7), torch.nn.Linear(7, 8)) if bug == "rank" else \
            torch.nn.Linear(64, 8)

    def forward(self, x):
        m = torch.sigmoid(self.mask(torch.relu(self.p + self.inp(x))))
        d = self.depth(torch.relu(self.q + self.dinp(x)))
        return {"mask": m, "depth": torch.cat([d[..., :-1], torch.zeros_like(d[..., -1:])], -1) if self.bug == "dead"
                else d}


def test_a_head_of_no_range_beside_a_ranged_output_is_held_to_the_target():
    """A review: a depth head of no range beside a sigmoid mask was held only to a tenth of its fall (the slack a
    bounded output needs), and a 7-wide bottleneck under 8 channels passed at 6% of its start; a channel stuck at 0
    was read as a LayerNorm's range (a constant column keeps its relation trivially). The healthy pair passes."""
    x = torch.randn(4, 12, 8, generator=torch.Generator().manual_seed(0))
    for bug in ("", "rank", "dead"):
        torch.manual_seed(0)
        r = overfit(_MaskAndDepth(bug), x, steps=600)
        assert r.data["passed"] == (not bug), (bug, r.verdict)
        if not bug:
            assert [t["range"] for t in r.data["terms"]] == ["[0, 1]", None], r.data["terms"]


@pytest.mark.slow
def test_a_layernorm_first_output_beside_a_tanh_passes_at_the_fitted_floor():
    """DPT's own pair: a LayerNorm's rows first, a tanh pooler beside them; each term reaches its floor (the
    LayerNorm's fitted, an estimate from above)."""
    torch.manual_seed(0)
    r = overfit(_RangedFirst("layernorm"), torch.randn(4, 10, 8), steps=1000, lr=1e-2)
    f = finding(r, "made-target-out-of-range")
    assert r.exit_code == 0 and "LayerNorm" in f.message and "fitted" in f.message, r.verdict
    assert r.data["terms"][0]["floor"] > 0.01 * r.data["terms"][0]["start"]


def _layernorm_rows(n, k, seed=0):
    """Rows a LayerNorm with a scale and shift of its own makes, and rows that are only centred."""
    g = torch.Generator().manual_seed(seed)
    ln = torch.nn.LayerNorm(k)
    with torch.no_grad():
        ln.weight.copy_(torch.rand(k, generator=g) * 2.5 + 0.2)
        ln.bias.copy_(torch.randn(k, generator=g))
        x = torch.randn(n, k, generator=g) * 5 + 1
        return ln(x), x - x.mean(-1, keepdim=True)


def test_rows_that_only_keep_one_linear_relation_have_no_range_floor():
    """A review: rows that keep one linear relation and nothing more (a Linear one unit short of its outputs, centred
    rows) were given the best hyperplane's floor, and a bottleneck regressor passed: such a model trains its
    hyperplane onto the target's best. Only a LayerNorm's rows (each row's spread fixed too) are a range. Random and
    RMS-normalised rows keep no relation; too few rows (fewer than twice the unknowns) cannot tell."""
    from torchdiag.diagnostics.overfit_batch.causes import _layernorm_floor

    g = torch.Generator().manual_seed(2)
    ln, centred = _layernorm_rows(128, 32)
    short = torch.randn(128, 31, generator=g) @ torch.randn(31, 32, generator=g) + torch.randn(32, generator=g)
    t = torch.randn(128, 32, generator=torch.Generator().manual_seed(1))
    for rows in (centred, short, torch.randn(128, 32), F.rms_norm(torch.randn(128, 32), (32,)), ln[:60]):
        assert _layernorm_floor(rows, t[:len(rows)], [1], 1e-4, 0.0) is None


def test_a_layernorms_rows_of_small_variance_still_keep_its_range():
    """A LayerNorm's eps spreads a row of variance v to v / (v + eps), not 1: a trained 16-wide output (pre-norm rows
    of variance ~1e-3 in some samples) left 0.5-3% of the spread unexplained mid-run, over the 0.1% allowed, so its
    range was not seen until step 11,000, and a --steps 5000 run was a false cannot-overfit. Rows that only keep the
    relation still have no range, at 16 wide and at 256 (their spread varies by ~sqrt(2 / width))."""
    from torchdiag.diagnostics.overfit_batch.causes import _layernorm_floor

    g = torch.Generator().manual_seed(3)
    for k in (16, 256):
        n = 4 * (k + 1)
        ln = torch.nn.LayerNorm(k)
        with torch.no_grad():
            ln.weight.copy_(torch.rand(k, generator=g) * 2.5 + 0.2)
            ln.bias.copy_(torch.randn(k, generator=g))
            x = torch.randn(n, k, generator=g) * (torch.rand(n, 1, generator=g) * 0.08 + 0.02)   # var 4e-4 .. 0.01
            rows = ln(x)
        deficit = 1 - (x.var(-1, unbiased=False) / (x.var(-1, unbiased=False) + ln.eps))
        assert float(deficit.max()) > 0.02   # rows the old bound (0.1% of the spread overall) could not take
        t = torch.randn(n, k, generator=g)
        got = _layernorm_floor(rows, t, [1], 1e-4, 0.0)
        assert got is not None and got["kind"].startswith("a LayerNorm's range"), k
        centred = x - x.mean(-1, keepdim=True)
        short = torch.randn(n, k - 1, generator=g) @ torch.randn(k - 1, k, generator=g)
        for only_relation in (centred * 7 + 0.5, short):
            assert _layernorm_floor(only_relation, t, [1], 1e-4, 0.0) is None, k


def test_a_layernorms_rows_are_floored_by_a_layernorm_fitted_to_the_target():
    """A LayerNorm's rows keep one relation and each row's weighted spread: the floor is the best LayerNorm output
    fitted to the target, an estimate from above. Checked against a longer fit made here (8,000 Adam steps at a fixed
    rate) and the bound no output keeping one relation gets below (the centred target's smallest singular value,
    squared, over its values). Not fitted when it cannot matter: a LayerNorm output of the target itself already
    under a tenth of the goal."""
    from torchdiag.diagnostics.overfit_batch.causes import _layernorm_floor

    rows, _ = _layernorm_rows(128, 32)
    t = torch.randn(128, 32, generator=torch.Generator().manual_seed(1))
    got = _layernorm_floor(rows, t, [1], 1e-4, 0.0)
    u, w, b = t.clone().requires_grad_(), torch.ones(32, requires_grad=True), torch.zeros(32, requires_grad=True)
    opt = torch.optim.Adam([u, w, b], lr=5e-3)
    for _ in range(8000):
        opt.zero_grad()
        F.mse_loss(F.layer_norm(u, (32,), w, b), t).backward()
        opt.step()
    fitted = float(F.mse_loss(F.layer_norm(u, (32,), w, b), t).detach())
    tc = t.double() - t.double().mean(0)
    bound = float(torch.linalg.svdvals(tc)[-1] ** 2 / tc.numel())
    assert got["kind"].startswith("a LayerNorm's range along the last dimension") and got["fitted"]
    assert bound < got["floor"] and got["floor"] == pytest.approx(fitted, rel=0.1)
    assert _layernorm_floor(rows, t, [1], 1e-4, 11 * float(F.mse_loss(F.layer_norm(t, (32,)), t))) is None


def test_a_bottleneck_regressor_against_torchdiags_own_target_stays_cannot_overfit():
    """A review's: two outputs through one hidden unit (its outputs on a line) passed as memorised within a range."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1), torch.nn.Linear(1, 2))
    r = overfit(model, torch.randn(2, 64, 8), steps=3000)
    assert r.exit_code == 1 and "made-target-out-of-range" not in codes(r), r.verdict


@pytest.mark.slow
def test_a_narrow_layernorm_output_against_torchdiags_own_target_passes_at_its_floor():
    """A sweep: TIPSv2's text model (width 32, 128 token rows) levelled at 0.0113 x the start against the made-up
    target and was cannot-overfit; a LayerNorm's rows cannot fit N(0, 1) rows closer than about 0.011 x. Here width
    16 over 64 rows: the floor is 0.0225 x the start. The run stops once it is that close to the floor (it ran on to
    the 20,000-step cap before, a quarter of a minute for a verdict it had at step 1500)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16), torch.nn.LayerNorm(16))
    r = overfit(model, torch.randn(2, 32, 64))
    f = finding(r, "made-target-out-of-range")
    assert r.exit_code == 0 and f.severity == "info" and "LayerNorm" in f.message and "fitted" in f.message
    assert r.data["final_loss"] - r.data["floor"] <= 0.01 * (r.data["initial_loss"] - r.data["floor"])
    assert r.data["floor"] > 0.01 * r.data["initial_loss"]
    assert r.data["steps"] <= 4 * 500, r.data["steps"]     # the default cap (4 × the default 500 steps), not 20,000


def test_dropout_is_off_on_the_trained_copy_and_said_so(untouched):
    # dropout on the output is a floor under a regression loss (its noise): p/(1-p) of the output's power,
    # here 1.0, far above the 1% target; with it off on the copy the model memorises the batch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4), torch.nn.Dropout(0.5))
    x = torch.randn(6, 8)
    target = torch.randn(6, 4)
    with untouched(model):
        r = overfit(model, x, loss="mse", target=target)
    assert model[3].training and model.training                            # the user's model: as it was
    assert r.data["dropout_off"] == ["3"] and "train mode (dropout off: 1 module)" in r.header["training"]
    assert r.data["passed"] is True, r.verdict
    # the initial loss is the loss without dropout (eval mode = train mode without dropout here)
    model.eval()
    expected = float(F.mse_loss(model(x), target).detach())
    model.train()
    assert r.data["initial_loss"] == pytest.approx(expected, rel=1e-6)


class _DrawnDropout(torch.nn.Module):
    """Dropout drawn through torch's functions only, never an nn.Dropout: F.dropout at its default p (0.5), a fused
    attention's dropout_p inside a checkpointed block (its recompute in backward must not draw a mask its forward
    did not: checkpoint compares the saved tensors), nn.MultiheadAttention's own dropout."""

    def __init__(self):
        super().__init__()
        self.inp, self.qkv = torch.nn.Linear(8, 32), torch.nn.Linear(32, 32)
        self.mha = torch.nn.MultiheadAttention(32, 2, dropout=0.5, batch_first=True)
        self.out = torch.nn.Linear(32, 4)

    def attend(self, h):
        q = self.qkv(h).view(h.shape[0], h.shape[1], 2, 16).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5 if self.training else 0.0)
        return a.transpose(1, 2).reshape(h.shape)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        h = self.inp(x)
        h = F.dropout(h) if self.training else h
        h = h + checkpoint(self.attend, h, use_reentrant=False)
        return self.out(h + self.mha(h, h, h, need_weights=False)[0])


def test_dropout_drawn_through_functions_is_off_and_said_so(untouched):
    """BART-family layers call F.dropout(x, p, training=self.training) and fused attention takes dropout_p: no
    module to put in eval. Their noise held a tiny BART encoder above the target (a false verdict, 2026-12-02). The
    calls are made as eval mode makes them, on the copy alone; the model's train flags (which also choose gradient
    checkpointing, a VAE's sampling) stay on."""
    torch.manual_seed(0)
    model = _DrawnDropout()
    x, target = torch.randn(4, 6, 8), torch.randn(4, 6, 4)
    with untouched(model):
        r = overfit(model, x, loss="mse", target=target)
    assert model.training and all(m.training for m in model.modules())
    assert not model._forward_pre_hooks and not any(m._forward_hooks for m in model.modules())
    assert r.data["passed"] is True, r.verdict
    assert r.data["functional_dropout_off"] == 3 and r.data["dropout_off"] == []
    assert "train mode (dropout off: 3 functional calls a step)" in r.header["training"]
    model.eval()   # the first loss is the model's without dropout, which eval mode also gives here
    with torch.no_grad():
        assert r.data["initial_loss"] == pytest.approx(float(F.mse_loss(model(x), target)), rel=1e-5)


class _NestedCheckpoints(torch.nn.Module):
    """A reentrant checkpoint around a function that checkpoints its own function (neither a module call), which
    draws F.dropout: the inner recompute runs in a nested backward, where a torch-function mode is off the stack."""

    def __init__(self, late=False):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 64), torch.nn.Linear(64, 8), torch.nn.Linear(8, 4)
        self.late, self.calls = late, 0   # late: checkpointing from the second forward on (the refusal at step 1)

    def mlp(self, x):
        return self.b(F.dropout(torch.relu(self.a(x)), 0.5, training=self.training))

    def layer(self, x):
        from torch.utils.checkpoint import checkpoint

        return x + checkpoint(self.mlp, x, use_reentrant=False)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        self.calls += 1
        if self.late and self.calls == 1:
            return self.c(x + self.mlp(x))
        return self.c(checkpoint(self.layer, x.requires_grad_(), use_reentrant=True))


@pytest.mark.parametrize("late", [False, True])
def test_functional_dropout_a_checkpoint_draws_again_is_left_on_and_said(untouched, late):
    """Where the recompute drew a mask its forward did not, checkpoint refused it (exit 3 blamed the model, reviews;
    at step 1 where checkpointing starts late): the run starts again with the dropout drawn as the model draws it,
    and says so."""
    torch.manual_seed(0)
    model, x, target = _NestedCheckpoints(late), torch.randn(16, 8), torch.randn(16, 4)
    with untouched(model):
        r = overfit(model, x, loss="mse", target=target, steps=30)
    assert r.exit_code in (0, 1) and r.data["steps"] == 30 and r.data["functional_dropout_kept"] is True
    assert r.data["functional_dropout_off"] == 0 and "left on: a checkpointed function" in r.header["training"]
    assert torch._C._len_torch_function_stack() == 0


def test_a_checkpoint_refusal_with_nothing_dropped_stays_the_models_error():
    """A checkpointed block that saves other tensors on its first call (a cache) fails the user's own first step too:
    with no dropout drawn, it is the model's error, not a reason to start again (a review: a PASS said dropout)."""
    from torchdiag.errors import ModelError

    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.cache = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4), None

        def block(self, x):
            h = torch.tanh(self.a(x))
            if self.cache is None:
                self.cache = (h * h).mean().detach()
            return h

        def forward(self, x):
            from torch.utils.checkpoint import checkpoint

            return self.b(checkpoint(self.block, x, use_reentrant=False))

    torch.manual_seed(0)
    with pytest.raises(ModelError, match="CheckpointError"):
        overfit(Cached(), torch.randn(16, 8), loss="mse", target=torch.randn(16, 4), steps=20)
    assert torch._C._len_torch_function_stack() == 0


def test_functional_dropout_off_leaves_no_mode_behind_an_interrupt():
    """Ctrl-C inside a forward skips the always-call hook (KeyboardInterrupt is no Exception): the mode it pushed
    would stay on the caller's stack, and the caller's own dropout would stop dropping (a review)."""
    class Interrupted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.calls = torch.nn.Linear(8, 4), 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 4:
                raise KeyboardInterrupt
            return F.dropout(self.a(x), 0.5, training=self.training)

    torch.manual_seed(0)
    r = overfit(Interrupted(), torch.randn(16, 8), loss="mse", target=torch.randn(16, 4))
    assert r.data["interrupted"] and r.data["functional_dropout_off"] == 1
    assert torch._C._len_torch_function_stack() == 0
    assert 0.3 < float((F.dropout(torch.ones(10_000), 0.5, training=True) == 0).float().mean()) < 0.7


def test_a_loss_that_checkpoints_its_own_dropout_is_left_alone(tmp_path):
    """A model that draws no dropout, a loss that checkpoints a projection drawing its own: the backward is plain
    (the mode is held through a backward only after a forward that dropped; a review: exit 3 before)."""
    path = tmp_path / "ckpt_loss.py"
    path.write_text(textwrap.dedent("""
        import torch, torch.nn.functional as F
        from torch.utils.checkpoint import checkpoint

        def _proj(o):
            return F.dropout(o * 2.0, 0.1, training=True)

        def loss(output, target):
            return F.mse_loss(checkpoint(_proj, output, use_reentrant=False), target)
    """))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    r = overfit(model, torch.randn(16, 8), loss=f"{path}:loss", target=torch.zeros(16, 4), steps=20)
    assert r.exit_code in (0, 1) and r.data["steps"] >= 1 and r.data["functional_dropout_off"] == 0


def test_target_loss_stops_at_first_step_below_it():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = overfit(model, x, target_loss=1.0, target_ratio=1e-6)
    losses = r.series["loss"]
    assert r.data["passed"] and losses[-1] <= 1.0 and all(v > 1.0 for v in losses[:-1])
    assert r.data["steps_to_target"] == len(losses) - 1


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_other_optimizers_pass(opt):
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = overfit(model, x, optimizer=opt)
    assert r.data["passed"] and r.data["lr"] == DEFAULT_LR[opt]
    assert r.header["training"].startswith({"sgd": "SGD (momentum 0.9)", "adamw": "AdamW"}[opt])


def test_amp_bf16_on_cpu_passes():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = overfit(model, x, amp="bf16")
    assert r.data["passed"] and r.data["amp"] == "bf16" and "autocast bf16" in r.header["training"]


# --- cannot memorise by construction --------------------------------------------------------------

def test_batch_mean_model_cannot_overfit_and_the_culprit_is_named(untouched):
    torch.manual_seed(0)
    model, x = load("broken_cannot_overfit.py:build")
    with untouched(model):
        r = overfit(model, x)
    assert r.data["passed"] is False and r.exit_code == 1 and r.data["steps"] == 500
    f = finding(r, "cannot-overfit")
    assert f.severity == "error"
    same = finding(r, "identical-outputs")
    assert same.where == "3" and "(BatchMean)" in same.message   # Sequential index 3 is BatchMean
    # Truth: a batch-constant prediction cannot beat the entropy of the labels (hand-computed).
    y = seeded_targets(16, 10)
    counts = torch.bincount(y, minlength=10).double() / 16
    h = float(-(counts[counts > 0] * counts[counts > 0].log()).sum())
    assert r.data["best_loss"] >= h - 1e-4
    assert r.data["final_loss"] == pytest.approx(h, abs=0.02)     # Adam gets to the floor
    assert r.data["final_accuracy"] == float(counts.max())        # the majority class only
    assert f"{h:.4g}" in same.message
    assert not any("still falling" in n for n in r.notes)        # it sits on the floor


def test_parameters_cut_off_by_no_grad_are_named():
    torch.manual_seed(0)
    model, x = load("broken_overfit_nograd.py:build")
    r = overfit(model, x, steps=50)
    body = ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"]
    nog = finding(r, "no-grad")
    assert nog.where == "body" and all(n in nog.message for n in body) and "4 of 5" in nog.message
    assert nog.severity == "error"   # as in doctor and gradflow
    assert "unchanged-params" not in codes(r)   # the same parameters: said once, by their cause
    assert "cannot-overfit" in codes(r) and r.exit_code == 1
    assert any("still falling at the end" in n for n in r.notes)   # only `bias` learns, slowly


def test_parameters_without_a_gradient_do_not_make_a_falling_loss_a_failure():
    """A module whose output is thrown away (LLaVA's unread last tower layer) gets the no-grad error; the rest of the
    model still fits the batch, so the run is extended while the loss falls toward the target, and it memorises."""
    class Unread(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
            self.spare = torch.nn.Linear(8, 3)

        def forward(self, x):
            self.spare(x)
            return self.body(x)

    torch.manual_seed(0)
    r = overfit(Unread(), torch.randn(8, 8), lr=3e-4)
    assert r.data["passed"] and r.data["steps"] > 500   # extended past the first budget: it was still falling
    assert {f.code for f in r.findings if f.severity != "info"} == {"no-grad"} and r.exit_code == 1


def test_dead_relu_gives_flat_loss_zero_grads_and_identical_outputs():
    torch.manual_seed(0)
    model, x = load("broken_overfit_dead.py:build")
    r = overfit(model, x, steps=20)
    # all-zero logits: cross-entropy is exactly ln(10) at every step
    assert all(v == pytest.approx(math.log(10), rel=1e-6) for v in r.series["loss"])
    assert {"flat-loss", "zero-grad", "unchanged-params", "identical-outputs", "cannot-overfit"} <= set(codes(r))
    zero = finding(r, "zero-grad")
    assert zero.where == "0.weight" and "0.weight, 0.bias, 3.weight" in zero.message
    assert finding(r, "identical-outputs").where == "2"          # the dead ReLU
    assert r.series["grad_norm"] == [0.0] * 20
    assert not any("still falling" in n for n in r.notes)


def test_softmax_before_cross_entropy_is_bounded_output_with_the_exact_floor(untouched):
    torch.manual_seed(0)
    model, x = load("broken_overfit_softmax.py:build")
    with untouched(model):
        r = overfit(model, x, steps=20)
    # Truth by hand: logits in [0, 1], 10 classes -> best case true class 1, others 0:
    # -log(e / (e + 9)) = log(1 + 9/e)
    floor = -math.log(math.e / (math.e + 9))
    f = finding(r, "bounded-output")
    assert "[0, 1]" in f.message and "10 classes" in f.message and f"{floor:.4g}" in f.message
    assert r.data["best_loss"] >= floor - 1e-5 and "cannot-overfit" in codes(r)
    assert finding(r, "cannot-overfit").hint is None          # a cause was found, no "try more steps"


def test_tanh_output_floor_and_no_finding_when_the_target_is_reachable():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh())
    from torchdiag.core.inputs import ModelInputs

    x = ModelInputs((torch.randn(6, 8),), {}, "test")
    r = overfit(model, x, steps=5)
    floor = math.log(1 + 3 * math.exp(-2))                    # logits in [-1, 1], 4 classes
    assert f"{floor:.4g}" in finding(r, "bounded-output").message and "[-1, 1]" in finding(r, "bounded-output").message
    # an absolute target above the floor is reachable in principle: no bounded-output
    r2 = overfit(model, x, steps=5, target_loss=floor + 0.05)
    assert "bounded-output" not in codes(r2)
    # unbounded logits never get it
    torch.manual_seed(0)
    mlp, xm = load("mlp.py:build")
    assert "bounded-output" not in codes(overfit(mlp, xm, steps=3))


def _soft_hits(out, y):
    """1 - the mean probability of the right class: a loss that takes raw logits and applies softmax itself."""
    return 1 - F.softmax(out, 1).gather(1, y[:, None]).mean()


def test_an_unbounded_output_still_small_is_no_bounded_output():
    """A new user's Linear head at --steps 10 had logits within [-1, 1] (0.59 at most): "a tanh at the end?"; and a
    U-Net under a dice loss that applies softmax itself was told "scaling the trained output by 4 lowers the loss: the
    output's range holds it back" while its logits grew. Where a step of the weights takes the output out of the box
    (or to the scale that lowers the loss), nothing at the end squashes it. A tanh still gets it (a softmax under a
    custom loss: test_a_squashed_output_under_a_custom_loss_is_no_floor_of_the_loss)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    small = torch.nn.Linear(8, 4)
    with torch.no_grad():
        small.weight.mul_(0.05)
    r = overfit(small, x, target=y, steps=5)
    assert float(small(x).abs().max()) < 1 and "bounded-output" not in codes(r), [f.to_dict() for f in r.findings]
    torch.manual_seed(0)
    r = overfit(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()), x, target=y, steps=5)
    assert "bounded-output" in codes(r)
    torch.manual_seed(0)
    r = api_run("overfit-batch", torch.nn.Linear(8, 4), x, target=y, loss=_soft_hits, steps=40)
    assert "bounded-output" not in codes(r), [f.to_dict() for f in r.findings]


def test_non_finite_loss_points_to_nancheck():
    torch.manual_seed(0)
    model, x = load("broken_overfit_nan.py:build")
    r = overfit(model, x)
    f = finding(r, "non-finite-loss")
    assert "step 0" in f.message and "nancheck" in f.hint
    assert r.data["steps"] == 0 and math.isnan(r.data["initial_loss"]) and r.data["final_accuracy"] is None
    assert "cannot-overfit" in codes(r)
    # one severity per cause: the error gradflow and doctor give it, before its consequence
    assert f.severity == "error" and codes(r).index("non-finite-loss") < codes(r).index("cannot-overfit")


def test_loss_without_graph_is_no_grad(tmp_path):
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)
            def forward(self, x):
                with torch.no_grad():
                    return self.fc(x)
        def build():
            return M()
        def example_inputs():
            return (torch.randn(6, 4),)
    """))
    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.loading import load_model

    loaded = load_model(f"{tmp_path}/m.py:build", [], torch.device("cpu"))
    x = resolve_inputs([], loaded, torch.device("cpu"))
    r = overfit(loaded.model, x)
    f = finding(r, "no-grad")
    assert f.where == "" and "does not require grad" in f.message
    assert r.data["steps"] == 0 and "cannot-overfit" in codes(r)


def test_on_step_is_called_for_every_evaluation():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    seen = []
    r = overfit(model, x, on_step=lambda s, v: seen.append((s, v)))
    assert seen == list(enumerate(r.series["loss"]))


# --- CLI ------------------------------------------------------------------------------------------

def test_cli_pass_json_keys_and_exit_0(cli):
    r = cli("overfit-batch", sample("mlp.py:build"), "--json")
    assert r.code == 0
    d = r.json
    for key in ("passed", "steps", "initial_loss", "final_loss", "best_loss", "loss", "findings",
                "grad_norm", "learning_rate", "steps_to_target", "loss_rule", "interrupted"):
        assert key in d, key
    assert d["passed"] is True and d["exit_code"] == 0 and d["interrupted"] is False
    assert len(d["loss"]) == d["steps"] + 1 and d["final_loss"] == d["loss"][-1]
    assert d["best_loss"] == min(d["loss"]) and d["loss_rule"].startswith("cross_entropy on output")


def test_cli_cannot_overfit_exit_1_and_table(cli):
    r = cli("overfit-batch", sample("broken_cannot_overfit.py:build"), "--steps", "100")
    assert r.code == 1
    assert "ERROR   cannot-overfit" in r.stdout and "FAIL: cannot overfit" in r.stdout
    assert "Loss curve" in r.stdout and "loss rule: cross_entropy on output" in r.stdout
    j = cli("overfit-batch", sample("broken_cannot_overfit.py:build"), "--steps", "100", "--json").json
    assert j["passed"] is False and j["exit_code"] == 1
    severities = [f["severity"] for f in j["findings"]]   # most severe first: the error leads
    assert j["findings"][0]["code"] == "cannot-overfit" and severities == sorted(severities, key=["error", "warning", "info"].index)


def test_cli_same_seed_same_curve_other_seed_other_curve(cli):
    args = ("overfit-batch", sample("mlp.py:build"), "--steps", "15", "--target-ratio", "1e-9", "--json")
    a, b = cli(*args).json, cli(*args).json
    c = cli(*args, "--seed", "1").json
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and len(a["loss"]) == 16
    assert c["loss"] != a["loss"]


def test_cli_batch_function_targets_are_used(cli, tmp_path):
    (tmp_path / "data.py").write_text(textwrap.dedent("""
        import torch
        def one_batch():
            g = torch.Generator().manual_seed(7)
            return torch.randn(12, 784, generator=g), torch.arange(12) % 10
    """))
    d = cli("overfit-batch", sample("mlp.py:build"), "--batch", f"{tmp_path}/data.py:one_batch",
            "--steps", "2", "--target-ratio", "1e-9", "--json").json
    # Truth: rebuild the model as the CLI does (factory seeded with --seed 0) and compute CE by hand.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, _ = load("mlp.py:build")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(12, 784, generator=g)
    with torch.no_grad():
        truth = float(F.cross_entropy(model(x), torch.arange(12) % 10))
    assert d["initial_loss"] == pytest.approx(truth, rel=1e-6)
    assert d["batch_size"] == 12 and d["inputs"] == ["input[0]: 12x784 float32"]


KEYBOARD_LOSS = """
import torch.nn.functional as F
calls = []
def loss(output, target):
    calls.append(1)
    if len(calls) == 6:          # the 6th evaluation is step 5
        raise KeyboardInterrupt
    return F.mse_loss(output, output.detach() * 0 + 1)
"""


def test_ctrl_c_gives_partial_result_exit_130_and_flushed_tensorboard(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lossfile = tmp_path / "kb.py"
    lossfile.write_text(KEYBOARD_LOSS)
    r = cli("overfit-batch", sample("mlp.py:build"), "--loss", f"{lossfile}:loss", "--tb", tmp_path / "tb", "--json")
    assert r.code == 130
    d = r.json
    assert d["interrupted"] is True and d["exit_code"] == 130 and d["passed"] is False
    assert d["steps"] == 5 and len(d["loss"]) == 5 and len(d["grad_norm"]) == 5
    assert "cannot-overfit" not in [f["code"] for f in d["findings"]]
    acc = EventAccumulator(str(tmp_path / "tb" / "overfit-batch"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("overfit-batch/loss")] == pytest.approx(d["loss"])
    # table mode prints the partial result and says so on stderr
    lossfile2 = tmp_path / "kb2.py"
    lossfile2.write_text(KEYBOARD_LOSS)
    t = cli("overfit-batch", sample("mlp.py:build"), "--loss", f"{lossfile2}:loss")
    assert t.code == 130 and "INTERRUPTED after 5 step(s)" in t.stdout and "Initial loss" in t.stdout
    assert "interrupted at step 5" in t.stderr and "Traceback" not in t.stderr


MARKER_LOSS = """
import pathlib
import torch.nn.functional as F
calls = []
def loss(output, target):
    calls.append(1)
    if len(calls) == 3:          # training is under way: tell the test to press Ctrl-C
        pathlib.Path(__file__).with_suffix(".started").write_text("1")
    return F.mse_loss(output, output.detach() * 0 + 1)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_real_sigint_in_a_subprocess_exit_130_partial_json_and_flushed_tensorboard(tmp_path):
    """What a person does: start a long run, press Ctrl-C (SIGINT to the process) mid-training."""
    import json
    import os
    import signal
    import subprocess

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from support import ENDS_WITHIN, ROOT, spawn, wait_until

    lossfile = tmp_path / "marker.py"
    lossfile.write_text(MARKER_LOSS)
    started = tmp_path / "marker.started"
    proc = spawn([sys.executable, "-m", "torchdiag", "overfit-batch", sample("mlp.py:build"),
                  "--loss", f"{lossfile}:loss", "--steps", "1000000", "--target-ratio", "1e-30",
                  "--tb", str(tmp_path / "tb"), "--json"],
                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # follow the subprocess's progress (a loaded machine may take minutes to import torch); the
        # guard only stops a hung test, no assertion depends on how fast anything is
        assert wait_until(started.exists, proc), proc.communicate(timeout=ENDS_WITHIN)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=ENDS_WITHIN)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    d = json.loads(out)
    assert d["interrupted"] is True and d["passed"] is False and d["exit_code"] == 130
    assert d["steps"] >= 2 and len(d["loss"]) in (d["steps"] + 1, d["steps"])
    assert "cannot-overfit" not in [f["code"] for f in d["findings"]]
    assert "Traceback" not in err and "interrupted at step" in err
    acc = EventAccumulator(str(tmp_path / "tb" / "overfit-batch"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("overfit-batch/loss")] == pytest.approx(d["loss"])


def test_tensorboard_series_tags(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = cli("overfit-batch", sample("mlp.py:build"), "--tb", tmp_path, "--optimizer", "sgd", "--lr", "0.05",
            "--json").json
    acc = EventAccumulator(str(tmp_path / "overfit-batch"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("overfit-batch/loss", "overfit-batch/grad_norm", "overfit-batch/learning_rate"):
        assert tag in tags
    assert [e.value for e in acc.Scalars("overfit-batch/loss")] == pytest.approx(d["loss"])
    assert [e.value for e in acc.Scalars("overfit-batch/learning_rate")] == pytest.approx([0.05] * d["steps"])
    assert [e.step for e in acc.Scalars("overfit-batch/grad_norm")] == list(range(d["steps"]))


def test_plot_writes_png(cli, tmp_path):
    out = tmp_path / "curve.png"
    r = cli("overfit-batch", sample("mlp.py:build"), "--plot", out)
    assert r.code == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Loss curve: {out}" in r.stderr


def test_plot_without_matplotlib_is_exit_2(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib → ImportError
    r = cli("overfit-batch", sample("mlp.py:build"), "--plot", tmp_path / "c.png")
    assert r.code == 2 and r.stderr.startswith("error: --plot needs matplotlib")
    assert "Traceback" not in r.stderr and not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("args,message", [
    (["-i", "8xZ"], "error: bad input shape"),
    (["--steps", "0"], "error: --steps: must be ≥ 1"),
    (["--optimizer", "rmsprop"], "error: --optimizer: 'rmsprop' is not one of adam, adamw, sgd"),
    (["--amp", "fp8"], "error: --amp: 'fp8' is not one of"),
    (["--target-ratio", "2"], "error: --target-ratio: must be between 0 and 1"),
    (["--plot", "curve.txt"], "error: --plot curve.txt: unsupported file type '.txt'"),
    (["--device", "meta"], "error: overfit-batch needs real values; the meta device has none"),
    (["--loss", "hinge"], "error: unknown loss 'hinge'"),
])
def test_bad_input_is_exit_2_with_one_error_line(cli, args, message):
    r = cli("overfit-batch", sample("mlp.py:build"), *args)
    assert r.code == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_cuda_on_cpu_only_machine_is_exit_2(cli, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU-only machine, even on a GPU box
    r = cli("overfit-batch", sample("mlp.py:build"), "--device", "cuda", "--json")
    assert r.code == 2 and r.stderr.startswith("error: device 'cuda' is not available")
    assert r.json["exit_code"] == 2


def test_model_that_raises_is_exit_3_naming_the_module(cli):
    r = cli("overfit-batch", sample("broken_shape.py:build"))
    assert r.code == 3 and "error: forward (step 0) failed in 2.0 (Linear)" in r.stderr


@pytest.mark.cuda
def test_cuda_passes_and_leaves_model_untouched(untouched):
    torch.manual_seed(0)
    model, x = load("cnn.py:build", device="cuda", inputs=["8x3x32x32"])
    with untouched(model):
        r = overfit(model, x, amp="fp16")
    assert r.data["passed"]


@pytest.mark.parametrize("name,message", [
    ("adir", "is a directory"),
    ("adir.png", "is a directory"),
    ("loss.txt", "unsupported file type '.txt'"),
    ("missing/loss.png", "does not exist"),
])
def test_plot_path_is_checked_before_loading(cli, tmp_path, name, message):
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir.png").mkdir()
    r = cli("overfit-batch", sample("broken_factory.py:raises"), "--plot", tmp_path / name)   # factory raises: exit 3 if loaded
    assert r.code == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--plot" in errors[0] and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("args,flag", [
    (["--steps", "0"], "--steps"),
    (["--target-ratio", "1.5"], "--target-ratio"),
    (["--target-ratio", "0"], "--target-ratio"),
    (["--lr", "-1"], "--lr"),
    (["--optimizer", "lion"], "--optimizer"),
    (["--amp", "fp8"], "--amp"),
])
def test_bad_option_is_exit_2_before_the_model_loads(cli, args, flag):
    r = cli("overfit-batch", sample("broken_factory.py:raises"), *args)   # factory raises: exit 3 if loaded
    assert r.code == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {flag}: "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("kw,name", [
    (dict(steps=0), "steps"), (dict(target_ratio=1.5), "target_ratio"), (dict(target_loss=float("nan")), "target_loss"),
    (dict(optimizer="lion"), "optimizer"), (dict(lr=0), "lr"), (dict(amp="fp8"), "amp"),
])
def test_bad_option_from_python_names_the_keyword_before_training(kw, name):
    from torchdiag.errors import OptionError

    model = torch.nn.Linear(4, 3)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(OptionError) as e:
        overfit(model, torch.randn(6, 4), **kw)
    assert str(e.value).startswith(f"{name}: ") and e.value.code == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_options_hold_every_rule_and_take_the_config_keys():
    """check builds Options from its [overfit-batch] table (keys with - → _): every rule is here."""
    from torchdiag.diagnostics.overfit_batch import Options
    from torchdiag.errors import OptionError

    assert Options(steps=200, target_ratio=0.05, target_loss=0.1).steps == 200
    for bad in (dict(target_ratio=1.5), dict(target_ratio=-1), dict(steps="many"), dict(steps=2.5),
                dict(target_loss="low"), dict(max_names=0)):
        with pytest.raises(OptionError):
            Options(**bad)
    assert OptionError("target_ratio", "x").name_for("config").message.startswith("target-ratio: ")


def test_optimizer_defaults_match_the_contract():
    from torchdiag.diagnostics.overfit_batch import OPTIMIZER

    assert OPTIMIZER.name == "adam" and OPTIMIZER.learning_rate == 1e-3 and OPTIMIZER.momentum == 0.9
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = overfit(model, x, optimizer="sgd", steps=2, target_ratio=1e-9)
    assert r.data["lr"] == 1e-2 and r.series["learning_rate"] == [1e-2, 1e-2]
    assert r.header["training"].startswith("SGD (momentum 0.9), lr 0.01")


def test_undeepcopyable_model_is_exit_3_and_untouched():
    import threading

    class Locked(torch.nn.Linear):
        def __init__(self):
            super().__init__(4, 3)
            self.lock = threading.Lock()      # deepcopy cannot copy a lock

    from torchdiag.errors import ModelError

    with pytest.raises(ModelError) as e:
        overfit(Locked(), torch.randn(6, 4), steps=2)
    assert "cannot copy the model" in e.value.message and "deepcopy" in e.value.message and e.value.code == 3


def test_fp16_autocast_on_cpu_uses_a_grad_scaler_and_passes():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = overfit(model, x, amp="fp16", steps=300)
    assert r.data["amp"] == "fp16" and "autocast fp16" in r.header["training"]
    assert len(r.series["loss"]) == r.data["steps"] + 1 and all(math.isfinite(v) for v in r.series["grad_norm"])



def test_grad_norm_is_one_batched_norm_of_real_half_and_complex_gradients():
    """The per-step grad norm (one _foreach_norm per kind) equals the norm of every element's modulus,
    computed here by hand in float32; complex parameters train like any other."""
    import torch

    from torchdiag.api import run
    from torchdiag.diagnostics.overfit_batch.loop import grad_norm

    g = [torch.randn(3, dtype=torch.complex64), torch.randn(2), torch.randn(4, dtype=torch.float16)]
    by_hand = torch.sqrt(sum((t.abs().float() ** 2).sum() for t in g))
    assert float(grad_norm(g)) == pytest.approx(float(by_hand), rel=1e-6)

    class Complex(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.cfloat))
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc((x.to(torch.cfloat) @ self.w).abs())

    torch.manual_seed(0)
    r = run("overfit-batch", Complex(), torch.randn(2, 4), steps=5)
    assert r.data["steps"] == 5 and len(r.series["grad_norm"]) == 5
    assert all(math.isfinite(v) and v > 0 for v in r.series["grad_norm"])


# --- the budget runs out while the loss still falls: extend, or say "not yet" -------------------------

def _slow_regression():
    """4 weights, from 0, fitted to 0.6 … 1.2 through x = I: Adam moves each weight by about lr per step, so
    the loss falls steadily (about mean((y - lr·t)²)) and reaches 1% of its start near t = 1.1 / lr."""
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    return model, torch.eye(4), torch.tensor([[0.6], [0.8], [1.0], [1.2]])


def test_without_steps_a_run_still_falling_at_the_budget_is_extended_and_its_curve_is_the_longer_runs():
    model, x, y = _slow_regression()                # at lr 1e-3: ~1500 steps, beyond the default 500
    budgets, seen = [], []
    r = overfit(model, x, loss="mse", target=y, lr=1e-3, on_budget=budgets.append,
                on_step=lambda step, loss: seen.append(step))
    # the progress hooks: each extension announced (the bar's new total) before the steps it allows
    assert budgets == list(range(1000, r.data["step_budget"] + 1, 500)) and seen == list(range(r.data["steps"] + 1))
    assert r.data["passed"] is True and r.exit_code == 0, r.verdict
    assert 500 < r.data["steps_to_target"] <= 2000 and r.data["step_budget"] in (1000, 1500, 2000)
    assert r.data["max_steps"] == 500 and "extended from 500" in dict(r.summary)["Steps"]
    assert f"extended to {r.data['step_budget']}" in r.header["training"]
    # truth: the same run under a hard budget it does not need to extend stops at the same step, same curve
    long = overfit(model, x, loss="mse", target=y, lr=1e-3, steps=2000)
    assert long.data["step_budget"] == 2000 and long.series["loss"] == r.series["loss"]
    assert "extended" not in dict(long.summary)["Steps"] and "extended" not in long.header["training"]


def test_under_a_wrapper_the_default_budget_is_not_extended_and_the_warning_says_why(monkeypatch):
    """A sweep: a healthy model passed at step 789 in one process (the budget extended) and was NOT YET at 500 under
    torchrun with --wrap ddp, where the budget is never extended (each rank's curve is its own rows'); the warning
    read as if it could have been. The agreement across ranks is stood in for by one rank's own flags."""
    from torchdiag.diagnostics.overfit_batch import loop

    monkeypatch.setattr(loop, "_agreement", lambda ctx, group: lambda flags: flags)
    model, x, y = _slow_regression()                # at lr 1e-3: ~1500 steps, beyond the default 500
    r = overfit(model, x, loss="mse", target=y, lr=1e-3)
    assert r.data["steps"] == 500 and r.data["step_budget"] == 500 and r.verdict.startswith("NOT YET")
    f = finding(r, "not-overfit-yet")
    assert "the budget of 500 step(s) (not extended under torchrun with --wrap: each rank's curve is its own rows') " \
        "ends" in f.message, f.message


def test_a_given_steps_is_a_hard_budget_and_still_falling_at_its_end_is_not_yet_a_warning():
    model, x, y = _slow_regression()
    r = overfit(model, x, loss="mse", target=y, lr=1e-2, steps=40)   # passes at ~150 steps (test above × 10)
    assert r.data["steps"] == 40 and r.data["step_budget"] == 40 and r.exit_code == 0
    assert "cannot-overfit" not in codes(r) and r.verdict.startswith("NOT YET")
    f = finding(r, "not-overfit-yet")
    assert f.severity == "warning" and "steps" in f.hint and r.data["trend"]["kind"] == "falling"


def test_a_run_falling_too_slowly_to_reach_the_target_within_the_cap_is_not_extended(monkeypatch):
    from torchdiag.diagnostics.overfit_batch import cost

    monkeypatch.setattr(cost, "EXTRA_SECONDS", 0)   # no time past the default cap (4 × 500)
    model, x, y = _slow_regression()                # at lr 3e-4: ~5000 steps, beyond 4 × 500
    r = overfit(model, x, loss="mse", target=y, lr=3e-4)
    assert r.data["steps"] == 500 and r.data["step_budget"] == 500     # hopeless within the cap: not extended
    assert r.data["step_cap"] == 2000
    assert "cannot-overfit" not in codes(r) and r.exit_code == 0 and r.verdict.startswith("NOT YET")
    assert r.data["trend"]["kind"] == "falling" and 500 + r.data["trend"]["steps_to_go"] > 2000
    # the projection is the curve's own: mean((y - 3e-4 t)²) reaches 1% of 0.86 near t = 3700-5000; the
    # recent trend gives it within a factor of 2 (the loss's fall slows as it nears the target)
    assert 2000 < 500 + r.data["trend"]["steps_to_go"] < 10000


@pytest.fixture
def unhurried(monkeypatch):
    """Any step rate affords the full cap: these tests must not depend on how busy the machine is."""
    from torchdiag.diagnostics.overfit_batch import cost

    monkeypatch.setattr(cost, "EXTRA_SECONDS", 1e9)


def test_a_fast_model_still_falling_past_the_default_cap_runs_on_to_its_target(unhurried):
    """The same slow regression (4 weights, well under a millisecond a step): its steps are fast, so the run goes on past
    4 × 500 and memorises the batch where the truth says (mean((y - 3e-4 t)²) ≤ 1% of its start near t ≈ 3700)."""
    model, x, y = _slow_regression()
    r = overfit(model, x, loss="mse", target=y, lr=3e-4)
    assert r.data["passed"] and r.exit_code == 0 and r.data["step_cap"] == 20000, r.verdict
    assert 3000 < r.data["steps_to_target"] < 5000
    assert "for its fast steps" in r.header["training"]
    hard = overfit(model, x, loss="mse", target=y, lr=3e-4, steps=r.data["steps"])   # the same curve, unextended
    assert hard.series["loss"] == r.series["loss"]


def _xor_net(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Sigmoid(), torch.nn.Linear(4, 1), torch.nn.Sigmoid())
    for layer in (model[0], model[2]):
        torch.nn.init.xavier_uniform_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    return model


def test_a_sigmoid_net_whose_loss_crawls_then_falls_is_memorised_not_called_a_floor(unhurried):
    """A 2-4-1 sigmoid net fitting XOR under MSE (a ported StackOverflow program's, bench/bugs/so_31556268):
    the loss crawls for thousands of steps, then falls fast. The trend at 500 steps projects the target beyond
    20,000 steps and a slowing stretch looks like a floor; its steps are fast, so it runs on and memorises
    the batch (truth: the same seed under --steps 20000 reaches the target at the same step)."""
    x = torch.tensor([[0., 0.], [0., 1.], [1., 0.], [1., 1.]])
    y = torch.tensor([[0.], [1.], [1.], [0.]])
    r = overfit(_xor_net(0), x, loss="mse", target=y)
    hard = overfit(_xor_net(0), x, loss="mse", target=y, steps=20000)
    assert hard.data["passed"] and hard.data["steps_to_target"] > 2000     # it needs more than the default cap
    assert r.data["passed"] and r.data["steps_to_target"] == hard.data["steps_to_target"], r.verdict


def test_the_cap_past_2000_steps_is_what_60_seconds_more_afford_at_the_runs_own_rate():
    from torchdiag.diagnostics.overfit_batch.cost import fast_cap

    assert fast_cap(500, 0.5) == 20000        # 1 ms a step: 60,000 more would fit; the cap is 40 × 500
    assert fast_cap(500, 50.0) == 2500        # 0.1 s a step: 600 more fit, 500 of them in whole stretches
    assert fast_cap(2000, 2000.0) == 2000     # 1 s a step: 60 more fit, not a stretch: the default cap
    assert fast_cap(0, 0.0) == 2000


class _Sleepy(torch.nn.Module):
    """The slow regression, made to take at least 1 ms a step (a sleep in its forward)."""

    def __init__(self):
        super().__init__()
        self.fc = _slow_regression()[0]

    def forward(self, x):
        import time

        time.sleep(0.001)
        return self.fc(x)


def test_a_slow_model_gets_only_the_steps_its_measured_rate_affords(monkeypatch):
    """A review: an LSTM step of 0.2 s got 20,000 steps from a FLOP count that missed the LSTM. The rate is measured:
    at ≥ 1 ms a step and 1 s allowed past the default cap, at most 1000 more steps fit: the cap is 2000–3000
    whatever the model's FLOPs (a busier machine only lowers it)."""
    from torchdiag.diagnostics.overfit_batch import cost

    monkeypatch.setattr(cost, "EXTRA_SECONDS", 1.0)
    _, x, y = _slow_regression()
    r = overfit(_Sleepy(), x, loss="mse", target=y, lr=2e-4)    # ~7,000 steps to the target at this lr
    assert not r.data["passed"] and 2000 <= r.data["step_cap"] <= 3000, r.data["step_cap"]
    assert r.data["steps"] <= 3000


def test_a_first_sighting_of_a_slowing_fall_under_steps_is_not_yet():
    """A sweep: RoBERTa-PreLayerNorm at --steps 300 was cannot-overfit (error), "levelling off near 0.0815", 1.9% of
    the start; it passes at step 380, at 0.069. A healthy classifier's cross-entropy slows after its fast phase, and
    the windowed geometric projection calls it a floor (here at step 100; it memorises the batch at step ~190 when
    the budget is free). With no steps left to look again, a first sighting is not-overfit-yet (a warning); a loss on
    its floor (a plateau) stays an error."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.Tanh(), torch.nn.Linear(128, 10))
    x = torch.randn(8, 16)
    r = overfit(copy.deepcopy(model), x, steps=100)
    assert r.data["trend"]["kind"] == "levelling" and r.exit_code == 0, r.verdict
    assert finding(r, "not-overfit-yet").severity == "warning" and "first sighting" in r.verdict
    free = overfit(model, x)
    assert free.data["passed"] and free.data["steps_to_target"] > 100, free.verdict
    stuck, xs = load("broken_cannot_overfit.py:build")
    assert "cannot-overfit" in codes(overfit(stuck, xs, steps=300))
    # a review: logits clamped to [-2, 2] level at 6.5x the goal, 0.05% above their floor at step 200: a floor
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10))
    clamped = overfit(torch.nn.Sequential(mlp, torch.nn.Hardtanh(-2, 2)),
                      torch.randn(16, 20, generator=torch.Generator().manual_seed(0)), steps=200)
    assert clamped.data["trend"]["kind"] == "levelling" and "cannot-overfit" in codes(clamped), clamped.verdict


def test_a_loss_on_its_floor_is_a_plateau_and_never_extended():
    torch.manual_seed(0)
    model, x = load("broken_cannot_overfit.py:build")
    r = overfit(model, x)                           # the default budget, which a falling loss would extend
    assert r.data["steps"] == 500 and r.data["step_budget"] == 500
    assert r.data["trend"]["kind"] in ("plateau", "levelling") and "cannot-overfit" in codes(r)


def test_trend_judge_on_hand_built_curves():
    from torchdiag.diagnostics.overfit_batch.trend import judge

    n = 500
    t = judge([math.exp(-0.0056 * s) for s in range(n + 1)], 0.01)
    # truth: e^{-0.0056 t} = 0.01 at t = ln(100) / 0.0056 = 822.4, i.e. 323 steps after 500
    assert t.kind == "falling" and abs(t.to_go - (math.log(100) / 0.0056 - n)) <= 2
    assert judge([1 - 1e-6 * s for s in range(n + 1)], 0.01).kind == "plateau"
    assert judge([0.5] * (n + 1), 0.01).kind == "plateau"
    floor = judge([0.4 + 0.6 * math.exp(-s / 40) for s in range(n + 1)], 0.01)
    assert floor.kind in ("plateau", "levelling")
    assert judge([1.0, 0.9, 0.8], 0.01).kind == "short"
    assert judge([1 - s / 1000 for s in range(n + 1)], 0.01).to_go in (490, 491)    # linear: 0.5 → 0.01 at 0.001/step


def test_a_slow_optimizer_still_falling_is_info_when_the_default_optimizer_memorises_the_batch():
    """The user's SGD at a small lr is still falling at the budget; adam (lr 1e-3) on a fresh copy memorises the
    same batch (the slow regression needs ~1100 of its steps): the model can fit it, so `not-overfit-yet` is info.
    The user's model is untouched, and under --steps (a hard budget) no second run is asked."""
    model, x, y = _slow_regression()
    before = model.weight.detach().clone()
    r = overfit(model, x, loss="mse", target=y, optimizer="sgd", lr=1e-5)
    f = finding(r, "not-overfit-yet")
    assert f.severity == "info" and r.exit_code == 0 and "adam (lr 0.001) memorises" in f.message, f.message
    d = r.data["default_optimizer"]
    assert d["passed"] and 500 < d["steps"] <= 2000, d    # truth: ≈ 1.1 / lr adam steps (see _slow_regression)
    assert torch.equal(model.weight, before)
    hard = overfit(model, x, loss="mse", target=y, optimizer="sgd", lr=1e-4, steps=40)   # a hard budget: not asked
    assert finding(hard, "not-overfit-yet").severity == "warning" and "default_optimizer" not in hard.data


class RaisesWhenMoved(torch.nn.Module):
    """Raises once its scale drifts by 1%: the user's slow SGD never gets there, adam does (a review)."""

    def __init__(self):
        super().__init__()
        self.fc, self.s = torch.nn.Linear(4, 1, bias=False), torch.nn.Parameter(torch.tensor(1.0))
        with torch.no_grad():
            self.fc.weight.zero_()

    def forward(self, x):
        if abs(float(self.s) - 1) > 0.01:
            raise ValueError("scale drifted")
        return self.fc(x) * self.s


def test_a_second_opinion_that_raises_leaves_the_run_judged(monkeypatch):
    from torchdiag.diagnostics.overfit_batch import cost

    monkeypatch.setattr(cost, "EXTRA_SECONDS", 0)   # no time past 2000: the user's run stops at 500, before it drifts
    _, x, y = _slow_regression()
    r = overfit(RaisesWhenMoved(), x, loss="mse", target=y, optimizer="sgd", lr=1e-5)
    assert finding(r, "not-overfit-yet").severity == "warning" and r.exit_code == 0
    assert r.data["steps"] == 500 and any("second opinion, failed" in n for n in r.notes), r.notes


def test_no_second_opinion_when_the_run_used_the_default_optimizer():
    model, x, y = _slow_regression()
    r = overfit(model, x, loss="mse", target=y, steps=40)
    assert finding(r, "not-overfit-yet").severity == "warning" and "default_optimizer" not in r.data


@pytest.mark.parametrize("lr", [1e-8, 30.0])
def test_an_optimizer_that_cannot_fit_what_the_default_memorises_is_named(lr):
    """SGD creeping (lr 1e-8: a plateau) or diverging (lr 30, momentum 0.9, on a quadratic whose curvature is
    1/2: non-finite) on the slow regression; adam (lr 1e-3) memorises the same batch on a fresh copy, so the
    failure is the optimizer's: `cannot-overfit` stays the error, `optimizer-cannot-fit` says what fails."""
    model, x, y = _slow_regression()
    r = overfit(model, x, loss="mse", target=y, optimizer="sgd", lr=lr)
    assert r.exit_code == 1 and finding(r, "cannot-overfit").severity == "error"
    f = finding(r, "optimizer-cannot-fit")
    assert f.severity == "warning" and "adam (lr 0.001) memorises it" in f.message and "optimizer adam" in f.hint
    assert r.data["default_optimizer"]["passed"] and "adam (lr 0.001) memorises it" in r.verdict
    flat = [f for f in r.findings if f.code == "flat-loss"]
    assert all("the step is what does not move it" in f.hint for f in flat)   # not "gradients vanish" (a review)


def test_a_model_that_cannot_fit_under_any_optimizer_gets_no_optimizer_finding():
    torch.manual_seed(0)
    model, x = load("broken_cannot_overfit.py:build")
    r = overfit(model, x, optimizer="sgd", lr=1e-2)
    assert "cannot-overfit" in codes(r) and "optimizer-cannot-fit" not in codes(r)
    assert r.data["default_optimizer"]["passed"] is False


def test_the_second_opinion_holds_one_copy_and_is_not_asked_for_a_loss_non_finite_from_the_start():
    import gc

    class Slow(torch.nn.Linear):
        pass

    model = Slow(4, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    _, x, y = _slow_regression()
    alive = {}

    def on_step(step, loss):
        if step in (1, 600):   # the run's copy, then the second opinion's (the run ends at 500)
            alive[step] = sum(isinstance(o, Slow) for o in gc.get_objects())

    r = overfit(model, x, loss="mse", target=y, optimizer="sgd", lr=1e-5, on_step=on_step)
    assert r.data["default_optimizer"]["passed"] and alive == {1: 2, 600: 2}, alive   # the user's and one copy
    nan = overfit(load("broken_overfit_nan.py:build")[0], torch.randn(16, 784), optimizer="sgd", lr=1e-2)
    assert "cannot-overfit" in codes(nan) and "default_optimizer" not in nan.data


def test_a_bounded_output_read_off_a_copy_that_did_not_move_is_withdrawn_when_the_default_optimizer_fits():
    # a review: at lr 1e-8 a plain Linear's outputs stay within [-1, 1], and bounded-output claimed a floor the
    # loss cannot go below; adam's copy memorises the batch, so the claim is refuted and withdrawn (with a note)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.1)
    r = overfit(model, torch.randn(4, 8), loss="cross_entropy", target=torch.tensor([0, 1, 2, 3]),
                optimizer="sgd", lr=1e-8)
    assert "optimizer-cannot-fit" in codes(r) and "bounded-output" not in codes(r), codes(r)
    assert any("bounded-output withdrawn" in n for n in r.notes), r.notes


# --- --momentum: SGD as the user's script has it ----------------------------------------------------

def _one_weight():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    return model, torch.ones(1, 1), torch.ones(1, 1)


def test_momentum_zero_is_plain_sgd_and_the_default_is_0_9():
    """loss (w - 1)², w from 0, lr 0.1: plain SGD gives w_t = 1 - 0.8^t, loss 0.64^t; momentum 0.9 (the default)
    w_1 = 0.2, w_2 = 0.2 + (0.9·0.2 + 0.16) = 0.54 (loss 0.2116), computed by hand."""
    model, x, y = _one_weight()
    plain = overfit(model, x, loss="mse", target=y, optimizer="sgd", lr=0.1, momentum=0.0, steps=5)
    assert plain.series["loss"] == pytest.approx([0.64 ** t for t in range(6)], rel=1e-5)
    assert "momentum" not in plain.header["training"]
    heavy = overfit(model, x, loss="mse", target=y, optimizer="sgd", lr=0.1, steps=2)
    assert heavy.series["loss"] == pytest.approx([1.0, 0.64, 0.2116], rel=1e-5)
    assert "momentum 0.9" in heavy.header["training"]


def test_momentum_on_the_command_line_and_refused_for_adam(cli, tmp_path):
    good = cli("overfit-batch", sample("mlp.py:build"), "--optimizer", "sgd", "--momentum", "0", "--lr", "0.05",
               "--steps", "3", "--json")
    assert good.code in (0, 1) and "momentum" not in good.json["training"] and good.json["momentum"] == 0, good.stderr
    bad = cli("overfit-batch", sample("mlp.py:build"), "--momentum", "0.5")
    assert bad.code == 2 and "--momentum: applies to sgd only, not adam" in bad.stderr
    for command in ("gradflow", "nancheck", "lr-find"):
        assert cli(command, sample("mlp.py:build"), "--optimizer", "adam", "--momentum", "0.5").code == 2


def _logistic():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Sigmoid())


def _bce(out, target):
    return torch.nn.functional.binary_cross_entropy(out, target)


def test_a_batch_beyond_a_tiny_models_capacity_is_info_when_two_samples_are_memorised():
    """One feature, labels that are not a threshold of it: a 2-weight logistic model cannot fit 32 of them (no
    monotone split does: closed-form truth, the best threshold classifier misclassifies several), but it fits any
    two samples with different labels at different x. The pipeline works: capacity-limited (info), exit 0."""
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = (torch.arange(32) % 3 == 0).float().unsqueeze(1)       # 1, 0, 0, 1, 0, 0, …: no threshold separates them
    best = max(max(((x[:, 0] > t) == y[:, 0].bool()).float().mean(), ((x[:, 0] <= t) == y[:, 0].bool()).float().mean())
               for t in x[:, 0])
    assert best < 1.0                                          # no logistic model reaches 100% on the batch
    r = overfit(_logistic(), x, loss=_bce, target=y, lr=0.5, steps=400)
    (f,) = [f for f in r.findings if f.code == "capacity-limited"]
    assert f.severity == "info" and r.exit_code == 0 and not [g for g in r.findings if g.severity == "error"]
    few = r.data["few_samples"]
    # of the rows labelled unlike row 0 (x = -1), the one farthest from it: x = 1 is row 31 (31 % 3 != 0)
    assert few["passed"] and few["samples"] == [0, 31]
    assert r.verdict.startswith("PASS on two samples") and r.data["trainable_values"] == 2


def test_a_fault_two_samples_cannot_fit_either_keeps_cannot_overfit():
    """A loss with a floor (a constant 1 added: the ratio target 0.01 × initial is out of reach for any batch):
    two samples fail as well, so the error stands, with the two-sample run said in a note."""
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = (torch.arange(32) % 3 == 0).float().unsqueeze(1)
    r = overfit(_logistic(), x, loss=lambda out, t: _bce(out, t) + 1.0, target=y, lr=0.5, steps=400)
    assert [f.code for f in r.findings if f.severity == "error"] == ["cannot-overfit"] and r.exit_code == 1
    assert r.data["few_samples"]["passed"] is False
    assert any("were not memorised either" in n for n in r.notes)


def test_a_model_with_as_many_values_as_targets_keeps_cannot_overfit_though_two_samples_fit():
    """A review: a forgotten ReLU (a linear 4-256-256-4 stack, 68,100 values for 64 labels) memorises any two
    samples and fails the batch of random labels; so do a softmax over the batch and conflicting duplicate rows.
    Not a capacity the count explains: the error stands, and no two-sample run is made."""
    torch.manual_seed(0)
    linear = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 4))
    x, y = torch.randn(64, 4), torch.randint(0, 4, (64,))
    r = overfit(linear, x, loss="cross_entropy", target=y, steps=300)
    assert "cannot-overfit" in codes(r) and "capacity-limited" not in codes(r) and r.exit_code == 1
    assert "few_samples" not in r.data and r.data["trainable_values"] == 68_100


def test_the_two_samples_are_rows_with_usable_different_targets_and_only_per_sample_targets_count():
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.diagnostics.overfit_batch.capacity import limited, pick

    x = ModelInputs((torch.tensor([[0.0], [1.0], [9.0], [5.0]]),))
    labels = torch.tensor([[1, 2], [3, -100], [-100, -100], [1, 2]])   # row 2 is all ignored, row 3 is row 0's
    assert pick(4, labels, x) == [0, 1]                               # not row 2, though its input is farthest
    assert pick(4, torch.tensor([[0.0], [1.0], [float("nan")], [2.0]]), x) == [0, 3]   # NaN rows are not targets
    assert pick(4, torch.ones(4, 1), x) is None                       # every target alike: a constant fits two
    assert pick(4, None, x) is None and pick(2, torch.tensor([0, 1]), x) is None
    ignored_first = torch.tensor([[-100, -100], [3, 4], [5, 6], [3, 4]])        # row 0 all ignored: row 1 anchors
    assert pick(4, ignored_first, x) == [1, 2]
    # a (B*T,) target beside a B-row batch (logits reshaped to (B*T, C)) is not per sample: nothing is claimed
    assert not limited(10, 4, torch.zeros(48, dtype=torch.long)) and limited(10, 4, torch.zeros(4, 3))


class _Bags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = torch.nn.EmbeddingBag(1000, 32), torch.nn.Linear(32, 5)

    def forward(self, text, offsets):
        return self.fc(self.emb(text, offsets))


def test_updates_rounding_away_are_counted_against_the_elements_that_get_a_gradient():
    """A new user's bfloat16 EmbeddingBag classifier: every element with a gradient was unchanged by step 2049, and
    the note said 1,444 "of the 32,165 trainable elements: too few to stop the fall alone", the failure "no
    mechanical cause found". The rows the batch never reads get no gradient to round away: the share is of those
    that do, and the rounding is the cause it is (float32 reaches the target)."""
    g = torch.Generator().manual_seed(0)
    text, offsets = torch.randint(0, 1000, (40,), generator=g), torch.tensor([0, 7, 15, 30])
    target = torch.randint(0, 5, (4,), generator=g)

    def model():
        torch.manual_seed(0)
        return _Bags()

    r = api_run("overfit-batch", model(), (text, offsets), target=target, dtype="bfloat16")
    assert "update-rounds-away" in codes(r) and not any("too few to stop" in n for n in r.notes), r.notes
    f = finding(r, "cannot-overfit")
    assert not (f.hint or "").startswith("no mechanical cause found"), f.hint
    assert api_run("overfit-batch", model(), (text, offsets), target=target).data["passed"]


class _SubsetZeroed(torch.nn.Module):
    """A mask bug: the samples whose first feature is below 0 reach the MLP as zeros (one answer for all of them)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.body(x * (x[:, :1] > 0).float())


class _OwnTokenOnly(torch.nn.Module):
    """A language model whose every position sees its own token alone (no context, no position): a bigram model."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(12, 32), torch.nn.Linear(32, 12)

    def forward(self, ids):
        return self.head(torch.relu(self.emb(ids)))


def test_distinct_inputs_the_model_answers_alike_make_no_batch_floor():
    """A review: batch-floor passed a mask bug that zeroes some samples (all 16 inputs distinct; PASS at 56% batch
    accuracy) and a GPT whose attention saw each token alone (all 60 contexts distinct), each at a floor it had made
    itself, "the same input, or the same context". Positions are grouped by what the model reads for them too:
    neither passes."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    torch.manual_seed(0)
    r = overfit(_SubsetZeroed(), x, target=y)
    assert not r.data["passed"] and "batch-floor" not in codes(r), (r.verdict, codes(r))
    ids = torch.randint(0, 12, (4, 16), generator=g)
    torch.manual_seed(0)
    r = overfit(_OwnTokenOnly(), ids, target=torch.roll(ids, -1, 1))
    assert not r.data["passed"] and "batch-floor" not in codes(r), (r.verdict, codes(r))


class _ReadsOneInput(torch.nn.Module):
    """A model that reads only its second input (a bug: the first is dropped)."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(4, 16), torch.nn.Linear(16, 4)

    def forward(self, x, group):
        return self.head(self.emb(group % 4)) + 0 * x.sum()


def test_inputs_the_key_cannot_tell_apart_make_no_batch_floor():
    """A third review: an input laid out time-first, (T, N, F), was left out of the key, and distinct ids above 2^24
    merged in float32: a model that read only a 4-valued input passed at that input's floor both times. An input not
    laid out by sample tells nothing (no floor), and ids are compared exactly."""
    g = torch.Generator().manual_seed(0)
    group, y = torch.randint(0, 4, (16,), generator=g), torch.randint(0, 4, (16,), generator=g)
    for x in (torch.randn(5, 16, 3, generator=g), 2 ** 30 + torch.arange(16)):
        torch.manual_seed(0)
        r = overfit(_ReadsOneInput(), (x, group), target=y)
        assert not r.data["passed"] and "batch-floor" not in codes(r), (x.shape, r.verdict, codes(r))


def test_a_class_per_position_on_the_last_dimension_asks_batch_accuracy_too():
    """A review: (N, T) next ids against (N, T, V) logits dropped overfit-batch's batch-accuracy requirement (the
    accuracy read dim 1). It reads the last dimension, as the loss does; checked against an argmax by hand."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(30, 32), torch.nn.Linear(32, 30))
    ids = torch.randperm(30, generator=torch.Generator().manual_seed(1))[:24].view(4, 6)   # no id twice: no floor
    target = torch.roll(ids, -1, dims=1)
    r = overfit(model, ids, target=target)
    assert r.header["target"].endswith("and batch accuracy 100%"), r.header["target"]
    assert r.data["passed"] and r.data["final_accuracy"] == 1.0


def test_the_floor_of_positions_alike_in_answer_and_unlike_in_target():
    """ambiguity.floor by hand: rows grouped by their answer at the first step and at the last, each group's targets'
    entropy, over every position. Rows alike only at the first step are no group (the model told them apart)."""
    from torchdiag.diagnostics.overfit_batch.ambiguity import answers, floor

    first = torch.tensor([[1.0, 2.0, 0], [1.0, 2.0, 0], [1.0, 2.0, 0], [0.5, 0.1, 0], [0.5, 0.1, 0], [3.0, 3.0, 0],
                          [3.0, 3.0, 0]])
    last = first.clone()
    last[2] += 1   # told apart from rows 0 and 1 by the end
    targets = torch.tensor([0, 1, 1, 2, 2, 0, -100])   # row 6 is ignored: no group with row 5
    want = -(math.log(1 / 2) + math.log(1 / 2)) / 6   # rows 0, 1: one of each target; rows 3, 4 agree; 6 kept
    assert floor(answers(first) + 3 * answers(last), targets) == pytest.approx(want)


def test_a_batch_with_one_input_twice_under_two_labels_passes_at_its_floor():
    """A new user's GPT from a trained checkpoint levelled at 0.0169 x its start (two windows with the same first
    character and different next ones) against 0.01: cannot-overfit after 3,000 steps. Here: one input twice in a batch
    of 8, labelled 0 and 1. No weights take the loss below 2 ln 2 / 8: memorised as far as the batch allows, PASS
    (info), and the run stops at the budget once there."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, generator=g)
    x[1] = x[0]
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    r = overfit(model, x, target=y)
    assert r.exit_code == 0 and r.data["passed"] and codes(r) == ["batch-floor"], [f.to_dict() for f in r.findings]
    assert r.data["floor"] == pytest.approx(2 * math.log(2) / 8, rel=1e-6) and r.data["steps"] <= 1000
    x[1] = x[0] + 0.5   # distinct inputs: no floor, the target as before
    torch.manual_seed(0)
    r = overfit(torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), x, target=y)
    assert r.verdict.startswith("PASS: loss") and "batch-floor" not in codes(r), r.verdict


def test_a_cause_that_has_not_stopped_the_fall_is_not_an_error():
    """A sweep: bfloat16 Mistral at --steps 100 was cannot-overfit (0.0107 x initial) because five RMSNorm weights'
    updates round away, yet --steps 150 memorised the batch at step 108. A fall projected to the target within as
    many steps again is not-overfit-yet, with the cause noted; the truth, checked: more steps memorise it."""
    import torch
    from torch import nn

    from torchdiag.api import run

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 128), nn.LayerNorm(128), nn.ReLU(), nn.Linear(128, 4))

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    r = run("overfit-batch", model(), x, dtype="bfloat16", steps=22, lr=3e-3)
    assert {f.code for f in r.findings if f.severity != "info"} == {"update-rounds-away", "not-overfit-yet"}, \
        [(f.code, f.message) for f in r.findings]
    # 71 of the 2,948 elements: too few to stop the fall alone (a sweep's bfloat16 LLaMA, its norm
    # gains, reached --target-ratio 0.1 at step 192 of a --steps 100 run called cannot-overfit)
    assert r.exit_code == 0 and any("too few to stop the fall alone" in n for n in r.notes), r.notes
    assert run("overfit-batch", model(), x, dtype="bfloat16", steps=60, lr=3e-3).data["passed"]


def test_a_cause_found_keeps_the_error_for_a_loss_still_far_from_the_target():
    """A review of the rule above: a head fitting noisy targets (its floor 0.042 x initial, the target 0.01 x) beside
    a detached layer (no-grad, the cause) was "about 10 step(s) away" at 26 steps, 5.8x the target, after a bump: the
    error stands unless the loss is within 2x of the target. Checked: 400 steps stay above 0.04 x initial."""
    import torch
    from torch import nn

    from torchdiag.api import run

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.frozen, self.head = nn.Linear(16, 16), nn.Linear(16, 1)

        def forward(self, x):
            return self.head(x) + 0 * self.frozen(x).detach().sum(1, keepdim=True)

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 16, generator=g), torch.randn(16, 1, generator=g) * 0.5
    y = x @ w + 0.35 * torch.randn(64, 1, generator=g)

    def fit(steps):
        torch.manual_seed(0)
        return run("overfit-batch", Net(), x, target=y, loss="mse", steps=steps, lr=0.05)

    r = fit(26)
    assert r.data["trend"]["kind"] == "falling" and "cannot-overfit" in {f.code for f in r.findings}, r.verdict
    assert fit(400).data["best_loss"] > 0.04 * r.data["initial_loss"]


def test_a_falling_loss_with_a_cause_found_says_why_it_is_an_error():
    """A sweep: `--dtype bfloat16 --steps 100` gave cannot-overfit beside a note that more steps may reach the target
    (updates that round away in bfloat16: the cause the error stands on). The note says so. At lr 3e-4 the first
    layer's and the LayerNorm's updates round away: 580 of 1,476 elements, a cause that can stop the fall; in 100
    steps a float32 copy falls to 0.30x its start, this run to 0.42x (in 20, 0.797x and 0.808x: not held back yet)."""
    import torch
    from torch import nn

    from torchdiag.api import run

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 4))
    r = run("overfit-batch", model, torch.randn(8, 16), dtype="bfloat16", steps=100, lr=3e-4)
    assert sum(row["unchanged"] for row in r.data["rounded_away"]) >= 0.1 * sum(p.numel() for p in model.parameters())
    assert r.data["float32_copy"]["held"] is True and r.data["float32_copy"]["ratio"] < 0.35
    assert r.data["trend"]["kind"] == "falling" and r.exit_code == 1
    assert {f.code for f in r.findings} >= {"cannot-overfit", "update-rounds-away"}
    (note,) = [n for n in r.notes if n.startswith("the loss was still falling")]
    assert "the cause found above (update-rounds-away) may stop it before the target" in note
    assert "may reach the target" not in note


class NothingTrains(torch.nn.Module):
    """A frozen layer whose outputs are small, and a trainable tensor the loss multiplies by 0."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(8, 4).requires_grad_(False)
        with torch.no_grad():
            self.base.weight.mul_(0.01)
        self.gain = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.base(x) + 0 * self.gain


def test_a_model_where_nothing_trains_is_not_told_its_output_is_squashed():
    """A sweep: a LoRA whose B was frozen at zero got 'every output value stays within [-1, 1] (a tanh at the end?)':
    nothing trained, so the output's range says nothing of a squash."""
    torch.manual_seed(0)
    res = api_run("overfit-batch", NothingTrains(), torch.randn(8, 8), steps=20)
    got = {f.code for f in res.findings}
    assert "cannot-overfit" in got and "zero-grad" in got and "bounded-output" not in got, got


def _smoothed(out, y):
    return F.cross_entropy(out, y, label_smoothing=0.1)


def test_a_custom_loss_at_its_own_floor_with_every_sample_right_is_memorised():
    """A sweep: a label-smoothed cross-entropy at exactly its floor (the smoothed target's entropy) was cannot-overfit
    with "try more --steps"; every prediction was right."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
    res = api_run("overfit-batch", model, x, target=y, loss=_smoothed)
    f = finding(res, "loss-floor")
    assert f.severity == "warning" and "batch accuracy 100%" in f.message and res.exit_code == 0
    assert res.data["memorised"] and res.data["final_accuracy"] == 1.0 and res.verdict.startswith("PASS")
    # the smoothed target's entropy: (1 − 0.1 + 0.1/3) true class, 0.1/3 each other one
    p = [1 - 0.1 + 0.1 / 3, 0.1 / 3, 0.1 / 3]
    assert abs(res.data["final_loss"] - -sum(q * math.log(q) for q in p)) < 1e-3


@pytest.mark.slow
def test_a_failure_with_no_cause_names_the_frozen_layers():
    """A sweep: a classifier frozen by mistake got only "try more --steps or another --lr"."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 10))
    model[2].requires_grad_(False)
    res = api_run("overfit-batch", model, torch.randn(32, 8), lr=0.05)   # a plateau by ~1500 steps
    f = finding(res, "cannot-overfit")
    assert "2 parameter tensor(s) are frozen (requires_grad=False), in module(s) 2" in f.hint, f.hint


def _plain_ce(out, y):
    return F.cross_entropy(out, y)


def test_a_squashed_output_under_a_custom_loss_is_no_floor_of_the_loss():
    """A review: a softmax at the end under a custom cross-entropy, every sample right, was passed as memorised at
    'the loss's own floor'. Scaling its output lowers the loss: the output's range is the limit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4), torch.nn.Softmax(-1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    res = api_run("overfit-batch", model, x, target=y, loss=_plain_ce)
    codes = {f.code for f in res.findings}
    assert "loss-floor" not in codes and "cannot-overfit" in codes and res.exit_code == 1, codes
    assert "scaling the trained output by" in finding(res, "bounded-output").message
    # a custom loss's accuracy is told, not required: the header's target does not promise it
    assert "batch accuracy 100%" not in res.header["target"]


def _gaussian_nll(out, y):
    return torch.nn.functional.gaussian_nll_loss(out[:, 0], y, torch.nn.functional.softplus(out[:, 1]) ** 2 + 1e-6)


def test_a_loss_that_crosses_zero_is_not_passed_by_the_ratio_target():
    """A sweep: a Gaussian NLL passed "≤ 0.01 × initial" the moment it crossed 0 (step 48, a quarter of the
    variance explained). A ratio to a loss with no floor at 0 says nothing: one line, exit 2, the curve so far."""
    from torchdiag.errors import UsageError

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    x = torch.randn(32, 4)
    y = 0.7 * x[:, 0] + 0.1 * torch.randn(32)
    with pytest.raises(UsageError, match="the loss went below 0 at step") as e:
        api_run("overfit-batch", model, x, target=y, loss=_gaussian_nll, lr=0.01)
    assert "--target-loss" in e.value.hint or "target_loss" in e.value.hint
    assert e.value.partial is not None and e.value.partial.data["loss"][0] > 0
    ok = api_run("overfit-batch", model, x, target=y, loss=_gaussian_nll, lr=0.01, target_loss=-0.5, steps=300)
    # a target below 0 is the only one (a review: the ratio passed the run as it crossed 0 once it was given)
    assert ok.data["target_loss"] == -0.5
    assert not ok.data["passed"] or ok.data["final_loss"] <= -0.5, (ok.data["final_loss"], ok.verdict)
    # and the header and a failure name that target alone, not the ratio it does not use (a hostile review)
    assert ok.header["target"].startswith("loss ≤ -0.5") and "× initial" not in ok.header["target"]
    short = api_run("overfit-batch", model, x, target=y, loss=_gaussian_nll, lr=0.01, target_loss=-50, steps=5)
    assert not short.data["passed"] and "target -50" in short.verdict and "× initial" not in short.verdict



def test_updates_that_round_away_later_in_the_run_are_counted_there():
    """A sweep: a bfloat16 CNN that could not memorise its batch was told its updates that round away were "too few
    to stop the fall alone", counted at the first step only (16 of 650 elements here); at step 513, 484 of them did
    not move. Counted again at steps 64, 128, 256, … the latest is the cause named. Truth: where bfloat16 levels off
    (1.07), float32 weights go on falling (0.61 in the same steps)."""
    import torch
    from torch import nn

    from torchdiag.api import run

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(16, 10))

    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    r = run("overfit-batch", model(), x, dtype="bfloat16", steps=600)
    (f,) = [f for f in r.findings if f.code == "update-rounds-away"]
    assert r.exit_code == 1 and "after Adam step 513" in f.message, f.message
    assert sum(row["unchanged"] for row in r.data["rounded_away"]) > 0.5 * 650
    assert not any("too few to stop the fall" in n for n in r.notes), r.notes
    assert run("overfit-batch", model(), x, steps=600).data["best_loss"] < 0.7 * r.data["final_loss"]


def test_identical_outputs_under_a_bounded_output_names_the_range_not_the_label_entropy():
    """A sweep: the sample BERT's tanh output read by cross-entropy over 768 classes levels at 4.6603, 0.008 above the
    range's floor 4.652, one answer for both samples; identical-outputs quoted the label entropy 0.6931, a floor
    unbounded logits have and this output does not."""
    from types import SimpleNamespace

    from torchdiag.diagnostics.overfit_batch.causes import Causes
    from torchdiag.diagnostics.overfit_batch.report import _identical_outputs
    from torchdiag.results import Result

    for bounded in (None, {"box": (-1.0, 1.0), "classes": 768, "floor": 4.652, "needed": 0.066}):
        r = Result("overfit-batch")
        causes = Causes(unchanged=[], zero=[], final_same=True, floor=0.6931, bounded=bounded)
        _identical_outputs(r, SimpleNamespace(first_same=False), causes)
        message = finding(r, "identical-outputs").message
        assert ("label entropy" in message) is (bounded is None), message
        assert ("4.652" in message) is (bounded is not None), message


def test_outputs_collapsed_by_a_step_too_large_are_retried_at_a_tenth_of_it():
    """A sweep: Hugging Face BERT-base at Adam 1e-3 answers one class for every sample and was cannot-overfit (an
    error on a healthy model); at 1e-4 it memorises the batch in 30 steps. A small post-LN transformer encoder does
    the same at lr 0.03 against 0.003. Outputs that training made identical, with nothing else found, are trained
    again on a fresh copy at a tenth of the rate: memorised there, lr-too-large (a warning) and no cannot-overfit."""
    import torch.nn as nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 64)
            layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
            self.head = nn.Linear(64, 10)

        def forward(self, ids):
            return self.head(self.enc(self.emb(ids))[:, 0])

    ids = torch.randint(0, 100, (8, 16), generator=torch.Generator().manual_seed(0))
    for zero_head in (False, True):   # a review: a zero-initialised head, the same for all at step 0, was not retried
        torch.manual_seed(0)
        model = Encoder()
        if zero_head:
            nn.init.zeros_(model.head.weight)
            nn.init.zeros_(model.head.bias)
        r = api_run("overfit-batch", model, (ids,), lr=0.03)
        assert "lr-too-large" in codes(r) and "cannot-overfit" not in codes(r), (zero_head, codes(r))
        assert r.data["lower_lr"]["passed"] and r.data["lower_lr"]["lr"] == pytest.approx(0.003)
        assert r.exit_code == 0 and "lr 0.003" in finding(r, "lr-too-large").message
    torch.manual_seed(0)
    r = api_run("overfit-batch", Encoder(), (ids,), lr=0.03, steps=300)   # a budget given: said, not spent again
    assert "cannot-overfit" in codes(r) and any("a tenth of the rate was not tried" in n for n in r.notes), r.notes
    # a model broken by a mean over the batch is the same for every sample from the start: not retried, still an error
    model, x = load("broken_cannot_overfit.py:build")
    r = api_run("overfit-batch", model, x.args)
    assert "cannot-overfit" in codes(r) and "lower_lr" not in r.data, codes(r)


def test_a_loss_that_rose_and_stuck_is_not_flat_and_the_lower_rate_is_tried():
    """A sweep (so_48594888's correct version): a softmax that Adam saturated on its first steps into a Keras-style
    clamp (its gradient then exactly 0) left the loss 5.7x above its start for good. It was "flat from the start"
    (best = initial), and that second cause kept the run from a tenth of the rate, which memorises the batch."""
    import torch.nn as nn

    def clamped(p, y):
        return -(F.one_hot(y, 10) * p.clamp(1e-7, 1 - 1e-7).log()).sum(-1).mean()

    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(32, 2048, generator=g), torch.randint(0, 10, (32,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 512), nn.ReLU(), nn.Linear(512, 10), nn.Softmax(-1))
    r = api_run("overfit-batch", model, (x,), loss=clamped, target=y, lr=1e-2)
    assert "flat-loss" not in codes(r) and max(r.series["loss"]) > 5 * r.series["loss"][0], codes(r)
    assert "lr-too-large" in codes(r) and "cannot-overfit" not in codes(r) and r.exit_code == 0, codes(r)


def test_samples_a_dead_layer_strands_are_named_as_the_cause():
    """A sweep (so_39525358's correct version): one sample with every unit of a 3-wide ReLU bottleneck off carried
    77% of the plateau's loss, and cannot-overfit said "no mechanical cause found: try more steps". Built here: the
    first layer's units are off (by 5.5) for every sample with x0 < 0, whose labels are mixed, so no weight before
    the ReLU moves their shared output; the others are memorised."""
    import torch.nn as nn

    torch.manual_seed(0)   # the head's own initialisation: unseeded, the outcome depended on the tests run before
    g = torch.Generator().manual_seed(0)
    side = torch.tensor([1.0, -1.0]).repeat_interleave(16)
    x = torch.stack([side, 0.1 * torch.randn(32, generator=g)], 1)
    y = torch.arange(32) % 2
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[5.0, 3.0], [5.0, -3.0], [5.0, 1.0]]))
        model[0].bias.fill_(-0.5)
    dead = {k: v.clone() for k, v in model[0].state_dict().items()}
    r = api_run("overfit-batch", model, (x,), loss="cross_entropy", target=y, steps=300)
    assert "cannot-overfit" in codes(r), codes(r)
    f = finding(r, "stranded-samples")
    assert f.severity == "warning" and f.where == "1" and f.message.startswith("16 of 32 samples (16, 17,"), f.message
    assert "no mechanical cause" not in (finding(r, "cannot-overfit").hint or "")
    # labels that follow the side: the dead side's shared output (the head's bias) fits them, nothing is said
    model[0].load_state_dict(dead)
    r = api_run("overfit-batch", model, (x,), loss="cross_entropy", target=(side < 0).long(), steps=300)
    assert "stranded-samples" not in codes(r), codes(r)


def test_a_loss_the_steps_raise_is_a_cause_and_an_output_relu_strands_nothing():
    """A review: with flat-loss no longer said of a loss that rose, a gradient reversal left on the output path (the
    loss climbs 1.08 → 25.9; no rate or step count helps) got "no mechanical cause found: try more steps". It is
    `loss-rose` now. And a ReLU at the output against negative regression targets is the output's range, not samples
    a dead layer strands."""
    import torch.nn as nn

    from support import load_module

    Reverse = load_module("lr_broken.py").Reverse   # the sample's gradient reversal

    class Reversed(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

        def forward(self, x):
            return Reverse.apply(self.net(x))

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    torch.manual_seed(0)
    r = api_run("overfit-batch", Reversed(), (x,), loss="cross_entropy", target=y, steps=300)
    f = finding(r, "loss-rose")
    assert f.severity == "warning" and "cannot-overfit" in codes(r) and "gradient of the wrong sign" in f.hint
    assert "no mechanical cause" not in (finding(r, "cannot-overfit").hint or "")
    torch.manual_seed(0)
    relu_out = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1), nn.ReLU())
    t = torch.randn(32, 1, generator=g)
    r = api_run("overfit-batch", relu_out, (x,), loss="mse", target=t, steps=300)
    assert "cannot-overfit" in codes(r) and "stranded-samples" not in codes(r), codes(r)


@pytest.mark.parametrize("head", ["sigmoid", "tanh"])
def test_a_squashed_head_memorised_to_the_floor_of_torchdiags_own_loss_passes(head):
    # A review: a multi-label sigmoid head and a tanh policy, healthy, reached the floor their range leaves the
    # cross-entropy torchdiag chose (--loss auto), every sample predicted right, and were cannot-overfit, an error.
    # Now PASS with bounded-output as info; a loss the user chose, and a softmax's rows (the double softmax of
    # broken_overfit_softmax.py, above), keep the error.
    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    squash = torch.nn.Sigmoid() if head == "sigmoid" else torch.nn.Tanh()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10), squash)
    x = ModelInputs((torch.randn(8, 32),), {}, "test")
    r = overfit(model, x)
    assert r.exit_code == 0 and r.data["final_accuracy"] == 1.0, r.verdict
    assert r.verdict.startswith("PASS: the batch is memorised as far as the output's range allows")
    f = finding(r, "bounded-output")
    assert ("norm 1" in f.message) is False
    assert f.severity == "info" and r.data["final_loss"] - r.data["floor"] <= 0.01 * (r.data["initial_loss"] - r.data["floor"])
    assert "cannot-overfit" not in codes(r)
    torch.manual_seed(0)
    chosen = overfit(model, x, loss="cross_entropy")
    assert {"cannot-overfit", "bounded-output"} <= set(codes(chosen)) and chosen.exit_code == 1


def test_the_double_softmax_sample_is_still_an_error_at_its_floor():
    torch.manual_seed(0)
    model, x = load("broken_overfit_softmax.py:build")
    r = overfit(model, x)
    assert r.data["final_accuracy"] == 1.0 and "cannot-overfit" in codes(r) and r.exit_code == 1
    f = finding(r, "bounded-output")   # one-hot rows have norm 1 too: still said as the [0, 1] range (a review)
    assert f.severity == "warning" and "[0, 1]" in f.message and "norm 1" not in f.message


def test_an_l2_normalised_head_is_judged_against_the_unit_spheres_floor():
    # Truth by hand: on the unit sphere the largest margin between the true logit and the others (all equal) is
    # sqrt(C/(C-1)), so cross-entropy's floor is log(1 + (C-1) e^-sqrt(C/(C-1))) = 3.8616 for 128 classes; the
    # [-1, 1] box's 2.901 is never reached (a review's embedding tower ended at 3.8615 and was cannot-overfit).
    from torchdiag.core.inputs import ModelInputs

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 128))

        def forward(self, x):
            return torch.nn.functional.normalize(self.net(x), dim=-1)

    torch.manual_seed(0)
    r = overfit(Embed(), ModelInputs((torch.randn(8, 32),), {}, "test"))
    floor = math.log1p(127 * math.exp(-math.sqrt(128 / 127)))
    assert r.data["floor"] == pytest.approx(floor, rel=1e-9) and r.data["final_loss"] >= floor - 1e-4
    assert r.exit_code == 0 and "norm 1" in finding(r, "bounded-output").message


class _Ignores(torch.nn.Module):
    """Broken: the input is multiplied by 0 (a mask bug); the output is the layer's bias, started at 15."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.lin.bias.fill_(15.0)

    def forward(self, x):
        return self.lin(x * 0)


class _Loud(torch.nn.Module):
    """Healthy: an MLP whose output starts 15x larger than the made-up target."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def forward(self, x):
        return self.net(x) * 15.0


def test_shrinking_a_large_output_to_the_target_s_mean_is_no_memorising():
    """A review: a model that ignores its input, its output started at 15 against the N(0, 1) target torchdiag drew,
    fell 224 → 1.05 (below 0.01 x initial) by learning the constant and "PASS"ed. The ratio is taken of 10 x the loss
    of answering every sample with the target's mean when that is lower: it fails, with the causes; an output that
    starts large in a healthy model passes by memorising (90% of the target's spread at least)."""
    from torchdiag.api import run

    torch.manual_seed(0)
    x = torch.randn(8, 4, 16)
    res = run("overfit-batch", _Ignores(), (x,), lr=0.05, steps=1000)
    assert not res.data["passed"] and res.exit_code == 1, [f.message for f in res.findings]
    target = res.data["constant_loss"]
    assert res.data["initial_loss"] > 100 * target and 0.9 < target < 1.1
    assert {"identical-outputs", "zero-grad"} <= {f.code for f in res.findings}
    assert "the loss of answering every sample with the made-up target's mean" in res.header["target"]
    torch.manual_seed(0)
    loud = run("overfit-batch", _Loud(), (torch.randn(8, 4, 16),))
    assert loud.data["passed"] and loud.data["final_loss"] <= 0.1 * loud.data["constant_loss"], loud.data["final_loss"]


def test_a_zero_gate_is_no_cause_when_the_loss_went_non_finite_first():
    """A sweep: timm resnet18 under --dtype float16 (Adam's eps is 0 there) went non-finite at step 1, and its
    zero-initialised blocks were a `zero-grad` warning "dead activations": one step cannot tell a gate from a dead
    path. Said as a note; the non-finite loss is the cause."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.gamma = nn.Parameter(torch.zeros(32))

        def forward(self, x):
            return x + self.gamma * self.fc(x).relu()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), Block(), nn.Linear(32, 4))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    res = api_run("overfit-batch", model, (x,), target=y, loss=nn.functional.cross_entropy, dtype="float16", steps=20)
    assert [f.code for f in res.findings] == ["non-finite-loss", "cannot-overfit"], [f.code for f in res.findings]
    assert any("too few steps to tell a zero-initialised gate" in n and "1.fc.weight" in n for n in res.notes)


def test_a_run_from_a_trained_checkpoint_that_stops_at_the_batchs_floor_says_so(cli, tmp_path):
    """A new user's GPT from its checkpoint: cannot-overfit at 0.0169 x a start of 0.65 (two contexts alike with
    different next tokens: a floor), hinted only "more --steps or another --lr". Here two samples are one input with
    targets 0 and 1 (a floor of 2 ln 2 / 12 on the mean), and the checkpoint is the model trained to near that floor."""
    (tmp_path / "twins.py").write_text(textwrap.dedent("""
        import torch
        def build():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        def one_batch():
            g = torch.Generator().manual_seed(3)
            x = torch.randn(12, 4, generator=g)
            x[1] = x[0]
            y = torch.arange(12) % 2
            return x, y
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        import twins
    finally:
        sys.path.remove(str(tmp_path))
    model, (x, y) = twins.build(), twins.one_batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(1500):   # trained: the loss at its floor, 2 ln 2 / 12 = 0.1155
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    floor = 2 * math.log(2) / 12   # each of the twins: ln 2
    assert F.cross_entropy(model(x), y).item() < 1.2 * floor   # the premise
    torch.save(model.state_dict(), tmp_path / "trained.pt")
    d = cli("overfit-batch", f"{tmp_path}/twins.py:build", "--batch", f"{tmp_path}/twins.py:one_batch",
            "--checkpoint", tmp_path / "trained.pt", "--steps", "200", "--json")
    hints = [f.get("hint", "") for f in d.json["findings"] if f["code"] in ("cannot-overfit", "flat-loss")]
    assert any("the run started from --checkpoint at a loss of" in h for h in hints), d.json["findings"]


BAGS = '''
import torch, torch.nn as nn
class Bag(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.EmbeddingBag(1000, 8, mode="mean"); s.fc = nn.Linear(8, 5)
    def forward(s, x, offsets):
        return s.fc(s.emb(x, offsets))
def build(): return Bag()
def batch():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 1000, (40,), generator=g), torch.tensor([0, 10, 20, 30])), torch.tensor([0, 1, 2, 3])
'''


def test_a_batch_of_bags_is_counted_by_its_labels_not_its_flat_tokens(cli, tmp_path):
    # four bags of ten tokens each: one label per bag, so the batch holds 4 samples (a user's report: "one batch of 40")
    (tmp_path / "bags.py").write_text(BAGS)
    d = cli("overfit-batch", f"{tmp_path}/bags.py:build", "--batch", f"{tmp_path}/bags.py:batch", "--lr", "1e-12",
            "--steps", "20", "--json")
    (fail,) = [f for f in d.json["findings"] if f["code"] == "cannot-overfit"]
    assert "one batch of 4 in" in fail["message"], fail
    assert d.json["batch_size"] == 4


class _TalkingHeads(torch.nn.Module):
    """Attention whose per-head logits a 1x1 conv mixes before the softmax (EfficientFormerV2's talking heads): the
    conv's bias adds one constant to every logit of a softmax's row, which the softmax cancels."""

    def __init__(self, d=16, heads=4, classes=5):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.talk = torch.nn.Conv2d(heads, heads, 1)
        self.out = torch.nn.Linear(d, classes)
        torch.nn.init.constant_(self.talk.bias, 1.0)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
        a = self.talk(q @ k.transpose(-1, -2) * self.dh ** -0.5).softmax(-1)
        return self.out((a @ v).transpose(1, 2).reshape(B, T, d).mean(1))


def test_a_parameter_the_loss_does_not_depend_on_is_invariant_not_unchanged():
    """A sweep: efficientformerv2_s0's talking-head bias stayed bit-identical while the batch was memorised, a
    warning here where doctor and gradflow say `invariant` (info). The same float64 shift test now says so, and the
    bias's gradient is rounding (the softmax's rows sum to 1 whatever it adds)."""
    torch.manual_seed(0)
    model = _TalkingHeads()
    x = torch.randn(8, 6, 16)
    r = overfit(model, x, optimizer="sgd", lr=0.1)
    assert r.data["passed"]
    assert [(f.code, f.severity, f.where) for f in r.findings] == [("invariant", "info", "talk.bias")]
    y = torch.randint(0, 5, (8,))
    F.cross_entropy(model(x), y).backward()
    assert model.talk.bias.grad.abs().max() < 1e-6 * model.talk.weight.grad.abs().max()


def test_cross_entropy_over_features_that_cannot_go_below_zero_is_said_and_inconclusive_not_cannot_overfit():
    """A sweep: timm's resnet10t built headless (num_classes=0: pooled ReLU features) against the auto loss's random
    classes, every answer right and the loss at 0.036 x its start after 2000 steps, was a cannot-overfit error with "no
    mechanical cause found". Over an output >= 0 cross-entropy can only raise the target's value, never push the
    others below 0 (truth: in plain torch such a trunk falls 100x slower than with a Linear head on it)."""
    from types import SimpleNamespace

    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    from torchdiag.diagnostics.overfit_batch import report
    from torchdiag.results import Result

    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))

    def trunk(head: bool):
        torch.manual_seed(1)
        layers = [nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        return nn.Sequential(*layers, *([nn.Linear(64, 64)] if head else []))

    r = api_run("overfit-batch", trunk(False), ModelInputs((x,)), steps=300, lr=0.003)
    assert not r.data["passed"] and any("every output value is ≥ 0" in n for n in r.notes), r.notes
    assert api_run("overfit-batch", trunk(True), ModelInputs((x,)), steps=300, lr=0.003).data["passed"]
    # real labels: a ReLU on the logits is the model's own fault, not said as torchdiag's target (a review)
    real = api_run("overfit-batch", trunk(False), ModelInputs((x,)), steps=300, lr=0.003, target=torch.tensor([3, 7]),
                   loss="cross_entropy")
    assert not any("torchdiag drew" in n for n in real.notes), real.notes
    # the verdict once the run has settled short of the target with every answer right: a warning, not an error
    said = Result("overfit-batch")
    said.data.update(initial_loss=4.0, final_loss=0.14, final_accuracy=1.0)
    ctx = SimpleNamespace(option=lambda name: f"--{name.replace('_', '-')}")
    assert report._features_not_logits(said, SimpleNamespace(step=2000), SimpleNamespace(target_loss=None), ctx)
    f = said.findings[0]
    assert f.code == "made-target-nonnegative" and f.severity == "warning" and said.verdict.startswith("INCONCLUSIVE")
    assert "drop the activation after the last layer" in f.hint
    short = Result("overfit-batch")
    short.data.update(initial_loss=4.0, final_loss=1.0, final_accuracy=1.0)   # a quarter of its start: not enough
    assert not report._features_not_logits(short, SimpleNamespace(step=2000), SimpleNamespace(target_loss=None), ctx)


def test_a_projection_aims_at_what_the_outputs_range_leaves_reachable():
    """A sweep: a ReLU map against the normal target torchdiag drew (its floor 0.31 x the start) was "about 50207
    more steps" from 0.01 x the start, a goal no training reaches: "train longer: --steps 63000". The projection
    aims where _within_range passes: the floor plus 0.01 of the way from the start to it."""
    from types import SimpleNamespace

    from torchdiag.diagnostics.overfit_batch.report import _reachable_goal

    opts = SimpleNamespace(target_ratio=0.01, target_loss=None)
    curve = SimpleNamespace(first_terms=None)
    start, floor = 1.56, 0.485
    got = _reachable_goal(0.01 * start, start, opts, {"kind": "[0, ∞)", "floor": floor}, curve)
    assert got == pytest.approx(floor + 0.01 * (start - floor))
    assert _reachable_goal(0.01 * start, start, opts, None, curve) == pytest.approx(0.01 * start)
    assert _reachable_goal(0.01 * start, start, opts, {"kind": "span", "floor": floor, "span": True}, curve) == \
        pytest.approx(0.01 * start)   # a span's floor is a bound from below, never a pass


def test_a_relu_on_real_labels_logits_is_named_in_the_failures_hint():
    """A review: Linear-ReLU-Linear(64, 10)-ReLU on 16 real labels, 4 of its 10 logit columns held at 0 for every
    sample (truth: without the last ReLU the same training memorises the batch), was cannot-overfit with "no
    mechanical cause found"."""
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)

    def mlp(last_relu: bool):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10), *([nn.ReLU()] if last_relu else []))

    r = api_run("overfit-batch", mlp(True), ModelInputs((x,)), target=y, loss="cross_entropy")
    f = next(f for f in r.findings if f.code == "cannot-overfit")
    assert "drop the activation after the last layer" in f.hint and "no mechanical cause" not in f.hint, f.hint
    assert any("every output value is ≥ 0" in n and "torchdiag drew" not in n for n in r.notes), r.notes
    assert api_run("overfit-batch", mlp(False), ModelInputs((x,)), target=y, loss="cross_entropy").data["passed"]
    # logits shifted above 0 by a bias hold nothing at 0 and are no fault (a second review): not said
    torch.manual_seed(0)
    shifted = nn.Linear(32, 10)
    with torch.no_grad():
        shifted.bias += 10
    r = api_run("overfit-batch", shifted, ModelInputs((x,)), target=y, loss="cross_entropy", steps=200)
    assert not r.data["passed"] and not any("every output value is ≥ 0" in n for n in r.notes), r.notes


def test_a_budget_too_short_for_a_trend_is_not_yet_while_the_loss_still_falls():
    """A sweep: check's `overfit-batch = {steps = 10}` failed the healthy sample MLP (cannot-overfit, exit 1) at 0.05x
    its start, every answer right and the loss still falling: under 20 steps no trend is judged. The same model
    memorises the batch when given the steps."""
    model, x = load("mlp.py:build")
    short = overfit(model, x, steps=10)
    assert short.exit_code == 0 and short.verdict.startswith("NOT YET"), short.verdict
    f = next(f for f in short.findings if f.code == "not-overfit-yet")
    assert f.severity == "warning" and "fewer than 20 steps" in f.message and "20" in f.hint, (f.message, f.hint)
    assert overfit(model, x).data["passed"]


def test_the_never_changed_recheck_copies_a_model_trained_with_functional_dropout_off():
    """A sweep: DETR (F.dropout in its forward, turned off by a TorchFunctionMode whose hooks hold a thread-local)
    left "cannot copy the model to re-check parameters that never changed" (deepcopy: cannot pickle _thread._local)."""
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.l0, self.z, self.head = nn.Linear(8, 32), nn.Linear(8, 3), nn.Linear(32, 3)

        def forward(self, x):   # z multiplies zeros: its weight never changes, and the re-check copies the model
            return self.head(F.dropout(self.l0(x).relu(), 0.1, self.training)) + self.z(torch.zeros_like(x))

    torch.manual_seed(0)
    res = api_run("overfit-batch", Model(), (torch.randn(8, 8),))
    assert not [n for n in res.notes if "not re-checked" in n], res.notes
    assert "z.weight" in {f.where for f in res.findings if f.code == "unchanged-params"}, res.findings


def test_updates_that_round_away_but_do_not_hold_the_fall_back_are_no_cause():
    """A sweep: a float16 LLaMA under SGD (--steps 60) fell to 0.675x its start as float32 did, and was cannot-overfit
    with update-rounds-away as its cause (36% of its elements). A float32 copy trained for as many steps decides: here
    the saturated first layer's updates (179 of 580 elements with a gradient) round away in float16, and the loss falls
    exactly as in float32: the verdict is float32's (still falling: not yet), the rounding a warning beside it."""
    import torch
    from torch import nn

    def model():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))
        with torch.no_grad():
            m[0].weight.mul_(300)
        return m

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    r = api_run("overfit-batch", model(), x, target=y, dtype="float16", steps=20, optimizer="sgd", lr=0.003)
    assert r.exit_code == 0 and "update-rounds-away" in codes(r) and "not-overfit-yet" in codes(r), r.verdict
    assert sum(row["unchanged"] for row in r.data["rounded_away"]) >= 0.1 * 580
    assert r.data["float32_copy"]["held"] is False and r.data["float32_copy"]["steps"] == 20
    plain = api_run("overfit-batch", model(), x, target=y, steps=20, optimizer="sgd", lr=0.003)
    assert abs(r.data["float32_copy"]["ratio"] - plain.data["final_loss"] / plain.data["initial_loss"]) < 1e-3
    assert any("have not held the fall back" in n for n in r.notes), r.notes
