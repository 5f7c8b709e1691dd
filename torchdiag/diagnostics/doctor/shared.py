"""Helpers the checks share: names, output tensors and their differences, the working copy, the
module a failing forward stopped in."""
from __future__ import annotations

import contextlib

from ...core.device import wide_float
from ...core.train import NoRoom, train_copy
from ...errors import ModelError


def name(n: str) -> str:
    return n or "(root)"


def module_of(param_name: str) -> str:
    return param_name.rpartition(".")[0]


def short_dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


def tensors(obj, prefix="output") -> list:
    """(label, tensor) for every tensor in a forward output (nested tuples, lists and dicts). A nested
    tensor (PyTorch's fast paths return one) comes back as its components' values, flattened and
    concatenated: it has no single shape, and most ops (nansum, abs().max()) refuse it."""
    from ...core.inputs import _collect

    out: list = []
    _collect(prefix, obj, out)
    return [(label, flat_values(t)) for label, t in out]


def flat_values(t):
    """A nested tensor's values as one flat dense tensor; any other tensor unchanged."""
    import torch

    if not getattr(t, "is_nested", False):
        return t
    parts = [c.reshape(-1) for c in t.unbind()]
    return torch.cat(parts) if parts else t.new_zeros(0)


def max_diff(a, b) -> float | None:
    """The largest absolute difference between two outputs (inf for differing integer tensors);
    None when their structure or shapes differ."""
    ta, tb = tensors(a), tensors(b)
    if len(ta) != len(tb):
        return None
    m = 0.0
    for (_, x), (_, y) in zip(ta, tb):
        if x.shape != y.shape:
            return None
        x, y = dense(x), dense(y)
        if x.is_floating_point() and x.numel():
            wide = wide_float(x.device)   # float32 on mps (no float64 there)
            x, y = x.detach().to(wide), y.detach().to(wide)
            d = (x - y).abs().nan_to_num(0.0).masked_fill(x.isnan() != y.isnan(), float("inf"))  # NaN in one only
            m = max(m, float(d.max()))      # one read per tensor
        elif not bool(((x == y) | (x != x) & (y != y)).all()):   # NaN == NaN (a complex output's)
            m = max(m, float("inf"))
    return m


def dense(t):
    """A tensor as plain strided values to compare: sparse made dense, quantized dequantized, complex as
    (real, imaginary) pairs."""
    import torch

    if t.is_quantized:
        t = t.dequantize()
    if t.layout != torch.strided:
        t = t.to_dense()
    return torch.view_as_real(t) if t.is_complex() else t


def finite(obj) -> bool:
    """Every floating value of an output is finite (one read per tensor)."""
    return all(bool(dense(t.detach()).isfinite().all()) for _, t in tensors(obj)
               if (t.is_floating_point() or t.is_complex()) and t.numel())


def scale(obj) -> float:
    """The largest absolute value among an output's float tensors (for relative tolerances): |x| in the tensor's
    own dtype cannot overflow, and a complex one's is its modulus."""
    return max((float(dense(t.detach()).abs().max()) for _, t in tensors(obj)
                if (t.is_floating_point() or t.is_complex()) and t.numel()), default=0.0)


def batch_one(inputs, batch: int):
    return inputs.map(lambda t: t[:1] if t.dim() and t.shape[0] == batch else t)


@contextlib.contextmanager
def workspace(model, optimizer=None):
    """A copy to run and train on (core.train.train_copy: its room checked with its gradients and the state of
    `optimizer`, the run's); if the model cannot be copied, the model itself with its parameters and buffers
    restored bit for bit afterwards (doctor still runs)."""

    try:
        work = train_copy(model, "to run the checks on", optimizer=optimizer)
    except NoRoom:       # the fallback below keeps a copy of every value: as much memory again
        raise
    except ModelError:   # deepcopy refused: fall back to the model itself, restored below
        work = None
    if work is not None:
        yield work
        return
    with values_kept(model):
        yield model


@contextlib.contextmanager
def values_kept(model, parameters: bool = True):
    """The model's state_dict values (its buffers alone, without `parameters`) put back bit for bit on exit."""
    import torch

    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
             if parameters or not isinstance(v, torch.nn.Parameter)}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                if k in saved:
                    v.copy_(saved[k])


def failing_call(tracker, model):
    """(Call, module, positional args) of the module a failed forward stopped in; (None, None, ())."""
    call = tracker.failing
    if call is None:
        return None, None, ()
    module = dict(model.named_modules()).get(call.name)
    return call, module, tracker._stack[-1][1]


def mixes_devices_or_dtypes(module, args) -> bool:
    """Fact about a failing call: the tensors it received and its own parameters and buffers span
    more than one device, or more than one floating dtype."""
    import torch
    from torch.utils._pytree import tree_flatten

    ts = [a for a in tree_flatten(list(args))[0] if isinstance(a, torch.Tensor)]
    if module is not None:
        ts += list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return len({t.device for t in ts}) > 1 or len({t.dtype for t in ts if t.is_floating_point()}) > 1
