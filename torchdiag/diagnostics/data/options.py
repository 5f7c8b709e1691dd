"""data's options: torch-free, validated when built (before any data is loaded)."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.run import flag, number
from ...errors import OptionError

NEEDS_VALUES = True
# TensorFlow's input-pipeline analyzer: the share of step time spent waiting for input
INPUT_BOUND = (0.05, 0.20)      # < 5%: not input-bound; 5–20%: moderately; ≥ 20%: highly
WAIT_FLOOR_S = 1e-3             # waiting under this a batch is no warning: the loader's own overhead
FEATURE_SPREAD = 100.0          # 1-D features whose ranges are this far apart: standardise each, not all as one


@dataclass
class Options:
    batch_size: int = 32            # when the spec gives a Dataset (a DataLoader keeps its own)
    samples: int | None = 20000     # content checks read at most this many samples per split (None: all)
    batches: int = 20               # batches timed per loader configuration (and per training run)
    timeout: float = 30.0           # seconds a batch may take before the loader is reported stuck
    input_field: str | None = None
    target_field: str | None = None
    num_classes: int | None = None  # classes expected (else the model's output size, else the labels seen)
    workers: tuple[int, ...] | None = None   # num_workers to sweep (None: 0, 1, 2, 4, … up to the CPU count)
    sweep: bool = True              # time other num_workers (and pin_memory on CUDA)
    speed: bool = True              # time the loader at all (False: content checks only)
    per_class: int = 8              # sample inputs per class in the picture grid
    pictures: bool = True           # fill result.images / artefacts for --images, --plot and --tb

    def __post_init__(self):
        number("batch_size", self.batch_size, low=1, integer=True)
        if self.samples is not None:
            number("samples", self.samples, low=1, integer=True)
        number("batches", self.batches, low=1, integer=True)
        number("timeout", self.timeout, low=0, low_open=True)
        if self.num_classes is not None:
            number("num_classes", self.num_classes, low=1, integer=True, flag="--classes")
        number("per_class", self.per_class, low=0, high=64, integer=True)
        for name in ("input_field", "target_field"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise OptionError(name, f"{value!r} is not a field name", hint="e.g. image, label, [0], [1]")
        if self.input_field is not None and self.input_field == self.target_field:   # (a sweep: no input was read,
            raise OptionError("target_field", f"{self.target_field!r} is the input_field too",   # and "OK")
                              hint="the input and the target are two fields of a batch, e.g. input_field [0], "
                                   "target_field [1]", others=("input_field", "target_field"))
        if self.workers is not None:
            if isinstance(self.workers, str):   # "0,2,4" from a config file
                try:
                    self.workers = tuple(int(w) for w in self.workers.split(",") if w.strip())
                except ValueError:
                    raise OptionError("workers", f"{self.workers!r} is not a list of worker counts",
                                      hint="e.g. 0,2,4") from None
            self.workers = tuple(self.workers)
            if not self.workers:
                raise OptionError("workers", "is empty", hint="e.g. 0,2,4")
            for w in self.workers:
                number("workers", w, low=0, high=256, integer=True)
        for name in ("sweep", "speed", "pictures"):
            flag(name, getattr(self, name))
