"""The runs of lr-find: the range test (one per repeat) and the checked runs, each on a fresh copy of the
user's model (ctx.train_copy: the same starting weights every time) with a fresh optimizer (ctx.optimizer)
and, under --amp fp16, a fresh GradScaler.

Host reads: the range test reads the loss once per update (its early stop needs the value); a checked
run keeps its losses on the device and reads them once at its end. Under torchrun with a wrapper
(ctx.wrapper: DDP or fully_shard) every evaluation is followed by one agreement
(core.distributed.agree: [non-finite, diverged, failed]) so every rank stops a repeat at the same step,
and a rank whose forward raised stops its peers with it; after each run the losses are averaged over the
ranks (one all_reduce), so every rank reads the same curve, suggests the same rate and checks the same
rates."""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field

from ...core import train
from ...core.scaling import stepper
from ...errors import DiagError, ModelError, UsageError, one_line
from .rules import EarlyStop, schedule

FAILED = [False, False, True]      # the agreement of a rank whose forward or loss raised
DRAWS = 16                         # forwards with no update at a checked run's end: its loss's own scatter


@dataclass
class Repeat:
    """One range test: lrs[k] was applied by update k, losses[k] is the loss right after it."""

    seed: int
    initial: float = math.nan
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    ema: list[float] = field(default_factory=list)
    stopped: str | None = None      # non-finite | diverged | None (ran to max_lr)
    stop_lr: float | None = None
    peer_stop: bool = False         # under a wrapper: another rank's loss stopped it


class Fresh:
    """One run's copy, optimizer, GradScaler and loss rule (its random targets drawn with `seed`)."""

    def __init__(self, model, ctx, seed: int, why: str):
        self.work = ctx.train_copy(model, why, steps=True)
        params = [p for p in self.work.parameters() if p.requires_grad]
        if not params:
            raise train.nothing_to_train(self.work)
        self.optimizer = ctx.optimizer(params)
        self.scaler = ctx.grad_scaler()
        self.stepper = stepper(self.scaler, self.optimizer)
        self.loss_fn = ctx.loss()
        self.loss_fn.seed = seed      # a fresh rule draws its targets on first use, from its seed
        self.group = getattr(self.work, "process_group", None)   # DDP's; fully_shard uses the default one


class Runner:
    """The range test and the checked runs of one model and batch."""

    def __init__(self, model, inputs, opts, ctx):
        self.model, self.batch, self.opts, self.ctx = model, inputs, opts, ctx
        self.repeats: list[Repeat] = []
        self.checks: list[tuple[float, float, list[float], float]] = []   # (factor, lr, losses, spread at the end)
        self.start_spread: float | None = None   # the loss's spread at the starting weights (_spread)
        self.range_seconds = self.check_seconds = 0.0
        self.updates = 0
        self.loss_rule = ""
        self.made_target = False
        self.agree = _agreement(ctx)

    # --- the range test ------------------------------------------------------------------------
    def range_test(self, r: int) -> Repeat:
        """Repeat r: seed ctx.seed + r for the RNG (dropout …) and for the random targets torchdiag makes."""
        opts, ctx = self.opts, self.ctx
        seed = ctx.seed + r
        rep = Repeat(seed)
        self.repeats.append(rep)
        t0 = time.perf_counter()
        with train.seeded(seed):
            run = Fresh(self.model, ctx, seed, "to run the range test")
            value = self._evaluate(run, f"range test {r + 1}, before the first update")
            if not value.requires_grad:
                raise UsageError("the loss does not require grad: no trainable parameter is connected to it",
                                 hint="forward under torch.no_grad() or detach()? run `torchdiag gradflow`")
            self._describe(run)
            rep.initial = _read(value)
            if self._agreed([not math.isfinite(rep.initial), False, False])[0]:
                rep.stopped = "non-finite"
            stop = EarlyStop(opts.diverge, start=rep.initial)
            for k, lr in enumerate(schedule(opts.min_lr, opts.max_lr, opts.steps)):
                if rep.stopped:
                    break
                self._update(run, value, lr, f"range test {r + 1}, update {k + 1}")
                value = self._evaluate(run, f"range test {r + 1}, after update {k + 1}")
                lv = _read(value)
                why = stop.update(lv)
                bad, diverged, _ = self._agreed([why == "non-finite", why == "diverged", False])
                if not bad:   # a non-finite loss (here or on a peer) is left out on every rank alike
                    rep.lrs.append(lr)
                    rep.losses.append(lv)
                    rep.ema.append(stop.smoothed[-1] if why != "non-finite" and stop.smoothed else math.nan)
                if opts.on_step:
                    opts.on_step(self.updates, lv)
                if bad or diverged:
                    rep.stopped, rep.stop_lr = ("non-finite" if bad else "diverged"), lr
                    rep.peer_stop = why != "non-finite" if bad else why != "diverged"
        del run
        if self.agree is not None:   # every rank reads the mean curve: the same suggestion everywhere
            mean = self._mean([rep.initial] + rep.losses)
            rep.initial, rep.losses = mean[0], mean[1:]
        self.range_seconds += time.perf_counter() - t0
        return rep

    def identical(self) -> bool:
        """Every repeat so far gave the same curve, bit for bit (under a wrapper: the same mean curve on
        every rank, so every rank decides alike)."""
        first = self.repeats[0]
        return len(self.repeats) > 1 and all(r.initial == first.initial and r.losses == first.losses
                                             and r.stopped == first.stopped for r in self.repeats[1:])

    # --- a checked run ---------------------------------------------------------------------------
    def checked(self, factor: float, lr: float) -> list[float]:
        """check_steps updates at the constant rate `lr`, from the same weights, with the same seed (the
        RNG and the targets of repeat 1): losses[0] before any update, losses[k] after k updates."""
        ctx, n = self.ctx, self.opts.check_steps
        t0 = time.perf_counter()
        if self.start_spread is None:   # once: every checked run starts from these weights (reseeded below)
            with train.seeded(ctx.seed):
                run = Fresh(self.model, ctx, ctx.seed, "to check a learning rate")
                self.start_spread = self._spread(run, "a draw at the starting weights")
            del run
        with train.seeded(ctx.seed):
            run = Fresh(self.model, ctx, ctx.seed, "to check a learning rate")
            values = []
            value = self._evaluate(run, f"checked run at {lr:.3g}, before the first update")
            self._agreed([False, False, False])
            values.append(value.detach().float().reshape(()))
            for k in range(n):
                self._update(run, value, lr, f"checked run at {lr:.3g}, update {k + 1}")
                value = self._evaluate(run, f"checked run at {lr:.3g}, after update {k + 1}")
                self._agreed([False, False, False])
                values.append(value.detach().float().reshape(()))
            import torch

            losses = torch.stack([v.to(values[0].device) for v in values]).tolist()   # one read per run
            spread = self._spread(run, f"checked run at {lr:.3g}, a draw at its last weights") \
                if math.isfinite(losses[-1]) else 0.0
        del run
        if self.agree is not None:
            losses = self._mean(losses)
        self.checks.append((factor, lr, losses, spread))
        self.check_seconds += time.perf_counter() - t0
        if self.opts.on_step:
            self.opts.on_step(self.updates, losses[-1])
        return losses

    def _spread(self, run: Fresh, where: str) -> float:
        """The loss's own scatter at the run's weights: the standard deviation of DRAWS forwards with no update
        (0 for a deterministic forward; a dropout net's draws differ). A rise within it is the forward's draw, not
        the rate's doing (a sweep: dropout 0.8, a loss of one draw read as diverged and unstable)."""
        import torch

        with torch.no_grad():
            values = []
            for _ in range(DRAWS):
                values.append(self._evaluate(run, where).detach().float().reshape(()))
                self._agreed([False, False, False])
            draws = torch.stack([v.to(values[0].device) for v in values]).tolist()
        if self.agree is not None:
            draws = self._mean(draws)
        return statistics.stdev(draws) if all(math.isfinite(v) for v in draws) else 0.0

    # --- one evaluation, one update ----------------------------------------------------------------
    def _evaluate(self, run: Fresh, where: str):
        """Forward and loss under ctx.autocast(). A failure is the model's (exit 3), the module named
        when it can be; under a wrapper this rank first tells its peers (the FAILED agreement)."""
        try:
            try:
                with self.ctx.autocast():
                    return run.loss_fn(self.batch.call(run.work))
            except DiagError:
                raise
            except Exception as exc:
                raise self._forward_error(run, exc, where) from exc
        except DiagError:
            if self.agree is not None:
                with contextlib.suppress(Exception):   # a peer already gone: this rank's error is what counts
                    self.agree(FAILED)
            raise

    def _forward_error(self, run: Fresh, exc, where: str) -> ModelError:
        if self.ctx.wrapper is None:   # again under a tracker to name the module (never through a wrapper)
            from ...core.tracking import run_forward

            try:
                with self.ctx.autocast():
                    run_forward(run.work, self.batch, phase=f"forward ({where})")
            except ModelError as named:
                return named
            except Exception:
                pass
        return ModelError(f"forward or loss ({where}) failed: {one_line(exc)}",
                          hint=f"the model's own code or the loss raised; check {self.ctx.option('loss')}")

    def _update(self, run: Fresh, value, lr: float, where: str) -> None:
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        train.backward(run.scaler.scale(value) if run.scaler else value,
                       hint=f"the model's backward raised ({where}); try `torchdiag gradflow`")
        train.step(run.stepper)
        run.optimizer.zero_grad(set_to_none=True)
        self.updates += 1

    def _agreed(self, flags: list[bool]) -> list[bool]:
        """flags, agreed over the ranks under a wrapper; a peer that failed stops this rank too."""
        if self.agree is None:
            return flags
        out = self.agree(flags)
        if out[2]:
            err = ModelError("stopped: the model raised on another rank (its error comes first)",
                             hint="see the other rank's error")
            err.follows_peer = True   # an echo of a peer's failure: not the one to lead the report with
            raise err
        return out

    def _mean(self, values: list[float]) -> list[float]:
        """The mean over the ranks of each value (one all_reduce; every rank arrives: the runs are the
        same length everywhere, their stops agreed). NaN stays NaN."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return (t / dist.get_world_size()).tolist()

    def _describe(self, run: Fresh) -> None:
        if not self.loss_rule:
            self.loss_rule = run.loss_fn.describe()
            self.made_target = bool(run.loss_fn.made_target)


def _read(value) -> float:
    return float(value.detach().float())


def _agreement(ctx):
    """Under torchrun with a wrapper: fn(flags) -> each flag true on any rank; else None."""
    if ctx.wrapper is None:
        return None
    from ...core.distributed import agree

    return lambda flags: agree(flags, ctx.device)
