"""Broken, or still opening? (issue 26) A flagged finding (vanishing-grad, zero-grad, param-not-updated,
dead-units, saturated) re-checked by what the model does, not by what its parts are called.

1. A short real training run on a copy (ctx.train_copy, the run's loss and optimizer, the same batch,
   `steps` ≤ MAX_STEPS optimizer steps): each flagged measure is taken before and after. What resolves
   (the gradient crosses the threshold or becomes non-zero, the parameter moves, the units come alive)
   grows out of it: by design. What neither resolves nor grows by GROW stays, and keeps its level.
2. The gate: a parameter that is zero or tiny (RMS below TINY_FACTOR × the model's median parameter
   RMS) at initialisation and that the run grew (at least doubled, or left zero) — a layer scale, a
   skip-init gain, a zero-initialised residual or head. Found by perturbation on a fresh copy at
   initialisation: candidates set to the values the run gave them, the flagged measures taken again; a
   measure that grows by GROW (or resolves) has a gate among them. Candidates are bisected in model
   order, and the group named is confirmed to multiply the path (doubled, the gradient grows by
   PROPORTIONAL or more; an additive bias does not), within GATE_PASSES passes shared by every flag (a
   group is named when the budget ends first). What grew without resolving is by design only with a
   confirmed gate.

3. The longer run: a vanishing gradient the short run left under its threshold, still climbing fast enough
   to cross it within LONG_STEPS at its rate, is measured again after LONG_STEPS steps on a fresh copy. It
   opens (by design) only where that run resolves it and its growth compounds (_compounds): a gradient lifted
   by something else growing about lr a step rises additively and keeps its verdict.

Cost, stated with the result: 1 + steps forward/backward passes of the run and at most GATE_PASSES
more; 1 + LONG_STEPS more only when a gradient is climbing; one read back per pass. The user's model is
never touched (copies only)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import phase, train
from .device import has_float64
from .readback import read_back
from .recording import float_tensors, kinds, saturated
from .scaling import judged_backward
from .tracking import run_forward

STEPS = 3             # optimizer steps of the short training run
MAX_STEPS = 5         # and when an exploding gradient of a gate (a tiny parameter) is among the flags
LONG_STEPS = 10       # the longer run, for a vanishing gradient still climbing towards its threshold (_climbing)
ADDITIVE = 2.0        # the longer run's gradient, at least this x where additive steps would take it (_compounds)
TAIL = 3              # a measure pass's last values: the whole gradient's norm, the output's, the loss
GROW = 10.0           # growth of a flagged measure (or of its response to a gate) that counts
TINY_FACTOR = 1e-2    # a gate candidate's RMS is below this × the model's median parameter RMS (or zero)
PROPORTIONAL = 1.5    # doubling a gate from its trained value multiplies the gated gradient by ≥ this
GATE_PASSES = 10      # forward+backward passes spent naming gates (shared by every flag)
ADAPTIVE = 0.25       # a flagged parameter's RMS step ≥ this × the unflagged median: it trains normally,
ORDINARY = 1e-3       # provided its relative step is ≥ this × the median (a weight of an ordinary scale)
MODERATE = 4.0        # a large grad/weight whose relative step ≤ this × the unflagged median: a normal step,
MAX_RELATIVE = 0.1    # provided it is at most this fraction of the weight's norm per optimizer step,
SAME = 1.5            # or no more than this × the median relative step (the whole model moving that far)
SUSPECT = 1e-6        # a zero-grad back at most this x the whole gradient's norm: is it rounding? (_invariant)
MARGIN = 0.5          # dead units: input max ≤ zero point − MARGIN × the input's std (gradflow/dead.py's rule)
KINDS = ("vanishing-grad", "zero-grad", "param-not-updated", "dead-units", "exploding-grad", "saturated")


@dataclass
class Flag:
    """A finding to re-check: `name` is a parameter (grad kinds) or a module path (dead-units, saturated)."""

    name: str
    kind: str
    threshold: float = 0.0     # vanishing-/exploding-grad: the grad/weight ratio; dead-units, saturated: the fraction
    edge: float = 0.0          # dead-units: the input at or below which the activation outputs 0; saturated: the margin
    by_norm: bool = False      # a parameter tiny by construction: judged by its gradient norm, its step per element
    tiny: bool = False         # tiny by construction itself (a layer scale), not only judged by its norm


@dataclass
class Verdict:
    flag: Flag
    before: float               # the measure at initialisation (dead-units: the dead fraction)
    after: float                # after the run
    resolved: bool              # the finding no longer holds after the run
    grew: bool                  # resolved, or the measure grew by GROW
    gates: list[str] = field(default_factory=list)   # the gate (one name) or the smallest group found
    by_design: bool = False
    update: float = math.nan          # RMS(w_after - w_0) over the run (the run's optimizer): per element
    relative: float = math.nan        # |w_after - w_0| / |w_0|: the step relative to the weight
    median_update: float = math.nan   # the same two, medians over the parameters nothing flagged that moved
    median_relative: float = math.nan
    losses: tuple = (math.nan, math.nan)   # the loss before the run and after it
    output_fall: float = math.nan          # a gate's yardstick: how many times the gradient reaching the outputs fell
    invariant: bool = False     # zero-grad (or not updated) back only at rounding level, the loss independent of it
    rounding: bool = False      # ... back only at rounding level, the loss dependent on it: no gradient came back
    zero_start: bool = False    # the weight was zero at the start: measured by its gradient norm throughout
    steps: int = 0              # the optimizer steps of the run that measured `after`
    at: int = 0                 # measured after this earlier step of the run instead (exploding-grad: earlier_step)
    longer: Verdict | None = None   # the longer run's verdict, where it ran (_climbing)
    opens: bool = False             # the longer run resolved it and its growth compounds: the path opens

    def measure(self) -> str:
        """What `before` and `after` are."""
        k = self.flag.kind
        return ("max |grad|" if k == "zero-grad" else "grad norm" if self.flag.by_norm or self.zero_start
                else "grad/weight")

    def output_said(self) -> str:
        f = self.output_fall
        return f" and the gradient reaching the outputs fell {f:.3g}×" if math.isfinite(f) else ""

    def compared(self) -> bool:
        return math.isfinite(self.median_update) and math.isfinite(self.median_relative)

    def steps_normally(self) -> bool:
        """A small gradient the run's optimizer does not scale its step by (Adam's step is ~lr for any |g|
        well above its eps): per element the parameter moved at least ADAPTIVE × the median step, and relative
        to its weight at least ORDINARY × the median relative step (a weight stored 1e4× larger than it acts
        moves like the rest per element, but that step changes nothing)."""
        return (self.compared() and self.update > 0 and self.update >= ADAPTIVE * self.median_update
                and self.relative >= ORDINARY * self.median_relative)

    def steps_alike(self) -> bool:
        """A large grad/weight of a weight near zero (a scalar bias drawn at -0.002): per element the run's optimizer
        moved it no more than MODERATE × the median step of the others, while the loss fell. Relative to a weight
        that small any step is large; the step itself is the others' (a sweep: a depth net's last bias, ratio 590
        with a gradient of norm 1.1, was an exploding-grad error on a run that trained smoothly)."""
        fell = math.isfinite(self.losses[1]) and self.losses[1] < self.losses[0]
        return fell and ((self.compared() and 0 < self.update <= MODERATE * self.median_update)
                         or self.grew_out())

    def grew_out(self) -> bool:
        """The ratio at least halved as the weight moved at least its own norm (plain SGD: it grew away from zero;
        a review: a gradient that fell with an exploding loss halves the ratio too, the weight unmoved)."""
        return (math.isfinite(self.after) and 0 <= self.after <= self.before / 2 and math.isfinite(self.relative)
                and self.relative >= 1)

    def steps_moderately(self, steps: int) -> bool:
        """A large grad/weight the run's optimizer does not turn into a large step: relative to its weight the
        parameter moved at most MODERATE × the median relative step, and at most MAX_RELATIVE of its norm a step or
        no more than the median parameter did (SAME ×): where the whole model moves that far (a checkpoint's small
        weights under the run's rate), a parameter moving with it is not made to by its gradient (a sweep: a trained
        ConvNeXt's biases, 0.61 of their norm in 3 steps against a median of 0.57, were exploding-grad errors)."""
        return (self.compared() and math.isfinite(self.relative) and self.relative <= MODERATE * self.median_relative
                and (self.relative <= MAX_RELATIVE * steps or self.relative <= SAME * self.median_relative))

    def describe(self) -> str:
        """The measured fact, for the finding's message."""
        k, steps = self.flag.kind, self.steps
        if k in ("dead-units", "saturated"):
            fact = (f"{'dead' if k == 'dead-units' else 'saturated'} fraction {self.before:.0%} at initialisation, "
                    f"{self.after:.0%} after {steps} steps")
        elif k == "param-not-updated":
            fact = (f"gradient norm {self.before:.3g} at initialisation, {self.after:.3g} after {steps} steps "
                    "(at the initial loss level)" + ("; the step then moves it" if self.resolved else ""))
        else:
            what = self.measure()
            level = (" (at the initial loss level)" if k == "vanishing-grad" else
                     f", a {self.before / self.after:.3g}× fall while the loss went {self.losses[0]:.3g} → "
                     f"{self.losses[1]:.3g}{self.output_said()}" if k == "exploding-grad" and self.after > 0 else "")
            when = f"after step {self.at} of {steps}" if self.at else f"after {steps} steps"
            fact = f"{what} {self.before:.3g} at initialisation, {self.after:.3g} {when}{level}"
        if not self.gates:
            return fact + ("; it resolves by itself (no single gate isolated)" if self.resolved else "")
        gate = self.gates[0] if len(self.gates) == 1 else f"one of {', '.join(self.gates[:4])}" + (
            f" … (+{len(self.gates) - 4})" if len(self.gates) > 4 else "")
        return f"{fact}; the gate is {gate}, zero or tiny at initialisation and grown by the run"


@dataclass
class Recheck:
    verdicts: dict[str, Verdict]
    steps: int
    passes: int                 # forward/backward passes spent in all (runs + gate tests)
    candidates: list[str]
    longer: int = 0             # flags given the longer run (LONG_STEPS, on a fresh copy)
    eps: float | None = None    # Adam's eps raised for a float16 copy (half_eps), else None
    invariance: str = ""        # the rounding-level zero gradients not asked for invariance, and why (_invariant)

    def gate_passes(self) -> int:
        return self.passes - self.steps - 1 - (LONG_STEPS + 1 if self.longer else 0)

    def cost(self) -> str:
        again = (f", then {LONG_STEPS} steps on a fresh copy for {self.longer} gradient(s) still climbing towards "
                 "the threshold" if self.longer else "")
        eps = (f" (Adam's eps {self.eps:g}: float16 holds no 1e-8, whose step divides a gradient that vanished "
               "by 0)") if self.eps else ""
        asked = f"; {self.invariance}" if self.invariance else ""
        return (f"re-checked on a copy: {self.steps} optimizer steps on the same batch{again}{eps} and "
                f"{self.gate_passes()} gate test(s), {self.passes} forward/backward passes{asked}")


def recheck(model, inputs, flags: list[Flag], ctx, *, steps: int = STEPS, eval_mode: bool = False,
            prepare: Callable | None = None, passes: int = GATE_PASSES) -> Recheck:
    """Run the short training run and the gate tests for `flags` (see the module doc). `prepare(work)`
    readies each copy as the judged pass was (e.g. stochastic depth off). ModelError propagates (the
    caller keeps its plain verdicts)."""
    # a gate's large start takes longer to settle; a longer run only raises the loss's yardstick for the rest
    # (torchvision ssd300's class head: transient at 3 steps, 18.7x against a 4.7x loss fall at 5)
    gated = any(f.kind == "exploding-grad" and f.tiny for f in flags)
    steps = MAX_STEPS if gated else max(1, min(int(steps), MAX_STEPS))
    with phase.doing(f"re-checking {len(flags)} finding(s) on a copy trained for {steps} steps, and their gates"):
        return _recheck(model, inputs, flags, ctx, steps, eval_mode, prepare, passes)


def _recheck(model, inputs, flags, ctx, steps, eval_mode, prepare, passes) -> Recheck:
    """recheck's runs: the short one, then a longer one for the gradients climbing towards their threshold."""
    rc = _run(model, inputs, flags, ctx, steps, eval_mode, prepare, passes)
    climbing = [v.flag for v in rc.verdicts.values() if _climbing(v)]
    if not climbing:
        return rc
    # measured, not extrapolated: the climb only chooses who gets the longer run (on a fresh copy)
    longer = _run(model, inputs, climbing, ctx, LONG_STEPS, eval_mode, prepare, max(0, passes - rc.gate_passes()))
    for n, lv in longer.verdicts.items():
        v = rc.verdicts[n]
        v.longer, v.opens = lv, lv.by_design and _compounds(v, lv)   # the caller judges the short run first
    rc.passes += longer.passes
    rc.longer = len(climbing)
    return rc


def _climbing(v: Verdict) -> bool:
    """A vanishing gradient the short run left below its threshold, within GROW of it, and growing fast enough to
    cross it within LONG_STEPS at the same rate (mbart's first attention query bias: 1.5e-8 -> 9.6e-8 in 3 Adam
    steps against 1e-7, as its siblings crossed). A gradient lost for good barely grows (a deep sigmoid chain's
    1e-15: x2)."""
    if v.flag.kind != "vanishing-grad" or v.by_design or v.steps >= LONG_STEPS:   # by design: resolved, or a gate
        return False
    # within GROW of its threshold: the zoo rows it clears sat at 0.5-0.96 of it; for one farther off, 11 passes
    # of a large model would be spent on an extrapolation
    if not (v.before > 0 and math.isfinite(v.after) and v.after > v.before and v.after * GROW >= v.flag.threshold):
        return False
    rate = (v.after / v.before) ** (1.0 / v.steps)
    return v.after * rate ** (LONG_STEPS - v.steps) >= v.flag.threshold


def _compounds(short: Verdict, long: Verdict) -> bool:
    """Did the gradient grow over the longer run at least ADDITIVE x faster than steps of one size would take it
    (the short run's rise, (after - before) / steps, added every step)? Something else growing by ~lr a step
    (a small head, behind a fixed 1e-5 factor that never opens: a review's model that cannot learn) lifts it by
    about such steps: 1.37e-8 -> 5.0e-8 in 3 Adam steps, 1.65e-7 at 10 against 1.36e-7 so predicted (x1.2).
    A path that opens compounds: mbart's first query bias 1.5e-8 -> 9.6e-8, then 3.3e-6 against 2.8e-7 (x12)."""
    rise = (short.after - short.before) / short.steps
    if not (short.before > 0 and rise > 0 and long.after > 0):
        return False
    return long.after >= ADDITIVE * (short.before + rise * long.steps)


def _run(model, inputs, flags: list[Flag], ctx, steps: int, eval_mode: bool, prepare, passes: int) -> Recheck:
    """One short training run of `steps` optimizer steps on a fresh copy, and the gate tests (module doc)."""
    work = fresh_copy(model, ctx, eval_mode, prepare, steps=True)
    params = _params(work)
    v0 = {n: p.detach().clone() for n, p in params.items()}
    loss_fn = ctx.loss()
    start = _start_norms(params, flags)
    m0 = _measure(work, inputs, flags, ctx, loss_fn, start)
    optimizer = ctx.optimizer([p for p in params.values() if p.requires_grad])
    eps = half_eps(optimizer)
    mk, moved, run, trail = m0, {}, [], []
    big = [i for i, f in enumerate(flags) if f.kind == "exploding-grad"]
    for k in range(steps):
        last = k == steps - 1
        before = {f.name: params[f.name].detach().clone() for f in flags if last and f.kind == "param-not-updated"}
        train.step(optimizer)
        mk = _measure(work, inputs, flags, ctx, loss_fn, start)
        run.append(mk[-1])     # the loss after each step: did the run diverge?
        if big and not last:   # an exploding gradient at each earlier step, and the outputs': earlier_step
            trail += [mk[i] for i in big] + [mk[-2]]
        # after the next forward: a forward that writes the parameter back has undone the step
        moved = {n: params[n].detach().ne(b).any() for n, b in before.items()}
    cands = _candidates(params, v0)
    stepped = [f for f in flags if f.kind in ("vanishing-grad", "exploding-grad")]
    updates = _updates(params, v0, stepped, {f.name for f in flags})
    read = read_back(m0 + mk + list(moved.values()) + [c[1] for c in cands] + run + updates + trail
                     + list(start.values()))
    zero_start = {n for n, w in zip(start, read[len(read) - len(start):]) if w == 0}
    read = read[:len(read) - len(start)]
    trail, read = read[len(read) - len(trail):], read[:len(read) - len(trail)]
    upd, read = read[len(read) - len(updates):], read[:len(read) - len(updates)]
    losses, read = read[len(read) - len(run):], read[:len(read) - len(run)]
    k = len(flags) + TAIL         # each measure pass ends with the whole gradient's norm, the outputs', the loss
    (q0, (g0, o0, l0)), (qk, (gk, ok, lk)) = [(read[i:i + k - TAIL], read[i + k - TAIL:i + k]) for i in (0, k)]
    out_fall = output_fall(o0, ok)
    mv = dict(zip(moved, read[2 * k:2 * k + len(moved)]))
    grown = [n for (n, _), g in zip(cands, read[2 * k + len(moved):]) if g > 0]
    # the same batch is fitted fast (a loss of 7 falls below 0.2 in one Adam step at batch 2): every
    # gradient shrinks with the loss, so a gradient after the run is compared at the initial loss level
    level = g0 / gk if gk > 0 and math.isfinite(g0 / gk) else 1.0
    fell = loss_fell(l0, losses)
    qk = [b * level if f.kind in ("vanishing-grad", "param-not-updated") else b for f, b in zip(flags, qk)]
    verdicts = {}
    for f, a, b in zip(flags, q0, qk):
        resolved = _resolved(f, b, mv.get(f.name, 0.0))
        if f.kind == "exploding-grad":
            # a tiny parameter's (a gate's) gradient against the outputs'; any other against the loss (review: a
            # gain-3 MLP under Adam at lr 0.05 fell 24x while its logits' gradient fell 1.3x and its loss 10x)
            resolved = resolved and transient(a, b, fell, out_fall if f.tiny else math.nan)
        elif f.kind == "saturated":   # gone as the loss fell below its start (a diverging run also unsaturates)
            resolved = resolved and math.isfinite(fell) and fell > 1
        verdicts[f.name] = Verdict(f, a, b, resolved, resolved or _grew(f, a, b), losses=(l0, lk), steps=steps,
                                   zero_start=f.name in zero_start, output_fall=out_fall if f.tiny else math.nan)
    for j, i in enumerate(big):
        earlier_step(verdicts[flags[i].name], trail[j::len(big) + 1], trail[len(big)::len(big) + 1], o0, l0, losses)
    if upd:
        for i, f in enumerate(stepped):
            v = verdicts[f.name]
            v.median_update, v.median_relative = upd[0], upd[1]
            v.update, v.relative = upd[2 + 2 * i], upd[3 + 2 * i]
    asked, how = _invariant(work, inputs, verdicts, gk, ctx, level)
    used = 1 + steps + asked
    for v in verdicts.values():
        v.by_design = v.resolved        # gone after a few real steps: it grows out of it
    live = [v for v in verdicts.values() if v.grew and v.flag.kind != "exploding-grad"]   # a large gradient has no gate
    if live and grown:
        trained = {n: params[n].detach() for n in grown}
        nonzero = {n for n in grown if bool(v0[n].ne(0).any())}
        used += _name_gates(model, inputs, live, grown, nonzero, trained, ctx, eval_mode, prepare, loss_fn, passes)
    return Recheck(verdicts, steps, used, grown, eps=eps, invariance=how)


def output_fall(o0: float, ok: float) -> float:
    """How many times the gradient reaching the outputs fell from `o0` to `ok` (nan when either is 0, or when it did
    not move at all: a constant gradient, the outputs the loss's own terms, per-sample losses)."""
    fall = o0 / ok if o0 > 0 and ok > 0 else math.nan
    return math.nan if abs(fall - 1.0) <= 1e-6 else fall


def earlier_step(v: Verdict, grads: list[float], outs: list[float], o0: float, l0: float, losses: list[float]) -> None:
    """An exploding gradient the last step left large may have come back at an earlier step: Adam on one batch
    overshoots and returns, so the last step is one draw of an oscillation (torchvision SSD300's head: grad norm 1609
    -> 65453 -> 6.79 -> 92.4 while the loss went 96.6 -> 4858 -> 25.2 -> 22.6; one thread more or fewer moved the
    last value across the yardstick). A step counts where its gradient is back within the threshold and fell GROW x
    further than the loss's best so far (a gate's: than the gradient reaching the outputs) in a run that stayed
    finite and whose last gradient is no larger than the first (a review: one that dipped at step 1 and then grew
    1e4x, the loss 5e6x, had not left the start's level): the step's values then stand for `after`, `at` says which
    step."""
    if v.resolved or not math.isfinite(loss_fell(l0, losses)) or not v.after <= v.before:
        return
    for k, (b, o) in enumerate(zip(grads, outs)):
        fall = output_fall(o0, o) if v.flag.tiny else math.nan
        if _resolved(v.flag, b, 0.0) and transient(v.before, b, loss_fell(l0, losses[:k + 1]), fall):
            v.after, v.at, v.resolved, v.grew, v.losses = b, k + 1, True, True, (l0, losses[k])
            v.output_fall = fall
            return


HALF_EPS = 1e-4   # Adam's eps for a float16 copy: the usual advice for pure float16 training


def half_eps(optimizer) -> float | None:
    """A float16 copy under Adam/AdamW: torch's eps 1e-8 is 0 in float16, so a gradient whose square underflows is
    divided by 0 and the copy's weights go NaN at the first step (a sweep: `gradflow timm:resnet18 --dtype float16`
    called its zero-initialised BatchNorm gains `zero-grad` errors, the re-check's copy broken). The re-check asks
    whether a few real steps open a path, not whether this eps trains: raised to HALF_EPS there (returned), as is."""
    import torch

    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return None
    groups = [g for g in optimizer.param_groups if any(p.dtype == torch.float16 for p in g["params"])]
    for g in groups:
        g["eps"] = max(g["eps"], HALF_EPS)
    return HALF_EPS if groups else None


def _invariant(work, inputs, verdicts: dict, whole: float, ctx, level: float = 1.0) -> tuple[int, str]:
    """A zero gradient that came back from the run at rounding level (max |grad| ≤ SUSPECT × the whole
    gradient's norm) is not an opening when the trained copy's loss does not depend on the parameter at all
    (core/invariance.py, on a float64 copy: a bias before a BatchNorm once its zero-init-last gate opened,
    attention queries over value rows that are all the same): unresolved and `invariant`. Returns the forwards
    it ran (none when nothing is suspect or on mps; when a forward fails, the verdicts stand) and, where the float64
    copy does not fit, that it was not asked, for the note (a review: the refusal was silent, and such a bias was
    called `zero-init`; a float32 copy in its place called a bias the loss reads at 1e-6 `invariant`)."""
    from . import invariance

    # (a param-not-updated's gradient norm was brought to the initial loss's level: its limit is, too; a sweep: gmixer's
    # token-MLP biases, cancelled by the LayerNorms, "moved" by Adam normalising rounding once the zero head opened)
    # one still exactly 0 after the run is asked too (a sweep: timm gcresnext50ts' attention-pooling biases, which its
    # softmax over H×W cancels, came back as rounding in 14 blocks, an `invariant`, and as exactly 0 in 2, an error)
    suspect = [n for n, v in verdicts.items() if v.flag.kind in ("zero-grad", "param-not-updated")
               and (v.resolved or v.after == 0)
               and v.after <= SUSPECT * whole * (level if v.flag.kind == "param-not-updated" else 1.0)]
    if not suspect or not has_float64(ctx.device):
        return 0, ""
    import copy

    import torch

    from .train import NoRoom, room_for_copy

    forwards = [0]
    try:
        room_for_copy(work, "in float64", torch.float64, backward=True, activations=ctx.activation_bytes(torch.float64))
        twin = copy.deepcopy(work).double()
        twin.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        double = inputs.map(invariance.double)
        found = invariance.cancelled(twin, double, suspect, ctx.loss(), ctx)
        rest = [n for n in suspect if n not in found and verdicts[n].after > 0]
        wide = _float64_grads(twin, double, {n: verdicts[n].flag.kind for n in rest}, ctx.loss(), level) if rest else {}
    except NoRoom as exc:
        return 0, f"{len(suspect)} rounding-level zero gradient(s) not asked for invariance ({exc.message})"
    except Exception:      # noqa: BLE001 - a second opinion only: the run's verdicts stand
        return forwards[0], ""
    for n in found:
        v = verdicts[n]
        v.resolved, v.grew, v.invariant = False, False, True
    for n in rest:   # the loss depends on it, and in float64 its gradient all but vanishes: the float32 one was
        # rounding, no path opened (a review: a top-1 MoE router renormalised over its one expert, its gate exactly 1,
        # "resolves by itself" at 5.6e-10; a real tiny gradient, a zero-init path opening, is as large in float64)
        v = verdicts[n]
        if wide.get(n, math.inf) < ROUNDING * v.after:
            v.resolved, v.grew, v.rounding = False, False, True
    return forwards[0], ""


ROUNDING = 1e-3   # a float64 gradient this small beside the float32 one: the float32 one was rounding


def _float64_grads(twin, inputs, kinds: dict[str, str], loss_fn, level: float) -> dict[str, float]:
    """{name: the float64 copy's gradient, measured as the run measured it (Verdict.after: max |grad| of a zero-grad,
    the norm at the initial loss level of a param-not-updated)}: one forward and backward."""
    params = dict(twin.named_parameters())
    for p in twin.parameters():
        p.grad = None
    loss_fn(inputs.call(twin)).backward()
    grads = {n: params[n].grad for n in kinds}
    return {n: 0.0 if g is None else float(g.abs().max()) if kinds[n] == "zero-grad" else float(g.norm() * level)
            for n, g in grads.items()}


# ---- the measures ----------------------------------------------------------------------------------

def fresh_copy(model, ctx, eval_mode: bool = False, prepare: Callable | None = None, steps: bool = False):
    """A training copy of `model` in the judged pass's mode, readied by `prepare` (the user's model untouched); its
    room asked with its gradients, and the optimizer's state where it `steps` (the short training run; the gate
    tests run forward and backward only)."""
    work = ctx.train_copy(model, "to re-check a finding with a short training run", backward=True, steps=steps)
    work.train(not eval_mode)
    if prepare is not None:
        prepare(work)
    return work


def train_steps(work, inputs, ctx, steps: int) -> None:
    """`steps` optimizer steps of the run's optimizer on `work` (a copy), with the run's loss on the batch."""
    optimizer = ctx.optimizer([p for p in work.parameters() if p.requires_grad])
    loss_fn = ctx.loss()
    for _ in range(steps):
        work.zero_grad(set_to_none=True)
        with ctx.seeded(), ctx.autocast():
            loss = loss_fn(run_forward(work, inputs, phase="forward (re-check with a short training run)"))
        train.backward(loss)
        train.step(optimizer)


def _params(work) -> dict:
    return dict({id(p): (n, p) for n, p in work.named_parameters()}.values())


def _start_norms(params: dict, flags) -> dict:
    """The norms at the start of the flagged grad/weight parameters (0-d device tensors, not read)."""
    return {f.name: _real(params[f.name]).norm() for f in flags
            if f.kind in ("vanishing-grad", "exploding-grad") and f.name in params}


def _measure(work, inputs, flags, ctx, loss_fn, start: dict) -> list:
    """One forward + backward: each flag's measure as a 0-d device tensor (read back by the caller).
    Grad kinds: grad/weight (vanishing; the grad norm when the weight was zero at the start, `start`: a zero-init
    bias a few steps later has a norm of ~lr x steps, and dividing by it would call its unchanged gradient grown
    1e3-1e7x), max |grad| (zero-grad), the grad norm (param-not-updated); dead-units: the dead fraction of the
    module's input units; saturated: the saturated fraction of its outputs (core.recording.saturated)."""
    import torch

    modules = dict(work.named_modules())
    acc: dict[str, list] = {}
    handles = []
    for f in flags:
        if f.kind == "dead-units" and f.name in modules:
            def hook(mod, args, name=f.name):
                if args and torch.is_tensor(args[0]) and args[0].is_floating_point():
                    acc.setdefault(name, []).append(args[0].detach().float())
            handles.append(modules[f.name].register_forward_pre_hook(hook))
        if f.kind == "saturated" and f.name in modules:
            def out_hook(mod, args, y, name=f.name, margin=f.edge):
                if torch.is_tensor(y) and y.is_floating_point() and y.numel():
                    yf = y.detach().float()
                    # ReLU6: its zero side is the dead-unit question, as in the finding (gradflow/activations.py)
                    flat = saturated(mod, yf, margin) - ((yf == 0).sum() if "relu" in kinds(mod) else 0)
                    sat, n = acc.setdefault(name, [0, 0])
                    acc[name] = [sat + flat, n + y.numel()]
            handles.append(modules[f.name].register_forward_hook(out_hook))
    work.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            output = run_forward(work, inputs, phase="forward (re-check with a short training run)")
            outs = [t for t in float_tensors(output) if t.requires_grad and t.dim() > 0]   # not a loss it returns
            for t in outs:
                t.retain_grad()
            loss = loss_fn(output)
    finally:
        for h in handles:
            h.remove()

    def again():   # the same forward again, for the fp16 judged backward (its buffers as they were)
        from .guard import leave_no_trace

        with leave_no_trace(work, buffers=True), torch.enable_grad(), ctx.seeded(), ctx.autocast():
            return loss_fn(run_forward(work, inputs, phase="forward (re-check, scaled as a GradScaler's)"))

    judged_backward(loss, ctx, work.parameters(), again)   # under --amp fp16, scaled as its GradScaler would
    params = _params(work)
    zero = torch.zeros((), device=ctx.device)
    whole = [_real(p.grad).pow(2).sum() for p in params.values() if p.grad is not None]
    out = []
    for f in flags:
        if f.kind == "dead-units":
            out.append(_dead_fraction(acc.get(f.name), f.edge) if f.name in acc else zero + 1)
            continue
        if f.kind == "saturated":
            out.append(acc[f.name][0] / acc[f.name][1] if f.name in acc else zero + 1)
            continue
        p = params.get(f.name)
        g = None if p is None else p.grad
        g = g.to_dense() if g is not None and g.is_sparse else g   # a sparse embedding's (no amax on sparse)
        if p is None or g is None:
            out.append(zero)
        elif f.kind == "zero-grad":
            out.append(g.detach().abs().amax().float())
        elif f.kind in ("vanishing-grad", "exploding-grad"):
            gn, wn = _real(g).norm(), _real(p).norm()
            w0 = start.get(f.name, wn)
            # zero at the start: by its norm; a weight written to zero since (a clamp): by its start norm
            out.append(gn if f.by_norm else torch.where(w0 > 0, gn / torch.where(wn > 0, wn, w0), gn))
        else:
            out.append(_real(g).norm())
    out.append(torch.stack(whole).sum().sqrt() if whole else zero)   # the whole gradient's norm,
    head = [_real(t.grad).pow(2).sum() for t in outs if t.grad is not None]
    out.append(torch.stack(head).sum().sqrt() if head else zero)      # the gradient reaching the outputs',
    out.append(loss.detach().float().reshape(()))                      # and the loss, last
    return out


def _real(t):
    """A tensor's magnitudes as float32 (a complex one's moduli: .float() would drop the imaginary part)."""
    t = t.detach()
    return t.abs().float() if t.is_complex() else t.float()


def _dead_fraction(calls, edge: float):
    """Units (input positions) whose max over the batch stays ≤ edge − MARGIN × the input's std."""
    import torch

    x = torch.cat([c.reshape(c.shape[0], -1) if c.dim() >= 2 else c.reshape(1, -1) for c in calls], 1)
    top = x.amax(0)
    std = x.std(correction=0) if x.numel() > 1 else torch.zeros((), device=x.device)
    return (top <= edge - MARGIN * std).float().mean()


def loss_fell(l0: float, losses: list[float]) -> float:
    """How many times the loss fell in the run (start over its lowest), or nan when it never went below its
    start or was not finite at some step. Adam on one batch of 2 overshoots and comes back, so the last step is
    one draw of an oscillation (timm MobileNetV5: 7.2 -> 0.89 -> 5.8 -> 8.8 -> 3.9 -> 0.70; torchvision SSD300:
    95.8 -> 5327 -> 25.2 -> 23.5); a saturated unit's loss never gets below its start."""
    if not (l0 > 0 and math.isfinite(l0) and losses and all(math.isfinite(v) for v in losses)):
        return math.nan
    best = min(losses)
    return l0 / best if 0 < best <= l0 else math.nan


def transient(before: float, after: float, fell: float, output_fall: float = math.nan) -> bool:
    """An exploding gradient that the starting point made: in a run whose loss went below its start
    (loss_fell; a saturated unit's gradient also falls, while the loss rises: tanh(1e5 x): 4.8e4 -> 445 as
    the loss went 1.12 -> 1.9), it fell GROW x further than the loss did (fitting the batch shrinks every
    gradient with the loss), at least GROW x. Compared as measured, not against the whole gradient, which it
    can be most of. `output_fall`, given for a parameter tiny by construction (a gate: its gradient is its
    branch's output times the gradient there, whatever its value): the fall of the gradient reaching the
    model's outputs, which every gradient is linear in, replaces the loss's. For a gate the loss overstates
    it: cross-entropy on a batch of 2 falls 25x in 5 Adam steps while the gradient reaching the logits falls
    ~3x (timm mobilenetv4_hybrid_medium_075's layer scales). For a weight of ordinary size the loss's fall
    stays: a gain-3 MLP that Adam at lr 0.05 repairs fell 24x while its logits' gradient fell 1.3x."""
    base = output_fall if math.isfinite(output_fall) else fell
    return math.isfinite(fell) and after > 0 and before / after >= GROW * max(base, 1.0)


def _resolved(f: Flag, after: float, moved: float) -> bool:
    if f.kind == "zero-grad":
        return after > 0
    if f.kind == "vanishing-grad":
        return after >= f.threshold
    if f.kind == "exploding-grad":
        return after <= f.threshold
    if f.kind in ("dead-units", "saturated"):
        return after <= f.threshold
    return moved > 0


def _grew(f: Flag, before: float, after: float) -> bool:
    if not (math.isfinite(before) and math.isfinite(after)):
        return False
    if f.kind in ("dead-units", "exploding-grad", "saturated"):
        return False           # units either come alive (resolved) or not; a large gradient has no gate
    return after > 0 and (before == 0 or after >= GROW * before)


def _updates(params: dict, v0: dict, stepped: list, flagged: set[str]) -> list:
    """[median RMS step, median relative step, then per flag its RMS step and relative step] as 0-d device
    tensors ([] when no flag). RMS step: RMS(w_after - w_0) over the run, per element; relative step:
    |w_after - w_0| / |w_0|. The medians are over the parameters nothing flagged that moved (a parameter with
    no gradient, or accepted by --allow, does not step and says nothing about a step; none: nan). Per element
    is what an adaptive optimizer sets: about lr for every element whose gradient is well above its eps, so
    a parameter whose gradient is merely small moves as far as the rest, and one whose gradient is lost under
    eps (or under a plain SGD step) does not. Relative is what a step does to the weight: as large as the
    weight, it erases it."""
    import torch

    live = [n for n, p in params.items() if p.requires_grad and p.numel()]
    if not stepped or not live:
        return []
    rms, rel = {}, {}
    for n in live:
        delta = _real(params[n].detach() - v0[n])
        rms[n] = delta.pow(2).mean().sqrt()
        rel[n] = delta.norm() / _real(v0[n]).norm()      # zero at initialisation: inf or nan
    others = [n for n in live if n not in flagged]
    zero = torch.zeros((), device=rms[live[0]].device)

    def median(values):
        if not values:
            return zero + math.nan
        stacked = torch.stack(values)
        moved = torch.isfinite(stacked) & (torch.stack([rms[n] for n in others]) > 0)
        return torch.where(moved, stacked, math.nan).nanmedian()

    per = [x for f in stepped for x in (rms.get(f.name, zero), rel.get(f.name, zero))]
    return [median([rms[n] for n in others]), median([rel[n] for n in others]), *per]


def _candidates(params: dict, v0: dict) -> list[tuple[str, Any]]:
    """[(name, 0-d device flag)]: zero or tiny at initialisation (RMS < TINY_FACTOR × the median RMS of
    the model's non-zero parameters) and at least doubled (or left zero) by the run."""
    import torch

    trainable = [n for n, p in params.items() if p.requires_grad and p.numel()]
    if not trainable:
        return []
    rms0 = {n: _real(v0[n]).pow(2).mean().sqrt() for n in trainable}
    stacked = torch.stack([rms0[n].to("cpu") for n in trainable])     # one sync for the median
    nonzero = stacked[stacked > 0]
    if not nonzero.numel():
        return []
    limit = float(nonzero.median()) * TINY_FACTOR
    out = []
    for n in trainable:
        if float(stacked[trainable.index(n)]) >= limit:
            continue
        now = _real(params[n]).pow(2).mean().sqrt()
        out.append((n, (now >= 2 * rms0[n]) & (now > 0)))
    return out


# ---- naming the gate ---------------------------------------------------------------------------------

def _name_gates(model, inputs, live, grown, nonzero, trained, ctx, eval_mode, prepare, loss_fn, budget) -> int:
    """Bisect the grown candidates (model order) against the flags on fresh copies at initialisation with
    a group set to its trained values, then confirm that each named group multiplies the path: doubled,
    the flag's gradient grows PROPORTIONAL× or more (an additive bias does not). `budget` passes at most.
    Sets .gates (and .by_design for what grew without resolving). Returns the passes used."""
    flags = [v.flag for v in live]
    base = {v.flag.name: v.before for v in live}
    groups = {v.flag.name: list(grown) for v in live}
    used = 0
    tested: dict[tuple, dict] = {}
    confirm = 2 if any(f.kind != "dead-units" for f in flags) else 0

    def responds(group) -> dict:
        nonlocal used
        key = tuple(group)
        if key not in tested:
            used += 1
            got = _values(model, inputs, flags, {n: trained[n] for n in group}, ctx, eval_mode, prepare, loss_fn)
            tested[key] = {f.name: _responds(f, q, base[f.name]) for f, q in zip(flags, got)}
        return tested[key]

    first = responds(grown)
    for v in live:
        if not first.get(v.flag.name):
            groups.pop(v.flag.name)        # the run's growth is not the candidates' doing: no gate
    # screen: the tiny non-zero candidates (layer scales) apart from the exactly-zero ones (gains, heads,
    # and zero-initialised biases): one pass drops the half that is not the cause
    tiny = [n for n in grown if n in nonzero]
    if groups and tiny and len(tiny) < len(grown) and used < budget - confirm:
        got = responds(tiny)
        rest = [n for n in grown if n not in nonzero]
        for name in groups:
            groups[name] = tiny if got.get(name) else rest
    if groups and used < budget - confirm:   # a multiplicative zero silences its module (a sweep: zero BatchNorm
        quiet = _silencing(model, inputs, grown, ctx, eval_mode, prepare)   # biases were named beside the gains)
        for shared in {tuple(g) for g in groups.values()}:
            part = [n for n in shared if n in quiet]
            if part and len(part) < len(shared) and used < budget - confirm:
                got = responds(part)
                for name, g in groups.items():
                    if tuple(g) == shared:
                        groups[name] = part if got.get(name) else [n for n in shared if n not in quiet]
    while used < budget - confirm:
        wide = [g for g in groups.values() if len(g) > 1]
        if not wide:
            break
        group = max(wide, key=lambda g: (sum(1 for x in groups.values() if x == g), len(g)))
        half = group[:len(group) // 2]
        got = responds(half)
        for name, g in groups.items():
            if g == group:
                groups[name] = half if got.get(name) else group[len(group) // 2:]
    if groups and confirm:
        used += _multiplies(model, inputs, flags, groups, trained, ctx, eval_mode, prepare, loss_fn)
    for v in live:
        if v.flag.name in groups:
            v.gates = groups[v.flag.name]
            v.by_design = True
    return used


SILENT_REL = 1e-3   # of the largest: a gradient below this in the spread's projection is rounding


def _silencing(model, inputs, names, ctx, eval_mode, prepare) -> set[str]:
    """Of the candidate parameters `names`, those that silence their module at initialisation (one forward and one
    backward on a fresh copy): its output is the same for every sample of the batch, and the parameter scales how the
    samples differ (a random projection of the output minus its batch mean has a gradient in it). A zero gain (a
    BatchNorm weight at 0) does; a zero bias, beside it or beside a live weight, does not (a sweep: zero BatchNorm
    biases were named with the gains). Read in the hook: a residual's `out += identity` changes the output after it.
    Nothing for a batch of one (every output is then alike)."""
    import torch

    work = fresh_copy(model, ctx, eval_mode, prepare)
    modules = dict(work.named_modules())
    params = dict(work.named_parameters())
    owner = {n: n.rsplit(".", 1)[0] if "." in n else "" for n in names if n in params}
    seen: dict[str, tuple] = {}   # module -> (alike across the batch, the spread's random projection)
    handles = []
    for mod_name in set(owner.values()):
        if mod_name in modules:
            def hook(mod, args, y, key=mod_name):
                if key not in seen and torch.is_tensor(y) and y.is_floating_point() and y.dim() >= 1 and y.shape[0] >= 2:
                    seen[key] = ((y.amax(0) == y.amin(0)).all(), (torch.randn_like(y) * (y - y.mean(0, keepdim=True))).sum())
            handles.append(modules[mod_name].register_forward_hook(hook))
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            run_forward(work, inputs, phase="forward (re-check: which candidate silences its module)")
        keys = list(seen)
        alike = read_back([seen[k][0] for k in keys]) if keys else []
        quiet = {k for k, a in zip(keys, alike) if a}
        cand = [n for n, m in owner.items() if m in quiet and params[n].requires_grad]
        if not cand:
            return set()
        grads = torch.autograd.grad(sum(seen[k][1] for k in quiet), [params[n] for n in cand], allow_unused=True)
        moved = read_back([g.detach().abs().amax() if g is not None else torch.zeros(()) for g in grads])
    except Exception:   # noqa: BLE001 - a screen only: without it the bisection goes on as before
        return set()
    finally:
        for h in handles:
            h.remove()
    top = max(moved, default=0.0)   # a bias's gradient there is rounding (its shift cancels exactly): relative
    return {n for n, m in zip(cand, moved) if m > SILENT_REL * top}


def _multiplies(model, inputs, flags, groups, trained, ctx, eval_mode, prepare, loss_fn) -> int:
    """Drop from `groups` the flags whose gradient does not grow PROPORTIONAL× when their group is
    doubled from its trained value (two passes: every named group at its trained value, then doubled)."""
    union = sorted({n for g in groups.values() for n in g})
    at = _values(model, inputs, flags, {n: trained[n] for n in union}, ctx, eval_mode, prepare, loss_fn)
    doubled = _values(model, inputs, flags, {n: 2 * trained[n] for n in union}, ctx, eval_mode, prepare, loss_fn)
    for f, a, b in zip(flags, at, doubled):
        if f.kind != "dead-units" and f.name in groups and not (a > 0 and b >= PROPORTIONAL * a):
            groups.pop(f.name)
    return 2


def _responds(f: Flag, q: float, base: float) -> bool:
    if f.kind == "dead-units":
        return q <= f.threshold
    return math.isfinite(q) and q > 0 and (base == 0 or q >= GROW * base)


def _values(model, inputs, flags, setting: dict, ctx, eval_mode, prepare, loss_fn) -> list[float]:
    """The flags' measures on a fresh copy at initialisation with `setting` ({name: value}) put in."""
    import torch

    work = fresh_copy(model, ctx, eval_mode, prepare)
    params = _params(work)
    start = _start_norms(params, flags)
    with torch.no_grad():
        for n, value in setting.items():
            params[n].copy_(value)
    return read_back(_measure(work, inputs, flags, ctx, loss_fn, start))
