"""The profiled run: the steps under torch.profiler's schedule, then the result built from its events."""
from __future__ import annotations

import contextlib
import re
import time
import warnings

from ...core import op_dtypes
from ...core.guard import leave_no_trace
from ...core.interrupts import deferred
from ...core.scaling import stepper
from ...core.tracking import forward_error
from ...core.train import backward, step
from ...errors import ModelError, UsageError
from ...results import Result
from . import syncs
from .labels import PHASE_PREFIX, ModuleLabels
from .options import Options
from .ranks import record_collectives
from .rows import (
    kernel_rows,
    kernel_table,
    module_rows,
    module_table,
    operator_rows,
    operator_table,
    phase_rows,
    phase_table,
    round_and_display,
)
from .stats import step_stats

_KINETO_NOISE = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] ")
# kineto asks the CUDA runtime for its devices when it builds a trace; on a machine without a usable
# driver it logs this as an ERROR line although only CPU activity was requested; it is noise, filtered out
_NO_GPU_PROBE = re.compile(r"gpuGetDeviceCount failed with code \d+")
# a profiler stopped by Ctrl-C/SIGTERM in a warmup step says so on stderr; the interrupt already does
_STOPPED_IN_WARMUP = re.compile(r"disableProfiler called but no active profiling session found")


@contextlib.contextmanager
def quiet_kineto(cpu_only: bool = False, drop: re.Pattern | None = None):
    """Kineto writes `USDT:… profiler_start` / `STAGE:…` lines straight to file descriptor 2 when the
    profiler starts and stops. Around those calls only, send fd 2 to a temporary file and pass on
    every other line (warnings, the user's own prints) unchanged. `cpu_only`: also drop kineto's
    failed GPU probe, which says nothing about a CPU profile. `drop`: lines that match it too."""
    import os
    import sys
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except ValueError:
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not _KINETO_NOISE.match(line) and not (cpu_only and _NO_GPU_PROBE.search(line))
                    and not (drop is not None and drop.search(line))]
            if kept:
                sys.stderr.write("".join(kept))


def run(model, inputs, opts: Options | None, ctx) -> Result:
    import torch

    opts, default = resolved(opts or Options(), ctx)
    if opts.mode == "inference":
        inputs = ctx.inference_inputs(model, inputs)
    result = _header(opts, ctx, default)
    with leave_no_trace(model):
        work, optimizer, loss_fn = _workload(model, opts, ctx)
        labels = ModuleLabels(work)
        step_fn = Step(work, inputs, opts.mode, loss_fn, optimizer, labels, ctx)
        prof, step_ms, trace = _profile(opts, ctx, step_fn)
        events = prof.events()
        averages = prof.key_averages(group_by_input_shape=opts.record_shapes)
        found = _syncs(opts, ctx, step_fn) if opts.syncs else None
        seen = _op_dtypes(opts, step_fn) if ctx.autocast_dtype or ctx.spec.dtype else None
    record_collectives(result, events)       # under torchrun only: profile/ranks.py
    _idle_wrapper(result, opts, default, ctx)
    if opts.trace:
        result.artefacts["trace"] = trace    # None: the profiler wrote nothing (render/profile.py says so)
    if loss_fn is not None:
        result.header["loss"] = loss_fn.describe()
    active_total_us = _timing(result, step_ms, opts, inputs)
    _tables(result, averages, events, labels.types, opts, ctx.on_cuda, active_total_us)
    if found is not None:
        syncs.report(result, found, opts)
    if seen is not None:
        op_dtypes.report(result, seen, ctx, "one more step, not profiled")
    result.notes.append(f"operator and module times are totals over the {opts.active} active step(s); "
                        "profiled steps include the overhead of the profiler and of the module labels")
    if not opts.warmup:
        result.notes.append(f"{ctx.option('warmup')} 0: the first active step pays one-time costs (allocations, kernel selection) "
                            "and can skew the times")
    if labels.compiled:
        result.notes.append("torch.compile'd: run compiled, its modules timed as one (a label inside the compiled "
                            "part would break its graph); the first steps, which compile it, are the warm-up's")
    if not ctx.on_cuda and torch.cuda.is_available():
        result.notes.append(f"a CUDA GPU is available; profile it with {ctx.option('device')} cuda")
    return result


# what each wrapper communicates, and when (why train is the default under it)
_WRAPPER_COMMS = {"ddp": "DDP communicates only in backward, in its gradient allreduce",
                  "fsdp": "FSDP, applied at the root, all-gathers the parameters in the first forward and keeps them "
                          "whole until a backward reshards them and reduce-scatters the gradients"}


def resolved(opts: Options, ctx) -> tuple[Options, bool]:
    """(opts with its mode, whether the mode was the default): an explicit mode stands; else inference,
    or train under torchrun's --wrap ddp|fsdp (ctx.wrapper), where an inference profile would leave out
    what the wrapper does: DDP makes no collective without a backward."""
    import dataclasses

    if opts.mode is not None:
        return opts, False
    return dataclasses.replace(opts, mode="train" if ctx.wrapper is not None else "inference"), True


def _header(opts: Options, ctx, default: bool = False) -> Result:
    mode = ("inference (eval mode, no grad)" if opts.mode == "inference" else
            f"train (forward + loss + backward + {ctx.spec.optimizer.name} step, on a copy of the model)")
    if default and ctx.wrapper is not None:
        mode += (f"; the default under {ctx.option('wrap')} {ctx.spec.wrap}: {_WRAPPER_COMMS[ctx.spec.wrap]} "
                 f"({ctx.option('mode')} inference profiles the forward alone)")
    result = Result("profile", header={
        "mode": mode,
        "schedule": f"wait {opts.wait}, warmup {opts.warmup}, active {opts.active} steps",
        "activities": "CPU, CUDA" if ctx.on_cuda else "CPU",
    })
    if ctx.on_cuda:
        result.header["sync"] = "torch.cuda.synchronize() before the first step and after every step"
    return result


def _workload(model, opts: Options, ctx):
    """(module to run, optimizer, loss rule): the model itself in eval mode for inference; a train
    copy with the run's optimizer and loss rule for train mode."""
    if opts.mode == "inference":
        if ctx.wrapper is None:
            model.eval()
            return model, None, None
        # under a wrapper: its forward on a wrapped copy (FSDP's all-gathers are in it; DDP's is local)
        return ctx.train_copy(model, f"to profile {ctx.option('mode')} inference through the wrapper").eval(), None, None
    work = ctx.train_copy(model, f"to profile {ctx.option('mode')} train on it", steps=True)
    params = [p for p in work.parameters() if p.requires_grad]
    if not params:
        raise UsageError(f"{ctx.option('mode')} train: the model has no trainable parameters (all requires_grad=False)",
                         hint=f"use {ctx.option('mode')} inference")
    return work, ctx.optimizer(params), ctx.loss()


def _idle_wrapper(result: Result, opts: Options, default: bool, ctx) -> None:
    """An explicit inference profile under a wrapper whose steps ran no collective (DDP: it reduces
    gradients in backward) profiles each rank's own forward: say so, and what shows the wrapper."""
    coll = result.data.get("collectives")
    if opts.mode != "inference" or default or ctx.wrapper is None or coll is None or coll["time_us"] > 0:
        return
    wrap = ctx.spec.wrap
    result.add("no-collectives-in-inference", "info", "",
               f"{ctx.option('mode')} inference under {ctx.option('wrap')} {wrap}: no collective ran in the "
               f"{opts.active} profiled step(s): {_WRAPPER_COMMS[wrap]}; these times are each rank's own forward",
               hint=f"{ctx.option('mode')} train (the default under {ctx.option('wrap')} {wrap}) profiles the step "
                    "with the wrapper's collectives")


def _profile(opts: Options, ctx, step_fn):
    """Run the scheduled steps under torch.profiler: (profiler, step times in ms, trace bytes or None)."""
    import tempfile
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.on_cuda else [])
    quiet = lambda: quiet_kineto(cpu_only=not ctx.on_cuda)   # noqa: E731
    sync = (lambda: torch.cuda.synchronize(ctx.device)) if ctx.on_cuda else (lambda: None)
    step_ms: list[float] = []
    ready: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="torchdiag-profile-") as tmp:
        trace_file = Path(tmp) / "trace.json"

        def on_ready(prof):
            # kineto saves a trace once: exported here, in a private folder; render/ writes the user's files
            ready.append(True)
            if opts.trace:
                prof.export_chrome_trace(str(trace_file))

        with warnings.catch_warnings():   # --warmup 0 is the user's choice, said in a note (run), not torch's warning
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            plan = schedule(wait=opts.wait, warmup=opts.warmup, active=opts.active, repeat=1)
        prof = profile(activities=activities, schedule=plan,
                       on_trace_ready=on_ready, record_shapes=opts.record_shapes,
                       profile_memory=opts.memory, with_stack=False)
        grad_ctx = torch.no_grad if opts.mode == "inference" else torch.enable_grad
        with step_fn.labels, grad_ctx():
            # the profiler's own bookkeeping runs with Ctrl-C/SIGTERM held (core/interrupts.py): one
            # arriving there is raised after it, inside the try, so the profiler is always stopped
            try:
                with deferred(), quiet():
                    prof.__enter__()
                sync()
                for _ in range(opts.total_steps):
                    t0 = time.perf_counter()
                    step_fn()
                    sync()
                    step_ms.append((time.perf_counter() - t0) * 1e3)
                    with deferred(), quiet():
                        prof.step()
            except BaseException:
                _stop_failed(prof, step_fn.labels, ctx)
                raise
            with deferred(), quiet():
                prof.__exit__(None, None, None)
        if step_fn.optimizer is not None:
            step_fn.optimizer.zero_grad(set_to_none=True)
        if not ready:  # not expected with repeat=1; keeps the contract if torch changes
            raise RuntimeError("torch.profiler did not deliver a trace")
        # kineto reports a failed export only in its own log: no file (or an empty one) is no trace
        trace = trace_file.read_bytes() if opts.trace and trace_file.is_file() else None
    return prof, step_ms, trace or None


def _stop_failed(prof, labels: ModuleLabels, ctx) -> None:
    """Stop the profiler after the steps raised (the model's error, Ctrl-C, SIGTERM): the module ranges
    left open are closed first; an error in stopping is not raised over the one that stopped the run."""
    labels.close_open()
    with deferred(), quiet_kineto(cpu_only=not ctx.on_cuda, drop=_STOPPED_IN_WARMUP):
        with contextlib.suppress(Exception):
            prof.__exit__(None, None, None)


def _syncs(opts: Options, ctx, step_fn) -> dict:
    """One more step (not profiled) under host-sync detection (profile/syncs.py)."""
    import torch

    grad_ctx = torch.no_grad if opts.mode == "inference" else torch.enable_grad
    with step_fn.labels, grad_ctx():
        return syncs.detect(step_fn, ctx)


def _op_dtypes(opts: Options, step_fn):
    """One more step (not profiled) recording the dtype each compute op ran in (core/op_dtypes.py)."""
    import torch

    grad_ctx = torch.no_grad if opts.mode == "inference" else torch.enable_grad
    with step_fn.labels, grad_ctx(), op_dtypes.OpDtypes(step_fn.model) as rec:
        step_fn()
    return rec.seen


class Step:
    """One step: a forward (inference), or forward + loss (under --amp: autocast) + backward (scaled
    under fp16) + optimizer step (through the GradScaler under fp16)."""

    def __init__(self, model, inputs, mode, loss_fn, optimizer, labels: ModuleLabels, ctx):
        self.model, self.inputs, self.mode, self.loss_fn = model, inputs, mode, loss_fn
        inputs.keep()   # the copy a forward that writes into its input is re-run from: not in the profiled steps
        self.optimizer, self.labels, self.ctx = optimizer, labels, ctx
        self.scaler = ctx.grad_scaler() if optimizer is not None else None

    def __call__(self):
        from torch.autograd.profiler import record_function

        if self.mode == "inference":
            with self.ctx.autocast():
                _forward(self.model, self.inputs, self.labels)
            return
        with record_function(PHASE_PREFIX + "forward"), self.ctx.autocast():
            out = _forward(self.model, self.inputs, self.labels)
        with record_function(PHASE_PREFIX + "loss"), self.ctx.autocast():
            loss = self.loss_fn(out)
        with record_function(PHASE_PREFIX + "backward"):
            scaled = self.scaler.scale(loss) if self.scaler is not None else loss
            if not backward(scaled, "the model's backward raised; check custom autograd functions and in-place ops"):
                raise ModelError("backward failed: the loss does not require grad (no trainable parameter reaches it)")
        with record_function(PHASE_PREFIX + "optimizer_step"):
            step(stepper(self.scaler, self.optimizer))
            self.optimizer.zero_grad(set_to_none=True)


def _forward(model, inputs, labels: ModuleLabels):
    try:
        return inputs.call(model)
    except ModelError:
        raise
    except Exception as exc:
        err = forward_error(exc, labels)   # names the innermost open module
        labels.close_open()
        raise err from exc


def _timing(result: Result, step_ms: list[float], opts: Options, inputs) -> float:
    """Step-time data, series and summary lines; returns the summed active step time in µs."""
    active_ms = step_ms[opts.wait + opts.warmup:]
    stats = step_stats(active_ms)
    batch = inputs.batch_size
    per_s = (batch / (stats["mean"] / 1e3)) if batch and stats["mean"] > 0 else None
    result.data["step_time_ms"] = {k: round(stats[k], 4) for k in ("mean", "median", "p90")}
    result.data["step_time_stats_ms"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}
    result.data["batch_size"] = batch
    result.data["samples_per_s"] = None if per_s is None else round(per_s, 2)
    result.data["active_steps"] = opts.active
    result.data["step_phases"] = ["wait"] * opts.wait + ["warmup"] * opts.warmup + ["active"] * opts.active
    result.series["step_times_ms"] = [round(v, 4) for v in step_ms]
    result.summary.append(
        ("Step time", f"mean {stats['mean']:.3f} ms · median {stats['median']:.3f} ms · p90 {stats['p90']:.3f} ms "
                      f"(over {opts.active} active step{'s' if opts.active != 1 else ''})"))
    if per_s is not None:
        result.summary.append(("Throughput", f"{round(per_s, 2):,.1f} samples/s (batch {batch})"))
    return sum(active_ms) * 1e3


def _tables(result: Result, averages, events, types: dict, opts: Options, on_cuda: bool, active_total_us: float):
    ops = operator_rows(averages, on_cuda, opts.record_shapes, opts.memory)
    total_self_cpu = sum(r["self_cpu_time_us"] for r in ops) or 1.0
    key = "self_cuda_time_us" if on_cuda else "self_cpu_time_us"
    ops.sort(key=lambda r: (-r[key], -r["self_cpu_time_us"], r["op"]))
    for r in ops:
        r["self_cpu_share"] = r["self_cpu_time_us"] / total_self_cpu
    result.data["operators_total"] = len(ops)
    result.tables.append(operator_table(ops if opts.top == 0 else ops[: opts.top], on_cuda, opts, len(ops)))
    if on_cuda:
        kernels = kernel_rows(averages)
        result.tables.append(kernel_table(kernels if opts.top == 0 else kernels[: opts.top]))
    mods = module_rows(events, types, on_cuda, opts.mode == "train", opts.memory)
    for r in mods:
        r["share"] = r["cpu_time_us"] / active_total_us if active_total_us else None
    result.tables.append(module_table(mods, opts, on_cuda))
    phases = phase_rows(events)
    if phases:
        for r in phases:
            r["share"] = r["cpu_time_us"] / active_total_us if active_total_us else None
        result.tables.append(phase_table(phases, on_cuda))
    for t in result.tables:
        round_and_display(t)
