"""Are a forward's ±inf values written as constants (a mask filled with -inf) or computed (an overflow, a
division by zero, log(0))?

A model may return ±inf on purpose: Grounding DINO pads its class logits' text axis to `max_text_len` with
`torch.full(..., -inf)` and `masked_fill(mask, -inf)`, and marks invalid box proposals with +inf. Such a value
is a constant the code wrote, whatever the weights are: no target can be fitted there, and a made-up loss term
over it is +inf (every gradient NaN), an artefact of torchdiag's loss. An overflow is the model's fault. The
two are told apart by what each op did, not by the values (a gradient path does not tell: a fill plus a weighted
value has one; nor does float64: casts and divisions overflow there too): one forward under a dispatch mode
counts, per op, the non-finite values of its floating inputs before it runs and of its outputs after.

- an op whose inputs are all finite and whose output is not *made* them: a fill when the call passes ±inf as a
  number (`masked_fill(m, -inf)`, `full(shape, -inf)`, `scalar_tensor(-inf)`) and makes no NaN; computed
  otherwise (a cast to float16 of 1e9, `x / 0`, `exp(1000)`);
- an op that makes NaN from inputs without NaN (`-inf - -inf`, a softmax over a row masked throughout, 0 × inf)
  computed it;
- an uninitialised allocation (`empty_like`) makes nothing: its contents are whatever the memory held.

`only_fills`: every non-finite value of the forward came from fills. Only then does the auto loss leave an
output's ±inf positions of that forward out of a made-up target's term (core/loss.py), and nancheck call the
output's ±inf by design. Cost: one forward with a few reductions per op, only when a made-up term or a module's
output is non-finite; values are read back once."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError

UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "empty_permuted"})


@dataclass
class Fills:
    made: dict[str, int] = field(default_factory=dict)       # op -> ±inf values it wrote as a constant
    computed: dict[str, int] = field(default_factory=dict)   # op -> non-finite values it computed
    masks: dict[str, Any] = field(default_factory=dict)      # output label -> its ±inf positions (on its device)
    failed: str | None = None                                # why the forward could not be asked

    @property
    def only_fills(self) -> bool:
        return self.failed is None and not self.computed and bool(self.made)

    def mask(self, label: str, like) -> Any | None:
        """Output `label`'s ±inf positions when fills alone made every non-finite value of the forward and the
        output has `like`'s shape and device; else None."""
        m = self.masks.get(label) if self.only_fills else None
        return m if m is not None and m.shape == like.shape and m.device == like.device else None

    def describe(self) -> str:
        ops = ", ".join(f"{op} ({n:,})" for op, n in sorted(self.made.items(), key=lambda kv: -kv[1]))
        return f"by {ops}"


def _op(func) -> str:
    return str(getattr(func, "overloadpacket", func)).replace("aten.", "")


def _mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def floats(tree) -> list:
        return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and (t.is_floating_point() or
                                                                                  t.is_complex()) and t.numel()]

    def bad(ts) -> Any:   # (non-finite, NaN) counts over the tensors, on the first one's device
        if not ts:
            return None
        return torch.stack([torch.stack([(~torch.isfinite(t)).sum(), torch.isnan(t).sum()]).to(ts[0].device)
                            for t in ts]).sum(0)

    class Origins(TorchDispatchMode):
        """Per op call: (op, passes ±inf as a number, inputs' counts, outputs' counts), counts on the device."""

        def __init__(self):
            super().__init__()
            self.rows: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = _op(func)
            if name in UNINITIALISED:
                return func(*args, **kwargs)
            before = bad(floats((args, kwargs)))   # before: an in-place op overwrites its input
            out = func(*args, **kwargs)
            after = bad(floats(out))
            if after is not None:
                number = any(isinstance(a, float) and math.isinf(a) for a in tree_leaves((args, kwargs)))
                self.rows.append((name, number, before, after))
            return out

    return Origins()


def classify(rows) -> tuple[dict[str, int], dict[str, int]]:
    """(made, computed) from the mode's rows, read back in one go."""
    import torch

    if not rows:
        return {}, {}
    by_device: dict = {}   # one read per device
    for k, (_, _, before, after) in enumerate(rows):
        row = torch.cat([before.to(after.device) if before is not None else torch.zeros_like(after), after])
        by_device.setdefault(after.device, []).append((k, row))
    values: list = [None] * len(rows)
    for items in by_device.values():
        for (k, _), v in zip(items, torch.stack([r for _, r in items]).tolist()):
            values[k] = v
    made: dict[str, int] = {}
    computed: dict[str, int] = {}
    for (name, number, _, _), v in zip(rows, values):
        (in_bad, in_nan, out_bad, out_nan) = (int(x) for x in v)
        if out_bad and not in_bad:
            into = made if number and not out_nan else computed
            into[name] = into.get(name, 0) + out_bad
        elif out_nan and not in_nan:
            computed[name] = computed.get(name, 0) + out_nan
    return made, computed


def ask(model, inputs, ctx) -> Fills:
    """One forward of `model` (in place, in train mode, under no_grad, seeded as the run, autocast as the
    run; buffers and flags put back) under the dispatch mode: what made its non-finite values, and each output's
    ±inf positions."""
    import torch

    from .guard import leave_no_trace
    from .loss import float_outputs
    from .tracking import run_forward

    if ctx.wrapper is not None or ctx.pass_wrapper is not None:   # a plain forward of one rank's (sharded) model
        return Fills(failed="not asked under torchrun")               # would wait for the others' collectives
    mode = _mode()
    try:
        with leave_no_trace(model), torch.no_grad(), ctx.seeded():
            model.train()   # the mode of the passes whose loss asks (flags put back)
            amp = ctx.autocast() if ctx.precision.amp else _nothing()
            with amp, mode:
                out = run_forward(model, inputs, phase="forward (where its ±inf come from)")
            made, computed = classify(mode.rows)
            masks = {label: torch.isinf(t.detach()) for label, t in float_outputs(out)}
    except ModelError as exc:
        return Fills(failed=exc.message)
    except Exception as exc:   # noqa: BLE001 - a second opinion only: without it, ±inf count as computed
        return Fills(failed=f"{type(exc).__name__}: {exc}")
    return Fills(made, computed, masks)


def _nothing():
    import contextlib

    return contextlib.nullcontext()
