"""watch's options: torch-free (the CLI's --help imports this), validated when built."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.run import flag, number
from ...errors import OptionError

DEFAULT_EVERY = 50


@dataclass(frozen=True)
class Options:
    """every: steps between read-backs (one host sync each on a healthy run); reports and TensorBoard
    points are made at those steps. accumulate: the loop carries gradients over optimizer steps on
    purpose (the missing-zero_grad check is off). status: the live line on stderr (None: only when
    stderr is a terminal). histograms: weight/gradient histograms to TensorBoard (a device→host copy of
    every parameter each `every` steps; only with a logdir). replay: localise the first non-finite
    value by replaying its batch on a copy of the model. spike/explode: how many times the running
    median a loss (resp. gradient norm) must reach to be a spike (resp. explosion). ratio_high: the
    update/weight ratio above which a layer's updates are too large."""

    every: int = DEFAULT_EVERY
    accumulate: bool = False
    status: bool | None = None
    histograms: bool = True
    replay: bool = True
    spike: float = 5.0
    explode: float = 20.0
    ratio_high: float = 0.1
    logdir: str | None = None

    def __post_init__(self):
        number("every", self.every, low=1, high=1_000_000, integer=True)
        flag("accumulate", self.accumulate)
        if self.status is not None:
            flag("status", self.status)
        flag("histograms", self.histograms)
        flag("replay", self.replay)
        number("spike", self.spike, low=1, low_open=True)
        number("explode", self.explode, low=1, low_open=True)
        number("ratio_high", self.ratio_high, low=0, low_open=True)
        if self.logdir is not None and not isinstance(self.logdir, str):
            try:
                object.__setattr__(self, "logdir", str(self.logdir))   # a Path
            except Exception:
                raise OptionError("logdir", f"{self.logdir!r} is not a folder name") from None
