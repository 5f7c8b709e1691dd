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
    """Bytes free now on `device` (a torch.device): the host's for the CPU, the driver's for a CUDA device;
    None where that is not known (mps, meta, an error)."""
    import torch

    if device.type == "cpu":
        return host_available()
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        except Exception:
            return None
    return None


def short_gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
