"""The rules lr-find reads its curves with: torch-free, on plain lists, so each can be tested by hand.

The range test (one repeat) gives the loss L0 before any update and, for each update k at rate lr_k, the
loss L_k right after it: the pairs (lr_k, L_k) say what each rate did. Two smoothings:

- online, for the early stop: a debiased exponential moving average (EMA_BETA) of L_k; a repeat stops when
  it exceeds `diverge` × its best value (fastai's rule, default 4) or a loss is non-finite. It must decide
  as it goes, so it lags; it only decides when to stop.
- afterwards, for the rules: a centred moving median over [L0, L_0, L_1, …] (half-width steps // 30, at
  least 1). It has no lag, and a median ignores a lone spike (an early spike does not fool the rules).

Noise: σ = 1.4826 × the median |second difference| / √6 of the raw losses up to the last point where the
smoothed loss is still at or below its start (a robust standard deviation of the scatter around a smooth
trend; a falling trend barely enters it, the blow-up at the top of the range is left out). A change is meaningful when it exceeds tol = max(3σ, 1% of |start|), start = the smoothed L0.

Per repeat: `fall` = start − the smoothed minimum. The curve is
  ok     — fall > tol (some rate reduced the loss);
  rises  — not ok, and the smoothed loss rose above start by more than tol, or the repeat was stopped
           (diverged or non-finite): no rate in the range reduced the loss and some made it worse;
  noise  — not ok and not rising, and 3σ > 1% of |start| (whatever moved is within the noise);
  flat   — otherwise (nothing moved: the range is too low, or the model does not respond).

The point rules, each an index into the curve (shown side by side):
  valley   — the descent runs from the first point where the smoothed loss has fallen by 10% of `fall`, and by
             more than 3σ, to the minimum; the suggestion is its middle (in log lr). fastai's default `valley` also takes the
             middle of its longest falling stretch (start + ½ of its length) but finds that stretch as the
             longest decreasing subsequence of the raw losses; on one fixed batch the loss falls by tiny
             steps from the very first rate, so that stretch would start at min_lr.
  steepest — the most negative slope d(smoothed loss)/d(log lr), central differences, up to the minimum.
  min/10   — the rate at the smoothed minimum, divided by 10.
The suggestion is the valley rule: the median (in log) of its values over the repeats that are `ok`, with
the band [min, max] over them; at least half the repeats must be ok, else there is no suggestion.

The checked runs (`judge`, `pick`): see their docstrings."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

EMA_BETA = 0.9          # the early stop's moving average
START_READS = 3         # ... compared with the loss before the first update from this many losses on
NOISE_K = 3.0           # a change is meaningful above NOISE_K σ …
MIN_REL = 0.01          # … and above 1% of the starting loss
VALLEY_FROM = 0.1       # the descent starts where 10% of the fall is done
GIVE_BACK = 0.25        # a checked run that gives back > 25% of its progress is unstable
CLEAR = 0.1             # one checked rate beats another clearly: 10% more of the fall (and > tol)
RANGE_K = 2.5           # a checked run's rise is the forward's own draws' up to RANGE_K σ √(2 ln n) (judge)
RULES = ("valley", "steepest", "min/10")


def schedule(min_lr: float, max_lr: float, steps: int) -> list[float]:
    """lr_k = min_lr × (max_lr / min_lr) ** (k / (steps − 1)): geometric, both ends included."""
    ratio = max_lr / min_lr
    return [min_lr * ratio ** (k / (steps - 1)) for k in range(steps)]


class EarlyStop:
    """The online stop of one repeat: feed each loss; `update` says why to stop, or None."""

    def __init__(self, diverge: float, beta: float = EMA_BETA, start: float = math.inf):
        """`start`: the loss before the first update. A blow-up at once is measured from it (a sweep: Adam at lr 1
        took a digits MLP from 2.3 to 6255 at its first update and back down; measured from that first update only,
        nothing diverged, and the fall after it read as "still falling at max_lr": raise it): the average of the
        first START_READS losses or more above diverge² × start. One raw draw against another is noise where the
        forward draws (a review: dropout 0.5 on a part-trained MLP, draws 5.7x apart with no update at all)."""
        self.diverge, self.beta = diverge, beta
        self.avg, self.n, self.best = 0.0, 0, math.inf
        self.start = start if math.isfinite(start) else None
        self.smoothed: list[float] = []

    def update(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return "non-finite"
        self.n += 1
        self.avg = self.beta * self.avg + (1 - self.beta) * loss
        value = self.avg / (1 - self.beta ** self.n)          # debiased
        self.smoothed.append(value)
        self.best = min(self.best, value)
        blown = self.start is not None and self.n >= START_READS and exceeds(value, self.start, self.diverge ** 2)
        # over the first START_READS the average is of one or two draws: diverge² there too (a review: dropout on a
        # part-trained MLP, its second loss 4x its first at lr 1.2e-7, "diverged", and exit 1)
        factor = self.diverge if self.n >= START_READS else self.diverge ** 2
        return "diverged" if blown or exceeds(value, self.best, factor) else None


def exceeds(value: float, best: float, factor: float) -> bool:
    """value > factor × best for a positive best; for a best ≤ 0 (a loss that can go negative), a rise
    above best of (factor − 1) × |best| (never for best == 0 with value == 0)."""
    if best > 0:
        return value > factor * best
    return value - best > (factor - 1) * abs(best) and value > best


def centred_median(values: list[float], half: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = sorted(values[max(0, i - half): i + half + 1])
        m = len(window)
        out.append(window[m // 2] if m % 2 else 0.5 * (window[m // 2 - 1] + window[m // 2]))
    return out


def half_width(steps: int) -> int:
    return max(1, steps // 30)


@dataclass
class Analysis:
    """One repeat's curve read by the rules (indices into lrs/smooth)."""

    status: str                     # ok | rises | noise | flat
    start: float                    # the smoothed L0
    smooth: list[float]             # smoothed L_k, one per lr run
    sigma: float
    tol: float
    fall: float
    rise: float
    min_index: int | None
    rules: dict[str, float | None] = field(default_factory=dict)   # rule -> lr
    descent_from: int | None = None      # index where the descent starts (valley's start)
    still_falling: bool = False          # the minimum is the last rate tried and the run was not stopped
    falls_at_once: bool = False          # already 10% of the fall done at the first rate


def analyse(lrs: list[float], initial: float, losses: list[float], steps: int, stopped: str | None) -> Analysis:
    """The rules on one repeat: `losses[k]` is the loss after the update at `lrs[k]` (finite values only:
    the loop stops before a non-finite one), `stopped` why the repeat ended early (None: ran to max_lr)."""
    n = min(len(lrs), len(losses))
    lrs, losses = lrs[:n], losses[:n]
    ys = [initial] + losses
    sm = centred_median(ys, half_width(steps))
    start, smooth = sm[0], sm[1:]
    if not smooth:
        return Analysis("rises" if stopped else "flat", start, [], 0.0, MIN_REL * abs(start), 0.0, 0.0, None,
                        {r: None for r in RULES})
    m = min(range(n), key=lambda i: smooth[i])
    # over the curve up to where it climbs above its start for good: the blow-up's curvature is not noise
    last = max([m] + [i for i in range(n) if smooth[i] <= start])
    sigma = noise(ys[:last + 3])
    tol = max(NOISE_K * sigma, MIN_REL * abs(start), 1e-12)
    fall, rise = start - smooth[m], max(smooth) - start
    if fall > tol:
        status = "ok"
    elif rise > tol or stopped:
        status = "rises"
    elif NOISE_K * sigma > MIN_REL * abs(start):
        status = "noise"
    else:
        status = "flat"
    a = rules = None
    if status == "ok":
        # the descent starts where the loss is below its start by 10% of the fall and by more than the noise: a
        # dropout net's draws (σ 0.11 on a loss of 1.5) dipped below 10% of the fall on the plateau 200x below
        # where it falls (a sweep)
        a = next(i for i in range(m + 1) if smooth[i] <= start - max(VALLEY_FROM * fall, NOISE_K * sigma))
        rules = {"valley": lrs[(a + m) // 2], "steepest": lrs[steepest(lrs, smooth, m)], "min/10": lrs[m] / 10}
    return Analysis(status, start, smooth, sigma, tol, fall, rise, m, rules or {r: None for r in RULES}, a,
                    still_falling=status == "ok" and m == n - 1 and stopped is None,
                    falls_at_once=status == "ok" and a == 0)


def noise(ys: list[float]) -> float:
    """σ of the scatter around a smooth trend: 1.4826 × median |second difference| / √6 (white noise of
    variance σ² gives second differences of variance 6σ²; a smooth trend gives almost none)."""
    d2 = sorted(abs(ys[i + 1] - 2 * ys[i] + ys[i - 1]) for i in range(1, len(ys) - 1))
    return 1.4826 * d2[len(d2) // 2] / math.sqrt(6) if d2 else 0.0


def steepest(lrs: list[float], smooth: list[float], upto: int) -> int:
    """The index of the most negative slope of the smoothed loss against log lr, up to `upto`."""
    if upto < 1:
        return 0
    logs = [math.log(v) for v in lrs]

    def slope(i):
        lo, hi = max(0, i - 1), min(len(lrs) - 1, i + 1)
        return (smooth[hi] - smooth[lo]) / (logs[hi] - logs[lo])

    return min(range(upto + 1), key=slope)


def log_median(values: list[float]) -> float:
    logs = sorted(math.log(v) for v in values)
    k = len(logs)
    mid = logs[k // 2] if k % 2 else 0.5 * (logs[k // 2 - 1] + logs[k // 2])
    return math.exp(mid)


# --- the checked runs --------------------------------------------------------------------------------

@dataclass
class Check:
    """One checked run at a constant rate: losses[0] before any update, losses[k] after k updates."""

    factor: float                   # of the suggestion: 0.1, 1 or 10
    lr: float
    losses: list[float]
    final: float = math.nan
    diverged: bool = False
    unstable: bool = False
    trained: bool = False
    rebound: float = 0.0
    progress: float = 0.0


def judge(c: Check, tol: float, diverge: float, start: float = 0.0, end: float = 0.0) -> Check:
    """What the losses of a checked run did (L0 = losses[0]; final = the mean of the last max(1, n // 10)
    losses, n the number of losses). `start`, `end`: the standard deviation of the loss over forwards with no
    update at the starting weights and at the run's last ones (0 for a deterministic forward: a dropout net's
    draws differ). A rise is a fault only beyond what the draws alone make:
      diverged — a loss is non-finite, or final > L0 + NOISE_K σ √(1 + 1/k), σ = start: it ended above where it
                 started, beyond the noise of one draw against a mean of k (a dropout net's L0 is one draw, and a
                 rate that cannot move the weights ended 0.13 above it; the end's scatter is a blown-up run's own,
                 15 on a loss of 46; σ = 0 for a deterministic forward, judged as before);
      unstable — not diverged, and at some step it gave back more than 25% of the progress made so far
                 (the rise above the lowest earlier loss, compared with L0 − that lowest loss) and more than
                 max(tol, RANGE_K σ √(2 ln n)), σ = max(start, end) (past the range n draws reach: a rise from the
                 lowest of them to a later one is the largest gap among them), or a loss exceeded `diverge` × L0 (the range
                 test's stop rule) before it came back down; a rise before any progress (within tol of L0)
                 is compared with the whole run's progress instead (a ViT's first Adam update lifted its
                 loss 3% on the way to a 98% fall: not a run that gives its progress back);
      trained  — not diverged and L0 − final > tol."""
    ls = c.losses
    l0 = ls[0]
    k = max(1, len(ls) // 10)
    finite = all(math.isfinite(v) for v in ls)
    c.final = sum(ls[-k:]) / k if finite else math.nan
    # (trained is judged by tol alone: a fall needs no more evidence than a deterministic run's)
    c.diverged = not finite or c.final > l0 + NOISE_K * start * math.sqrt(1 + 1 / k)
    # 2.5 where the range's mean is ~2: σ is estimated from DRAWS forwards, and an estimate low by a quarter made one
    # run in 12 "unstable" at a dropout net's suggestion (a review)
    noise = max(tol, RANGE_K * max(start, end) * math.sqrt(2 * math.log(len(ls))))
    c.unstable = not c.diverged and any(exceeds(v, l0, diverge) for v in ls[1:])
    if not c.diverged:
        low, whole = ls[0], l0 - min(ls)
        for v in ls[1:]:
            back = v - low
            made = l0 - low if l0 - low > tol else whole
            if back > noise and back > GIVE_BACK * made:
                c.unstable = True
            c.rebound = max(c.rebound, back)
            low = min(low, v)
        c.progress = l0 - c.final
        c.trained = c.progress > tol
    return c


def clearly_better(a: Check, b: Check, tol: float) -> bool:
    """a trained clearly faster than b: b did not train (and a did), or a's final loss is lower by more
    than tol and by more than 10% of a's own progress."""
    if not a.trained:
        return False
    if not b.trained:
        return True
    gap = b.final - a.final
    return gap > tol and gap > CLEAR * a.progress


def pick(checks: list[Check], tol: float, ceiling: float | None = None) -> Check | None:
    """The recommended rate: the suggestion (factor 1), unless a stable run at another factor trained
    clearly faster (then the clearly fastest stable one); a diverged or unstable suggestion gives way to
    any stable run that trained; None when no run trained. `ceiling`: the rate from which the range test's loss
    climbed for good as the rate grew; a stable suggestion does not give way to a rate above it (a sweep: a post-LN
    transformer whose 10x, past that point, memorised its one batch faster in 30 updates and learned nothing in 300
    on fresh batches, where the suggestion's neighbourhood reached 99.6%)."""
    base = next(c for c in checks if c.factor == 1)
    stable = [c for c in checks if c.trained and not c.unstable]
    if base in stable and ceiling is not None:
        stable = [c for c in stable if c.lr <= ceiling * (1 + 1e-6) or c is base]
    if not stable:
        trained = [c for c in checks if c.trained]
        return min(trained, key=lambda c: c.final) if trained else None
    best = min(stable, key=lambda c: c.final)
    if base in stable and (best is base or not clearly_better(best, base, tol)):
        return base
    return best


# --- the repeats together ----------------------------------------------------------------------------

@dataclass
class Suggestion:
    """The repeats read together: `status` ok (a suggestion), rises, noise, flat or split (fewer than half
    the repeats ok); per rule (median, low, high) over the ok repeats."""

    status: str
    lr: float | None = None
    band: tuple[float, float] | None = None
    rules: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    ok: int = 0
    tol: float = 0.0                # the largest noise level of the ok repeats (the checked runs use it)

    @property
    def band_ratio(self) -> float | None:
        return None if self.band is None else self.band[1] / self.band[0]

    @property
    def rule_ratio(self) -> float | None:
        """max / min over the rules' medians: how far the point rules disagree."""
        meds = [v[0] for v in self.rules.values()]
        return max(meds) / min(meds) if meds else None


def combine(analyses: list[Analysis]) -> Suggestion:
    ok = [a for a in analyses if a.status == "ok"]
    if 2 * len(ok) < len(analyses) or not ok:
        statuses = [a.status for a in analyses]
        if ok:
            status = "split"
        elif "rises" in statuses:
            status = "rises"
        elif "noise" in statuses:
            status = "noise"
        else:
            status = "flat"
        return Suggestion(status, ok=len(ok), tol=max((a.tol for a in analyses), default=0.0))
    rules = {}
    for rule in RULES:
        values = [a.rules[rule] for a in ok]
        rules[rule] = (log_median(values), min(values), max(values))
    lr, low, high = rules["valley"]
    return Suggestion("ok", lr, (low, high), rules, len(ok), max(a.tol for a in ok))
