"""A loss of both signs (a sweep's REINFORCE runs): per-episode policy-gradient losses, -5.8 for a failed episode and
+7..+30 for a success, read an ordinary success as a 30x `loss-spike` against a median of 0.92; and a converged
policy's rare exploratory step (its gradient norm 1000x a median near 0, back the next step) was a
`grad-norm-explosion`, "felt" through the noise of that signed loss. Ratios and relative rises mean nothing for such
a loss (below 0 at a quarter of the steps or more): no spike is judged on it, and a norm spike is felt only by the
norms staying up or a non-finite loss. A loss below 0 now and then is judged as before. The
same curves shifted to positive values keep their findings."""
import math
import random

import pytest

from torchdiag.diagnostics.watch import report
from torchdiag.diagnostics.watch.options import Options
from torchdiag.results import Result


def _episodes(shift: float) -> list[float]:
    """300 per-episode losses: failures at -5.8 and successes over 7..12 in turn, a long run of failures (steps
    80-169) and then half and half, so that the spread of the windows before step 200 is the failures' (none) and
    the median of the last window sits between the two (0.9 or so, as the sweep's 0.92); at step 200 a success of
    27.4, lower than one at step 4. `shift` moves them all."""
    rng = random.Random(2)
    values = [-5.8 if k % 2 else rng.uniform(7, 12) for k in range(300)]
    values[79:169] = [-5.8] * 90
    values[3], values[199] = 29.9, 27.4
    return [v + shift for v in values]


@pytest.mark.parametrize("shift", [0.0, 5.9], ids=["signed", "positive"])
def test_no_loss_spike_is_judged_on_a_loss_of_both_signs(shift):
    r = Result("watch")
    values = _episodes(shift)
    report._loss_curve(r, list(enumerate(values, 1)), {}, Options())
    spikes = [f for f in r.findings if f.code == "loss-spike"]
    assert (len(spikes) == 1 and "at step 200 " in spikes[0].message) if shift else not spikes, \
        [f.message for f in r.findings]


@pytest.mark.parametrize("shift", [0.0, 10.0], ids=["signed", "positive"])
def test_a_norm_spike_is_not_felt_through_a_signed_losss_noise(shift):
    """The norms: ~1e-4 (a converged policy), one 0.19 at step 200, back at once. The loss: signed noise around 0
    with a jump at step 203 that a positive loss of the same shape would feel (it stays a warning there)."""
    rng = random.Random(0)
    norms = [1.7e-4 * (1 + 0.2 * rng.random()) for _ in range(300)]
    norms[199] = 0.19
    losses = [0.02 * math.sin(i) + rng.gauss(0, 0.01) + shift for i in range(300)]
    for k in range(202, 206):
        losses[k] += 0.5 if not shift else 5.0
    steps = list(range(1, 301))
    r = Result("watch")
    r.series.update(step=steps, loss=losses)
    report._grad_norm_explosion(r, steps, norms, list(zip(steps, losses)), Options())
    found = [f for f in r.findings if f.code == "grad-norm-explosion"]
    assert (len(found) == 1 and "at step 200 " in found[0].message) if shift else not found, \
        [f.message for f in r.findings]


def test_a_norm_spike_before_the_run_went_non_finite_is_said_not_a_crash():
    """A review: a finite norm spike at step 120, NaN from step 121 on, the loss too: the spike was the last finite
    norm, yet not the run's last step, and the end of the run raised StatisticsError (the median of no norms after it)
    out of the user's `with` block."""
    norms = [0.8 + 0.05 * math.sin(i) for i in range(160)]
    losses = [0.5 + 0.02 * math.cos(i) for i in range(160)]
    norms[119], losses[119] = 4385.0, 2759.0
    for k in range(120, 160):
        norms[k] = losses[k] = math.nan
    steps = list(range(1, 161))
    r = Result("watch")
    r.series.update(step=steps, loss=losses)
    report._grad_norm_explosion(r, steps, norms, list(zip(steps, losses)), Options())
    found = [f for f in r.findings if f.code == "grad-norm-explosion"]
    assert len(found) == 1 and "at step 120 " in found[0].message


def test_a_loss_that_dips_below_zero_now_and_then_is_still_judged():
    """A review: a Gaussian NLL near its optimum (-0.11..0.30, below 0 at a few steps) knocked to 82.8 by a corrupted
    batch lost both warnings to one negative value. Below 0 at under a quarter of the steps, it is judged as before."""
    rng = random.Random(0)
    losses = [0.1 + 0.08 * rng.gauss(0, 1) for _ in range(160)]
    assert 0 < sum(v < 0 for v in losses[:119]) < 0.25 * 119
    norms = [0.86 * (1 + 0.1 * rng.random()) for _ in range(160)]
    losses[119], norms[119] = 82.8, 135.5
    for k in range(120, 135):   # knocked off: the loss stays up for a while
        losses[k] = 2.0 - 0.05 * (k - 120)
    steps = list(range(1, 161))
    r = Result("watch")
    r.series.update(step=steps, loss=losses)
    report._loss_curve(r, list(zip(steps, losses)), {}, Options())
    report._grad_norm_explosion(r, steps, norms, list(zip(steps, losses)), Options())
    said = {f.code for f in r.findings if f.severity == "warning"}
    assert {"loss-spike", "grad-norm-explosion"} <= said, [f.message for f in r.findings]
