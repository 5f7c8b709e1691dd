"""The one home of precision: dtype facts (largest finite, smallest normal/subnormal, ulp), the run's
precision resolved for its device (`Precision`), whether torch supports it there (`check_supported`,
a one-line usage error before the model loads), and the mechanics: autocast, the GradScaler, casting
a model and its float inputs for --dtype.

Two ways to run in reduced precision (core.run DTYPES/AMPS):
- --dtype bfloat16|float16: parameters, floating buffers and float inputs are cast; every op runs in it.
- --amp bf16|fp16: weights stay float32; ops run under torch.autocast in that dtype; fp16 adds a
  GradScaler where an optimizer step runs (its scale keeps small gradients above float16's underflow).

torch is imported inside functions: `Precision` and the facts table can be built without it."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from ..errors import OptionError, option_name

# Headroom: a value within this factor of the dtype's largest finite value is an overflow risk (one
# more doubling-heavy op, e.g. x*x or a sum over 8 such values, and it is Inf). Warnings, not errors.
HEADROOM = 8.0
# Commands that model autocast on the meta device rather than run it there (memory's estimate).
AMP_MODELLED_ON_META = ("memory",)
REDUCED = ("bfloat16", "float16")      # the reduced floating dtypes, by name: the one list


def is_reduced(dtype) -> bool:
    """bfloat16 or float16: a torch dtype, or its name with or without "torch."."""
    return str(dtype).replace("torch.", "") in REDUCED


@dataclass(frozen=True)
class DtypeFacts:
    """What a floating dtype can hold (torch.finfo), torch-free once built."""

    name: str
    max: float                  # largest finite value
    smallest_normal: float      # below it values lose precision (subnormal) ...
    smallest_subnormal: float   # ... and below half of this they flush to zero
    eps: float                  # ulp of 1.0
    mantissa_bits: int

    def ulp(self, x: float) -> float:
        """The spacing of representable values at |x| (the distance to the next one away from zero)."""
        a = abs(x)
        if a < self.smallest_normal:
            return self.smallest_subnormal
        return 2.0 ** math.floor(math.log2(a)) * self.eps

    @property
    def headroom_limit(self) -> float:
        """|x| above this is within HEADROOM of overflowing."""
        return self.max / HEADROOM

    def as_dict(self) -> dict:
        return {"dtype": self.name, "max": self.max, "smallest_normal": self.smallest_normal,
                "smallest_subnormal": self.smallest_subnormal, "eps": self.eps}


# torch.finfo values, written out so that facts() needs no torch; tests check them against torch.finfo.
_FACTS = {
    "float32": DtypeFacts("float32", 3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45, 2.0**-23, 23),
    "bfloat16": DtypeFacts("bfloat16", 3.3895313892515355e38, 1.1754943508222875e-38, 9.183549615799121e-41, 2.0**-7, 7),
    "float16": DtypeFacts("float16", 65504.0, 6.103515625e-05, 5.960464477539063e-08, 2.0**-10, 10),
    "float64": DtypeFacts("float64", 1.7976931348623157e308, 2.2250738585072014e-308, 5e-324, 2.0**-52, 52),
}


def facts(dtype) -> DtypeFacts:
    """The facts of a dtype given as a name ("float16") or a torch.dtype."""
    name = str(dtype).replace("torch.", "")
    try:
        return _FACTS[name]
    except KeyError:
        raise ValueError(f"no precision facts for {name}") from None


@dataclass(frozen=True)
class Precision:
    """The run's precision resolved for its device: what the parameters are cast to and what ops run in."""

    dtype: str | None = None       # --dtype: parameters and float inputs cast to it (None: as built)
    amp: str | None = None         # the autocast dtype (bfloat16/float16), None without --amp
    device_type: str = "cpu"

    @property
    def compute(self) -> str:
        """The dtype the model's ops (matmuls, convs) run in."""
        return self.amp or self.dtype or "float32"

    @property
    def reduced(self) -> bool:
        return self.compute in REDUCED

    @property
    def scaled(self) -> bool:
        """fp16 autocast: a GradScaler scales the loss where an optimizer step runs."""
        return self.amp == "float16"

    @property
    def facts(self) -> DtypeFacts:
        return facts(self.compute)

    def describe(self) -> str:
        if self.amp:
            return (f"autocast {self.amp} on {self.device_type} (float32 weights"
                    + (", GradScaler where a step runs)" if self.scaled else ")"))
        if self.dtype:
            return f"{self.dtype} (parameters, buffers and float inputs cast)"
        return "float32"

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "amp": self.amp, "compute": self.compute, "grad_scaler": self.scaled,
                "largest_finite": self.facts.max, "smallest_subnormal": self.facts.smallest_subnormal}


def precision_of(spec, device_type: str) -> Precision:
    """The Precision of a RunSpec on a device type (amp `auto` resolved: float16 on CUDA, else bfloat16)."""
    from .run import autocast_dtype

    return Precision(spec.dtype, autocast_dtype(spec.amp, device_type), device_type)


def check_supported(spec, device) -> None:
    """A one-line usage error (exit 2) for a precision torch refuses on this device, before the model loads."""
    import torch
    from torch.amp.autocast_mode import is_autocast_available

    p = precision_of(spec, device.type)
    if p.amp and not is_autocast_available(device.type) and not (device.type == "meta" and spec.command in AMP_MODELLED_ON_META):
        dtype = option_name("dtype", spec.caller)
        raise OptionError("amp", f"torch has no autocast for the {device.type} device",
                          hint=f"run on cpu or cuda, or use {dtype} instead (summary and flops work on meta with {dtype})")
    if device.type == "cuda" and "bfloat16" in (p.amp, p.dtype) and not torch.cuda.is_bf16_supported():
        name = "amp" if p.amp else "dtype"
        raise OptionError(name, f"this GPU ({torch.cuda.get_device_name(device)}) has no bfloat16 support",
                          hint="use float16 (fp16 with amp), or float32")


def autocast(precision: Precision, device):
    """torch.autocast in the run's amp dtype on `device`, or a nullcontext without --amp."""
    if not precision.amp:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=device.type, dtype=getattr(torch, precision.amp))


def refuse_scaled_complex(params, precision: Precision, option: str = "--amp") -> None:
    """fp16 loss scaling has no kernel for complex gradients (GradScaler's unscale raises NotImplementedError):
    a usage error before any step, naming the parameter count, not a crash in the middle of the run."""
    if not precision.scaled:
        return
    complex_params = [p for p in params if getattr(p, "is_complex", lambda: False)() and p.requires_grad]
    if complex_params:
        from ..errors import UsageError

        raise UsageError(f"{option} fp16 needs a GradScaler, which cannot unscale complex gradients "
                         f"({len(complex_params)} complex parameter(s) train)",
                         hint="use bf16 (no loss scaling), or run without amp")


def grad_scaler(precision: Precision, device):
    """torch.amp.GradScaler for fp16 autocast (CPU has one since torch 2.3), else None."""
    if not precision.scaled:
        return None
    import torch

    return torch.amp.GradScaler(device.type)


def cast_model(model, dtype: str | None):
    """The model with floating parameters and buffers in `dtype`, IN PLACE (integer, bool and complex
    ones kept: `Module.to(dtype)` would cast complex parameters to the real dtype, dropping their
    imaginary part). Only for a model torchdiag built itself; a caller's model goes through `cast_copy`."""
    if dtype is None:
        return model
    import torch

    target = getattr(torch, dtype)
    return model._apply(lambda t: t.to(target) if t.is_floating_point() else t)


def cast_overflow(model, dtype: str | None) -> dict[str, tuple[int, float]]:
    """The parameters and buffers whose finite values lie beyond `dtype`'s largest, which the cast turns into ±Inf:
    {name: (how many, the largest |value|)}, read back once for all; {} where the cast narrows no exponent range
    (bfloat16 keeps float32's: its largest is float32's to 0.4%, a band no weight sits in, not worth a read). A sweep: a checkpoint's 1e6 became Inf under --dtype float16, and nancheck blamed the file."""
    if dtype is None:
        return {}
    import torch

    from .readback import read_back

    top = torch.finfo(getattr(torch, dtype)).max
    named = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]
             if t.is_floating_point() and not t.is_complex() and t.numel() and t.device.type != "meta"
             and torch.finfo(t.dtype).max > 2 * top]   # a narrower exponent range (not bfloat16's from float32)
    if not named:
        return {}
    with torch.no_grad():
        sizes = [t.detach().abs().masked_fill(~torch.isfinite(t.detach()), 0) for _, t in named]
        values = read_back([v for s in sizes for v in ((s > top).sum(), s.amax())])
    return {n: (int(values[2 * i]), float(values[2 * i + 1])) for i, (n, _) in enumerate(named) if values[2 * i]}


def overflow_words(overflow: dict[str, tuple[int, float]], dtype: str) -> str:
    """The header's words for cast_overflow's names."""
    import torch

    names = list(overflow)
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    count = sum(c for c, _ in overflow.values())
    return (f"{count} finite value(s) of {shown} (up to |{max(m for _, m in overflow.values()):.3g}|) lie beyond "
            f"{dtype}'s largest, {torch.finfo(getattr(torch, dtype)).max:.6g}: the cast made them ±Inf")


def needs_cast(model, dtype: str | None) -> bool:
    """True when some floating parameter or buffer of `model` is not already `dtype`."""
    if dtype is None:
        return False
    tensors = list(model.parameters()) + list(model.buffers())
    return any(t.is_floating_point() and str(t.dtype) != f"torch.{dtype}" for t in tensors)


def cast_copy(model, dtype: str | None):
    """A deep copy of a caller's model in `dtype` (the caller's model is never changed); the model
    itself when nothing needs casting."""
    if not needs_cast(model, dtype):
        return model
    from .train import train_copy

    modes = [m.training for m in model.modules()]
    work = train_copy(model, f"to run it in {dtype}")   # deepcopy, parameter hooks kept, .grad cleared
    for m, training in zip(work.modules(), modes):      # train_copy sets train mode: put each flag back
        m.training = training
    return cast_model(work, dtype)


def cast_inputs(inputs, dtype: str | None):
    """ModelInputs with every floating tensor in `dtype` (integer and bool inputs kept)."""
    if dtype is None or inputs is None:
        return inputs
    import torch

    target = getattr(torch, dtype)
    return inputs.map(lambda t: t.to(target) if t.is_floating_point() else t)
