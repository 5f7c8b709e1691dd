"""watch: diagnostics inside the user's own training run, on their data, at almost no cost.

    with Watch(model, optimizer, every=50) as w:     # (torchdiag.watch once the API exposes it)
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()
            w.log("val_loss", val)                     # optional: metrics the loop computes
    result = w.result()

`script.run_command(["python", "train.py", ...], watch)` runs a script in-process with the same hooks.
The engine (engine.py, stats.py) keeps statistics on the device and reads them back once every
`every` optimizer steps; report.py turns what it saw into findings; replay.py localises the first
non-finite value. Drawing (status line, TensorBoard, plot) is render/watch.py, fed through the
callbacks `on_read(snapshot)`, `on_histograms(step, named_params)`, `on_finish(result)`."""
from __future__ import annotations

import threading
import weakref

from ...errors import UsageError, interrupt_code, one_line
from .options import DEFAULT_EVERY, Options

NEEDS_VALUES = True

__all__ = ["Watch", "Options", "DEFAULT_EVERY", "NEEDS_VALUES", "log", "set_epoch", "active"]
_active: list = []   # the watches open now, innermost last (a script run by the CLI logs into its watch)


def active():
    """The innermost open Watch, or None."""
    return _active[-1] if _active else None


def log(name: str, value, step: int | None = None) -> None:
    """Record a metric in the open watch (a script run under `torchdiag watch` has no `w` to call);
    does nothing when no watch is open, so the script runs unchanged without torchdiag watching."""
    if _active:
        _active[-1].log(name, value, step)


def set_epoch(epoch: int) -> None:
    """Tell the open watch which epoch the loop is in (findings then name it); nothing without one."""
    if _active:
        _active[-1].set_epoch(epoch)

NO_STEP = "no optimizer step was seen: watch reports on training steps (optimizer.step())"
NO_STEP_HINT = "run a training loop that calls optimizer.step() inside the watch"


def no_step(engine, prefix: str = ""):
    """The UsageError of a run with no optimizer step; backward passes without one are a hand-written update (a
    sweep: `p -= lr * p.grad` under no_grad, told only to call optimizer.step())."""
    from ...errors import UsageError

    backwards = engine.backwards if engine is not None else 0
    sharded = [n for n in (engine.checks.get("unhooked", []) if engine is not None else []) if "fully_shard" in n]
    if sharded:   # its steps ran, over parameters watch does not read (a sweep: "an update written by hand")
        return UsageError(f"{prefix}{sharded[0].split(':')[0]}", sharded[0].split(": ", 1)[1])
    # watch itself failed before a step counted: exit 4, ours (a review: a compiled LBFGS was "an update written by hand")
    if engine is not None and engine.broken:
        from ...errors import DiagError

        return DiagError(f"{prefix}{engine.broken}", "an internal error in torchdiag: please report it")
    if not backwards and engine is not None and engine.under_functorch:   # (a sweep: torch.func.grad, own update)
        return UsageError(f"{prefix}no optimizer step was seen, though a watched model ran under a torch.func "
                          "transform (grad, vjp, vmap): watch counts and judges the steps of torch.optim optimizers, "
                          "not an update made from a transform's gradients by hand",
                          "write the transform's gradients into each parameter's .grad (p.grad = grads[name]) and "
                          "call an optimizer's step() (torch.optim.SGD(model.parameters(), lr=…))")
    if not backwards:
        return UsageError(prefix + NO_STEP, NO_STEP_HINT)
    return UsageError(f"{prefix}no optimizer step was seen, though {backwards} backward pass(es) ran: watch counts "
                      "and judges the steps of torch.optim optimizers, not an update written by hand",
                      "make the update an optimizer's step (torch.optim.SGD(model.parameters(), lr=…) does "
                      "p -= lr * p.grad), with zero_grad()")


class Watch:
    """A context manager around the user's loop. `model`/`optimizer` may be None (or lists): without an
    optimizer, every optimizer that steps the model's parameters is watched (torch's global step hooks);
    without a model either, every model and optimizer the code trains (the script runner)."""

    def __init__(self, model=None, optimizer=None, *, opts: Options | None = None, on_read=None,
                 on_histograms=None, on_finish=None, gather=None, **options):
        self.opts = opts if opts is not None else Options(**options)
        # gather(own) -> Result: every rank's report merged on rank 0 under torchrun, at the block's end (api.watch
        # passes the runner's; a diagnostic does not import the runner)
        self.gather, self._gathered = gather, None
        self.models = list(model) if isinstance(model, (list, tuple)) else [model]
        # held weakly: a given optimizer the loop lets go (a new one each epoch) must go, for its successor to be
        # followed (engine._successor)
        self._optimizers = [weakref.ref(o) for o in (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
                            if o is not None]
        self.on_read, self.on_histograms, self.on_finish = on_read, on_histograms, on_finish
        self.engine = None
        self._result = None
        self._finishing = threading.RLock()

    def __enter__(self):
        from .engine import Engine

        self._result, self._gathered = None, None
        hist = self.on_histograms if self.opts.histograms else None
        optimizers = [o for o in (ref() for ref in self._optimizers) if o is not None]
        self.engine = Engine(self.opts, self.models, optimizers, on_read=self.on_read, on_histograms=hist)
        self.engine.attach()
        _active.append(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        interrupted = interrupt_code(exc) if isinstance(exc, KeyboardInterrupt) else None
        failure = one_line(exc) if isinstance(exc, Exception) else None
        self.finish(interrupted=interrupted, failure=failure)
        return False   # the loop's own exception goes on

    def log(self, name: str, value, step: int | None = None) -> None:
        """Record a metric the loop computes (a validation loss, an accuracy) at the current step."""
        if self.engine is None:
            raise UsageError("watch: log() is for inside the `with` block")
        self.engine.log(str(name), value, step)
        for outer in self._outer():   # the run's metric: a watch around this one (`torchdiag watch` around a script
            outer.engine.log(str(name), value, step)   # that opens a watch_callback) judges it too (a sweep: it passed)

    def set_epoch(self, epoch: int) -> None:
        if self.engine is not None:
            self.engine.set_epoch(epoch)
            for outer in self._outer():
                outer.engine.set_epoch(epoch)

    def _outer(self) -> list:
        """The open watches this one was opened inside of that watch the whole run (no models given: the command's
        around a script). One given its own models judges their metrics and epochs only (a review: a probe's
        val_loss under its own watch was a val-worsens of the outer model's run, its epochs named the outer's)."""
        if self not in _active:
            return []
        return [w for w in _active[:_active.index(self)] if w.engine is not None and not w.engine.explicit_models]

    def finish(self, interrupted=None, failure: str | None = None):
        """The last read, hooks removed, the Result built (once)."""
        from ...core.interrupts import deferred
        from .report import build

        with self._finishing:   # once: a rank blocked in a collective reports from another thread (cli/watch.py)
            if self in _active:
                _active.remove(self)
            if self._result is not None or self.engine is None:
                return self._result
            with deferred():   # a second Ctrl-C waits for the report (a review: it landed in the build, exit 4, no report)
                self.engine.finish()
                self._result = build(self.engine, interrupted, failure)
            if self.on_finish is not None:
                self.on_finish(self._result)
            if self.gather is not None:   # at the block's end on every rank, whoever calls result() later
                try:
                    self._gathered = self.gather(self._own)
                except Exception as exc:   # noqa: BLE001 - this rank's own (no step seen): result() raises it
                    self._gathered = exc
        return self._result

    def finish_within(self, seconds: float, interrupted=None):
        """finish() from another thread, unless the run's own finish holds it past `seconds` (a read stuck in the
        device's queue): then None."""
        if not self._finishing.acquire(timeout=seconds):
            return None
        try:
            return self.finish(interrupted=interrupted)
        finally:
            self._finishing.release()

    def result(self):
        """The run's Result (after the `with` block). A run with no optimizer step is a UsageError (exit 2).
        Under torchrun (through torchdiag.watch) each rank handed its report to rank 0 at the block's end:
        rank 0's holds every rank's findings, tagged with their ranks; the other ranks get their own."""
        if self.engine is None:
            raise UsageError("watch: result() comes after the `with` block has run")
        if self.gather is None:
            return self._own()
        self.finish()
        if isinstance(self._gathered, BaseException):
            raise self._gathered
        return self._gathered

    def _own(self):
        result = self.finish()
        if self.engine is not None and self.engine.step == 0 and result.code is None and not self.engine.scaler_calls:
            raise no_step(self.engine)
        return result
