"""Finiteness primitives. Two kinds:

- exact, one host sync each (`finite`, `counts`, `value_range`): used only where something is already
  known to be non-finite, or to confirm a suspicion;
- device-side (`device_sum`, `totals`, `read_back`, `all_finite`): a 0-dim value per tensor that is
  non-finite whenever any element is (NaN and Inf survive a sum), kept on the device and read back
  once, so a healthy check costs a constant number of host syncs however deep the model is. A huge
  but finite tensor can overflow its sum: that is only a suspicion, decided exactly afterwards."""
from __future__ import annotations

import math

from ...core.device import wide_float
from ...core.readback import read_back

_FULL: tuple = ()


def _init_dtypes():
    global _FULL
    import torch

    _FULL = (torch.float32, torch.float64)


def is_float(t) -> bool:
    return t.is_floating_point() or t.is_complex()


def _wide(d):
    """float8 has no sum, norm or isfinite of its own (a review's fp8 buffer was an internal error): its float32
    copy; a sparse tensor (a graph's adjacency buffer: no norm on SparseCPU, an internal error) its stored values;
    any other tensor as it is."""
    import torch

    if d.layout == torch.sparse_coo:
        d = d.coalesce().values()
    elif d.layout != torch.strided:   # CSR, CSC, BSR, BSC
        d = d.values()
    return d.float() if d.is_floating_point() and d.element_size() == 1 else d


def finite(t) -> bool:
    """True when every element is finite. One reduction; the exact test only on suspicion."""
    import torch

    if not _FULL:
        _init_dtypes()
    d = _wide(t.detach())
    if d.dtype in _FULL:
        if math.isfinite(d.sum().item()):
            return True
    elif d.is_complex():
        return bool(torch.isfinite(d).all())
    elif math.isfinite(d.sum(dtype=torch.float32).item()):  # float16/bfloat16/float8: sum in float32
        return True
    if d.numel() == 0:
        return True
    return bool(torch.isfinite(d).all())  # a huge finite sum can overflow: decide exactly


def device_sum(t):
    """A 0-dim tensor on t's device, non-finite when any element of t is (no host sync)."""
    import torch

    if not _FULL:
        _init_dtypes()
    d = _wide(t.detach())
    if d.dtype in _FULL:
        return d.sum()
    if d.is_complex():
        return d.abs().sum()
    return d.sum(dtype=torch.float32)


def totals(tensors) -> list:
    """One 0-dim float64 tensor per device, non-finite when any element of any tensor is. Batched:
    `torch._foreach_norm(·, 1)` (a sum of |x|) per dtype group; no host sync."""
    import torch

    if not _FULL:
        _init_dtypes()
    groups: dict = {}
    for t in tensors:
        d = _wide(t.detach())
        if d.numel() and (d.is_floating_point() or d.is_complex()):   # int/bool values are always finite
            low = d.dtype not in _FULL and not d.is_complex()   # float16/bfloat16: norm in float32
            groups.setdefault((d.device, low, d.is_complex()), []).append(d)
    parts: dict = {}
    for (device, low, cplx), ts in groups.items():
        norms: list | tuple   # a list of sums, or _foreach_norm's tuple
        if cplx:
            norms = [t.abs().sum() for t in ts]
        else:
            norms = torch._foreach_norm(ts, 1, dtype=torch.float32) if low else torch._foreach_norm(ts, 1)
        parts.setdefault(device, []).extend(norms)
    return [_sum(ps) for ps in parts.values()]


def scalar_totals(scalars) -> list:
    """The sum of 0-dim tensors (device_sum's), one tensor per device in its widest float (no host sync)."""
    parts: dict = {}
    for s in scalars:
        parts.setdefault(s.device, []).append(s)
    return [_sum(ps) for ps in parts.values()]


def _sum(scalars):
    import torch

    wide = wide_float(scalars[0].device)
    return torch.stack([s.to(wide) for s in scalars]).sum()


def all_finite(tensors) -> bool:
    """True when every element of every tensor is finite, with ONE host sync per device for the lot.
    On suspicion (a non-finite total) each tensor is decided exactly by `finite`, so the answer is
    never wrong, only slower."""
    ts = [t.detach() for t in tensors if t.numel()]
    if not ts:
        return True
    if all(math.isfinite(v) for v in read_back(totals(ts))):
        return True
    return all(finite(t) for t in ts)


def counts(t) -> tuple[int, int]:
    """(NaN count, Inf count)."""
    import torch

    d = _wide(t.detach())
    return int(torch.isnan(d).sum()), int(torch.isinf(d).sum())


def value_range(t) -> tuple[float | None, float | None]:
    """(min, max) over the finite elements."""
    import torch

    d = _wide(t.detach())
    if d.is_complex():
        d = d.abs()
    d = d[torch.isfinite(d)]
    if d.numel() == 0:
        return None, None
    return float(d.min()), float(d.max())


def flatten(obj, label: str, out: list, depth: int = 0) -> list:
    """(label, tensor) for every floating tensor in a nested output."""
    import torch

    if isinstance(obj, torch.Tensor):
        if is_float(obj):
            out.append((label, obj))
    elif depth > 6:
        pass
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            flatten(x, f"{label}[{i}]", out, depth + 1)
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "items")):
        for k, x in obj.items():
            flatten(x, f"{label}['{k}']", out, depth + 1)
    return out


def floating_inputs(args, kwargs) -> list:
    """(label, tensor) for every floating tensor a module call received."""
    import torch

    if not kwargs and all(type(a) is torch.Tensor for a in args):   # the common case, fast
        return [(f"input[{i}]", a) for i, a in enumerate(args) if a.is_floating_point() or a.is_complex()]
    return flatten(tuple(args), "input", []) + flatten(dict(kwargs), "input", [])


def shape_text(t) -> str:
    return "x".join(map(str, t.shape)) or "scalar"
