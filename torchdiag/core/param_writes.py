"""Parameters a forward writes in place, put back afterwards (copy on first write: only what is written is copied).

A probe forward (core.inputs.traceless) must leave the model as it found it; buffers are cloned before it, but
cloning every parameter would double a large model's memory. A dispatch mode sees each in-place op (an aten op
whose schema writes an argument): before the first write into a parameter's storage (a view of it included), that
parameter is copied; afterwards every copy is written back. Forwards that write no parameter (nearly all) pay
one Python call per op and copy nothing."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def restored_writes(model):
    """Within the block, parameters of `model` written in place are copied before their first write; restored after."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    params = {}
    for p in model.parameters():
        key = _storage(p)
        if key is not None:
            params.setdefault(key, p)
    saved: dict = {}

    class CopyOnWrite(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func._schema.is_mutable:
                for key in _written(func, args, kwargs):
                    if key in params and key not in saved:
                        saved[key] = params[key].detach().clone()
            return func(*args, **kwargs)

    try:
        with CopyOnWrite():
            yield
    finally:
        with torch.no_grad():
            for key, old in saved.items():
                params[key].copy_(old)


def _written(func, args, kwargs) -> list:
    """The storages an op writes (its schema's arguments marked written), as keys."""
    import torch

    keys = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor):
                key = _storage(t)
                if key is not None:
                    keys.append(key)
    return keys


def _storage(t):
    """(device, storage address) of a dense tensor with data; None for meta, sparse or subclass tensors without one."""
    try:
        if t.device.type == "meta" or t.is_sparse:
            return None
        return (str(t.device), t.untyped_storage().data_ptr())
    except Exception:   # noqa: BLE001 - a tensor subclass without a storage: never a plain parameter's
        return None
