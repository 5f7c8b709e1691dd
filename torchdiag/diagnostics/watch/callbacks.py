"""watch inside trainers that own the loop: a Hugging Face `TrainerCallback` (the optional extras:
transformers, and accelerate which its Trainer needs) and a Lightning `Callback` (lightning).

    cb = hf_callback(every=50)
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    cb.result                                  # the Result, once training ended

The callback opens a Watch on the Trainer's model at on_train_begin (optimizer=None: the optimizer that
steps the model's parameters is found by torch's global step hooks, through accelerate's wrapper), names
the epoch at each on_epoch_begin, logs the evaluation metrics (`eval_*`) at on_evaluate, and closes at
on_train_end. A training run that raises never reaches on_train_end: call `cb.close()` then."""
from __future__ import annotations

import numbers

from . import Watch


class _Runs:
    """One Watch per training run: a callback reused for a second run (Trainer.train() twice, fit() twice) finishes
    the first run's watch if it is still open, and `result` is the latest run's (a review: the second run was never
    finished, its global hooks stayed installed, and `result` still held the first run's)."""

    def __init__(self):
        self.watch = None
        self.result = None

    def _open(self, model, options) -> None:
        self.close()
        self.result = None
        self.watch = Watch(model, None, **options)
        self.watch.__enter__()

    def close(self):
        if self.watch is not None:
            watch, self.watch = self.watch, None
            self.result = watch.finish()


def hf_callback(**options):
    """A transformers.TrainerCallback watching Trainer.train(); options as Watch's (every, accumulate, ...)."""
    from transformers import TrainerCallback

    class TorchdiagWatch(_Runs, TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._open(model, options)

        def on_epoch_begin(self, args, state, control, **kwargs):
            if self.watch is not None and state.epoch is not None:
                self.watch.set_epoch(int(state.epoch))

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if self.watch is None:
                return
            for key, value in (metrics or {}).items():
                if key.startswith("eval_") and isinstance(value, numbers.Number) and "runtime" not in key \
                        and "per_second" not in key:
                    self.watch.log(key, float(value))

        def on_train_end(self, args, state, control, **kwargs):
            self.close()

    return TorchdiagWatch()


def lightning_callback(**options):
    """A lightning.pytorch.Callback watching Trainer.fit(): `cb.result` once fit ends (or raised).
    Lightning steps with `optimizer.step(closure)`: watch reads the gradients when the closure returns, before
    the update (engine._closure_done)."""
    from lightning.pytorch.callbacks import Callback

    class TorchdiagWatch(_Runs, Callback):
        def on_fit_start(self, trainer, pl_module):
            self._open(pl_module, options)

        def on_train_epoch_start(self, trainer, pl_module):
            if self.watch is not None:
                self.watch.set_epoch(trainer.current_epoch)

        def on_validation_epoch_end(self, trainer, pl_module):
            if self.watch is None or trainer.sanity_checking:
                return
            for key, value in trainer.callback_metrics.items():
                if key.startswith("val"):
                    self.watch.log(key, float(value))

        def on_fit_end(self, trainer, pl_module):
            self.close()

        def on_exception(self, trainer, pl_module, exception):
            self.close()

    return TorchdiagWatch()
