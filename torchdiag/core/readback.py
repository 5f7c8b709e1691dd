"""Values computed on the device, read back to the host together: one sync per device, not one per
tensor (a per-module `.item()` drains the GPU queue after every module)."""
from __future__ import annotations

from .device import wide_float


def read_back(scalars) -> list[float]:
    """The values of 0-dim tensors, one host sync per device (one on a single-device model); a Python number
    (a value already read) passes through. In the device's widest float (float32 on mps)."""
    import torch

    by_device: dict = {}
    out = [0.0] * len(scalars)
    for i, s in enumerate(scalars):
        if isinstance(s, (int, float)):
            out[i] = float(s)
        else:
            by_device.setdefault(s.device, []).append(i)
    for device, idx in by_device.items():
        wide = wide_float(device)
        values = torch.stack([scalars[i].detach().reshape(()).to(wide) for i in idx]).tolist()
        for i, v in zip(idx, values):
            out[i] = v
    return out
