"""Count the calls that force a host sync (the CPU waiting for the device), on any device, CPU included.

    with SyncCounter() as s:
        step()
    s.total, s.counts            # {"aten::_local_scalar_dense": 3, "aten::nonzero": 1, ...}
    with SyncCounter(frames=True) as s: ...
    s.events[0].frames           # ((file, line, function), ...) innermost last
    s.events[0].via              # ".item()", "bool()", "print(tensor)", ... (the Python call that led to it)

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
  `.cpu()` of a CPU tensor is a no-op that dispatches nothing. `host_copies=True` counts them anyway
  (`Tensor.cpu` / `Tensor.to` events on a CPU tensor: "would sync if this tensor lived on a GPU");
- `Tensor.tolist` (also what `print(tensor)` uses): it reads the data directly, without dispatching
  an op, so it is counted by wrapping the Python method while the counter is active.

While a counter is open, the Python entry points that read values (`item`, `__bool__`, `__float__`,
`__int__`, `__index__`, `tolist`, `__repr__`, `__format__`, `cpu`, `to`) are wrapped so each event
also says which call led to it (`SyncEvent.via`, the outermost such call): the op alone cannot tell
`.item()` from `if t:`. The wrappers add no events of their own (except `tolist`, and `cpu`/`to`
with `host_copies`).

On CUDA, `torch.cuda.set_sync_debug_mode` is the ground truth; this counter reports the same places
without a GPU. On a CPU-only run every tensor is on the CPU, so it also counts reads of tensors that
stay on the CPU in a GPU run too (an optimizer's `step` counters): each event records the device of
the tensor read, so a GPU run can keep only `device != "cpu"`."""
from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass

TOLIST = "Tensor.tolist"
_DATA_DEPENDENT = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                   "unique_dim_consecutive", "equal", "_local_scalar_dense"}
# Python entry points wrapped while a counter is open -> how the call is named in SyncEvent.via
CALLS = {"item": ".item()", "__bool__": "bool()", "__float__": "float()", "__int__": "int()",
         "__index__": "int()", "tolist": ".tolist()", "__repr__": "print(tensor)",
         "__format__": "format(tensor)", "cpu": ".cpu()", "to": '.to("cpu")'}
_active: list = []          # counters currently open (they nest)
_originals: dict = {}       # name -> what torch.Tensor.__dict__ held (None: the attribute was inherited)
_via: list[str] = []        # the wrapped calls currently running, outermost first


@dataclass(frozen=True)
class SyncEvent:
    op: str                  # "aten::_local_scalar_dense", "Tensor.tolist", ...
    device: str = "cpu"      # the device of the tensor whose values the host waited for
    frames: tuple = ()       # ((file, line, function), ...), outermost first; empty unless frames=True
    via: str | None = None   # the Python call that led to it (CALLS values), None: an op called directly
    calls: tuple = ()        # ((code object, last instruction), ...) of the same frames: where in its line each was

    def site(self, skip=("/torch/", "/torchdiag/core/syncs.py")) -> tuple | None:
        """The innermost frame whose file contains none of `skip` (where the caller's code forced it)."""
        for f in reversed(self.frames):
            if not any(s in f[0].replace("\\", "/") for s in skip):
                return f
        return None


def library_dirs() -> tuple[str, ...]:
    """Folders whose code is not the user's: torch, torchdiag, the standard library."""
    import sysconfig

    import torch

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.dirname(os.path.abspath(torch.__file__)), here, sysconfig.get_paths()["stdlib"]]
    return tuple(os.path.join(os.path.normcase(d), "") for d in dirs)


def user_site(frames, libraries: tuple[str, ...]) -> tuple | None:
    """The innermost frame in the user's code: outside `libraries` and outside installed packages;
    failing that (a model that is itself an installed package: timm, transformers), outside
    `libraries` only. None: only library code ran (torchdiag's own loss rule, the optimizer)."""
    def inside(f, dirs) -> bool:
        path = os.path.normcase(os.path.abspath(f[0])) if not f[0].startswith("<") else f[0]
        return path.startswith(dirs) or f[0].startswith("<frozen")

    outside = [f for f in frames if not inside(f, libraries)]
    for f in reversed(outside):
        norm = f[0].replace("\\", "/")
        if "/site-packages/" not in norm and "/dist-packages/" not in norm:
            return f
    return outside[-1] if outside else None


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


def python_stack(depth: int = 1) -> tuple:
    """((file, line, function), ...) of the calling thread, outermost first, from `depth` frames up
    (0: this function, 1: its caller)."""
    return _stack(depth + 1)[0]


def _stack(depth: int) -> tuple[tuple, tuple]:
    """(python_stack's frames, ((code, last instruction), ...) of the same frames): the call each frame is in, which
    call_span reads its source columns from."""
    f = sys._getframe(depth)
    out, calls = [], []
    while f is not None:
        out.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        calls.append((f.f_code, f.f_lasti))
        f = f.f_back
    return tuple(reversed(out)), tuple(reversed(calls))


def call_span(call) -> tuple[int, int, int, int] | None:
    """(first line, last line, first column, end column) of the expression a frame was running (a call spanning
    several lines: `h.to(` with `"cpu")` below it), from its code's positions; None where they are not kept."""
    import itertools

    code, lasti = call
    try:
        pos = next(itertools.islice(code.co_positions(), max(lasti, 0) // 2, None), None)
    except (AttributeError, ValueError):
        return None
    if pos is None or any(v is None for v in pos):
        return None
    return pos[0], pos[1], pos[2], pos[3]


def _device(args) -> str:
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            return str(a.device)
    return "cpu"


TO_DEVICE = "Tensor.to(device)"   # `.to(<a torch.device>)` to the CPU: a copy only where the call site says "cpu"


def _to_cpu_of_cpu(name: str, tensor, args, kwargs) -> str | None:
    """`.cpu()` / `.to("cpu")` of a CPU tensor: no op runs, but on a GPU tensor it is a copy that syncs; the op to
    record, or None. A torch.device (or a string held in a variable) is mostly another tensor's (`h.to(w.device)`),
    the same device on a GPU: TO_DEVICE, which profile keeps only where the call's source line writes "cpu" (a
    sweep: gpt2's and a user's `.to(w.device)` listed)."""
    import torch

    if tensor.device.type != "cpu":
        return None                   # a real copy: the dispatch mode sees its _to_copy
    if kwargs.get("non_blocking") or (name == "to" and len(args) > 2 and args[2] is True):
        return None                   # into pinned memory, no wait (a review: its hint said to do what was done)
    if name == "cpu":
        return "Tensor.cpu"
    given = kwargs.get("device", args[0] if args else None)
    if isinstance(given, str) and given.split(":")[0] == "cpu":
        return "Tensor.to"
    return TO_DEVICE if isinstance(given, torch.device) and given.type == "cpu" else None


def _wrap(name: str, original):
    label = CALLS[name]

    def wrapper(self, *args, **kwargs):
        copy = _to_cpu_of_cpu(name, self, args, kwargs) if name in ("cpu", "to") and any(
            c.host_copies for c in _active) else None
        if name == "tolist" or copy:
            op = TOLIST if name == "tolist" else copy
            for counter in list(_active):
                if name == "tolist" or counter.host_copies:
                    counter._record(op, str(self.device), 2)
        _via.append(label)
        try:
            return original(self, *args, **kwargs)
        finally:
            _via.pop()

    wrapper.__name__ = getattr(original, "__name__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _patch() -> None:
    import torch

    for name in CALLS:
        _originals[name] = torch.Tensor.__dict__.get(name)
        setattr(torch.Tensor, name, _wrap(name, getattr(torch.Tensor, name)))


def _unpatch() -> None:
    import torch

    for name, original in _originals.items():
        if original is None:
            delattr(torch.Tensor, name)       # inherited from the C base class: uncover it again
        else:
            setattr(torch.Tensor, name, original)
    _originals.clear()


class SyncCounter:
    """A context manager counting host-sync calls made inside it (see the module doc).
    `frames=True` also keeps the Python stack of each one (slower); `host_copies=True` also counts
    `.cpu()` / `.to("cpu")` of CPU tensors (syncs once the tensor lives on a GPU)."""

    def __init__(self, frames: bool = False, host_copies: bool = False):
        self.frames = frames
        self.host_copies = host_copies
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
        frames, calls = _stack(depth + 1) if self.frames else ((), ())
        self.events.append(SyncEvent(op, device, frames, _via[0] if _via else None, calls))

    def __enter__(self):
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
            _patch()
        _active.append(self)
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        _active.remove(self)
        if not _active:
            _unpatch()
        return False
