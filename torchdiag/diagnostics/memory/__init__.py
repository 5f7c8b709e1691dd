"""memory: where the memory of a training step (or an inference forward) goes.

One engine, two ways to run it (torchdiag/core/memtrack.py): a TorchDispatchMode that keeps the
books of every live tensor storage by category.
- measured (`measured`): on the real device, on a copy of the model (real tensors: the bytes tensors
  hold; on CUDA the caching allocator's own peak allocated/reserved are read as well);
- estimated (`estimated`): on fake tensors (torch's FakeTensorMode, fake CPU tensors): the same step
  runs, shapes and dtypes propagate, nothing is allocated. Used for --device meta (a 7B model in
  seconds), for every --batch-sizes entry and for the --budget search (`batch`).

The step (`step`) is a steady-state training step: optimizer state already exists (created by one
zero-gradient step before tracking), gradients start as None (zero_grad(set_to_none=True)), then
forward + loss, backward, optimizer.step(). `shard`: the ZeRO/FSDP maths; `report`: run() and the
Result; `options`: the torch-free Options and the size parsers (`check` uses parse_bytes). The CUDA
allocator history (snapshot) is data, `result.artefacts["snapshot"]`, written by render/memory.py."""
from __future__ import annotations

from .batch import Peaks, largest_fitting, sweep
from .estimated import estimate
from .measured import measure
from .options import (
           MAX_BATCH,
           MODES,
           NEEDS_VALUES,
           OPTIMIZER,
           WRAP,
           Options,
           parse_batch_sizes,
           parse_bytes,
)
from .ranks import merge_ranks  # the torchrun hook (runner/ranks.py)
from .report import run
from .shard import Units, fsdp_peaks, fsdp_unit_bytes, fsdp_units, shard_rows
from .step import StepReport, run_step

__all__ = ["Options", "OPTIMIZER", "NEEDS_VALUES", "WRAP", "MODES", "MAX_BATCH", "run", "merge_ranks",
           "measure", "estimate", "run_step",
           "StepReport", "Peaks", "sweep", "largest_fitting", "shard_rows", "fsdp_unit_bytes",
           "Units", "fsdp_units", "fsdp_peaks", "parse_bytes",
           "parse_batch_sizes"]
