"""`--device auto|cpu|cuda|cuda:N|mps|meta` → torch.device, or a one-line usage error."""
from __future__ import annotations

import re

from ..errors import UsageError

DEVICE_CHOICES = "auto|cpu|cuda|cuda:N|mps|meta"


def resolve_device(text: str):
    import torch

    if text is not None and not text.strip():   # `--device ''` (an unset shell variable) is not a choice of auto
        raise UsageError("empty device name", hint=f"choose one of {DEVICE_CHOICES}")
    name = (text or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name in ("cpu", "meta"):
        return torch.device(name)
    m = re.fullmatch(r"cuda(?::(\d+))?", name)
    if m:
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise UsageError(f"device '{text}' is not available: {why}",
                             hint="use --device cpu (or meta to count without allocating)")
        index = int(m.group(1) or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise UsageError(f"device '{text}' is not available: this machine has {count} CUDA device(s)",
                             hint=f"use cuda:0 … cuda:{count - 1}")
        return torch.device("cuda", index)
    if name == "mps":
        mps = getattr(torch.backends, "mps", None)
        if not (mps and mps.is_available()):
            raise UsageError("device 'mps' is not available on this machine", hint="use --device cpu")
        return torch.device("mps")
    raise UsageError(f"unknown device '{text}'", hint=f"choose one of {DEVICE_CHOICES}")


def has_float64(device) -> bool:
    """Whether the device computes in float64: Apple's mps has none (a cast there raises TypeError)."""
    return getattr(device, "type", device) != "mps"


def wide_float(device):
    """The widest float the device computes in: float64, float32 on mps (sums and exact counts to 2**24 there)."""
    import torch

    return torch.float64 if has_float64(device) else torch.float32


def widened(t):
    """t in its device's widest float (see wide_float)."""
    return t.to(wide_float(t.device))


def synchronize(device) -> None:
    """Wait for queued kernels so timings and memory readings are real."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
