"""Bookkeeping that an interrupt must not split: Ctrl-C or SIGTERM arriving inside is held and
delivered when the block ends. torch.profiler's step() opens its next "ProfilerStep" range in two
Python statements; an interrupt between them left a range it then failed to close (an AssertionError,
then a segfault at exit). Torch-free."""
from __future__ import annotations

import contextlib
import signal
import threading

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred():
    """Hold Ctrl-C and SIGTERM for the block; re-deliver the first one held to the handler it was
    meant for. Only Python handlers are swapped: an ignored signal stays ignored. Off the main
    thread (where handlers cannot be set) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict = {}
    holding = [True]

    def hold(signum, frame):
        if holding[0]:
            held.append(signum)
        else:   # the block has ended but this handler is still set: pass it on
            previous[signum](signum, frame)

    try:
        for sig in _HELD:
            if callable(signal.getsignal(sig)):
                previous[sig] = signal.getsignal(sig)
                signal.signal(sig, hold)
        yield
    finally:
        holding[0] = False   # from here on a signal reaches its own handler, even mid-restore
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])
