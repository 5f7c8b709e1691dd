"""watch inside trainers that own the loop: a Hugging Face `TrainerCallback` (the optional extra:
transformers, and accelerate which its Trainer needs). Lightning's Callback is not written yet.

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


def hf_callback(**options):
    """A transformers.TrainerCallback watching Trainer.train(); options as Watch's (every, accumulate, ...)."""
    from transformers import TrainerCallback

    class TorchdiagWatch(TrainerCallback):
        def __init__(self):
            self.watch = None
            self.result = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            accumulate = options.pop("accumulate", None)
            self.watch = Watch(model, None, accumulate=bool(accumulate), **options)
            self.watch.__enter__()

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

        def close(self):
            if self.watch is not None and self.result is None:
                self.result = self.watch.finish()

    return TorchdiagWatch()
