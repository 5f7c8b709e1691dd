"""torch's fake-tensor module logs the traceback of an op its fake kernel refuses, at ERROR level, on the user's
terminal: a run on fake tensors that may fail (memory's estimate, doctor's fake-CUDA run) says its failure itself."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def fake_log_quiet():
    """The fake-tensor log off for the block (a sweep: 21 lines for mixtral's `_grouped_mm` on float32 in memory;
    74 for nystromformer's mask in doctor, whose row said another error)."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
