"""Diagnostics leave no trace: flags, grads, hooks and global state restored on exit."""
from __future__ import annotations

import contextlib

from .lazy import is_uninitialised


def _hook_count(model) -> int:
    n = 0
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_state_dict_hooks", "_load_state_dict_pre_hooks"):
            n += len(getattr(m, attr, {}) or {})
    for p in model.parameters():
        n += len(getattr(p, "_backward_hooks", None) or {})
    return n


def snapshot_buffers(model) -> list:
    """Every buffer slot, to put back with restore_buffers: (module, its buffer names then, and per slot (name, the
    tensor there, a copy of its value)). BatchNorm running stats, counters, a fake-quant observer's scale, which its
    first forward resizes in place. A lazy module's uninitialised buffer keeps no copy (it has no value yet)."""
    import torch

    saved = []
    with torch.no_grad():
        for m in model.modules():
            slots = []
            for name, b in m._buffers.items():
                keep = b is not None and not is_uninitialised(b)
                slots.append((name, b, b.detach().clone() if keep else None))
            saved.append((m, (list(m._buffers), dict(vars(m))), slots))   # names in order; attributes by reference
    return saved


def restore_buffers(saved) -> None:
    """Each slot holds its tensor again (a forward that assigned a new one, or registered one, is undone), with its
    value, shape and dtype (a QAT observer's min_val resized from (0,) to (8,) made copy_ raise, and the model kept the
    new values). Only a slot whose value, shape, dtype or device changed is written, told by one comparison read for
    all (BatchNorm's running stats change without a version bump): an expanded buffer (one memory location for many
    elements) or an inference tensor cannot be written in place (a review: every command raised on them). One slot
    that cannot be put back does not stop the others; the first such error is raised after them all."""
    import torch

    slots = []
    with torch.no_grad():
        for m, (names, attrs), kept in saved:
            for name in [n for n in m._buffers if n not in names]:   # registered during the forward
                del m._buffers[name]
                if name in attrs:   # over a plain attribute of that name (a review: the model then raised)
                    object.__setattr__(m, name, attrs[name])
            for name, b, value in kept:
                if m._buffers.get(name) is not b:
                    m._buffers[name] = b
                if value is not None:
                    slots.append((b, value))
            if list(m._buffers) != names:   # deleted and registered again: the state_dict's key order as it was
                ordered = [(n, m._buffers.pop(n)) for n in names if n in m._buffers]
                m._buffers.update(ordered)
        changed = _changed(slots)
        failed = None
        for (b, value), moved in zip(slots, changed):
            if moved:
                try:
                    _put_back(b, value)
                except Exception as exc:   # noqa: BLE001 - the others first
                    failed = failed or exc
    if failed is not None:
        raise failed


def _changed(slots) -> list[bool]:
    """Per (tensor, saved value): does it differ in shape, dtype, device or value? One read per device for all the
    values (a NaN compares unequal: written back as it was); a dtype that cannot be compared (quantized) is written."""
    import torch

    out = [not (b.shape == v.shape and b.dtype == v.dtype and b.device == v.device) for b, v in slots]
    by_device: dict = {}
    for i, (b, v) in enumerate(slots):
        if out[i] or not b.numel() or b.is_meta:   # a meta tensor holds no value to compare or put back
            continue
        try:
            differs = b != v
            if b.is_floating_point():   # -0.0 == +0.0, yet their bits differ (a review)
                differs = differs | (torch.signbit(b) != torch.signbit(v))
            by_device.setdefault(b.device, []).append((i, differs.any()))
        except RuntimeError:
            out[i] = True
    for items in by_device.values():
        for (i, _), moved in zip(items, torch.stack([f for _, f in items]).tolist()):
            out[i] = bool(moved)
    return out


def _put_back(b, value) -> None:
    import torch

    if b.is_inference():   # writable in place only in inference mode
        with torch.inference_mode():
            b.copy_(value)
        return
    try:
        if b.shape != value.shape or b.dtype != value.dtype or b.device != value.device:
            raise RuntimeError("another shape, dtype or device")
        b.copy_(value)
    except RuntimeError:
        b.data = value.clone()


# names of parameters a model's own forward wrote in place during a diagnostic (their version counters moved): the
# run's context says so (Context.finish); they stay as the forward left them (see leave_no_trace)
WRITTEN: dict[str, bool] = {}   # name -> requires_grad


@contextlib.contextmanager
def leave_no_trace(model, buffers: bool = True):
    """Run a diagnostic on `model` in place and put back everything it may touch: training
    flags, requires_grad flags, .grad tensors, RNG state, grad mode, anomaly mode, default
    dtype and MHA fast-path setting, and buffer values: any forward may write them (BatchNorm in
    train mode, a step counter, a fake-quant observer in eval too: summary and flops changed them, a
    sweep). buffers=False for a caller that restores them itself. Parameters
    themselves must not be written (commands that train work on a copy); tests check that bit
    for bit. A forward that writes its own parameters in place (`self.w.add_(1)`) is seen by their version
    counters (free) and said (WRITTEN), not undone: a copy before every write would cost a Python call per op, or
    the model's memory again, on every model."""
    import torch

    saved_buffers = snapshot_buffers(model) if buffers else None
    training = [(m, m.training) for m in model.modules()]
    # a lazy module's uninitialised parameter raises on any op, and its flag and .grad are its initial ones
    params = [p for p in {id(p): p for p in model.parameters()}.values() if not is_uninitialised(p)]
    requires = [(p, p.requires_grad) for p in params]
    versions = [(n, p, p._version, p.requires_grad) for n, p in model.named_parameters() if not is_uninitialised(p)]
    grads = [(p, p.grad) for p in params]
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    grad_enabled = torch.is_grad_enabled()
    anomaly = torch.is_anomaly_enabled()
    dtype = torch.get_default_dtype()
    fastpath = torch.backends.mha.get_fastpath_enabled()
    try:
        yield
    finally:
        for m, flag in training:
            m.training = flag
        for p, flag in requires:
            p.requires_grad_(flag)
        for p, g in grads:
            p.grad = g
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        torch.set_grad_enabled(grad_enabled)
        torch.autograd.set_detect_anomaly(anomaly)
        torch.set_default_dtype(dtype)
        torch.backends.mha.set_fastpath_enabled(fastpath)
        if saved_buffers is not None:
            restore_buffers(saved_buffers)
        WRITTEN.update({n: flag for n, p, v, flag in versions if p._version != v})


def fingerprint(model) -> dict:
    """Everything a diagnostic must leave as it was, for tests: state bytes, flags, grads, hooks."""
    import torch
    import torch.nn.functional as F

    state = {}
    # named_parameters/named_buffers, not state_dict: non-persistent buffers count too
    tensors = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for k, v in tensors:
        t = v.detach()
        state[k] = (t.device.type, t.dtype, tuple(t.shape),
                    None if t.device.type == "meta" else t.cpu().clone())
    return {
        "state": state,
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
        "hooks": _hook_count(model),
        "rng": torch.random.get_rng_state().clone(),
        "grad_enabled": torch.is_grad_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "mha_fastpath": torch.backends.mha.get_fastpath_enabled(),
        "patched": (F.scaled_dot_product_attention, torch.nn.Module.__call__, torch.nn.Module.register_parameter),
    }


def differences(before: dict, after: dict) -> list[str]:
    """What changed between two fingerprints ([] when nothing did)."""
    import torch

    out = []
    if before["state"].keys() != after["state"].keys():
        out.append("state_dict keys changed")
    for k, (dev, dt, shape, val) in before["state"].items():
        if k not in after["state"]:
            continue
        dev2, dt2, shape2, val2 = after["state"][k]
        if (dev, dt, shape) != (dev2, dt2, shape2):
            out.append(f"{k}: device/dtype/shape changed")
        elif val is not None and not torch.equal(val.view(-1).view(torch.uint8) if val.numel() and val.dtype != torch.bool else val,
                                                   val2.view(-1).view(torch.uint8) if val2.numel() and val2.dtype != torch.bool else val2):
            out.append(f"{k}: values changed")
    for key in ("training", "requires_grad", "hooks", "grad_enabled", "anomaly", "default_dtype", "mha_fastpath", "patched"):
        if before[key] != after[key]:
            out.append(f"{key} changed")
    if len(before["grads"]) != len(after["grads"]) or any(
            (a is None) != (b is None) or (a is not None and not torch.equal(a, b))
            for a, b in zip(before["grads"], after["grads"])):
        out.append(".grad changed")
    if not torch.equal(before["rng"], after["rng"]):
        out.append("global RNG state changed")
    return out
