"""Count the calls that force a host sync (the CPU waiting for the device), on any device, CPU included.

    with SyncCounter() as s:
        step()
    s.total, s.counts            # {"aten::_local_scalar_dense": 3, "aten::nonzero": 1, ...}
    with SyncCounter(frames=True) as s: ...
    s.events[0].frames           # ((file, line, function), ...) innermost last

Counted at the dispatch level (a TorchDispatchMode), so it works on CPU where a sync costs nothing
and is otherwise invisible, and in CI:

- `aten::_local_scalar_dense`: `.item()`, `bool(t)` / `if t:`, `float(t)`, `int(t)`, `math.isfinite(t)`,
  formatting a 0-dim tensor;
- ops whose output size depends on the values: `aten::nonzero` (also `torch.where(cond)`,
  `argwhere`), `aten::masked_select`, `aten::index` / `aten::index_put_` with a boolean mask
  (`t[mask]`, `t[mask] = v`), the `unique` family, `aten::repeat_interleave` without `output_size`;
- `aten::equal` (returns a Python bool);
- device→CPU copies: `aten::_to_copy` to the CPU / `aten::copy_` into a CPU tensor from a non-CPU
  source (`.cpu()`, `.to("cpu")`, `.numpy()` after `.cpu()`). On a CPU-only run these are invisible:
  `.cpu()` of a CPU tensor is a no-op that dispatches nothing;
- `Tensor.tolist` (also what `print(tensor)` uses): it reads the data directly, without dispatching
  an op, so it is counted by wrapping the Python method while the counter is active.

On CUDA, `torch.cuda.set_sync_debug_mode` is the ground truth; this counter reports the same places
without a GPU. On a CPU-only run every tensor is on the CPU, so it also counts reads of tensors that
stay on the CPU in a GPU run too (an optimizer's `step` counters): each event records the device of
the tensor read, so a GPU run can keep only `device != "cpu"`."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

TOLIST = "Tensor.tolist"
_DATA_DEPENDENT = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                   "unique_dim_consecutive", "equal", "_local_scalar_dense"}
_active: list = []          # counters currently open (they nest)
_original_tolist = None


@dataclass(frozen=True)
class SyncEvent:
    op: str                  # "aten::_local_scalar_dense", "Tensor.tolist", ...
    device: str = "cpu"      # the device of the tensor whose values the host waited for
    frames: tuple = ()       # ((file, line, function), ...), outermost first; empty unless frames=True

    def site(self, skip=("/torch/", "/torchdiag/core/syncs.py")) -> tuple | None:
        """The innermost frame whose file contains none of `skip` (where the caller's code forced it)."""
        for f in reversed(self.frames):
            if not any(s in f[0].replace("\\", "/") for s in skip):
                return f
        return None


def _bool_index(indices) -> bool:
    import torch

    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _is_device_to_cpu(name: str, args, kwargs) -> bool:
    import torch

    if name == "_to_copy":
        src, device = args[0], kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and src.device.type != "cpu"
    if name == "copy_":
        dst, src = args[0], args[1]
        return isinstance(src, torch.Tensor) and dst.device.type == "cpu" and src.device.type != "cpu"
    return False


def forces_sync(func, args, kwargs) -> bool:
    """Does this aten op make the host wait for the device (on a device where that costs anything)?"""
    name = func.overloadpacket.__name__
    if name in _DATA_DEPENDENT:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return _bool_index(args[1] if len(args) > 1 else kwargs.get("indices"))
    if name == "repeat_interleave":
        # repeats as a tensor, output size not given: the size is read from the repeats
        return func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
    return _is_device_to_cpu(name, args, kwargs)


def _frames(depth: int) -> tuple:
    f = sys._getframe(depth)
    out = []
    while f is not None:
        out.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(reversed(out))


def _device(args) -> str:
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            return str(a.device)
    return "cpu"


def _counting_tolist(self, *args, **kwargs):
    for counter in list(_active):
        counter._record(TOLIST, str(self.device), 3)
    return _original_tolist(self, *args, **kwargs)


class SyncCounter:
    """A context manager counting host-sync calls made inside it (see the module doc).
    `frames=True` also keeps the Python stack of each one (slower)."""

    def __init__(self, frames: bool = False):
        self.frames = frames
        self.events: list[SyncEvent] = []
        self._mode = None

    @property
    def counts(self) -> Counter:
        return Counter(e.op for e in self.events)

    @property
    def total(self) -> int:
        return len(self.events)

    def by_site(self) -> Counter:
        """(op, "file:line") -> count, the site being SyncEvent.site() (needs frames=True)."""
        out: Counter = Counter()
        for e in self.events:
            s = e.site()
            out[(e.op, f"{s[0]}:{s[1]}" if s else "?")] += 1
        return out

    def _record(self, op: str, device: str, depth: int) -> None:
        self.events.append(SyncEvent(op, device, _frames(depth + 1) if self.frames else ()))

    def __enter__(self):
        global _original_tolist
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if forces_sync(func, args, kwargs):
                    src = args[1:2] if func.overloadpacket.__name__ == "copy_" else args
                    counter._record(f"aten::{func.overloadpacket.__name__}", _device(src), 2)
                return func(*args, **kwargs)

        if not _active:
            _original_tolist = torch.Tensor.tolist
            torch.Tensor.tolist = _counting_tolist
        _active.append(self)
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        import torch

        self._mode.__exit__(*exc)
        _active.remove(self)
        if not _active:
            torch.Tensor.tolist = _original_tolist
        return False
