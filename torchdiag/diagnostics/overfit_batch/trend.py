"""Where the loss curve is heading when the step budget runs out short of the target, judged from the
curve's own recent trend (torch-free: plain floats).

On the running minimum m (robust to the noise of Adam's oscillations), with a window w of the last
fifth of the steps taken (n):
- the recent rate r = (m[n-w] - m[n]) / w per step, and the drop still needed, need = m[n] - goal;
- plateau: the best loss fell by less than PLATEAU_REL of itself over the last window (it stopped
  improving);
- levelling off: the last window's drop is less than LEVEL × the window's before it (the decrease
  shrinks geometrically), and the geometric sum of what is left, d2·ρ/(1-ρ), falls short of `need`:
  the loss is settling on a floor above the target;
- falling: otherwise. The steps still needed are projected from the same trend: geometrically when
  the decrease shrinks (ρ < 1), linearly (r per step) when it does not; either way an estimate.

Fewer than MIN_STEPS steps carry no trend ("short"); a loss already under the goal (the accuracy
part of the target unmet) is "unknown": the trend of the loss says nothing of the accuracy."""
from __future__ import annotations

import math
from dataclasses import dataclass

MIN_STEPS = 20      # below this, no trend is judged
PLATEAU_REL = 1e-3  # plateau: the best loss fell by less than 0.1% of itself over the last fifth of the run
LEVEL = 0.5         # levelling off: each window's drop at most LEVEL × the one before it


@dataclass
class Trend:
    kind: str                     # "falling", "plateau", "levelling", "short", "unknown"
    to_go: int | None = None      # falling: projected further steps to the target
    floor: float | None = None    # levelling: where the loss is heading
    rate: float = 0.0             # the recent drop of the best loss per step
    slowing: bool = False         # falling, though its slowing (geometric) trend would stop short of the target:
                                  # the linear projection is what says it gets there

    @property
    def falling(self) -> bool:
        return self.kind == "falling"


CONSTANT_TIMES = 10.0   # the yardstick at most this many times the made-up target's constant fit (loop.Curve.yardstick)


def goal_of(initial: float, opts) -> float:
    """The loss the target asks for: the larger of target_ratio × initial and target_loss (either reaches it)."""
    goal = opts.target_ratio * initial if initial >= 0 else -math.inf
    if opts.target_loss is not None and opts.target_loss < 0:   # a loss below 0 is judged by that target alone
        return opts.target_loss
    return max(goal, opts.target_loss) if opts.target_loss is not None else goal


def judge(losses: list[float], goal: float) -> Trend:
    """The trend of `losses` (losses[0] the initial loss, one per step after) toward `goal`."""
    n = len(losses) - 1
    if n < MIN_STEPS or not all(math.isfinite(v) for v in losses) or not math.isfinite(goal):
        return Trend("short")
    best, m = math.inf, []
    for v in losses:
        best = min(best, v)
        m.append(best)
    w = n // 5
    need = m[n] - goal
    if need <= 0:
        return Trend("unknown")
    d2, d1 = m[n - w] - m[n], m[n - 2 * w] - m[n - w]
    rate = d2 / w
    if d2 <= PLATEAU_REL * abs(m[n - w]):
        return Trend("plateau", rate=rate)
    rho = d2 / d1 if d1 > 0 else math.inf
    if rho < 1:
        left = d2 * rho / (1 - rho)           # what the geometric trend still has to give
        if rho <= LEVEL and left < need:
            return Trend("levelling", floor=m[n] - left, rate=rate)
        if left > need:                       # windows k with d2·(ρ + … + ρ^k) = need
            k = math.log(1 - need * (1 - rho) / (d2 * rho)) / math.log(rho)
            return Trend("falling", to_go=max(1, math.ceil(k * w)), rate=rate)
        return Trend("falling", to_go=max(1, math.ceil(need / rate)), rate=rate, slowing=True)
    return Trend("falling", to_go=max(1, math.ceil(need / rate)), rate=rate)
