"""The training loop of overfit-batch: evaluate, stop or step, and record the curve.

Host syncs: one per step whatever the depth (each sync drains a GPU queue). The loss, the batch accuracy's counts, the
previous update's gradient norm (one `_foreach_norm` over every gradient) and "has every gradient
been non-zero at least once" are read back together, once per evaluation; per-parameter facts stay
on the device until the run ends (Trainer.final_flags: one read). The optimizer's own syncs (torch's
single-tensor Adam reads each parameter's `step`) and the loss rule's are not the loop's."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

from ...core import train
from ...core.device import wide_float
from ...core.distributed import is_sharded, local_shard
from ...core.functional_dropout import FunctionalDropoutOff
from ...core.rounding import stagnation_counts
from ...core.scaling import scale_facts, stepper
from ...errors import (
    DiagError,
    ModelError,
    UsageError,
    caused_by,
    interrupt_code,
    one_line,
)
from ...results import Result
from .ambiguity import first_groups
from .causes import (
    accuracy_counts,
    constant_loss,
    logit_range,
    same_across_samples,
    sample_tensor,
    start_bounds,
)
from .sharded import global_norm, local_view
from .trend import CONSTANT_TIMES, goal_of, judge

SAME_AGAIN = (10, 50)   # steps whose outputs are asked again whether they differ across samples, while they did not
LATE = 2    # the first step of the later counts of updates that round away (_late_start): 2, 4, 8, … (a sweep:
            # zero-init residual BatchNorm weights get a gradient from step 2, and a run done in 14-41 steps was
            # never counted past its first: `unchanged-params` with no cause, not `update-rounds-away`)


@dataclass
class Curve:
    """What the loop saw: one loss per evaluation, one grad norm / lr per update, and why it stopped."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    accs: list[float] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)    # trainable tensors without a gradient at step 0
    no_grad: list[str] = field(default_factory=list)    # of those, the ones judged (not-reached ones left out)
    step: int = 0
    no_graph: bool = False
    nonfinite_at: int | None = None
    reached_at: int | None = None
    interrupted: int = 0                    # 0, or the exit code of the interrupt (130 Ctrl-C, 143 SIGTERM)
    first_same: bool | None = None
    differed: bool = False   # the outputs differed across samples at step 0 or at a step of SAME_AGAIN
    first_span: tuple | None = None         # cross-entropy: the logits' (lowest, highest) at step 0 (causes.logit_range)
    first_bounds: tuple | None = None       # made-up mse: the output's (lowest, highest) value at step 0
    first_answers: object = None            # cross-entropy: ambiguity.FirstGroups of step 0 (grouped when asked)
    constant: float | None = None           # made-up mse: the loss of answering every sample with the target's mean
    seconds: float = 0.0
    scales: list[float] = field(default_factory=list)     # fp16: the GradScaler's scale each update used
    skipped: list[bool] = field(default_factory=list)     # fp16: the update was skipped (non-finite gradients)
    peer_stop: str | None = None            # under a wrapper: another rank's loss stopped the run
    drew: bool = False                      # step 0's forward and loss advanced the RNG (draws.py)
    budget: int = 0                         # the step budget run under: --steps, or more while still falling (_extend)
    levelled: bool = False                  # the trend was seen levelling off at an extension (the run looked again)
    cap: int | None = None                  # the step cap the last extension used (cost.fast_cap)
    wrapped: bool = False                   # a default budget not extended: under torchrun with --wrap
    first_terms: list | None = None         # auto over several outputs: [(label, value)] of each term at step 0
    last_terms: list | None = None          # and of the last evaluation, on the device until the verdict reads them
    term_steps: list = field(default_factory=list)   # (step, labels, the terms stacked on the device): read once,
                                                     # by the verdict (report._at_term_floors)

    @property
    def yardstick(self) -> float:
        """What the target ratio is taken of: the initial loss, or CONSTANT_TIMES the loss of answering every sample
        with the made-up target's mean (causes.constant_loss) when that is lower: an output that starts 15x too large
        falls 200x by shrinking alone, which memorises nothing (a review: a model that multiplies its input by 0
        "memorised" the batch). Against CONSTANT_TIMES x that loss no constant passes, and an output that starts at
        the target's scale (an initial loss of about 2) keeps the initial as its yardstick."""
        first = self.losses[0]
        return min(first, CONSTANT_TIMES * self.constant) if self.constant is not None and 0 < self.constant else first


class Trainer:
    """One batch, one copy, one optimizer (ctx.optimizer), optionally under autocast with a GradScaler."""

    def __init__(self, work, batch, loss_fn, opts, ctx, optimizer=None, functional=True, hold_draws=False):
        self.hold_draws = hold_draws      # the same random draws at every step's forward (draws.py)
        self._draws = None
        self.work, self.batch, self.loss_fn, self.opts, self.ctx = work, batch, loss_fn, opts, ctx
        # an empty tensor (DINOv3 without register tokens) has nothing to train or judge
        self.trainable = [(n, p) for n, p in work.named_parameters() if p.requires_grad and p.numel()]
        self.frozen = sum(1 for _, p in work.named_parameters() if not p.requires_grad)
        if not self.trainable:
            raise train.nothing_to_train(work)
        dtype = ctx.autocast_dtype
        self.amp = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype)
        self.optimizer = ctx.optimizer([p for _, p in self.trainable], optimizer)   # None: the run's
        self.scaler = ctx.grad_scaler()      # fp16 autocast only: the loss is scaled, the step may be skipped
        self.stepper = stepper(self.scaler, self.optimizer)
        self.start = {n: p.detach().clone() for n, p in self.trainable}
        self.ever_nonzero = None          # bool per trainable tensor, on the device (first update on)
        self._all_nonzero = False         # read back: every gradient was non-zero once, stop checking
        self._pending_norm = None         # the last update's gradient norm, read with the next loss
        self._pending_scale = None        # the last update's [loss scale, found inf] (fp16), read likewise
        self.stagnation = []              # reduced-precision weights: core.rounding counts of step 0
        self.stagnant_counts: list[float] = []   # those counts, read back by final_flags
        self.late = (0, [])               # (step, counts) of the latest power-of-two step from LATE on
        self.late_counts: list[float] = []
        self.curve = Curve(budget=opts.budget)
        self._t0 = 0.0                    # when train() started (cost.fast_cap reads the rate since)
        self.dropped: list[str] = []      # dropout / stochastic-depth modules switched off on the copy
        self.group = getattr(work, "process_group", None)   # DDP's; FSDP (and the agreement) use the default one
        self.agree = _agreement(ctx, self.group)   # under a wrapper: the stop decided by every rank
        self.sharded = is_sharded(p for _, p in self.trainable)  # --wrap fsdp: DTensor parameters, read through their shards
        self.source = None                # the user's model, untouched (report._routed copies its start)
        self.fits: dict = {}              # causes.made_target_floor's fitted LayerNorm floors, fitted once a run
        self.quiet = FunctionalDropoutOff()   # dropout drawn through torch's functions, off like the modules'
        if functional:
            self.quiet.attach(self._plain())
        else:
            self.quiet.off()
        self.functional = 0               # such draws in step 0 (the calls made as in eval mode each step)
        self.functional_kept = not functional   # ... left on: a checkpoint's recompute drew them where it was off

    @property
    def samples(self) -> int | None:
        """How many samples the batch holds, for what is said: a given target's leading size (one label per sample;
        an EmbeddingBag's flat token list is not its count of bags), else the first input's."""
        t = self.loss_fn.target
        if t is not None and not self.loss_fn.made_target and getattr(t, "dim", lambda: 0)():
            return int(t.shape[0])
        return self.batch.batch_size

    def release(self) -> None:
        """Drop the trained copy, its optimizer and the start values once the verdict no longer reads them (the
        second opinion trains another copy: two would be held at once)."""
        import gc

        self.quiet.off()
        self.work = self.optimizer = self.stepper = self.scaler = None
        self.start, self.trainable, self.ever_nonzero = {}, [], None
        gc.collect()   # a copy in a reference cycle (hooks, closures) is freed now, not at the next collection
        if self.ctx.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def autocast(self):
        return self.ctx.autocast()

    def partial(self, why: str) -> Result:
        """What ran before a failure: the curve so far."""
        c = self.curve
        p = Result("overfit-batch")
        p.data.update({"steps": c.step, "loss": list(c.losses)})
        if c.losses:
            p.summary += [("Loss before the error", f"{c.losses[0]:.6g} → {c.losses[-1]:.6g} ({len(c.losses)} evaluations)")]
        p.notes.append(why)
        return p

    def train(self) -> Curve:
        """Evaluate; stop at the target, a non-finite loss, no graph or the budget; else update.
        Ctrl-C stops the loop and keeps the curve so far."""
        c = self.curve
        t0 = self._t0 = time.perf_counter()
        try:
            while True:
                self.optimizer.zero_grad(set_to_none=True)
                try:
                    if self._one_step(c):
                        break
                except ModelError as e:
                    if self._drawn_again(e, c.step):
                        raise DrawnAgain() from e
                    raise
                c.step += 1
        except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM (Terminated): keep the partial curve
            self.quiet.reset()   # a forward left by it did not run its always-call hook
            c.interrupted = interrupt_code(exc)
        self._read()                        # a norm still pending (interrupted between update and loss)
        c.seconds = time.perf_counter() - t0
        return c

    def _one_step(self, c: Curve) -> bool:
        """Evaluate at c.step, then update unless the run stops there (True)."""
        value, lv, acc, out = self._evaluated(c.step)
        if self.opts.on_step:
            self.opts.on_step(c.step, lv)
        if self._stop(value, lv, acc, out):
            return True
        if c.step == 0:   # the forward's draws (a checkpointed block's recompute in backward draws again)
            self.functional = self.quiet.draws if self.quiet.live else 0
        self._update(value, c.step)
        if c.step == 0:
            self.quiet.idle()
        return False

    def _drawn_again(self, error, step: int) -> bool:
        """A checkpoint refused its recompute after forwards that dropped under FunctionalDropoutOff (a checkpointed
        function that is no module call, inside a nested backward or an autograd.grad, drew its dropout there), at
        any step (checkpointing may start late): the run is to start again with that dropout on
        (overfit_batch._trained; a refusal of the model's own comes again there, and stands). A refusal with nothing
        dropped is the model's own (a block that saves other tensors on its first call). Not under torchrun (its
        peers would have to start again in step)."""
        from torch.utils.checkpoint import CheckpointError

        if not (self.quiet.live and self.quiet.draws) or self.agree is not None or not caused_by(error, CheckpointError):
            return False
        self.quiet.off()
        return True

    def _evaluated(self, step: int):
        """_evaluate; under a wrapper, a rank whose forward or loss raised still makes the step's
        agreement (its peers are about to), flagged "failed", so they stop with it at once instead of
        waiting in their next collective until the timeout."""
        try:
            return self._evaluate(step)
        except DiagError:
            if self.agree is not None:
                with contextlib.suppress(Exception):   # a peer already gone: this rank's own error is what counts
                    self.agree([False, False, False, True])
            raise

    def _stop(self, value, lv: float, acc: float | None, out) -> bool:
        """Stop at a non-finite loss, the target, the budget or no graph. Under a wrapper (self.agree)
        the decision is every rank's: one all_reduce per step (the loop reads the loss each step
        anyway), so every rank takes the same number of steps and the same collectives; the target
        counts as reached when it is reached on every rank's rows. A peer whose forward or loss
        raised (_evaluated) ends this rank's run too."""
        c, opts = self.curve, self.opts
        # a custom loss's accuracy is told, not required: its target is the loss's (report._at_its_floor)
        counted = acc if getattr(self.loss_fn, "custom", None) is None else None
        flags = [not math.isfinite(lv), not reached(lv, c.yardstick, counted, opts), not value.requires_grad]
        bad, short, no_graph, failed = flags + [False] if self.agree is None else self.agree(flags + [False])
        if failed:
            err = ModelError(f"stopped at step {c.step}: the model raised on another rank (its error comes first)",
                             hint="see the other rank's error", partial=self.partial(f"stopped with a peer at step {c.step}"))
            err.follows_peer = True   # an echo of a peer's failure: not the one to lead the report with
            raise err
        if bad:
            if flags[0]:
                c.nonfinite_at = c.step
            else:
                c.peer_stop = f"stopped at step {c.step}: the loss on another rank is non-finite"
            return True
        if not short:
            c.reached_at = c.step
            return True
        if c.step >= c.budget and not self._extend(out):
            return True
        if no_graph:
            if flags[2]:
                c.no_graph = True
            else:
                c.peer_stop = f"stopped at step {c.step}: the loss on another rank has no graph"
            return True
        return False

    def _extend(self, out) -> bool:
        """At the budget, short of the target, --steps left out: run on by another DEFAULT_STEPS (to the cap) while
        the loss's own recent trend (trend.judge) puts the target within that cap, or it is levelling off
        for the first time (confirmed by one more stretch before it is called a floor). A model whose steps are
        fast (cost.fast_cap: a cap past opts.cap) runs on while its loss falls or levels, whatever the projection:
        a sigmoid net's loss can crawl, then fall fast; only a plateau or the cap ends it early. A run that reaches
        the target inside --steps never gets here. Not under a wrapper (each rank's curve is its own rows'). With
        parameters that get no gradient too (the rest of the model may still fit the batch: LLaVA's unread last
        tower layer): a run that then ends short of the target is cannot-overfit, the no-grad error its cause,
        after at most the cap's steps."""
        c, opts = self.curve, self.opts
        if self.agree is not None or opts.steps is not None:
            c.wrapped = opts.steps is None   # said by the verdict: it could have run on in one process
            return False
        cap = self._cap()
        if c.budget >= cap or self._at_made_floor(out):
            return False
        t = judge(c.losses, goal_of(c.yardstick, opts))
        if cap > opts.cap:
            go = t.falling or t.kind == "levelling"
            c.levelled = c.levelled or t.kind == "levelling"   # seen once: a later sighting confirms it
        elif t.kind == "levelling":   # a slowing fall may be a phase: look once more before calling it a floor
            go, c.levelled = not c.levelled, True
        else:
            go = t.falling and t.to_go is not None and c.step + t.to_go <= cap
        if go:
            c.budget = min(cap, c.budget + opts.budget)
            if opts.on_budget:
                opts.on_budget(c.budget)
        return go

    def _at_made_floor(self, out) -> bool:
        """The loss is within the target ratio of the floor that torchdiag's own random target leaves an output of a
        fixed range (causes.made_target_floor, read from this step's output: no extra forward). The verdict calls it
        memorised (report._within_range); running on toward a target below the floor only costs time (a LayerNorm
        output ran to the 20,000-step cap, 13 s, for the verdict it had at step 1500). One output only: with several,
        the floor is the first output's, not the sum's, and a review's stop at the first's floor cut off a NaN due
        1,500 steps later: with several, every term at its own floor, as the verdict asks (_at_terms_floors)."""
        import torch

        from .causes import made_target_floor

        c, ratio = self.curve, self.opts.target_ratio
        if self.opts.target_loss is None and not self.sharded and c.first_answers is not None:
            from .ambiguity import batch_floor, causal

            with torch.no_grad():
                floor = batch_floor(c.first_answers, out, self.loss_fn,
                                    lambda: causal(self.work, self.batch, out, self.autocast))
            if 0 < floor < c.yardstick and c.losses[-1] - floor <= ratio * (c.yardstick - floor):
                return True
        if self.opts.target_loss is not None or not getattr(self.loss_fn, "made_target", False) or self.sharded:
            return False
        start = c.first_terms[0][1] if c.first_terms else c.losses[0]   # the first output's own term
        with torch.no_grad():
            found = made_target_floor(out, self.loss_fn, ratio * start, self.fits, c.first_bounds)
            if c.first_terms:
                return found is not None and self._at_terms_floors(out, found)
        floor = found["floor"] if found else math.nan
        return 0 < floor < c.losses[0] and c.losses[-1] - floor <= ratio * (c.losses[0] - floor)

    def _at_terms_floors(self, out, first: dict) -> bool:
        """Every output's term, at this step, within the target ratio of its fall to its own floor (causes.term_floors):
        what report._at_term_floors passes on. A sweep: a tiny BERT's two outputs were there at step 152, and the run
        went on to the 5,000-step cap (87 s) for the verdict it had then."""
        from .causes import floor_of, term_floors, terms_within

        c = self.curve
        labels, starts = tuple(k for k, _ in c.first_terms), [v for _, v in c.first_terms]
        if not c.term_steps or c.term_steps[-1][1] != labels:
            return False
        floors = term_floors(out, self.loss_fn, first, c.first_terms, self.opts)
        if not floors:
            return False
        floors = [floor_of(f, s) for f, s in zip(floors, starts)]
        now = c.term_steps[-1][2].tolist()   # one read, at an extension only
        return bool(floors[0]) and all(s > 0 for s in starts) and \
            terms_within(now, starts, floors, self.opts.target_ratio)

    def _cap(self) -> int:
        """The most steps this run may take without --steps: opts.cap, or more when its steps are fast (cost.fast_cap,
        at the rate measured so far: a slower stretch lowers it)."""
        from .cost import fast_cap

        self.curve.cap = fast_cap(self.curve.step, time.perf_counter() - self._t0)
        return self.curve.cap

    def _evaluate(self, step: int):
        """Forward and loss at `step`; records the loss (and accuracy), and at step 0 the output's shape facts.
        (value, loss, accuracy, output)."""
        c = self.curve
        if step == 0:
            from .draws import Draws

            self._draws = Draws(self.ctx.device)
        elif self.hold_draws:
            self._draws.again()
        try:
            with self.autocast():
                out = self._forward(step)
                value = self.loss_fn(out)
            if step == 0:
                c.drew = self._draws.drew()
        except ModelError as e:
            if step and e.partial is None:
                e.partial = self.partial(f"the error came at step {step}")
            raise
        except UsageError:
            raise
        except Exception as exc:
            raise ModelError(f"loss (step {step}) failed: {one_line(exc)}",
                             hint=f"check the loss/target: {self.ctx.option('loss')}, {self.ctx.option('batch')}") from exc
        lv, acc = self._read(value, accuracy_counts(out, self.loss_fn))
        c.last_terms = getattr(self.loss_fn, "terms", None)
        if c.last_terms:   # with its step and labels: an output cut from the loss for a step leaves a term out
            import torch

            c.term_steps.append((step, tuple(k for k, _ in c.last_terms),
                                 torch.stack([v.detach().float().reshape(()) for _, v in c.last_terms])))
        if step == 0 and c.last_terms:   # one more read, at the start only: the row just stacked
            _, labels, terms = c.term_steps[-1]
            c.first_terms = list(zip(labels, terms.tolist()))
        c.losses.append(lv)
        if acc is not None:
            c.accs.append(acc)
        if step == 0:
            c.first_same = same_across_samples(sample_tensor(out, self.batch.batch_size))[0]
            c.differed = not c.first_same
            c.first_span = logit_range(out, self.loss_fn)   # one read: its box and its sign are read from it
            c.first_bounds = start_bounds(out, self.loss_fn)
            c.constant = constant_loss(out, self.loss_fn)
            c.first_answers = first_groups(out, self.loss_fn, self.batch)   # (detached values: no graph)
            if lv < 0 and self.opts.target_loss is None and math.isfinite(lv):
                raise UsageError(f"the initial loss is {lv:.6g} (< 0): a ratio to it says nothing",
                                 hint=f"give an absolute target with {self.ctx.option('target_loss')}, "
                                      f"or a loss ≥ 0 ({self.ctx.option('loss')})")
        elif step in SAME_AGAIN and not c.differed:   # the same from the start: by design (a zero-initialised head)
            c.differed = not same_across_samples(sample_tensor(out, self.batch.batch_size))[0]   # or broken
        if step and lv < -1e-4 * c.losses[0] and c.losses[0] >= 0 and self.opts.target_loss is None:   # not rounding at 0
            # a likelihood crosses 0 on its way down: "≤ 0.01 × initial" would pass it there (a sweep: a Gaussian
            # NLL passed at step 48, a quarter of the variance explained)
            err = UsageError(f"the loss went below 0 at step {step} ({lv:.6g}, from {c.losses[0]:.6g}): it is not "
                             "bounded below by 0 (a negative log-likelihood), so a ratio to its start says nothing",
                             hint=f"give an absolute target with {self.ctx.option('target_loss')}")
            err.partial = self.partial(f"stopped at step {step}: the loss went below 0")
            raise err
        return value, lv, acc, out

    def _read(self, value=None, counts=None):
        """The one host read of a step: (loss, batch accuracy or None). Also records the previous
        update's gradient norm (and loss scale under fp16) and whether every gradient has been
        non-zero at least once."""
        import torch

        vals = [] if value is None else [value.detach().float().reshape(())]
        if counts is not None:
            vals += [counts[0].float(), counts[1].float()]
        pending, scale = self._pending_norm, self._pending_scale
        if pending is not None:
            vals.append(pending)
        if scale is not None:
            vals += list(scale)
        check = self.ever_nonzero is not None and not self._all_nonzero
        if check:
            vals.append(self.ever_nonzero.all().float())
        if not vals:
            return None, None
        read = torch.stack([v.to(vals[0].device) for v in vals]).tolist()
        lv = read.pop(0) if value is not None else None
        acc = None
        if counts is not None:
            correct, n = read.pop(0), read.pop(0)
            acc = correct / n if n else None
        if pending is not None:
            self.curve.grad_norms.append(read.pop(0))
            self._pending_norm = None
        if scale is not None:
            self.curve.scales.append(read.pop(0))
            self.curve.skipped.append(read.pop(0) > 0)
            self._pending_scale = None
        if check:
            self._all_nonzero = read.pop(0) == 1.0
        return lv, acc

    def _late_start(self, step: int):
        """At steps LATE, 2·LATE, 4·LATE … the reduced-precision weights before the update (a copy of those only), to
        count again what rounds away: a bfloat16 CNN's share grew from 48 of 5,514 elements at step 1 to 3,775 at
        step 1,000 (a sweep), and the first step's count had ruled rounding out as a cause."""
        from ...core.rounding import is_reduced

        if step < LATE or step & (step - 1) or self.sharded:
            return None
        kept = {n: p.detach().clone() for n, p in self.trainable if is_reduced(p.dtype) and p.grad is not None}
        return kept or None

    def final_flags(self) -> tuple[list[bool], list[bool]]:
        """(changed since the start, ever non-zero gradient) per trainable tensor: one read (with the
        first step's rounding counts of reduced-precision weights, kept in self.stagnant_counts)."""
        import torch

        changed = [(p.detach() != self.start[n]).any() for n, p in self.trainable]
        ever = self.ever_nonzero if self.ever_nonzero is not None else torch.zeros(len(self.trainable), dtype=torch.bool)
        wide = wide_float(ever.device)   # counts: float32 on mps (no float64), exact to 2**24
        parts = [torch.stack(changed).to(ever.device, wide), ever.to(wide)]
        parts += [c.to(ever.device, wide) for _, c in self.stagnation + self.late[1]]
        flags = torch.cat(parts).tolist()
        k, first = len(self.trainable), 2 * len(self.stagnation)
        self.stagnant_counts, self.late_counts = flags[2 * k:2 * k + first], flags[2 * k + first:]
        return [bool(f) for f in flags[:k]], [bool(f) for f in flags[k:2 * k]]

    def _grad_facts(self, step: int) -> None:
        """Gradient norm of this update (kept on the device until the next read) and the non-zero
        flags, both batched over every gradient: no host sync here."""
        import torch

        c = self.curve
        if step == 0:
            c.missing = [n for n, p in self.trainable if p.grad is None]
        have = [i for i, (_, p) in enumerate(self.trainable) if p.grad is not None]
        # under FSDP: this rank's shard of each (averaged) gradient; combined across ranks where needed
        grads = [local_shard(self.trainable[i][1].grad).detach() for i in have]
        if not grads:   # under FSDP None on every rank or on none: every rank returns here, or none does
            c.grad_norms.append(0.0)
            return
        norm = grad_norm(grads)
        self._pending_norm = global_norm(norm, self.ctx.device, self.group) if self.sharded else norm
        # an empty tensor (a shard FSDP left empty) has no inf-norm: it never flags, a peer's shard does
        have, grads = [i for i, g in zip(have, grads) if g.numel()], [g for g in grads if g.numel()]
        if self._all_nonzero or not grads:
            return
        # max |g| (the inf-norm) is 0 exactly when every element is 0 (NaN counts as non-zero, as g != 0 does)
        flags = torch.stack(torch._foreach_norm(grads, float("inf"))) != 0
        if self.ever_nonzero is None:
            self.ever_nonzero = torch.zeros(len(self.trainable), dtype=torch.bool, device=flags.device)
        if len(have) == len(self.trainable):
            self.ever_nonzero |= flags
        else:
            index = torch.as_tensor(have).to(flags.device, non_blocking=True)
            self.ever_nonzero[index] |= flags

    def _forward(self, step: int):
        """One forward; a failure becomes a ModelError naming the module (re-run under a tracker)."""
        from ...core.tracking import run_forward

        try:
            return self.batch.call(self.work)
        except DiagError:
            raise
        except Exception as exc:
            try:   # again under a tracker, to name the module; never through a wrapper: its peers would not follow
                if not self.sharded:   # FSDP's own forward all-gathers; DDP's inner module makes no collective
                    run_forward(self._plain(), self.batch, phase=f"forward (step {step})")
            except ModelError as named:
                raise named from exc
            except Exception:
                pass
            raise ModelError(f"forward (step {step}) failed: {one_line(exc)}",
                             hint="the model's own code raised; fix it or the inputs and run again") from exc

    def _plain(self):
        if self.ctx.wrapper is None:
            return self.work
        from ...core.distributed import inner

        return inner(self.work)

    def _update(self, value, step: int) -> None:
        """Backward (scaled under fp16), record the gradient facts, one optimizer step."""

        c = self.curve
        try:
            # under fp16 the scaled loss goes backward; the gradients are unscaled before they are read
            train.backward(self.scaler.scale(value) if self.scaler else value,
                           hint="the model's backward raised; try `torchdiag gradflow`", run=self.quiet.backward)
        except ModelError as e:
            e.partial = self.partial(f"backward failed at step {step}")
            raise
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
            self._pending_scale = scale_facts(self.scaler, self.optimizer)
        self._grad_facts(step)
        c.lrs.append(float(self.optimizer.param_groups[0]["lr"]))
        late = self._late_start(step)
        try:
            train.step(self.stepper)
        except ModelError as e:
            e.partial = self.partial(f"the optimizer failed at step {step}")
            raise
        if late is not None:
            self.late = (step, stagnation_counts(self.trainable, late))
        if step == 0:   # reduced-precision weights: did the first update round away? (counted on the device)
            if self.sharded:   # counted on this rank's shards, summed across ranks after the loop (sharded.localise)
                self.stagnation = stagnation_counts([(n, local_view(p)) for n, p in self.trainable],
                                                    {n: local_shard(t) for n, t in self.start.items()})
            else:
                self.stagnation = stagnation_counts(self.trainable, self.start)


class DrawnAgain(Exception):
    """Trainer.train: start again on a fresh copy with the functional dropout on (Trainer._drawn_again)."""


def _agreement(ctx, group):
    """Under torchrun with a wrapper: fn(flags) -> each flag true on any rank (core.distributed.agree,
    over the wrapped model's process group); else None."""
    if ctx.wrapper is None:
        return None
    from ...core.distributed import agree

    return lambda flags: agree(flags, ctx.device, group)


def grad_norm(grads):
    """The total L2 norm of `grads` in float32, on the device: one `_foreach_norm` per kind (float16/bfloat16
    gradients upcast inside the norm; float32/float64 and complex ones in their own precision (a float64 model's
    norm asked in float32 raised: a narrowing), then float32)."""
    import torch

    half = [g for g in grads if g.dtype in (torch.float16, torch.bfloat16)]
    rest = [g for g in grads if g.dtype not in (torch.float16, torch.bfloat16)]
    norms = list(torch._foreach_norm(half, 2, dtype=torch.float32)) if half else []
    norms += [n.float() for n in torch._foreach_norm(rest, 2)] if rest else []
    return torch.stack(norms).norm()


def reached(lv: float, initial: float, acc: float | None, opts) -> bool:
    if opts.target_loss is not None and lv <= opts.target_loss:
        return True
    # a ratio judges a loss bounded below by 0 only: not a negative value, nor a run whose given target is below 0
    # (a review: a Gaussian NLL passed the ratio as it crossed 0 once --target-loss -2 was given)
    if initial < 0 or lv < 0 or (opts.target_loss is not None and opts.target_loss < 0):
        return False
    return lv <= opts.target_ratio * initial and (acc is None or acc >= 1.0)
