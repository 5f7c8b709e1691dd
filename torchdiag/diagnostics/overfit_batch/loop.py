"""The training loop of overfit-batch: evaluate, stop or step, and record the curve."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

from ...core import train
from ...errors import DiagError, ModelError, UsageError, interrupt_code, one_line
from ...results import Result
from .causes import accuracy, output_box, same_across_samples, sample_tensor



@dataclass
class Curve:
    """What the loop saw: one loss per evaluation, one grad norm / lr per update, and why it stopped."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    accs: list[float] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)    # trainable tensors without a gradient at step 0
    step: int = 0
    no_graph: bool = False
    nonfinite_at: int | None = None
    reached_at: int | None = None
    interrupted: int = 0                    # 0, or the exit code of the interrupt (130 Ctrl-C, 143 SIGTERM)
    first_same: bool | None = None
    first_box: tuple | None = None
    seconds: float = 0.0


class _Scaled:
    """scaler.step + update behind an optimizer's step(), so core.train.step reports its failure."""

    def __init__(self, scaler, optimizer):
        self.scaler, self.optimizer = scaler, optimizer

    def step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()


class Trainer:
    """One batch, one copy, one optimizer (ctx.optimizer), optionally under autocast with a GradScaler."""

    def __init__(self, work, batch, loss_fn, opts, ctx):
        import torch

        self.work, self.batch, self.loss_fn, self.opts, self.ctx = work, batch, loss_fn, opts, ctx
        self.trainable = [(n, p) for n, p in work.named_parameters() if p.requires_grad]
        self.frozen = sum(1 for _, p in work.named_parameters() if not p.requires_grad)
        if not self.trainable:
            raise UsageError("the model has no trainable parameters (requires_grad is False everywhere)",
                             hint="nothing can be trained: unfreeze some parameters")
        dtype = ctx.autocast_dtype
        self.amp = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype)
        self.amp_dtype = getattr(torch, dtype) if dtype else None
        if self.amp == "fp16" and ctx.device.type not in ("cuda", "cpu"):
            raise UsageError(f"{ctx.option('amp')} fp16 needs a CUDA or CPU device (got {ctx.device.type})",
                             hint=f"use {ctx.option('amp')} bf16")
        self.optimizer = ctx.optimizer([p for _, p in self.trainable])
        self.scaler = torch.amp.GradScaler(ctx.device.type) if self.amp == "fp16" else None
        self.stepper = _Scaled(self.scaler, self.optimizer) if self.scaler else self.optimizer
        self.start = {n: p.detach().clone() for n, p in self.trainable}
        self.ever_nonzero = {n: False for n, _ in self.trainable}
        self.curve = Curve()

    def autocast(self):
        import torch

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=self.amp_dtype)

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
        c, opts = self.curve, self.opts
        t0 = time.perf_counter()
        try:
            while True:
                self.optimizer.zero_grad(set_to_none=True)
                value, lv, acc = self._evaluate(c.step)
                if opts.on_step:
                    opts.on_step(c.step, lv)
                if not math.isfinite(lv):
                    c.nonfinite_at = c.step
                    break
                if reached(lv, c.losses[0], acc, opts):
                    c.reached_at = c.step
                    break
                if c.step >= opts.steps:
                    break
                if not value.requires_grad:
                    c.no_graph = True
                    break
                self._update(value, c.step)
                c.step += 1
        except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM (Terminated): keep the partial curve
            c.interrupted = interrupt_code(exc)
        c.seconds = time.perf_counter() - t0
        return c

    def _evaluate(self, step: int):
        """Forward and loss at `step`; records the loss (and accuracy), and at step 0 the output's shape facts."""
        c = self.curve
        try:
            with self.autocast():
                out = self._forward(step)
                value = self.loss_fn(out)
        except ModelError as e:
            if step and e.partial is None:
                e.partial = self.partial(f"the error came at step {step}")
            raise
        except UsageError:
            raise
        except Exception as exc:
            raise ModelError(f"loss (step {step}) failed: {one_line(exc)}",
                             hint=f"check the loss/target: {self.ctx.option('loss')}, {self.ctx.option('batch')}") from exc
        lv = float(value.detach().float())
        c.losses.append(lv)
        acc = accuracy(out, self.loss_fn)
        if acc is not None:
            c.accs.append(acc)
        if step == 0:
            c.first_same = same_across_samples(sample_tensor(out, self.batch.batch_size))[0]
            c.first_box = output_box(out, self.loss_fn)
            if lv < 0 and self.opts.target_loss is None and math.isfinite(lv):
                raise UsageError(f"the initial loss is {lv:.6g} (< 0): a ratio to it says nothing",
                                 hint=f"give an absolute target with {self.ctx.option('target_loss')}, "
                                      f"or a loss ≥ 0 ({self.ctx.option('loss')})")
        return value, lv, acc

    def _forward(self, step: int):
        """One forward; a failure becomes a ModelError naming the module (re-run under a tracker)."""
        from ...core.tracking import run_forward

        try:
            return self.batch.call(self.work)
        except DiagError:
            raise
        except Exception as exc:
            try:
                run_forward(self.work, self.batch, phase=f"forward (step {step})")
            except ModelError as named:
                raise named from exc
            except Exception:
                pass
            raise ModelError(f"forward (step {step}) failed: {one_line(exc)}",
                             hint="the model's own code raised; fix it or the inputs and run again") from exc

    def _update(self, value, step: int) -> None:
        """Backward (scaled under fp16), record the gradient facts, one optimizer step."""
        import torch

        c = self.curve
        try:
            # under fp16 the scaled loss goes backward; the gradients are unscaled before they are read
            train.backward(self.scaler.scale(value) if self.scaler else value,
                           hint="the model's backward raised; try `torchdiag gradflow`")
        except ModelError as e:
            e.partial = self.partial(f"backward failed at step {step}")
            raise
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if step == 0:
            c.missing = [n for n, p in self.trainable if p.grad is None]
        norms = []
        for n, p in self.trainable:
            if p.grad is not None:
                g = p.grad.detach()
                norms.append(g.float().norm())
                if not self.ever_nonzero[n] and bool((g != 0).any()):
                    self.ever_nonzero[n] = True
        c.grad_norms.append(float(torch.stack(norms).norm()) if norms else 0.0)
        c.lrs.append(float(self.optimizer.param_groups[0]["lr"]))
        try:
            train.step(self.stepper)
        except ModelError as e:
            e.partial = self.partial(f"the optimizer failed at step {step}")
            raise


def reached(lv: float, initial: float, acc: float | None, opts) -> bool:
    if opts.target_loss is not None and lv <= opts.target_loss:
        return True
    if initial < 0:
        return False
    return lv <= opts.target_ratio * initial and (acc is None or acc >= 1.0)
