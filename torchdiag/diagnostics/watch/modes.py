"""Does train/eval mode change what a model computes? Asked once, at the end of a run that trained in eval mode: a
model without dropout, BatchNorm or code that reads self.training computes the same either way, and training it
in eval mode is no mistake (a sweep: a plain MLP left in eval got `trained-in-eval-mode`)."""
from __future__ import annotations

import contextlib

RTOL, ATOL = 1e-5, 1e-7   # kernels may differ by rounding between two calls (a GPU's reductions)


def mode_inert(model, args, kwargs) -> bool | None:
    """True when the model's output on (args, kwargs) is the same in eval and in train mode; None when that
    cannot be told (the forward raised). Under no_grad, with every module's mode, every buffer (BatchNorm's
    running statistics) and the random state put back: the user's model and run are as they were."""
    import torch

    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model.eval()
            seen = _flat(model(*args, **kwargs))
            model.train()
            return _same(seen, _flat(model(*args, **kwargs)))
    except Exception:   # the model's own failure on a second call: the warning stands as it was
        return None
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad(), contextlib.suppress(Exception):
            for b, value in buffers:
                b.copy_(value)


def _flat(obj) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj.detach()]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _flat(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _flat(v)]
    return []


def _same(a: list, b: list) -> bool:
    import torch

    if len(a) != len(b) or not a:
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point() or x.is_complex():
            if not torch.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True):
                return False
        elif not torch.equal(x, y):
            return False
    return True
