"""At which of the clock's steps the run stepped a learning-rate scheduler of a watched optimizer. A scheduler stepped
after every optimizer step counts batches: StepLR(30, 0.1) meant per epoch and stepped per batch cuts the rate
1000-fold by step 90 (a review: an MLP still learning froze at a loss of 0.55 against 0.19 without it, and watch said
nothing, since the cuts themselves held the loss flat from the first one on). While watching, LRScheduler.step is
wrapped (ReduceLROnPlateau's own step is not: it cuts on a metric, whenever). Nothing is read from a device."""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
import weakref

from .clip import ORIGINAL, OWNER, live  # the same marks on a wrapper as clip's

MAX_IDLE = 16                       # optimizers of no track whose schedulers are counted (unstepped)
MAX_RUNS = 10_000                   # runs of consecutive steps kept (a scheduler stepped per epoch: one run an epoch)
EACH_STEP = 0.9                     # a scheduler called at this share of the steps or more counts batches


class SchedulerCalls:
    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        self._closed = False
        self._wrapper = None
        # id(track) -> [first, last] runs of clock steps each followed by a call of a scheduler of its optimizer
        self.runs: dict[int, list[list[int]]] = {}
        # id(optimizer) of no track -> [it (weakly), the scheduler's type, the clock steps a scheduler of it was
        # stepped at, the first of them, the last]
        self.idle: dict[int, list] = {}

    def attach(self) -> None:
        from torch.optim.lr_scheduler import LRScheduler

        ref, original = weakref.ref(self), LRScheduler.step

        @functools.wraps(original)
        def step(scheduler, *args, **kwargs):
            me = ref()
            if me is not None and not me._closed:
                me._saw(scheduler)
            with _warnings_past(step.__code__):
                return original(scheduler, *args, **kwargs)

        setattr(step, ORIGINAL, original)
        setattr(step, OWNER, ref)
        LRScheduler.step = step   # type: ignore[method-assign,assignment]
        self._wrapper = step

    def _saw(self, scheduler) -> None:
        """A call after the clock's step `engine.step` (its first, at construction, comes before any: not counted)."""
        engine = self._engine()
        if engine is None or engine.closed or engine.step == 0 or getattr(scheduler, "_is_initial", False):
            return   # (a scheduler's own first step at construction, a SequentialLR's of its parts: not the loop's)
        opt = getattr(scheduler, "optimizer", None)
        track = engine.tracks.get(id(opt))
        if track is None:
            self._idle(scheduler, opt, engine.step)
            return
        s, runs = engine.step, self.runs.setdefault(id(track), [])
        if runs and runs[-1][1] >= s - 1:
            runs[-1][1] = s
        elif len(runs) < MAX_RUNS:
            runs.append([s, s])

    def _idle(self, scheduler, opt, step: int) -> None:
        """Counted by clock step: a ChainedScheduler steps each of its parts (a review: 80 steps said as 160)."""
        got = self.idle.get(id(opt))
        if got is not None and got[0]() is opt:
            if got[4] != step:
                got[2], got[4] = got[2] + 1, step
        elif opt is not None and len(self.idle) < MAX_IDLE:
            with contextlib.suppress(TypeError):
                self.idle[id(opt)] = [weakref.ref(opt), type(scheduler).__name__, 1, step, step]

    def unstepped(self) -> list[tuple[str, str, int, int]]:
        """(scheduler type, optimizer type, steps, first step) of schedulers stepped at two or more steps of the run on
        an optimizer still alive that never stepped at all (torch's own mark, `_opt_called`, which its wrapper of
        optimizer.step sets): the rate they set trains nothing (a sweep: a scheduler built on a leftover optimizer,
        the one that trains kept its rate and diverged, told only to lower it)."""
        out = []
        for ref, kind, steps, first, _ in self.idle.values():
            opt = ref()
            # the mark is set only through torch's wrapper: a step replaced after the scheduler was made says nothing
            wrapped = hasattr(getattr(opt, "step", None), "_wrapped_by_lr_sched")
            if opt is not None and steps >= 2 and wrapped and not getattr(opt, "_opt_called", False):
                out.append((kind, type(opt).__name__, steps, first))
        return out

    def each_step(self, first: int, last: int, track: int | None) -> bool:
        """Was a scheduler of the optimizer of `track` (an id) stepped after (nearly) every clock step from `first` to
        `last`? Another optimizer's warm-up stepped per batch says nothing of this one's (a review)."""
        runs = self.runs.get(track, []) if track is not None else []
        covered = sum(max(0, min(b, last) - max(a, first) + 1) for a, b in runs)
        return last >= first and covered >= EACH_STEP * (last - first + 1)

    def close(self) -> None:
        """Put LRScheduler.step back where this wrapper is still the one installed, past any wrapper of a watch closed
        before it; one installed over it later unwraps it when it closes."""
        from torch.optim.lr_scheduler import LRScheduler

        self._closed = True
        if self._wrapper is not None and LRScheduler.__dict__.get("step") is self._wrapper:
            LRScheduler.step = live(getattr(self._wrapper, ORIGINAL))   # type: ignore[method-assign]
        self._wrapper = None



_PAST: set = set()      # code objects of wrappers a warning's stacklevel passes over
_PATCH = threading.Lock()
_depth = 0


@contextlib.contextmanager
def _warnings_past(code):
    """torch's scheduler warnings name their caller (stacklevel=2): with this wrapper between, they named
    schedulers.py, not the user's sch.step() line (a sweep), and Python's once-per-line filter keyed on ours."""
    global _depth
    with _PATCH:
        _PAST.add(code)
        if _depth == 0:
            _warn.real = warnings.warn
            warnings.warn = _warn
        _depth += 1
    try:
        yield
    finally:
        with _PATCH:
            _depth -= 1
            if _depth == 0 and warnings.warn is _warn:
                warnings.warn = _warn.real


def _warn(message, category=None, stacklevel=1, source=None, **kwargs):
    """warnings.warn, counting `stacklevel` frames past the wrappers in _PAST (and past this function)."""
    frame, level, extra = sys._getframe(1), 1, 0
    while frame is not None:
        if frame.f_code in _PAST:
            extra += 1
        elif level >= stacklevel:
            break
        else:
            level += 1
        frame = frame.f_back
    return _warn.real(message, category, stacklevel + extra + 1, source, **kwargs)
