"""The step estimated on fake tensors (torch's FakeTensorMode, fake CPU tensors): shapes and dtypes
propagate, nothing is allocated. Used for --device meta, every --batch-sizes entry and the --budget search."""
from __future__ import annotations

import copy
from typing import Any

from ...core.fake_quiet import fake_log_quiet
from ...errors import ModelError, UsageError
from .step import StepReport, run_step, unique


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def _fake_copy(model, dtype):
    """A copy of `model` whose parameters and buffers are fake CPU tensors (call inside the fake
    mode). Nothing is copied from the original: ties between parameters are kept."""
    import torch
    from torch import nn

    memo: dict[int, Any] = {}
    for p in unique(model.parameters()):
        dt = dtype if (dtype is not None and p.is_floating_point()) else p.dtype
        memo[id(p)] = nn.Parameter(torch.empty(tuple(p.shape), dtype=dt, device="cpu"), requires_grad=p.requires_grad)
    others = list(model.buffers())
    for mod in model.modules():  # plain tensor attributes (masks, example_input_array …), in lists and dicts too
        others += [v for v in _held(list(vars(mod).values())) if not isinstance(v, nn.Parameter)]
    for b in unique(others):
        if id(b) in memo:
            continue
        dt = dtype if (dtype is not None and b.is_floating_point()) else b.dtype
        memo[id(b)] = torch.empty(tuple(b.shape), dtype=dt, device="cpu")
    return copy.deepcopy(model, memo)


def _held(values, depth: int = 0) -> list:
    """The tensors among `values` and inside their lists, tuples and dicts: a real one left there made the deep copy
    put real storage into a fake tensor (torchvision's AnchorGenerator keeps `cell_anchors` in a list: every
    detector's memory exited 4)."""
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple, dict)) and depth < 4:
            out += _held(list(v.values()) if isinstance(v, dict) else list(v), depth + 1)
    return out


def _fake_inputs(inputs, batch_size, dtype):
    import torch

    old = inputs.batch_size

    def make(t):
        shape = tuple(t.shape)
        if batch_size is not None and old is not None and shape and shape[0] == old:
            shape = (batch_size,) + shape[1:]
        dt = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        return torch.zeros(shape, dtype=dt, device="cpu")

    return inputs.map(make)


def estimate(model, inputs, opts, ctx, batch_size: int | None = None, emulate: str = "cpu", *,
             ran_for_real: bool = False) -> StepReport:
    """The step on fake tensors. `ran_for_real`: the same step (same shapes) was just measured, so a
    failure here comes from fake tensors themselves."""
    import torch

    dtype = getattr(torch, ctx.spec.dtype) if ctx.spec.dtype else None
    with _fake_mode(), fake_log_quiet():
        work = _fake_copy(model, dtype)
        ins = _fake_inputs(inputs, batch_size, dtype)
        try:
            return run_step(work, ins, opts, ctx, emulate=emulate, method="estimated on fake tensors (nothing allocated)")
        except (ModelError, *_value_reading_errors()) as exc:
            if not (ran_for_real or _reads_values(exc)):
                raise
            what = exc.message if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}"
            # an op whose fake kernel refuses what its real one runs (a sweep: torch._grouped_mm on float32, mixtral's
            # experts) is no value read: said as what failed
            why = "the model's code reads tensor values" if _reads_values(exc) else "the step does not run on fake tensors"
            real = getattr(ctx, "device", None) is not None and ctx.device.type != "meta"
            hint = (f"measure each batch size for real instead: without {ctx.option('batch_sizes')}/"
                    f"{ctx.option('budget')}, one run per size (-i with that batch)" if real else
                    f"measure it on a real device instead ({ctx.option('device')} cpu or cuda, without "
                    f"{ctx.option('batch_sizes')}/{ctx.option('budget')})")   # (a sweep: "use --device cpu" to one)
            raise UsageError(f"cannot estimate without allocating: {why} ({what})", hint=hint) from exc


def _value_reading_errors() -> tuple[type, ...]:
    """What fake tensors raise for an op whose result depends on values (.item(), nonzero, ...)."""
    from torch._subclasses import fake_tensor as ft

    return (ft.DataDependentOutputException, ft.DynamicOutputShapeException, ft.UnsupportedOperatorException,
            ft.UnsupportedFakeTensorException)


def _reads_values(exc) -> bool:
    """The failure, or what caused it, is fake tensors refusing a value-dependent op."""
    from ...errors import caused_by

    return caused_by(exc, _value_reading_errors())
