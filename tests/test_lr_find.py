"""lr-find: the range test against ranges known in closed form (least squares) or measured by an independent
sweep (a CNN, a transformer LM), broken-by-construction curves, the rules by hand, options, files."""
import copy
import math

import pytest

from support import load, load_module

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from torchdiag.api import run as api_run  # noqa: E402
from torchdiag.diagnostics.lr_find import Options, rules  # noqa: E402
from torchdiag.errors import OptionError, UsageError  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Hundreds of tiny steps: on a shared, loaded machine two spinning OpenMP threads make them ~20× slower
    (measured: 8 s vs 0.4 s for the CNN run below). Restored after this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def lr_find(model, x, **options):
    return api_run("lr-find", model, x, **options)


def codes(result):
    return [f.code for f in result.findings]


def checked(result):
    return {row["factor"]: row for row in result.table("checked").rows}


def independent_run(model, x, make_opt, loss_of, lr, steps):
    """Losses of `steps` updates at a constant rate on a deep copy, written from scratch: L0, L1 … L_steps."""
    work = copy.deepcopy(model).train()
    opt = make_opt(work.parameters(), lr)
    out = []
    for k in range(steps + 1):
        loss = loss_of(work)
        out.append(float(loss.detach()))
        if k < steps:
            opt.zero_grad()
            loss.backward()
            opt.step()
    return out


# --- closed form: least squares with plain SGD diverges above 2/L ---------------------------------------

@pytest.fixture(scope="module")
def least_squares():
    lin = load_module("lr_linear.py")
    x, y = lin.data()
    model = lin.build()
    lam = torch.linalg.eigvalsh(x.T @ x).max()          # L = 2 λ_max(XᵀX) / N: the Hessian of the mean squared error
    big_l = float(2 * lam / x.shape[0])
    return model, x, y, big_l


def test_least_squares_suggestion_below_the_closed_form_limit(least_squares, untouched):
    model, x, y, big_l = least_squares
    limit = 2 / big_l
    with untouched(model):
        r = lr_find(model, x, loss="mse", target=y, optimizer="sgd", momentum=0.0, steps=100, repeats=2, check_steps=30)
    assert r.exit_code == 0, r.verdict
    assert r.data["suggestion"] < limit and r.data["recommended"] < limit
    assert r.data["rules_lr"]["valley"]["high"] < limit and r.data["rules_lr"]["steepest"]["high"] < limit
    # the range crosses 2/L: the divergence finding, and no repeat stopped below the limit (GD shrinks the
    # loss at every rate below 2/L, so it cannot rise there)
    assert "diverges-above" in codes(r)
    assert all(lr is not None and lr > limit for lr in r.data["diverged_at_lr"])
    losses, lrs = r.series["loss_r0"], r.series["lr"]
    below = [k for k, lr in enumerate(lrs) if lr < limit]
    assert all(losses[k] <= (losses[k - 1] if k else r.table("curves").rows[0]["initial_loss"]) for k in below)
    # the checked runs: a rate below 2/L never diverges and its loss never rises; far above it, it diverges
    for row in r.table("checked").rows:
        if row["lr"] < limit:
            assert row["outcome"] != "diverged"
        elif abs(1 - row["lr"] * big_l) ** (2 * 30) > 1e3:
            assert row["outcome"] == "diverged"
    rows = checked(r)
    assert rows["10×"]["outcome"] == "diverged" and rows["10×"]["lr"] > limit   # 10× crosses 2/L here


def test_least_squares_curve_is_plain_gradient_descent_on_the_schedule(least_squares):
    """The recorded pairs (lr_k, loss after update k) against gradient descent written out by hand."""
    model, x, y, _ = least_squares
    r = lr_find(model, x, loss="mse", target=y, optimizer="sgd", momentum=0.0, steps=40, repeats=1, check_steps=0,
                min_lr=1e-4, max_lr=0.05)
    assert r.data["optimizer"] == "sgd" and r.data["momentum"] == 0.0
    w = model.weight.detach().clone().T.double()
    xd, yd = x.double(), y.double()
    expected = []
    for k in range(40):
        lr = 1e-4 * (0.05 / 1e-4) ** (k / 39)
        grad = 2 * xd.T @ (xd @ w - yd) / x.shape[0]
        w = w - lr * grad
        expected.append(float(((xd @ w - yd) ** 2).mean()))
        assert r.series["lr"][k] == pytest.approx(lr, rel=1e-12)
    assert r.series["loss_r0"] == pytest.approx(expected, rel=1e-4)
    # the range stays below 2/L (≈0.088): nothing diverges, and the header/data state the cost
    assert "diverges-above" not in codes(r) and r.data["diverged_at_lr"] == [None]
    assert r.data["max_updates"] == 40 and r.data["updates"] == 40 and r.verdict.startswith("SUGGESTED")
    assert "not checked" in r.verdict


# --- measured sweeps: a CNN (SGD, Adam) and a transformer LM (AdamW) -------------------------------------

def _ce_targets(n, classes, seed=0):
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_cnn_checked_runs_match_an_independent_sweep(optimizer):
    torch.manual_seed(0)
    model, x = load("cnn.py:build", "width=4", inputs=["8x3x32x32"])
    r = lr_find(model, x, optimizer=optimizer, steps=60, repeats=2, check_steps=20)
    assert r.data["suggestion"] is not None and r.exit_code == 0, r.verdict
    targets = _ce_targets(8, 10)
    make = (lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9)) if optimizer == "sgd" else \
        (lambda p, lr: torch.optim.Adam(p, lr=lr))
    loss_of = lambda m: F.cross_entropy(m(*x.args), targets)   # noqa: E731  the rule's random targets, seed 0
    for factor, row in checked(r).items():
        mine = independent_run(model, x, make, loss_of, row["lr"], 20)
        assert r.series[f"checked_{factor.replace('×', 'x')}"] == pytest.approx(mine, rel=1e-3, abs=1e-4)
    # an independent sweep over decades: the recommended rate is within a decade of the sweep's best stable rate
    finals = {}
    for lr in [10.0 ** e for e in range(-5, 1)]:
        losses = independent_run(model, x, make, loss_of, lr, 20)
        if all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]:
            finals[lr] = losses[-1]
    best = min(finals, key=finals.get)
    assert best / 10 <= r.data["recommended"] <= best * 10 * 1.0001, (finals, r.data["recommended"])


def test_transformer_lm_lets_the_checked_runs_decide():
    """AdamW on a small LM: the curve's valley sits in the descent (here ≈5e-3, above the ~1e-3 rule of
    thumb); whether it stands is decided by runs at constant rates, replicated here by hand."""
    torch.manual_seed(0)
    model, x = load("transformer_lm.py:build")
    r = lr_find(model, x, optimizer="adamw", steps=100, repeats=1, check_steps=30)
    s = r.data["suggestion"]
    make = lambda p, lr: torch.optim.AdamW(p, lr=lr)   # noqa: E731
    loss_of = lambda m: x.call(m)["loss"]              # noqa: E731  the model's own loss (labels given)
    at_s = independent_run(model, x, make, loss_of, s, 30)
    at_low = independent_run(model, x, make, loss_of, s / 10, 30)
    assert r.series["checked_1x"] == pytest.approx(at_s, rel=1e-3) and r.series["checked_0.1x"] == pytest.approx(at_low, rel=1e-3)
    # independently: at s the loss jumps back above its start after making progress, at s/10 it never rises
    spike = max(b - min(at_s[:i + 1]) for i, b in enumerate(at_s[1:]))
    assert spike > 0.25 * (at_s[0] - min(at_s)) and max(at_s[1:]) > at_s[0]
    assert all(b <= a for a, b in zip(at_low, at_low[1:]))
    # so the checked runs reject the curve's rate: a lower one is recommended, with the warning
    assert r.data["recommended"] == pytest.approx(s / 10) and r.data["recommended_factor"] == 0.1
    assert "lr-unstable" in codes(r) and r.verdict.startswith("RECOMMENDED") and r.exit_code == 0


def test_a_range_whose_first_update_blows_the_loss_up_says_so_and_not_raise_max_lr():
    """A sweep: --min-lr 1 --max-lr 10 on an MLP, Adam's first update took the loss 2.3 -> ~6000 and the rest fell
    back toward it: both repeats read "ok", a suggestion of 3.1 and "raise --max-lr", where every rate tried blows up
    (truth: the same first update in plain torch)."""
    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 16, generator=g), torch.randint(0, 10, (64,), generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    copy_ = copy.deepcopy(model)
    opt = torch.optim.Adam(copy_.parameters(), lr=1.0)
    before = F.cross_entropy(copy_(x), y)
    before.backward()
    opt.step()
    after = F.cross_entropy(copy_(x), y).item()
    assert after > 4 * before.item()   # the premise: the first update at min_lr blows the loss up
    r = lr_find(model, ModelInputs((x,)), min_lr=1.0, max_lr=10.0, steps=40, repeats=2, loss="cross_entropy",
                target=y)
    assert r.exit_code == 1 and "no-rate-trains" in codes(r) and "range-too-narrow" not in codes(r), codes(r)
    f = next(f for f in r.findings if f.code == "no-rate-trains")
    assert f"start {before.item():.3g}" in f.message and "(lower min_lr)" in f.hint, (f.message, f.hint)


# --- curves with no right answer -----------------------------------------------------------------------

def test_model_that_climbs_at_every_rate_is_an_error(untouched):
    model = load_module("lr_broken.py").ascends()
    with untouched(model):
        r = lr_find(model, model.example_input_array, steps=40, repeats=2)
    assert r.exit_code == 1 and "no-rate-trains" in codes(r)
    assert r.data["suggestion"] is None and r.data["recommended"] is None and r.table("checked") is None
    assert r.data["status"] == "rises" and r.verdict.startswith("FAIL: no rate in 1e-07–10 reduced the loss")
    # the loss really rose: every recorded loss above the initial one
    init = r.table("curves").rows[0]["initial_loss"]
    assert min(r.series["loss_r0"]) >= init


def test_flat_curve_gives_no_suggestion_not_a_wrong_one():
    model = load_module("lr_broken.py").flat()
    r = lr_find(model, model.example_input_array, steps=40, repeats=2)
    assert r.exit_code == 0 and r.data["suggestion"] is None and r.data["recommended"] is None
    f = next(f for f in r.findings if f.code == "no-suggestion")
    assert f.severity == "warning" and "did not move" in f.message
    assert r.data["status"] == "flat" and r.table("checked") is None and r.data["updates"] == 80
    # the loss moved by less than 1% over the whole range (checked on the raw numbers)
    init = r.table("curves").rows[0]["initial_loss"]
    assert max(abs(v - init) for v in r.series["loss_r0"]) < 0.01 * init


def test_noisy_curve_gives_no_suggestion(untouched):
    model = load_module("lr_broken.py").noisy()
    with untouched(model):      # dropout draws from the RNG: restored
        r = lr_find(model, model.example_input_array, steps=40, repeats=3)
    assert r.data["suggestion"] is None and r.data["status"] == "noise" and r.exit_code == 0
    assert "noise" in next(f for f in r.findings if f.code == "no-suggestion").message
    assert r.data["repeats_identical"] is False and r.data["repeats_run"] == 3   # dropout differs by seed


# --- repeats: what varies, what is skipped -----------------------------------------------------------

def test_repeats_vary_the_random_targets_and_skip_when_nothing_varies():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = lr_find(model, x, steps=30, repeats=3, check_steps=0)
    assert r.data["repeats_run"] == 3 and not r.data["repeats_identical"]
    assert "the random targets torchdiag draws" in r.data["varied"]
    assert r.series["loss_r0"][:3] != r.series["loss_r1"][:3]
    # the initial loss of repeat r is cross-entropy against the targets of seed r, computed here
    with torch.no_grad():
        out = model(*x.args)
    for row in r.table("curves").rows:
        t = _ce_targets(out.shape[0], out.shape[1], row["seed"])
        assert row["initial_loss"] == pytest.approx(float(F.cross_entropy(out, t)), rel=1e-5)
    # a given target and no dropout: identical curves, the third repeat skipped, said so
    y = torch.randint(0, 10, (x.batch_size,))
    r2 = lr_find(model, x, target=y, loss="cross_entropy", steps=30, repeats=3, check_steps=0)
    rows = r2.table("curves").rows
    assert r2.data["repeats_identical"] and r2.data["repeats_run"] == 2 == len(rows)
    assert r2.data["updates"] == sum(row["updates"] for row in rows) and r2.series["loss_r0"] == r2.series["loss_r1"]
    assert any("skipped" in n for n in r2.notes) and r2.data["varied"] == ["the RNG of the forward (dropout, sampling)"]


def test_user_model_untouched_with_grads_and_optimizer_state(untouched):
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = model(*x.args).sum()
    loss.backward()
    opt.step()          # the user's optimizer has state; the model has .grad
    state = copy.deepcopy(opt.state_dict())
    with untouched(model):
        lr_find(model, x, steps=20, repeats=1, check_steps=3)
    after = opt.state_dict()
    assert after["param_groups"] == state["param_groups"]
    assert all(torch.equal(after["state"][k]["exp_avg"], state["state"][k]["exp_avg"]) for k in state["state"])


# --- the rules, by hand ------------------------------------------------------------------------------

def test_schedule_is_geometric_with_both_ends():
    s = rules.schedule(1e-6, 1.0, 7)
    assert s[0] == 1e-6 and s[-1] == pytest.approx(1.0) and all(b / a == pytest.approx(10) for a, b in zip(s, s[1:]))


def test_early_stop_on_the_debiased_average():
    stop = rules.EarlyStop(4.0, beta=0.5)
    assert stop.update(1.0) is None and stop.update(1.0) is None      # debiased: 1.0, 1.0
    assert stop.update(5.0) is None                                   # (0.375 + 2.5) / 0.875 = 3.29 < 4 × 1
    assert stop.smoothed[-1] == pytest.approx(2.875 / 0.875)
    assert stop.update(10.0) == "diverged"                            # (1.4375 + 5) / 0.9375 = 6.87 > 4
    assert stop.smoothed[-1] == pytest.approx(6.4375 / 0.9375)
    assert rules.EarlyStop(4.0).update(float("nan")) == "non-finite"
    # the loss before the first update counts: first updates whose average stays 16x above it are a divergence
    # (from the third on: one dropout draw 5.7x another is noise, a review)
    blown = rules.EarlyStop(4.0, start=2.3)
    assert [blown.update(v) for v in (6255.0, 3000.0, 900.0)] == [None, None, "diverged"]
    assert [rules.EarlyStop(4.0).update(v) for v in (6255.0, 3000.0, 900.0)] == [None, None, None]
    noisy = rules.EarlyStop(4.0, start=0.0016)
    assert [noisy.update(v) for v in (0.0067, 0.002, 0.004, 0.001)] == [None, None, None, None]
    assert rules.exceeds(-0.5, -2.0, 4.0) is False and rules.exceeds(5.0, -2.0, 4.0) is True


def _sigmoid_curve(n=90, centre=40, spike_at=None):
    lrs = rules.schedule(1e-6, 10.0, n)
    # falls 5 → 1 around index 40 (strictly: a median of a monotone window is its centre), flat at exactly 1
    # over 55…70 (the minimum's first index is 55, smoothed or not), rises after 70
    losses = [1.0 + 4.0 / (1 + math.exp((k - centre) / 4)) if k < 55 else 1.0 + (0.002 * (k - 70) ** 2 if k > 70 else 0)
              for k in range(n)]
    if spike_at is not None:
        losses[spike_at] += 10.0
    return lrs, 5.0, losses


def test_valley_is_the_middle_of_the_descent_and_ignores_a_lone_spike():
    lrs, l0, losses = _sigmoid_curve()
    a = rules.analyse(lrs, l0, losses, 90, None)
    m = 55
    start = next(i for i in range(90) if losses[i] <= l0 - 0.1 * (l0 - losses[m]))
    assert a.status == "ok" and a.min_index == m
    assert a.rules["valley"] == lrs[(start + m) // 2] and a.rules["min/10"] == pytest.approx(lrs[m] / 10)
    assert a.rules["steepest"] == pytest.approx(lrs[40], rel=0.5)     # the sigmoid's steepest point
    spiked = rules.analyse(*_sigmoid_curve(spike_at=5), 90, None)
    assert spiked.rules == a.rules                          # one early spike: the median smoothing drops it


def test_flat_noise_and_rising_curves_have_no_rules():
    lrs = rules.schedule(1e-6, 1.0, 40)
    flat = rules.analyse(lrs, 2.0, [2.0 - 1e-6 * k for k in range(40)], 40, None)
    assert flat.status == "flat" and flat.rules["valley"] is None
    noisy = rules.analyse(lrs, 2.0, [2.0 + (0.3 if k % 2 else -0.3) for k in range(40)], 40, None)
    assert noisy.status == "noise"
    rising = rules.analyse(lrs, 2.0, [2.0 + 0.1 * k for k in range(40)], 40, "diverged")
    assert rising.status == "rises"
    s = rules.combine([rising, flat])
    assert s.status == "rises" and s.lr is None


def test_checked_runs_judged_and_picked_by_hand():
    tol = 0.01
    steady = rules.judge(rules.Check(0.1, 1e-4, [5.0, 4.5, 4.0, 3.5, 3.0]), tol, 4.0)
    fast = rules.judge(rules.Check(1.0, 1e-3, [5.0, 3.0, 2.0, 1.5, 1.0]), tol, 4.0)
    spiky = rules.judge(rules.Check(10.0, 1e-2, [5.0, 2.0, 4.5, 1.0, 0.9]), tol, 4.0)
    blown = rules.judge(rules.Check(10.0, 1e-2, [5.0, 30.0, float("inf"), 1.0, 1.0]), tol, 4.0)
    assert steady.trained and not steady.unstable and steady.final == 3.0
    assert fast.trained and fast.final == 1.0
    assert spiky.unstable and not spiky.diverged          # rose 2.5 after a progress of 3: > 25%
    assert blown.diverged and not blown.trained
    # a spike past diverge × L0 that comes back down is unstable, not diverged; ending above L0 is diverged
    back = rules.judge(rules.Check(10.0, 1e-2, [5.0, 25.0, 2.0, 0.5, 0.4]), tol, 4.0)
    assert back.unstable and not back.diverged and back.trained
    worse = rules.judge(rules.Check(10.0, 1e-2, [5.0, 4.0, 5.0, 6.0, 7.0]), tol, 4.0)
    assert worse.diverged and not worse.trained
    assert rules.pick([steady, fast, spiky], tol) is fast       # the suggestion, fastest and stable
    assert rules.pick([steady, fast, blown], tol) is fast
    slow = rules.judge(rules.Check(1.0, 1e-3, [5.0, 4.9, 4.8, 4.7, 4.6]), tol, 4.0)
    assert rules.pick([steady, slow, blown], tol) is steady     # 0.1× clearly faster
    unstable_base = rules.judge(rules.Check(1.0, 1e-3, [5.0, 2.0, 4.5, 1.0, 0.9]), tol, 4.0)
    assert rules.pick([steady, unstable_base, blown], tol) is steady
    dead = [rules.judge(rules.Check(f, 1.0, [5.0, 5.0, 5.0]), tol, 4.0) for f in (0.1, 1.0, 10.0)]
    assert rules.pick(dead, tol) is None
    # 10x stable and clearly faster on the batch, but past the rate from which the range test's loss climbed for
    # good (a sweep: a transformer's 10x memorised its batch and learned nothing on fresh ones): the suggestion stays
    quick = rules.judge(rules.Check(10.0, 1e-2, [5.0, 1.0, 0.5, 0.3, 0.2]), tol, 4.0)
    assert rules.pick([steady, fast, quick], tol) is quick
    assert rules.pick([steady, fast, quick], tol, ceiling=5e-3) is fast
    assert rules.pick([steady, fast, quick], tol, ceiling=2e-2) is quick


def test_a_rise_within_the_forwards_own_scatter_is_no_divergence_nor_instability():
    """A sweep: dropout 0.8, the checked run at the suggestion read "diverged" (L0 one low draw, 1.363, against a mean
    of draws at the start of 1.50) and at 10x "unstable" (a draw of 1.72 after one of 0.93). The draws' spread at the
    start and at the end, measured with no update, sets what a rise must exceed; a deterministic forward's is 0."""
    tol = 0.05
    above = [1.363, 1.49, 1.40, 1.52, 1.45, 1.48]      # a rate that cannot move the weights, ending one draw above L0
    assert rules.judge(rules.Check(1.0, 1e-7, above), tol, 4.0).diverged             # deterministic: a true climb
    # a deterministic forward is judged as before: ending above L0 at all is diverged, within tol or not (a review)
    assert rules.judge(rules.Check(1.0, 1e-3, [5.0, 5.01, 5.02, 5.02]), tol, 4.0).diverged
    assert not rules.judge(rules.Check(1.0, 1e-7, above), tol, 4.0, start=0.11).diverged
    run = [1.363, 1.48, 1.24, 1.01, 1.41, 1.06, 0.93, 1.72, 1.12, 1.02, 0.91, 0.79, 0.94, 1.00]
    assert rules.judge(rules.Check(1.0, 1e-2, run), tol, 4.0).unstable
    fair = rules.judge(rules.Check(1.0, 1e-2, run), tol, 4.0, start=0.11, end=0.18)
    assert not fair.unstable and fair.trained
    # the end's spread of a blown-up run is its own (15 on a loss of 46): divergence is judged by the start's
    blown = rules.judge(rules.Check(10.0, 0.18, [1.363, 5.5, 8.4, 30.0, 46.0, 44.0, 46.0]), tol, 4.0, start=0.11, end=15)
    assert blown.diverged


def test_the_valley_starts_where_the_fall_leaves_the_noise():
    """A plateau of draws scattered by σ 0.11 (a dropout net's at its start) over four decades, then a fall of 1.0: the
    descent starts in the fall, not at a dip of the plateau's draws below 10% of the fall (a sweep: a dropout net's
    suggestion 200x below where it trains; on 3 of these 8 draws the descent started at 1e-7 to 2e-5)."""
    import random

    lrs = rules.schedule(1e-7, 1.0, 100)
    for seed in range(8):
        draw = random.Random(seed)
        losses = [1.5 + draw.gauss(0, 0.11) - (0.0 if lr < 1e-3 else min(1.0, 0.5 * math.log10(lr / 1e-3)))
                  for lr in lrs]
        a = rules.analyse(lrs, 1.5 + draw.gauss(0, 0.11), losses, 100, None)
        assert a.status == "ok" and lrs[a.descent_from] >= 1e-3, (seed, lrs[a.descent_from])


def test_a_heavy_dropout_net_gets_a_rate_that_trains():
    """The sweep's model: MLP 16-64-64-4, dropout 0.8 after each hidden ReLU, 16 fixed samples. Before: a suggestion of
    5.6e-5, every checked run "diverged", no-rate-trains (exit 1). The truth, by hand: Adam at the suggestion lowers
    the eval-mode loss over 100 updates far more than at the old suggestion."""
    g = torch.Generator().manual_seed(123)
    x, y = torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.8), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.8),
                          nn.Linear(64, 4))
    from torchdiag.core.inputs import ModelInputs

    r = lr_find(model, ModelInputs((x,)), loss="cross_entropy", target=y)
    assert "no-rate-trains" not in codes(r) and "lr-too-high" not in codes(r), [f.message for f in r.findings]
    lr = r.data["recommended"]

    def eval_loss_after(rate):
        work = copy.deepcopy(model).train()
        opt = torch.optim.Adam(work.parameters(), lr=rate)
        torch.manual_seed(1)
        for _ in range(100):
            opt.zero_grad()
            F.cross_entropy(work(x), y).backward()
            opt.step()
        with torch.no_grad():
            return float(F.cross_entropy(work.eval()(x), y))

    with torch.no_grad():
        start = float(F.cross_entropy(copy.deepcopy(model).eval()(x), y))
    assert eval_loss_after(lr) < 0.6 * start and eval_loss_after(lr) < eval_loss_after(5.6e-5) - 0.3


def test_a_span_of_one_value_is_that_value():
    from torchdiag.diagnostics.lr_find.report import span

    assert span(1.2912, 1.2934) == "1.29" and span(0.89, 3.27) == "0.89–3.27"


def test_a_rise_before_any_progress_is_weighed_against_the_whole_run():
    """A sweep's find: a ViT's checked run at the suggestion rose 0.697 -> 0.721 at its first Adam update, then
    fell to 0.010; "gave back a quarter of its progress" when none was made yet called it unstable, and 0.1x (which
    ended at 0.27) was recommended. Compared with the whole run's progress the bump is 3%; a bump of half the run's
    progress stays unstable."""
    tol = 0.01
    vit = rules.judge(rules.Check(1.0, 3.35e-3, [0.697, 0.721, 0.6, 0.45, 0.3, 0.1, 0.03, 0.012, 0.0101]), tol, 4.0)
    assert vit.trained and not vit.unstable and vit.rebound == pytest.approx(0.024)
    bump = rules.judge(rules.Check(1.0, 1e-3, [5.0, 6.0, 7.0, 4.0, 1.0]), tol, 4.0)
    assert bump.trained and bump.unstable                 # rose 2 before falling 4: more than a quarter
    # 0.01 (tol) is no progress yet: a rise of 1.21 is 30% of the run's 4, one of 0.31 is 8%
    assert rules.judge(rules.Check(1.0, 1e-3, [5.0, 4.99, 6.2, 2.0, 1.0]), tol, 4.0).unstable
    assert not rules.judge(rules.Check(1.0, 1e-3, [5.0, 4.99, 5.3, 2.0, 1.0]), tol, 4.0).unstable


# --- under torchrun: the stop agreed, a peer's failure followed ----------------------------------------

def _with_fake_ranks(monkeypatch, peer):
    """A context with a wrapper (identity) and agree() ORing in a scripted peer's flags per call."""
    import torchdiag.core.distributed as dist
    from torchdiag.diagnostics.lr_find import loop

    calls = []

    def agree(flags, device, group=None):
        other = peer(len(calls))
        calls.append(list(flags))
        return [a or b for a, b in zip(flags, other)]

    monkeypatch.setattr(dist, "agree", agree)
    monkeypatch.setattr(loop.Runner, "_mean", lambda self, values: list(values))
    return calls


def _ctx_with_wrapper(model):
    from torchdiag.api import run_spec
    from torchdiag.core.context import context_for

    ctx = context_for(model, run_spec("lr-find"))
    ctx.wrapper = lambda work: work
    return ctx


def test_a_peer_divergence_stops_this_rank_at_the_same_update(monkeypatch):
    from torchdiag.api import as_inputs
    from torchdiag.diagnostics import lr_find

    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    # call 0: the initial loss; call k: after update k. The peer diverges after update 12.
    calls = _with_fake_ranks(monkeypatch, lambda i: [False, i == 12, False])
    r = lr_find.run(model, as_inputs(model, x), Options(steps=40, repeats=1, check_steps=3), _ctx_with_wrapper(model))
    rows = r.table("curves").rows
    assert rows[0]["stopped"] == "diverged" and len(r.series["loss_r0"]) == 12
    assert r.data["diverged_at_lr"][0] == pytest.approx(rules.schedule(1e-7, 10, 40)[11])
    # every evaluation agreed: 13 in the range test (L0 and 12 updates), 1 + 3 per checked run
    table = r.table("checked")
    assert len(calls) == 13 + 4 * (len(table.rows) if table else 0)


def test_a_peer_failure_makes_this_rank_stop_with_it(monkeypatch):
    from torchdiag.api import as_inputs
    from torchdiag.diagnostics import lr_find
    from torchdiag.errors import ModelError

    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    _with_fake_ranks(monkeypatch, lambda i: [False, False, i == 5])
    with pytest.raises(ModelError) as e:
        lr_find.run(model, as_inputs(model, x), Options(steps=40, repeats=1), _ctx_with_wrapper(model))
    assert e.value.follows_peer and "another rank" in str(e.value)


def test_a_failing_forward_tells_the_peers_before_raising(monkeypatch):
    from torchdiag.api import as_inputs
    from torchdiag.diagnostics import lr_find
    from torchdiag.errors import ModelError

    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 3:
                raise RuntimeError("boom")
            return self.fc(x)

    model = Breaks()
    calls = _with_fake_ranks(monkeypatch, lambda i: [False, False, False])
    with pytest.raises(ModelError, match="boom"):
        lr_find.run(model, as_inputs(model, torch.randn(8, 4)), Options(steps=20, repeats=1), _ctx_with_wrapper(model))
    assert calls[-1] == [False, False, True]      # the FAILED agreement its peers wait for


# --- options -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,field", [
    (dict(min_lr=0), "min_lr"), (dict(min_lr=-1e-3), "min_lr"), (dict(max_lr=1e-8), "max_lr"),
    (dict(min_lr=1.0, max_lr=1.0), "max_lr"), (dict(steps=5), "steps"), (dict(steps=50.5), "steps"),
    (dict(diverge=1.0), "diverge"), (dict(repeats=0), "repeats"), (dict(repeats=21), "repeats"),
    (dict(check_steps=2), "check_steps"), (dict(check_steps=-1), "check_steps"), (dict(steps=True), "steps"),
    (dict(max_lr=float("inf")), "max_lr"), (dict(on_step=3), "on_step"),
])
def test_options_are_validated_when_built(kw, field):
    with pytest.raises(OptionError) as e:
        Options(**kw)
    assert e.value.field == field


def test_bad_option_through_the_api_is_a_usage_error_before_any_work():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(UsageError, match="max_lr"):
        lr_find(model, torch.randn(4, 3), min_lr=1.0, max_lr=0.5)
    assert Options().cost == 100 * 3 + 3 * 30


# --- output: JSON, the plot, TensorBoard ----------------------------------------------------------------

@pytest.fixture(scope="module")
def small_result():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = lr_find(model, x, steps=40, repeats=2, check_steps=10)
    r.header["model"] = "sample_models/mlp.py:build"
    return r


def test_json_document_holds_every_number(small_result):
    import json

    from torchdiag.render.jsondoc import to_json

    doc = json.loads(to_json(small_result))
    for key in ("suggestion", "band", "recommended", "recommended_factor", "status", "rules_lr", "curves", "rules",
                "checked", "lr", "loss_r0", "smoothed_r0", "checked_1x", "diverged_at_lr", "max_updates", "updates",
                "varied", "schedule", "cost", "exit_code"):
        assert key in doc, key
    assert doc["band"][0] <= doc["suggestion"] <= doc["band"][1]
    assert len(doc["checked_1x"]) == 11 and doc["updates"] <= doc["max_updates"]


def test_plot_is_written_atomically_and_readable(small_result, tmp_path):
    from PIL import Image

    from torchdiag.render.lr_find import write_plot
    from torchdiag.render.plots import check_plot

    path = tmp_path / "lr.png"
    check_plot(path)
    assert write_plot(small_result, path) == str(path)
    w, h = Image.open(path).size
    assert w > 800 and h > 300
    with pytest.raises(UsageError):
        check_plot(tmp_path / "lr.txt")
    assert list(tmp_path.iterdir()) == [path]        # no temp file left


def test_tensorboard_gets_the_curves_as_series(small_result, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchdiag.render.tensorboard import write_result

    path = write_result(small_result, tmp_path)
    acc = EventAccumulator(str(path))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "lr-find/smoothed_r0" in tags and "lr-find/lr" in tags and "lr-find/suggestion" in tags
    assert len(acc.Scalars("lr-find/loss_r0")) == len(small_result.series["loss_r0"])


# --- real launches: `torchrun --nproc_per_node 2 -m torchdiag lr-find`, 2 gloo ranks ------------------------

def _torchrun(model: str, wrap: str):
    """`torch.distributed.run --standalone --nproc_per_node 2 -m torchdiag lr-find ... --device cpu --json`:
    (rc, doc). The schedule is the one the single-process run below repeats."""
    from support import sample, torchrun

    code, doc, _ = torchrun("lr-find", sample(f"lr_ranks.py:{model}"), "--wrap", wrap, "--optimizer", "sgd", "--steps",
                            "30", "--repeats", "2", "--check-steps", "5", env={"OMP_NUM_THREADS": "1"})
    return code, doc


@pytest.mark.distributed
@pytest.mark.slow
def test_under_torchrun_every_rank_reads_the_whole_batch_curve():
    rc, doc = _torchrun("healthy", "ddp")
    assert rc == 0 and doc["exit_code"] == 0 and doc["suggestion"] is not None
    ranks = doc["ranks"]
    assert [r["data"]["suggestion"] for r in ranks] == [doc["suggestion"]] * 2
    assert ranks[0]["data"]["updates"] == ranks[1]["data"]["updates"] == doc["updates"]
    # the mean over ranks of each rank's mean loss, with DDP's averaged gradient, is the single-process run
    # on the whole batch (the random targets are drawn for the whole batch and cut per rank)
    mod = load_module("lr_ranks.py")
    model = mod.healthy()
    single = lr_find(model, mod.example_inputs(), optimizer="sgd", steps=30, repeats=2, check_steps=5)
    assert doc["loss_r0"] == pytest.approx(single.series["loss_r0"], rel=1e-4, abs=1e-6)
    assert doc["suggestion"] == pytest.approx(single.data["suggestion"]) and doc["recommended"] == pytest.approx(single.data["recommended"])


@pytest.mark.distributed
@pytest.mark.slow
def test_under_torchrun_fsdp_a_rank_that_fails_mid_test_stops_its_peer():
    rc, doc = _torchrun("fails_later", "fsdp")
    assert rc != 0 and doc["exit_code"] == 3     # torchrun itself exits 1 when a rank fails
    assert "[rank 1]" in doc["error"]["message"] and "fails on rank 1" in doc["error"]["message"]
    assert doc["ranks"][0]["error"]["echo"] is True      # rank 0 stopped with it (no wait in a collective)


def test_ctrl_c_keeps_the_curve_so_far_without_a_verdict():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")

    def interrupt(done, loss):
        if done == 15:
            raise KeyboardInterrupt

    r = lr_find(model, x, steps=40, repeats=2, on_step=interrupt)
    assert r.exit_code == 130 and r.verdict.startswith("INTERRUPTED") and r.data["status"] == "interrupted"
    assert len(r.series["loss_r0"]) == 15 and r.data["suggestion"] is None and "loss_r1" not in r.series


def test_autocast_and_an_unused_lr_are_stated():
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = lr_find(model, x, amp="bf16", lr=0.5, steps=20, repeats=1, check_steps=3)
    assert r.data["amp"] == "bfloat16" and "autocast bfloat16" in r.header["training"]
    assert any("lr 0.5 is not used" in n for n in r.notes)


def test_fp16_autocast_steps_through_a_grad_scaler(monkeypatch):
    from torchdiag.core.scaling import ScaledStep

    stepped = []
    original = ScaledStep.step
    monkeypatch.setattr(ScaledStep, "step", lambda self: (stepped.append(self.scaler.get_scale()), original(self)))
    torch.manual_seed(0)
    model, x = load("mlp.py:build")
    r = lr_find(model, x, amp="fp16", steps=20, repeats=1, check_steps=3)
    assert r.data["amp"] == "float16" and len(stepped) == r.data["updates"] > 0
    assert stepped[0] == 2.0 ** 16            # torch's GradScaler starts at 2^16


@pytest.mark.cuda
def test_on_cuda_with_fp16_the_model_is_untouched(untouched):
    torch.manual_seed(0)
    model, x = load("mlp.py:build", device="cuda")
    with untouched(model):
        r = lr_find(model, x, amp="fp16", steps=30, repeats=2, check_steps=5)
    assert r.data["amp"] == "float16" and r.data["updates"] > 0 and r.exit_code in (0, 1)
    assert r.data["suggestion"] is None or r.data["band"][0] <= r.data["suggestion"] <= r.data["band"][1]


def test_docs_picture_is_what_the_code_draws_now(cli, tmp_path, monkeypatch):
    """docs/images/lr_find.png: `torchdiag lr-find sample_models/transformer_lm.py:build --optimizer adamw
    --plot FILE` (defaults, CPU, one thread), run from the repository root as the docs show it."""
    from support import ROOT, assert_readme_picture

    monkeypatch.chdir(ROOT)
    r = cli("lr-find", "sample_models/transformer_lm.py:build", "--optimizer", "adamw", "--device", "cpu",
            "--plot", tmp_path / "lr_find.png")
    assert r.code == 0, r.stderr
    assert_readme_picture("lr_find.png", tmp_path / "lr_find.png")


def test_a_loss_already_nan_is_an_error_not_a_curve():
    model, x = load("broken_nan_forward.py:build")
    r = lr_find(model, x, steps=20, repeats=1)
    assert r.exit_code == 1 and codes(r) == ["non-finite-loss"] and r.data["updates"] == 0
    assert r.verdict == "FAIL: the loss before any update is nan: nothing to measure"


@pytest.mark.slow
@pytest.mark.subprocess
def test_options_import_no_torch():
    """`torchdiag --help` must not import torch: the package and its Options are torch-free."""
    import subprocess
    import sys

    code = ("import sys; from torchdiag.diagnostics.lr_find import Options, options, rules; Options(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("losses,want,recommended", [
    # 0.1×, 1×, 10× — the suggestion diverges: lr-too-high, 0.1× recommended
    (([5, 4, 3, 2], [5, 9, 20, 50], [5, 50, 500, float("nan")]), {"lr-too-high"}, 0.1),
    # 0.1× clearly faster than a slow suggestion: lr-too-high
    (([5, 3, 1.5, 1.0], [5, 4.9, 4.8, 4.7], [5, 50, 500, 900]), {"lr-too-high"}, 0.1),
    # 10× clearly faster and stable: info lr-too-low, 10× recommended
    (([5, 4.9, 4.8, 4.7], [5, 4.5, 4.0, 3.5], [5, 2.0, 1.0, 0.5]), {"lr-too-low"}, 10.0),
    # the suggestion spikes back above its start: lr-unstable, the stable 0.1× recommended
    (([5, 4.5, 4.0, 3.5], [5, 2.0, 6.0, 1.0], [5, 50, 500, 900]), {"lr-unstable"}, 0.1),
    # nothing trains: the error
    (([5, 5, 5, 5], [5, 5, 5, 5], [5, 6, 7, 8]), {"no-rate-trains"}, None),
])
def test_checked_findings_from_what_the_losses_did(losses, want, recommended):
    from torchdiag.diagnostics.lr_find.report import _check_findings
    from torchdiag.results import Result

    s = rules.Suggestion("ok", 1e-3, (1e-3, 1e-3), {}, 1, tol=0.01)
    checks = [rules.judge(rules.Check(f, f * 1e-3, [float(v) for v in ls]), s.tol, 4.0)
              for f, ls in zip((0.1, 1.0, 10.0), losses)]
    best = rules.pick(checks, s.tol)
    r = Result("lr-find")
    _check_findings(r, s, checks, best, Options(check_steps=3))
    assert set(codes(r)) == want
    assert (best.factor if best else None) == recommended
    assert r.exit_code == (1 if "no-rate-trains" in want else 0)


def test_a_nan_in_the_batch_is_blamed_on_the_data_not_the_model(tmp_path, cli):
    """A sweep: a NaN in one input sample gave `non-finite-loss` with the hint to run nancheck on the model."""
    path = tmp_path / "nanb.py"
    path.write_text("import torch, torch.nn as nn\n"
                    "def build():\n    torch.manual_seed(0)\n    return nn.Linear(4, 3)\n"
                    "def batch():\n    x = torch.randn(8, 4)\n    x[3, 1] = float('nan')\n"
                    "    return (x,), torch.randint(0, 3, (8,))\n")
    r = cli("lr-find", f"{path}:build", "--batch", f"{path}:batch", "--json")
    (f,) = [f for f in r.json["findings"] if f["code"] == "non-finite-loss"]
    assert r.code == 1 and "the batch itself holds NaN/Inf (input[0])" in f["message"] and "data" in f["hint"], f


def test_a_divergence_at_the_ranges_last_rate_is_not_said_as_stopped_early():
    """A sweep: a repeat that diverged at its 15th update of 15, at --max-lr itself, read "stopped early (diverged) at
    lr 10: above that the loss blows up": it took every update, and nothing above the range was tried."""
    model, inputs = load("mlp.py:build")
    r = lr_find(model, inputs, steps=15, max_lr=0.3, repeats=1, check_steps=5)
    (f,) = [f for f in r.findings if f.code == "diverges-above"]
    assert r.data["diverged_at_lr"] == [pytest.approx(0.3)], r.data["diverged_at_lr"]
    assert "stopped early" not in f.message and "the range's last rate, lr 0.3" in f.message, f.message
