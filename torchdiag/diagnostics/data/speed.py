"""Does the loader keep up? The loader as configured (first batch, batches/s), a sweep over num_workers
(and pin_memory on CUDA), and with a model the share of each training step spent waiting for data,
measured for each worker count of the sweep (the count that balances it is measured, not guessed)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from ...core import batches as B
from ...core.datasets import rebuild
from ...core.fetch import guarded
from ...errors import DiagError, UsageError, one_line
from .scan import Ragged, safe


@dataclass
class Timing:
    """One pass over the first batches of one loader configuration."""

    num_workers: int | None
    pin_memory: bool = False
    first_batch_s: float | None = None
    batches: int = 0                    # timed batches after the first
    samples: int = 0
    seconds: float = 0.0                # for the timed batches
    labels: list = field(default_factory=list)   # per-sample labels in the order given (the probe only)
    sizes: list = field(default_factory=list)    # batch sizes seen
    wait_s: float = 0.0                 # with a model: time waiting for data (timed steps)
    step_s: float = 0.0                 # with a model: time in forward/backward/step (timed steps)
    ended: bool = False                 # the loader ran out before --batches
    stepped: bool = False               # a training step ran on each batch

    @property
    def batches_per_s(self) -> float | None:
        return self.batches / self.seconds if self.batches and self.seconds > 0 else None

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.samples and self.seconds > 0 else None

    @property
    def wait_share(self) -> float | None:
        total = self.wait_s + self.step_s
        return self.wait_s / total if self.stepped and self.batches and total > 0 else None

    def row(self) -> dict:
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory, "first_batch_s": self.first_batch_s,
                "batches_per_s": self.batches_per_s, "samples_per_s": self.samples_per_s, "batches": self.batches,
                "wait_share": self.wait_share, "step_s": self.step_s / self.batches if self.batches and self.step_s else None}


def time_loader(loader, opts, *, dataset=None, step=None, look=None, label="the loader", timing=None,
                limit: int | None = None) -> Timing:
    """Iterate the first `limit` (default opts.batches) + 1 batches (the first, which includes starting
    workers, timed on its own). `step(batch)`: a training step run on each batch (its time is the step, the
    rest the wait); `look(batch)`: called on each batch first, outside the timing of steps."""
    from torch.utils.data import DataLoader

    nw = loader.num_workers if isinstance(loader, DataLoader) else None
    t = timing or Timing(nw, bool(getattr(loader, "pin_memory", False)))
    t.stepped = step is not None
    changes = safe(loader) if isinstance(loader, DataLoader) else None
    fetcher, cleanup = guarded(loader, opts.timeout, dataset=dataset, label=label, changes=changes)
    start = last = time.perf_counter()
    try:
        for k, batch in enumerate(fetcher):
            got = time.perf_counter()
            if k == 0:
                t.first_batch_s = got - start
            if look is not None:
                look(batch)
            parts = batch.parts if isinstance(batch, Ragged) else [batch]
            n = sum(B.batch_size(p) for p in parts)
            t.sizes.append(n)
            if step is not None and not isinstance(batch, Ragged):
                step(batch)
            done = time.perf_counter()
            if k > 0:
                t.batches += 1
                t.samples += n
                t.seconds += done - last
                t.wait_s += got - last
                t.step_s += done - got if step is not None else 0.0
            last = done
            if k >= (opts.batches if limit is None else limit):
                break
        else:
            t.ended = True
    finally:
        fetcher.close()
        cleanup()
    return t


def labels_of(parts, target: str) -> list:
    out: list[int] = []
    for p in parts:
        try:
            y = B.get(p, target)
        except KeyError:
            return []
        if y.dim() <= 1 and not y.is_floating_point() or (y.dim() <= 1 and bool((y == y.round()).all())):
            out.extend(int(v) for v in y.reshape(-1).tolist())
        else:
            return []
    return out


def candidates(opts, current: int | None) -> list[int]:
    """num_workers to try: the ones asked for, else 0, 1, 2, 4, … up to the CPU count (and the loader's own)."""
    if opts.workers is not None:
        return sorted(set(opts.workers))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out, w = [0], 1
    while w <= min(cpus, 16):
        out.append(w)
        w *= 2
    if current is not None and current not in out:
        out.append(current)
    return sorted(out)


def sweep(loader, opts, ctx, dataset, step_factory=None, label="train data"):
    """Yields a Timing per configuration (so Ctrl-C keeps those done): the same loader with each num_workers
    (persistent workers off, so each run pays its start), and on CUDA pin_memory flipped for the fastest;
    with a model, the training steps too."""
    runs = []
    for nw in candidates(opts, loader.num_workers):
        variant = rebuild(loader, num_workers=nw, persistent_workers=False)
        step = step_factory() if step_factory else None
        runs.append(time_loader(variant, opts, dataset=dataset, step=step, label=f"{label} (num_workers={nw})"))
        yield runs[-1]
    if ctx.device.type == "cuda" and runs:
        best = max(runs, key=lambda r: r.batches_per_s or 0)
        variant = rebuild(loader, num_workers=best.num_workers, persistent_workers=False, pin_memory=not best.pin_memory)
        step = step_factory() if step_factory else None
        yield time_loader(variant, opts, dataset=dataset, step=step,
                          label=f"{label} (num_workers={best.num_workers}, pin_memory={not best.pin_memory})")


class TrainStep:
    """One training step of a copy of the model on a batch: forward, loss (against the batch's target, or
    the loss rules' own target when it has none), backward, optimizer step; synchronised on CUDA so the
    time is the step's."""

    def __init__(self, model, ctx, roles, skip_one: bool = False):
        from ...core.context import loss_rule

        self.work = ctx.train_copy(model, "to time its training step", steps=True)
        self.opt = ctx.optimizer([p for p in self.work.parameters() if p.requires_grad])
        self.ctx, self.roles, self.loss_rule = ctx, roles, loss_rule
        self.non_blocking = ctx.device.type == "cuda"
        self.skip_one = skip_one      # a batch of one raises in train mode (reported as last-batch-of-one)

    def __call__(self, batch) -> None:
        from ...core.tracking import forward_error
        from ...core.train import backward, step

        ctx = self.ctx
        if self.skip_one and B.batch_size(batch) == 1:
            return
        args, kwargs = B.model_call(batch, self.roles)
        move = lambda t: t.to(ctx.device, non_blocking=self.non_blocking) if isinstance(t, torch.Tensor) else t  # noqa: E731
        args, kwargs = tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}
        target = B.get(batch, self.roles.target) if self.roles.target else None
        target = move(target) if target is not None else None
        rule = self.loss_rule(ctx.custom_loss or ctx.spec.loss, ctx.loaded, target, ctx.seed)
        try:
            with ctx.autocast():
                out = self.work(*args, **kwargs)
                loss = rule(out)
        except DiagError:
            raise
        except Exception as exc:
            raise forward_error(exc, None, "the training step's forward") from exc
        backward(loss)
        step(self.opt)
        self.opt.zero_grad(set_to_none=True)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)


def _dtypes_fit(model, args, kwargs, exc) -> None:
    """A forward that failed on float64 inputs (numpy's default: scikit-learn's `X, y`) with float32 weights: said as
    the data's dtype (exit 2), not the model's code (a sweep: exit 3, "the model's own code raised"). Only once the
    forward failed: a model that casts its input itself takes them. The data are read as they are: a cast would change
    what the findings see (a review: rows 1e-12 apart collided)."""
    kinds = {p.dtype for p in model.parameters() if p.is_floating_point()}
    given = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor) and t.dtype == torch.float64]
    if given and kinds and torch.float64 not in kinds:
        weights = "/".join(sorted(str(k).replace("torch.", "") for k in kinds))
        raise UsageError(f"the data's input is float64 and the model's weights are {weights}: its forward failed "
                         f"({exc.message}), and every training step would", hint="convert the data to the model's dtype "
                         "(X.astype(np.float32), torch.tensor(x, dtype=torch.float32)), or the model to float64 "
                         "(model.double())") from None


def output_size(model, batch, roles, ctx, beyond_binary: bool | None = None) -> tuple[int | None, bool]:
    """(the class dimension of the model's output on one batch (eval, no grad, on a copy): C ≥ 2; 1 for one value
    per sample ((N,) or (N, 1): a binary logit or a regression, whose targets are values, not class indices), or per
    position (an output of the target's own shape whose values are not all 0/1: `beyond_binary`, read over the whole
    split by the caller, else from this batch); None when unknown (a forward that fails, an output of another shape);
    whether it is one value per position)."""
    import copy

    from ...core.inputs import ModelInputs
    from ...core.loss import primary_output
    from ...core.tracking import run_forward

    args, kwargs = B.model_call(batch, roles)
    inputs = ModelInputs(args, kwargs, "the data").to(ctx.device)
    work = copy.deepcopy(model).eval()
    with torch.no_grad(), ctx.seeded():
        try:
            out = run_forward(work, inputs)
        except DiagError as exc:   # a forward that failed on float64 data: the data's dtype, said as such
            _dtypes_fit(model, args, kwargs, exc)
            raise
    try:
        y, _ = primary_output(out)
    except Exception:
        return None, False
    # cross_entropy's convention: (N, C) with C ≥ 2 classes; (N, 1) is a binary logit, not one class
    n = B.batch_size(batch)
    if y.is_floating_point() and y.dim() >= 1 and y.shape[0] == n and y.numel() == n:   # (N,), (N, 1), (N, 1, 1, 1)
        return 1, False   # (a 0-d output is a batch's loss as often as a squeezed batch of one: unknown)
    target = B.get(batch, roles.target) if roles.target is not None else None
    if _one_per_target_value(y, target, beyond_binary):
        return 1, True
    if isinstance(target, torch.Tensor) and target.dim() >= 2 and y.dim() == target.dim() + 1 \
            and tuple(y.shape[:-1]) == tuple(target.shape) and y.shape[-1] >= 2:
        return int(y.shape[-1]), False   # (N, T, C) against (N, T): a language model's tokens (a new user's: T was read)
    if y.dim() >= 2 and y.shape[1] >= 2:
        return int(y.shape[1]), False
    return None, False


def _one_per_target_value(y, target, beyond_binary: bool | None) -> bool:
    """The output has the target's own (N, T, ...) shape and the target holds values other than 0/1 (an ignore
    index, a regression's values): one logit or value per position, not T classes (a per-token binary tagger's
    (N, T) logits read as 30 classes, a review). A 0/1 target of the output's shape stays a multi-label's. The
    values are the whole split's where known (a review: a loader sorted longest first had no padding in its first
    batch)."""
    if not isinstance(target, torch.Tensor) or target.dim() < 2 or tuple(y.shape) != tuple(target.shape):
        return False
    return beyond_binary if beyond_binary is not None else bool(((target != 0) & (target != 1)).any())


def input_scaling(model, batch, roles, ctx):
    """core.input_scale.Seen for the model's only float input on one batch (eval, on a copy), or None
    (several float inputs, none, or a forward that raises)."""
    from ...core.input_scale import weighted_inputs

    return _on_only_float_input(weighted_inputs, model, batch, roles, ctx)


def input_standardising(model, batch, roles, ctx):
    """core.input_scale.Standardising for the model's only float input on one batch (train mode, on a copy), or
    None."""
    from ...core.input_scale import standardising_changes

    return _on_only_float_input(standardising_changes, model, batch, roles, ctx)


def _on_only_float_input(measure, model, batch, roles, ctx):
    """measure(copy of the model, inputs, ctx, the only float input), or None when the batch has several or none.
    A plain copy: train_copy's room check reads sizes a lazy parameter does not have before its first forward."""
    import copy

    from ...core.inputs import ModelInputs

    args, kwargs = B.model_call(batch, roles)
    inputs = ModelInputs(args, kwargs, "the data").to(ctx.device)
    floats = [t for _, t in inputs.tensors() if t.is_floating_point()]
    if len(floats) != 1:
        return None
    return measure(copy.deepcopy(model), inputs, ctx, floats[0])


def batch_of_one_fails(model, batch, roles, ctx) -> str | None:
    """The one-line error a train-mode forward raises on a batch of one sample (BatchNorm refuses it), or None."""
    from ...core.train import train_copy

    args, kwargs = B.model_call(batch, roles)
    cut = lambda t: t[:1].to(ctx.device) if isinstance(t, torch.Tensor) and t.dim() else t  # noqa: E731
    work = train_copy(model, "to try a batch of one")
    try:
        with torch.no_grad(), ctx.seeded():
            work(*tuple(cut(a) for a in args), **{k: cut(v) for k, v in kwargs.items()})
    except Exception as exc:
        return one_line(exc)
    return None
