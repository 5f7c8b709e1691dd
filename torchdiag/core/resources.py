"""How much memory a size the user asked for may take, checked before anything is allocated."""
from __future__ import annotations

import os

MAX_WORK_BYTES = 16 * 2**30   # more than this for one input or picture is a typo, not a test batch


def memory_limit() -> int:
    """MAX_WORK_BYTES, or less when the machine has less memory available now."""
    free = host_available()
    return MAX_WORK_BYTES if free is None else min(MAX_WORK_BYTES, free)


def host_available() -> int | None:
    """Bytes of host memory available now (MemAvailable); None when the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_available(device) -> int | None:
    """Bytes free now on `device` (a torch.device): the host's for the CPU; for a CUDA device the driver's free
    memory plus what torch's caching allocator holds reserved but unused (it hands that out first); None where
    that is not known (mps, meta, an error)."""
    import torch

    if device.type == "cpu":
        return host_available()
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(free) + max(int(cached), 0)
        except Exception:
            return None
    return None

