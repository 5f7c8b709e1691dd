"""memory's options and the size parsers (`check` reads max-peak-memory with parse_bytes). Stdlib only:
validated when built, before any model is loaded."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...core.run import OptimizerSpec, choice, flag, number
from ...errors import OptionError, UsageError

MODES = ("train", "inference")
# under torchrun: how each --wrap reaches this command (runner/ranks.py: wrap_mode)
WRAP = {"ddp": ("train", ""), "fsdp": ("train", "")}
NEEDS_VALUES = False                          # the meta device is the estimate's home
OPTIMIZER = OptimizerSpec("adam", lr=1e-3)    # sgd with momentum 0.9; lr does not change memory
MAX_BATCH = 1 << 20                           # --batch-sizes and the --budget search stop here
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZES_HINT = "comma-separated positive integers, e.g. 1,8,32"


def parse_bytes(text: str) -> int:
    """'24GiB', '512MB', '1.5G', '1000' → bytes (KiB/MiB/GiB are powers of 2, KB/MB/GB of 10)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text or "")
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"bad memory size '{text}'", hint="write a number with a unit, e.g. 24GiB, 512MiB, 16GB or 80e9 bytes as 80GB")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1:
        raise UsageError(f"memory size '{text}' must be at least 1 byte")
    return int(value)


def parse_batch_sizes(text: str) -> list[int]:
    """'1,8,32' → [1, 8, 32] (sorted, unique, each in [1, MAX_BATCH])."""
    parts = str(text).replace(" ", "").split(",")
    if "" in parts[:-1] or parts == [""]:   # "1,,8": an entry left out by mistake (a trailing comma is fine)
        raise UsageError(f"bad batch sizes '{text}': an empty entry", hint=SIZES_HINT)
    try:
        sizes = [int(x) for x in parts if x]
    except ValueError:
        raise UsageError(f"bad batch sizes '{text}'", hint=SIZES_HINT) from None
    return _checked_sizes(sizes, text)


def _checked_sizes(sizes, text) -> list[int]:
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise UsageError(f"bad batch sizes '{text}'", hint=SIZES_HINT)
    if max(sizes) > MAX_BATCH:
        raise UsageError(f"{max(sizes)} is too large: batch sizes up to {MAX_BATCH:,} are estimated",
                         hint=f"give sizes from 1 to {MAX_BATCH}")
    return sorted(set(sizes))


@dataclass
class Options:
    mode: str = "train"                 # train | inference
    batch_sizes: Any = ()               # [1, 8, 32] or "1,8,32"
    budget: Any = None                  # bytes, or a size such as "24GiB"
    top: int = 10                       # 0 shows every module
    depth: int = 3
    shard: int = 1
    snapshot: bool = False              # keep the CUDA allocator history (result.artefacts["snapshot"])

    def __post_init__(self):
        self.mode = choice("mode", self.mode, MODES)
        try:
            if isinstance(self.batch_sizes, str):
                self.batch_sizes = parse_batch_sizes(self.batch_sizes)
            elif self.batch_sizes:
                self.batch_sizes = _checked_sizes(list(self.batch_sizes), self.batch_sizes)
            else:
                self.batch_sizes = []
        except UsageError as exc:
            raise OptionError("batch_sizes", exc.message, hint=exc.hint) from None
        if isinstance(self.budget, str):
            try:
                self.budget = parse_bytes(self.budget)
            except UsageError as exc:
                raise OptionError("budget", exc.message, hint=exc.hint) from None
        elif self.budget is not None:
            number("budget", self.budget, low=1, integer=True)
        number("top", self.top, low=0, integer=True)
        number("depth", self.depth, low=0, integer=True)
        number("shard", self.shard, low=1, integer=True)
        flag("snapshot", self.snapshot, "torchdiag.render.memory.write_snapshot")  # it once took a path
