"""A float64 copy that stays float64: model code that narrows a tensor on purpose (`softmax(x.float())`,
`softmax(x, dtype=torch.float32)`, `.to(torch.bfloat16)`) is made to compute in float64 instead, while a
re-check needs exact arithmetic (core/invariance.py). A float32 softmax rounds its logits at ~1e-7 of
their size, and in a shift test that rounding looks like a real dependence: XLM's key biases, which a
softmax cancels exactly, moved the loss by 7e-9 of itself on a float64 copy (transformers' modeling_xlm.py
computes `softmax(scores.float())`). Only floating dtypes narrower than float64 are widened; integer and
complex casts, and `view(dtype)` (a reinterpretation of the bits), are left as they are."""
from __future__ import annotations

from contextlib import contextmanager


def _narrow(dtype) -> bool:
    import torch

    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype != torch.float64


def _widened(func, args, kwargs):
    """(args, kwargs) with each narrowing float dtype replaced by float64."""
    import torch

    if func in (torch.Tensor.to, torch.Tensor.type):   # to(dtype) / to(device, dtype) / to(other) / type(dtype)
        args = tuple(torch.float64 if _narrow(a) else a.double() if _narrow_tensor(a) and i > 0 else a
                     for i, a in enumerate(args))
    if _narrow(kwargs.get("dtype")) and func is not torch.Tensor.view:
        kwargs = {**kwargs, "dtype": torch.float64}
    return args, kwargs


def _narrow_tensor(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and _narrow(t.dtype)


@contextmanager
def kept():
    """Run the body with narrowing float casts widened to float64 (see the module's doc)."""
    import torch
    from torch.overrides import TorchFunctionMode

    casts = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}

    class KeepFloat64(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in casts and args and isinstance(args[0], torch.Tensor):
                return args[0].double() if args[0].dtype != torch.float64 else args[0]
            args, kwargs = _widened(func, args, kwargs)
            return func(*args, **kwargs)

    with KeepFloat64():
        yield
