"""lr-find's own options: torch-free (`torchdiag --help` imports nothing heavy), validated when built,
before any model is loaded, for every caller (CLI, Python, `check`). Names as in pyproject, `_` for `-`:
CLI --min-lr, --max-lr, --steps, --diverge, --repeats, --check-steps."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...core.run import number
from ...errors import OptionError

MAX_REPEATS = 20


@dataclass
class Options:
    """The range test runs `steps` updates whose rate grows geometrically from `min_lr` to `max_lr`,
    `repeats` times (seeds seed … seed+repeats-1), stopping a repeat early once its smoothed loss exceeds
    `diverge` × its best. The suggestion is then checked by three runs of `check_steps` updates at
    0.1×, 1× and 10× of it (0: not checked). Cost: at most steps × repeats + 3 × check_steps updates."""

    min_lr: float = 1e-7
    max_lr: float = 10.0
    steps: int = 100
    diverge: float = 4.0
    repeats: int = 3
    check_steps: int = 30
    # Progress callback (updates done, loss or None): plain Python, holds no torch state (a CLI bar).
    on_step: Callable[[int, float | None], None] | None = None

    def __post_init__(self):
        number("min_lr", self.min_lr, low=0, low_open=True)
        number("max_lr", self.max_lr, low=0, low_open=True)
        if self.max_lr <= self.min_lr:
            raise OptionError("max_lr", f"must be above min_lr ({self.min_lr:g}), got {self.max_lr:g}",
                              hint="the range test sweeps the rate upwards, e.g. min_lr 1e-7 to max_lr 10",
                              others=("min_lr", "max_lr"))
        number("steps", self.steps, low=10, integer=True)
        number("diverge", self.diverge, low=1, low_open=True)
        number("repeats", self.repeats, low=1, high=MAX_REPEATS, integer=True)
        number("check_steps", self.check_steps, low=0, integer=True)
        if 0 < self.check_steps < 3:
            raise OptionError("check_steps", f"must be 0 (no check) or at least 3, got {self.check_steps}",
                              hint="a checked run needs a few updates to show which rate trains fastest")
        if self.on_step is not None and not callable(self.on_step):
            raise OptionError("on_step", f"{self.on_step!r} is not callable", hint="fn(updates_done, loss) or None")

    @property
    def cost(self) -> int:
        """The most updates the command runs (the range test may stop a repeat early)."""
        return self.steps * self.repeats + 3 * self.check_steps
