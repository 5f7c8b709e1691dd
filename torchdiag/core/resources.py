"""How much memory a size the user asked for may take, checked before anything is allocated."""
from __future__ import annotations

import os

MAX_WORK_BYTES = 16 * 2**30   # more than this for one input or picture is a typo, not a test batch


def memory_limit() -> int:
    """MAX_WORK_BYTES, or less when the machine has less memory available now."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return min(MAX_WORK_BYTES, int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return min(MAX_WORK_BYTES, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return MAX_WORK_BYTES
