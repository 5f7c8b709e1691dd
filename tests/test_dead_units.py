"""gradflow dead-units (issue 14, bench/corpus-findings.md item 6): a module flagged on a small or
alike batch is re-judged on fresh, different samples (diagnostics/gradflow/dead.py). Units that are 0
for both samples of a batch of 2 only by chance are info, not a warning; really dead units (bias
-1e3, far below zero on any input) stay a warning with their exact count."""
import pytest
import torch
from torch import nn

from torchdiag.api import run as api_run
from torchdiag.core.fresh import MIN_SAMPLES, fresh_tensor


def run(model, *args, **opts):
    return api_run("gradflow", model, tuple(args), **opts)


def by_module(res, name):
    return next(r for r in res.table("activations").rows if r["module"] == name)


def findings(res, code="dead-units"):
    return [(f.severity, f.where) for f in res.findings if f.code == code]


def alike_layer(dead_rows: int = 20, units: int = 32, inputs: int = 8):
    """Linear(8, 32) → ReLU with Gaussian rows (bias 0) and two alike samples; the sign of each row is
    chosen so that exactly `dead_rows` units are negative for both samples: a healthy layer whose
    units are 0 on this batch by chance (a row and its negative are equally likely under the init)."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(inputs, generator=g)
    x = torch.stack([v, v + 0.05 * torch.randn(inputs, generator=g)])
    w = torch.randn(units, inputs, generator=g) / inputs ** 0.5
    s = (x @ w.T).sum(0).sign()                  # the sign each row has on the batch
    w = w * s[:, None]                           # every unit positive on the batch ...
    w[:dead_rows] *= -1                          # ... then `dead_rows` of them negative
    model = nn.Sequential(nn.Linear(inputs, units), nn.ReLU(), nn.Linear(units, 2))
    with torch.no_grad():
        model[0].weight.copy_(w)
        model[0].bias.zero_()
    return model, x


def test_units_zero_by_chance_at_batch_2_are_not_a_warning(untouched):
    model, x = alike_layer()
    pre = model[0](x).detach()
    both_zero = int((pre <= 0).all(0).sum())     # the batch's own count, by plain torch
    assert both_zero == 20 and both_zero / 32 > 0.5   # over the threshold on this batch
    with untouched(model):
        res = run(model, x, strict=True)
    row = by_module(res, "1")
    assert row["dead_units"] == 20 and row["units"] == 32 and row["dead_fraction"] == 20 / 32
    assert row["dead_samples"] == 2 + MIN_SAMPLES
    assert row["dead_confirmed"] <= 16           # at most the threshold on the re-check
    assert findings(res) == [("info", "1")]
    assert "by chance" in next(f.message for f in res.findings if f.code == "dead-units")
    assert res.exit_code == 0                    # strict: a warning would fail


def test_really_dead_units_stay_a_warning_with_their_count():
    model, x = alike_layer()
    with torch.no_grad():
        model[0].bias[:20] = -1e3                # 20 units pushed far below zero
    res = run(model, x)
    row = by_module(res, "1")
    assert row["dead_units"] == 20 and row["dead_confirmed"] == 20 and row["dead_samples"] == 18
    assert findings(res) == [("warning", "1")]
    msg = next(f.message for f in res.findings if f.code == "dead-units")
    assert "20 (62.5%) stay dead on 18 samples" in msg
    assert run(model, x, strict=True).exit_code == 1


def test_batch_of_one_conv_is_rejudged(untouched):
    # batch 1: every output position is a unit seen once; a zero-bias conv on noise is 0 at about half
    # of them. Conv → BatchNorm → ReLU in train mode: the re-check must not leave running stats changed.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        pre = model[1](model[0](x))              # train-mode BN of one sample: per channel mean 0
    zero = int((pre <= 0).sum())
    with untouched(model):
        res = run(model, x, dead=0.4)
    row = by_module(res, "2")
    assert row["dead_units"] == zero and row["units"] == 8 * 8 * 8 and zero / 512 > 0.4
    assert row["dead_samples"] == 1 + MIN_SAMPLES and row["dead_confirmed"] / 512 <= 0.4
    assert findings(res) == [("info", "2")]


def test_allowed_module_is_not_rejudged():
    model, x = alike_layer()
    res = run(model, x, allow=["1"])
    assert findings(res) == [("info", "1")] and by_module(res, "1")["dead_samples"] is None
    assert "accepted by allow" in next(f.message for f in res.findings if f.code == "dead-units")


def test_fresh_inputs_keep_ranges_and_differ_per_sample():
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([[5, 9, 7], [6, 5, 8]])
    got = fresh_tensor(ids, g)
    assert got.dtype == ids.dtype and got.shape == ids.shape and got.min() >= 5 and got.max() <= 9
    ones = torch.ones(2, 3, dtype=torch.long)
    assert torch.equal(fresh_tensor(ones, g), ones)               # an all-ones mask stays all ones
    flags = torch.tensor([True, False])
    assert fresh_tensor(flags, g) is flags
    img = torch.randn(64, 3, 16, 16, generator=g) * 2 + 1
    new = fresh_tensor(img, g)
    assert new.shape == img.shape and new.dtype == img.dtype
    assert float(new.mean()) == pytest.approx(1.0, abs=0.5)
    # the per-sample channel offsets make sample means differ far more than plain noise would
    assert float(new.mean((2, 3)).std()) > 10 * float(img.mean((2, 3)).std())


def test_relu6_zero_side_is_not_saturation():
    # MobileNetV2 (ReLU6 after BatchNorm) warned "saturated" on 11 layers at 50.0-50.6%: the zeros were
    # counted as saturation. Saturation of ReLU6 is its flat top (y >= 6); its zeros are the dead-unit question.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU6(), nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(4))
        model[0].bias.zero_()
    x = torch.tensor([[-1.0, -2.0, 7.0, 1.0], [-3.0, 2.0, -1.0, 9.0], [-2.0, -4.0, 0.5, -1.0]])
    res = run(model, x)
    row = by_module(res, "1")
    y = x.clamp(0, 6)
    assert row["zero_fraction"] == pytest.approx(float((y == 0).float().mean()))      # 7 of 12
    assert row["saturated_fraction"] == pytest.approx(float((y >= 6).float().mean()))  # 2 of 12
    assert findings(res, "saturated") == []
    assert findings(run(model, x, saturated=0.1), "saturated") == [("warning", "1")]
