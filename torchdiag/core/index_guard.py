"""Indices out of range raise on the host during a probe forward, as they do on a CPU.

Probes try a layout and take its failure as "not this one" (core.inputs.traceless: a position table too short for
the length tried, ids the logits have no class for). On a CPU an out-of-range lookup raises IndexError; on a CUDA
device it is a device-side assert, which poisons the process's CUDA context: every later operation fails, the
layout that would have run and the command itself (measured on an H200: RoBERTa's default length ended
`summary` as an internal error, and every test after it in that process failed). Within `guarded()`, a dispatch
mode checks the indices of the lookups that assert on a GPU before they run there, and raises the IndexError a
CPU would. Each check reads two values back (one host sync per lookup), so only probes use it, never a
command's measured passes. Writes at indices (index_put_, scatter, index_copy_, index_add_) and torch.take are not
checked: a probe forward of a model's default inputs reads its tables, it does not write into them."""
from __future__ import annotations

import contextlib


def _classes(t) -> int:
    return t.shape[1] if t.dim() >= 2 else t.shape[0]     # (N, C, ...) or (C,)


def _checks():
    """{aten op: (its index argument, the size the indices must stay under, its ignored-index argument or None)}."""
    import torch

    aten = torch.ops.aten
    along = lambda a: a[0].shape[a[1]] if a[0].dim() else 1   # noqa: E731 - (self, dim, index)
    rows = lambda a: a[0].shape[0]                               # noqa: E731 - (weight, indices, ...)
    return {aten.embedding.default: (1, rows, None),
            aten.embedding_renorm_.default: (1, rows, None),   # max_norm: rows renormalised in place first
            aten._embedding_bag.default: (1, rows, None),
            aten._embedding_bag_forward_only.default: (1, rows, None),
            aten.index_select.default: (2, along, None),
            aten.gather.default: (2, along, None),
            aten.nll_loss_forward.default: (1, lambda a: _classes(a[0]), 4),   # (self, target, weight, reduction, ignore)
            aten.nll_loss2d_forward.default: (1, lambda a: _classes(a[0]), 4)}


def asserts(t) -> bool:
    """A lookup on `t`'s device asserts on the device instead of raising (every accelerator; not CPU or meta)."""
    return t.device.type not in ("cpu", "meta")


def _check_index(args) -> None:
    """x[i, j, ...] with integer index tensors (aten.index.Tensor: (self, [index or None per dimension])): each in
    [-size, size) of its dimension. A boolean mask takes several dimensions at once: such an indexing is left alone."""
    import torch

    x, indices = args[0], args[1]
    if any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices):   # uint8: an old mask
        return
    for dim, index in enumerate(indices):
        if not torch.is_tensor(index) or not asserts(index) or index.numel() == 0 or dim >= x.dim():
            continue
        size = x.shape[dim]
        lo, hi = torch.stack([index.min(), index.max()]).tolist()
        if lo < -size or hi >= size:
            raise IndexError(f"index {lo if lo < -size else hi} is out of bounds for dimension {dim} with size {size} "
                             "(checked before the GPU kernel would assert)")


def _check(func, spec, args) -> None:
    import torch

    i_index, size_of, i_ignore = spec
    index = args[i_index] if len(args) > i_index else None
    if not torch.is_tensor(index) or not asserts(index) or index.numel() == 0 or index.is_floating_point():
        return
    if i_ignore is not None and len(args) > i_ignore:
        index = index[index != args[i_ignore]]
        if index.numel() == 0:
            return
    size = size_of(args)
    lo, hi = torch.stack([index.min(), index.max()]).tolist()
    if lo < 0 or hi >= size:
        raise IndexError(f"index out of range in self ({func.__name__}: index {lo if lo < 0 else hi} of {size}, "
                         "checked before the GPU kernel would assert)")


@contextlib.contextmanager
def guarded(model):
    """Within the block, lookups on a GPU raise IndexError for an index out of range instead of asserting on the
    device; nothing is checked when `model` holds no tensor off the CPU."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    if not any(asserts(t) for t in _tensors(model)):
        yield
        return
    checks, index = _checks(), torch.ops.aten.index.Tensor

    class Guard(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            spec = checks.get(func)
            if spec is not None:
                _check(func, spec, args)
            elif func is index:
                _check_index(args)
            return func(*args, **kwargs)

    with Guard():
        yield


def _tensors(model):
    yield from model.parameters()
    yield from model.buffers()
