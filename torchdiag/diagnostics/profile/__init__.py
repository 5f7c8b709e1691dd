"""profile: where the time goes — step times, top operators, a per-module rollup, traces.

torch.profiler runs with a schedule (wait → warmup → active steps). A step is one forward pass
(inference: eval mode, no grad) or forward + loss + backward + optimizer step (train, on a copy so
the user's parameters never move). On CUDA both CPU and CUDA activities are recorded and every step
ends with a device synchronisation, so step times are real.

Cheap by design: the per-operator table is built from `prof.key_averages()` events directly
(`.table()` is the slow part of the profiler's own output, FIELD-NOTES), and module calls are
labelled with `record_function("module::<path>")` ranges from forward pre/post hooks (the
profiler's `with_modules` is deprecated). Backward time is attributed to modules through the
autograd sequence number that links each backward node to the forward op that created it.

All times in the operator and module tables are totals over the active steps (microseconds),
as torch.profiler reports them; `share` columns divide by the summed active step time.

The package: `options` (torch-free Options), `session` (the profiled run), `labels` (module
ranges), `rows` (profiler events → table rows), `stats` (step-time statistics). The trace is
data (`result.artefacts["trace"]`, Chrome trace JSON bytes), written by render/profile.py."""
from __future__ import annotations

from .labels import MODULE_PREFIX, PHASE_PREFIX, ROOT_LABEL, ModuleLabels, module_label
from .options import MODES, NEEDS_VALUES, OPTIMIZER, WRAP, Options
from .ranks import merge_ranks   # the torchrun hook (runner/ranks.py)
from .rows import kernel_rows, module_rows, operator_rows, phase_rows
from .session import quiet_kineto, run
from .stats import percentile, step_stats

__all__ = ["Options", "OPTIMIZER", "NEEDS_VALUES", "WRAP", "MODES", "run", "merge_ranks",
           "percentile", "step_stats", "ModuleLabels",
           "module_label", "operator_rows", "kernel_rows", "module_rows", "phase_rows", "quiet_kineto",
           "MODULE_PREFIX", "PHASE_PREFIX", "ROOT_LABEL"]
