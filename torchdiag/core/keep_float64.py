"""A float64 copy that stays float64: model code that narrows a tensor on purpose (`softmax(x.float())`,
`softmax(x, dtype=torch.float32)`, `.to(torch.bfloat16)`) is made to compute in float64 instead, while a
re-check needs exact arithmetic (core/invariance.py). A float32 softmax rounds its logits at ~1e-7 of
their size, and in a shift test that rounding looks like a real dependence: XLM's key biases, which a
softmax cancels exactly, moved the loss by 7e-9 of itself on a float64 copy (transformers' modeling_xlm.py
computes `softmax(scores.float())`). Only floating dtypes narrower than float64 are widened; integer and
complex casts, and `view(dtype)` (a reinterpretation of the bits), are left as they are. A cast to half,
bfloat16 or float8 makes a new tensor, as it does in the real run (an in-place write to it must not reach
its source); one to float32 may return its input, as `.float()` on a float32 tensor does. Code that
reads the bits of a float32 (`x.float().view(torch.int32)`) gets float64 bits: invariance.py runs the copy
as written when the widened forward fails."""
from __future__ import annotations

import functools
from contextlib import contextmanager


def _narrow(dtype) -> bool:
    import torch

    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype != torch.float64


def _widened(func, args, kwargs):
    """(func, args, kwargs, the narrow dtype asked for or None), each narrowing float cast made a float64 one."""
    import torch

    asked = _casts().get(func)
    if asked is not None:
        func = torch.Tensor.double
    if func in (torch.Tensor.to, torch.Tensor.type):   # to(dtype) / to(device, dtype) / to(other) / type(dtype)
        out = []
        for i, a in enumerate(args):
            if _narrow(a):
                asked, a = a, torch.float64
            elif i > 0 and isinstance(a, torch.Tensor) and _narrow(a.dtype):
                asked, a = a.dtype, a.double()
            out.append(a)
        args = tuple(out)
    if _narrow(kwargs.get("dtype")) and func is not torch.Tensor.view:
        asked, kwargs = kwargs["dtype"], {**kwargs, "dtype": torch.float64}
    return func, args, kwargs, asked


@functools.cache
def _casts() -> dict:
    import torch

    return {torch.Tensor.float: torch.float32, torch.Tensor.half: torch.float16, torch.Tensor.bfloat16: torch.bfloat16}


@contextmanager
def kept():
    """Run the body with narrowing float casts widened to float64 (see the module's doc)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class KeepFloat64(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            func, args, kwargs, asked = _widened(func, args, kwargs or {})
            out = func(*args, **kwargs)
            if asked is not None and asked != torch.float32 and args and out is args[0]:
                return out.clone()   # a cast to a narrower type makes a new tensor in the real run
            return out

    with KeepFloat64():
        yield
