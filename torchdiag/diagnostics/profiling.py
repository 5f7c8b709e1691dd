"""profile: where the time goes — step times, top operators, a per-module rollup, traces.

torch.profiler runs with a schedule (wait → warmup → active steps). A step is one forward pass
(inference: eval mode, no grad) or forward + loss + backward + optimizer step (train, on a deep
copy so the user's parameters never move). On CUDA both CPU and CUDA activities are recorded and
every step ends with a device synchronisation, so step times are real.

Cheap by design: the per-operator table is built from `prof.key_averages()` events directly
(`.table()` is the slow part of the profiler's own output, FIELD-NOTES), and module calls are
labelled with `record_function("module::<path>")` ranges from forward pre/post hooks (the
profiler's `with_modules` is deprecated). Backward time is attributed to modules through the
autograd sequence number that links each backward node to the forward op that created it.

All times in the operator and module tables are totals over the active steps (microseconds),
as torch.profiler reports them; `share` columns divide by the summed active step time."""
from __future__ import annotations

import contextlib
import copy
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..core.guard import leave_no_trace
from ..core.tracking import ForwardHooks, describe
from ..errors import ModelError, UsageError, one_line
from ..results import Column, Result, Table

MODES = ("inference", "train")
OPTIMIZERS = ("adam", "adamw", "sgd")
MODULE_PREFIX = "module::"
PHASE_PREFIX = "torchdiag::"
ROOT_LABEL = "(root)"


@dataclass
class Options:
    mode: str = "inference"
    wait: int = 1
    warmup: int = 2
    active: int = 5
    top: int = 15
    record_shapes: bool = False
    memory: bool = False
    trace: Optional[Path] = None
    tb: Optional[Path] = None
    depth: int = 3
    loss: Any = None              # core.loss.Loss, train mode
    optimizer: str = "adam"
    lr: float = 1e-3


# ----------------------------------------------------------------------------------------- statistics

def percentile(values, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    vals = sorted(values)
    if not vals:
        return float("nan")
    rank = (len(vals) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return vals[lo] + (vals[hi] - vals[lo]) * (rank - lo)


def step_stats(times_ms) -> dict:
    n = len(times_ms)
    mean = sum(times_ms) / n
    std = math.sqrt(sum((t - mean) ** 2 for t in times_ms) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "median": percentile(times_ms, 50), "p90": percentile(times_ms, 90),
            "min": min(times_ms), "max": max(times_ms), "std": std, "steps": n}


# ----------------------------------------------------------------------------------------- labelling

class ModuleLabels(ForwardHooks):
    """Forward pre/post hooks that open and close `record_function("module::<path>")` ranges.
    Keeps the open calls on a stack, so a failure names the innermost module and the ranges
    left open by the exception can be closed."""

    def __init__(self, model):
        super().__init__(model)
        self.types = {name: type(mod).__name__ for name, mod in model.named_modules()}
        self.stack: list = []

    def __enter__(self):
        # torch's _RecordFunctionFast (what torch.compile uses for its own annotations) opens the same
        # kind of range as record_function at ~0.6 µs instead of ~6 µs per call. It is private:
        # fall back to the public record_function when it is missing.
        try:
            from torch._C._profiler import _RecordFunctionFast as fast
        except ImportError:
            fast = None
        if fast is None:
            from torch.autograd.profiler import record_function as fast
        self._rf = fast
        return super().__enter__()

    def __exit__(self, *exc):
        self.close_open()
        return super().__exit__(*exc)

    def _pre(self, mod, args):
        name = self.names.get(id(mod), "?")
        rf = self._rf(MODULE_PREFIX + (name or ROOT_LABEL))
        rf.__enter__()
        self.stack.append((name, mod, args, rf))

    def _post(self, mod, args, output):
        if self.stack:
            self.stack.pop()[3].__exit__(None, None, None)

    def failing(self):
        """(name, type, input description) of the innermost open module, or None."""
        if not self.stack:
            return None
        name, mod, args, _ = self.stack[-1]
        return name, type(mod).__name__, describe(tuple(args))

    def close_open(self):
        while self.stack:
            try:
                self.stack.pop()[3].__exit__(None, None, None)
            except Exception:
                pass


def module_label(event_name: str) -> str | None:
    if not event_name.startswith(MODULE_PREFIX):
        return None
    name = event_name[len(MODULE_PREFIX):]
    return "" if name == ROOT_LABEL else name


# ----------------------------------------------------------------------------------------- the run

_KINETO_NOISE = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def quiet_kineto():
    """Kineto writes `USDT:… profiler_start` / `STAGE:…` lines straight to file descriptor 2 when the
    profiler starts and stops. Around those calls only, send fd 2 to a temporary file and pass on
    every other line (warnings, the user's own prints) unchanged."""
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
                    if not _KINETO_NOISE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))

def _check(opts: Options, device) -> None:
    if opts.mode not in MODES:
        raise UsageError(f"unknown mode '{opts.mode}'", hint="choose --mode inference or --mode train")
    if opts.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer '{opts.optimizer}'", hint="choose " + ", ".join(OPTIMIZERS))
    for name in ("wait", "warmup"):
        if getattr(opts, name) < 0:
            raise UsageError(f"--{name} must be ≥ 0 (got {getattr(opts, name)})")
    if opts.active < 1:
        raise UsageError(f"--active must be ≥ 1 (got {opts.active})", hint="profile at least one step")
    if opts.top < 0:
        raise UsageError(f"--top must be ≥ 0 (got {opts.top}); 0 lists every operator")
    if device.type == "meta":
        raise UsageError("profile needs a device that runs kernels; meta tensors have no timing",
                         hint="use --device cpu or --device cuda")
    if opts.trace is not None:
        if Path(opts.trace).expanduser().is_dir():
            raise UsageError(f"--trace {opts.trace}: is a directory", hint="give a file name, e.g. --trace run.json")
        parent = Path(opts.trace).expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--trace {opts.trace}: directory {parent} does not exist",
                             hint="create the directory first or pick another path")


def _stat(path) -> tuple | None:
    """What tells a rewritten file from the old one (None: no such file)."""
    if path is None:
        return None
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _make_optimizer(name: str, params, lr: float):
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def _device_of(inputs, model):
    import torch

    for _, t in inputs.tensors():
        return t.device
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def run(model, inputs, opts: Options | None = None) -> Result:
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile, schedule

    opts = opts or Options()
    device = _device_of(inputs, model)
    _check(opts, device)
    on_cuda = device.type == "cuda"
    total_steps = opts.wait + opts.warmup + opts.active

    result = Result("profile", header={
        "mode": ("inference (eval mode, no grad)" if opts.mode == "inference" else
                 f"train (forward + loss + backward + {opts.optimizer} step, on a copy of the model)"),
        "schedule": f"wait {opts.wait}, warmup {opts.warmup}, active {opts.active} steps",
        "activities": "CPU, CUDA" if on_cuda else "CPU",
    })
    if on_cuda:
        result.header["sync"] = "torch.cuda.synchronize() before the first step and after every step"

    with leave_no_trace(model):
        if opts.mode == "train":
            try:
                work = copy.deepcopy(model)
            except Exception as exc:
                raise ModelError(f"--mode train profiles a copy of the model, and copy.deepcopy failed: {one_line(exc)}",
                                 hint="make the model deep-copyable, or use --mode inference") from exc
            work.train()
            params = [p for p in work.parameters() if p.requires_grad]
            if not params:
                raise UsageError("--mode train: the model has no trainable parameters (all requires_grad=False)",
                                 hint="use --mode inference")
            optimizer = _make_optimizer(opts.optimizer, params, opts.lr)
            loss_fn = opts.loss
            if loss_fn is None:
                from ..core.loss import Loss

                loss_fn = Loss("auto")
        else:
            work = model
            work.eval()
            optimizer = loss_fn = None

        activities = [ProfilerActivity.CPU]
        if on_cuda:
            activities.append(ProfilerActivity.CUDA)
        tb_dir = Path(opts.tb) / "profile" if opts.tb else None
        tb_before: set = set()
        if tb_dir is not None:
            tb_dir.mkdir(parents=True, exist_ok=True)
            tb_before = set(tb_dir.glob("*.pt.trace.json*"))
            from torch.profiler import tensorboard_trace_handler

            tb_handler = tensorboard_trace_handler(str(tb_dir))
        ready = []
        trace_before = _stat(opts.trace)
        trace_error: list[str] = []

        def on_ready(prof):
            # kineto saves a trace once ("Trace is already saved"): with both --tb and --trace, the
            # handler writes its file and --trace gets a copy of it.
            ready.append(True)
            if tb_dir is not None:
                tb_handler(prof)
                if opts.trace is not None:
                    import shutil

                    new = sorted(set(tb_dir.glob("*.pt.trace.json*")) - tb_before, key=lambda p: p.stat().st_mtime)
                    if new:
                        try:
                            shutil.copyfile(new[-1], opts.trace)
                        except OSError as exc:
                            trace_error.append(one_line(exc))
            elif opts.trace is not None:
                prof.export_chrome_trace(str(opts.trace))

        def sync():
            if on_cuda:
                torch.cuda.synchronize(device)

        step_ms: list[float] = []
        labels = ModuleLabels(work)
        grad_ctx = torch.no_grad if opts.mode == "inference" else torch.enable_grad
        prof = profile(activities=activities,
                       schedule=schedule(wait=opts.wait, warmup=opts.warmup, active=opts.active, repeat=1),
                       on_trace_ready=on_ready, record_shapes=opts.record_shapes,
                       profile_memory=opts.memory, with_stack=False)
        with labels, grad_ctx():
            with quiet_kineto():
                prof.__enter__()
            try:
                sync()
                for step in range(total_steps):
                    t0 = time.perf_counter()
                    _one_step(work, inputs, opts.mode, loss_fn, optimizer, labels, record_function)
                    sync()
                    step_ms.append((time.perf_counter() - t0) * 1e3)
                    with quiet_kineto():
                        prof.step()
            finally:
                with quiet_kineto():
                    prof.__exit__(None, None, None)
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        if not ready:  # not expected with repeat=1; keeps the contract if torch changes
            raise RuntimeError("torch.profiler did not deliver a trace")

        if opts.trace is not None:
            # kineto reports a failed write only in its own log (and replaces an empty folder by the
            # file): the trace is there and new, or the command fails
            after = _stat(opts.trace)
            if after is None or after == trace_before or not Path(opts.trace).is_file():
                why = trace_error[0] if trace_error else "the profiler did not write it (it reports that only in its own log)"
                raise UsageError(f"--trace {opts.trace}: the trace could not be written: {why}",
                                 hint="give a file in a writable folder, e.g. --trace run.json")
        events = prof.events()
        averages = prof.key_averages(group_by_input_shape=opts.record_shapes)

    active_ms = step_ms[opts.wait + opts.warmup:]
    stats = step_stats(active_ms)
    active_total_us = sum(active_ms) * 1e3
    batch = inputs.batch_size
    result.data["step_time_ms"] = {k: stats[k] for k in ("mean", "median", "p90")}
    result.data["step_time_stats_ms"] = stats
    result.data["batch_size"] = batch
    result.data["samples_per_s"] = (batch / (stats["mean"] / 1e3)) if batch and stats["mean"] > 0 else None
    result.data["active_steps"] = opts.active
    result.data["step_phases"] = ["wait"] * opts.wait + ["warmup"] * opts.warmup + ["active"] * opts.active
    result.series["step_times_ms"] = step_ms
    if opts.mode == "train":
        result.header["loss"] = loss_fn.describe()

    ops = operator_rows(averages, on_cuda, opts.record_shapes, opts.memory)
    total_self_cpu = sum(r["self_cpu_time_us"] for r in ops) or 1.0
    key = "self_cuda_time_us" if on_cuda else "self_cpu_time_us"
    ops.sort(key=lambda r: (-r[key], -r["self_cpu_time_us"], r["op"]))
    for r in ops:
        r["self_cpu_share"] = r["self_cpu_time_us"] / total_self_cpu
    shown = ops if opts.top == 0 else ops[: opts.top]
    result.data["operators_total"] = len(ops)
    result.tables.append(_operator_table(shown, on_cuda, opts, len(ops)))
    if on_cuda:
        kernels = kernel_rows(averages)
        result.tables.append(Table("kernels", "Top CUDA kernels by time", [
            Column("kernel", "kernel"), Column("calls", "calls", "count"),
            Column("cuda_time_us", "CUDA time", "float", "µs")],
            kernels if opts.top == 0 else kernels[: opts.top]))

    mods = module_rows(events, labels.types, on_cuda, opts.mode == "train", opts.memory)
    for r in mods:
        r["share"] = r["cpu_time_us"] / active_total_us if active_total_us else None
    result.tables.append(_module_table(mods, opts, on_cuda))
    phases = phase_rows(events)
    if phases:
        for r in phases:
            r["share"] = r["cpu_time_us"] / active_total_us if active_total_us else None
        result.tables.append(Table("phases", "Where a train step goes", [
            Column("phase", "phase"), Column("cpu_time_us", "CPU time", "float", "µs"),
            Column("share", "% of steps", "pct")] + (
            [Column("cuda_time_us", "CUDA time", "float", "µs")] if on_cuda else []), phases))

    for t in result.tables:
        for r in t.rows:
            for k, v in r.items():
                if isinstance(v, float) and not k.endswith("share"):
                    r[k] = round(v, 3)
        _display_in_ms(t)
    result.data["step_time_ms"] = {k: round(v, 4) for k, v in result.data["step_time_ms"].items()}
    result.data["step_time_stats_ms"] = {k: round(v, 4) if isinstance(v, float) else v
                                         for k, v in stats.items()}
    result.series["step_times_ms"] = [round(v, 4) for v in step_ms]
    if result.data["samples_per_s"] is not None:
        result.data["samples_per_s"] = round(result.data["samples_per_s"], 2)
    if opts.trace is not None:
        result.data["trace"] = str(opts.trace)
    if tb_dir is not None:
        new = sorted(set(tb_dir.glob("*.pt.trace.json*")) - tb_before)
        result.data["tb_trace"] = str(new[-1]) if new else None

    result.summary += [
        ("Step time", f"mean {stats['mean']:.3f} ms · median {stats['median']:.3f} ms · p90 {stats['p90']:.3f} ms "
                      f"(over {opts.active} active step{'s' if opts.active != 1 else ''})"),
    ]
    if result.data["samples_per_s"] is not None:
        result.summary.append(("Throughput", f"{result.data['samples_per_s']:,.1f} samples/s (batch {batch})"))
    if opts.trace is not None:
        result.summary.append(("Trace", f"{opts.trace}  (open in https://ui.perfetto.dev or chrome://tracing)"))
    if tb_dir is not None and result.data.get("tb_trace"):
        result.summary.append(("TB trace", result.data["tb_trace"]))
    result.notes.append(f"operator and module times are totals over the {opts.active} active step(s); "
                        "profiled steps include the overhead of the profiler and of the module labels")
    if not on_cuda and torch.cuda.is_available():
        result.notes.append("a CUDA GPU is available; profile it with --device cuda")
    return result


def _display_in_ms(table: Table) -> None:
    """JSON keeps microseconds (`*_us`); people read milliseconds (display-only `_` keys)."""
    for col in table.columns:
        if col.unit != "µs":
            continue
        key = col.key
        for r in table.rows:
            v = r.get(key)
            r["_" + key] = None if v is None else v / 1e3
        col.key, col.unit = "_" + key, "ms"


def _one_step(model, inputs, mode, loss_fn, optimizer, labels, record_function):
    if mode == "inference":
        try:
            inputs.call(model)
        except Exception as exc:
            raise _forward_error(exc, labels) from exc
        return
    with record_function(PHASE_PREFIX + "forward"):
        try:
            out = inputs.call(model)
        except Exception as exc:
            raise _forward_error(exc, labels) from exc
    with record_function(PHASE_PREFIX + "loss"):
        loss = loss_fn(out)
    with record_function(PHASE_PREFIX + "backward"):
        try:
            loss.backward()
        except Exception as exc:
            raise ModelError(f"backward failed: {one_line(exc)}",
                             hint="the model's backward raised; check custom autograd functions and in-place ops") from exc
    with record_function(PHASE_PREFIX + "optimizer_step"):
        try:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        except Exception as exc:
            raise ModelError(f"optimizer step failed: {one_line(exc)}") from exc


def _forward_error(exc, labels: ModuleLabels) -> ModelError:
    if isinstance(exc, ModelError):
        return exc
    failing = labels.failing()
    labels.close_open()
    if failing is not None:
        name, kind, shapes = failing
        msg = f"forward failed in {name or '(root)'} ({kind}) with input shapes {shapes}: {one_line(exc)}"
    else:
        msg = f"forward failed: {one_line(exc)}"
    err = ModelError(msg, hint="the model's own code raised; fix it or the inputs (-i) and run again")
    err.where = failing[0] if failing else ""
    return err


# ----------------------------------------------------------------------------------------- tables

def _is_ours(name: str) -> bool:
    return name.startswith(MODULE_PREFIX) or name.startswith(PHASE_PREFIX) or name.startswith("ProfilerStep")


def _is_cpu_side(evt) -> bool:
    from torch.autograd import DeviceType

    return getattr(evt, "device_type", DeviceType.CPU) == DeviceType.CPU


def operator_rows(averages, on_cuda: bool, shapes: bool, memory: bool) -> list[dict]:
    """One row per CPU-side operator (per input-shape group with --record-shapes)."""
    rows = []
    for e in averages:
        if _is_ours(e.key) or not _is_cpu_side(e):
            continue
        r = {"op": e.key, "calls": int(e.count),
             "self_cpu_time_us": float(e.self_cpu_time_total), "cpu_time_us": float(e.cpu_time_total)}
        if on_cuda:
            r["self_cuda_time_us"] = float(e.self_device_time_total)
            r["cuda_time_us"] = float(e.device_time_total)
        if shapes:
            r["input_shapes"] = [list(s) if isinstance(s, (list, tuple)) else s for s in (e.input_shapes or [])]
            shown = list(r["input_shapes"])
            while shown and not shown[-1]:      # trailing non-tensor arguments (stride, padding, flags)
                shown.pop()
            r["_shapes"] = ", ".join("x".join(str(d) for d in s) if s else "·" for s in shown) or "·"
        if memory:
            r["self_cpu_memory_bytes"] = int(e.self_cpu_memory_usage)
            r["cpu_memory_bytes"] = int(e.cpu_memory_usage)
            if on_cuda:
                r["self_cuda_memory_bytes"] = int(e.self_device_memory_usage)
        rows.append(r)
    return rows


def kernel_rows(averages) -> list[dict]:
    rows = [{"kernel": e.key, "calls": int(e.count), "cuda_time_us": float(e.self_device_time_total)}
            for e in averages if not _is_cpu_side(e)]
    rows.sort(key=lambda r: -r["cuda_time_us"])
    return rows


def _operator_table(rows, on_cuda, opts: Options, total: int) -> Table:
    cols = [Column("op", "operator")]
    if opts.record_shapes:
        cols.append(Column("_shapes", "input shapes"))
    cols += [Column("calls", "calls", "count"), Column("self_cpu_time_us", "self CPU", "float", "µs"),
             Column("self_cpu_share", "%", "pct"), Column("cpu_time_us", "total CPU", "float", "µs")]
    if on_cuda:
        cols += [Column("self_cuda_time_us", "self CUDA", "float", "µs"),
                 Column("cuda_time_us", "total CUDA", "float", "µs")]
    if opts.memory:
        cols += [Column("self_cpu_memory_bytes", "self CPU mem", "bytes"),
                 Column("cpu_memory_bytes", "CPU mem", "bytes")]
        if on_cuda:
            cols.append(Column("self_cuda_memory_bytes", "self CUDA mem", "bytes"))
    by = "self CUDA" if on_cuda else "self CPU"
    title = f"Top {len(rows)} of {total} operators by {by} time" if len(rows) < total else f"Operators by {by} time"
    note = f"totals over {opts.active} active step(s); % = share of all operators' self CPU time"
    if opts.memory:
        note += "; memory = bytes allocated minus freed inside the op (negative: freed more than allocated)"
    return Table("operators", title, cols, rows, note=note)


def module_rows(events, types: dict, on_cuda: bool, train: bool, memory: bool) -> list[dict]:
    """Per-module rollup from the `module::` ranges (forward), plus backward time attributed through
    autograd sequence numbers (the forward op that created a backward node → its innermost module)."""
    fwd: dict[str, dict] = {}
    seq_owner: dict[tuple, str] = {}
    order: list[str] = []
    for e in events:
        name = module_label(e.name)
        if name is None:
            continue
        r = fwd.get(name)
        if r is None:
            r = fwd[name] = {"calls": 0, "cpu": 0.0, "cuda": 0.0, "mem": 0}
            order.append(name)
        r["calls"] += 1
        r["cpu"] += e.cpu_time_total
        if on_cuda:
            r["cuda"] += e.device_time_total
        if memory:
            r["mem"] += e.cpu_memory_usage
    bwd: dict[str, dict] = {}
    if train:
        # Every forward op records the autograd sequence number current at dispatch; the counter
        # only moves when an op creates a backward node. So among forward ops sharing a number the
        # node's creator is the last to start (earlier ones made no node, e.g. a frozen Linear).
        fwd_ops = [e for e in events if e.sequence_nr is not None and e.sequence_nr >= 0
                   and not _is_ours(e.name) and not e.name.startswith("autograd::")
                   and not _is_backward_side(e)]
        fwd_ops.sort(key=lambda e: e.time_range.start)
        for e in fwd_ops:
            seq_owner[(e.thread, e.sequence_nr)] = _innermost_module(e)
        for e in events:
            if not e.name.startswith("autograd::engine::evaluate_function:"):
                continue
            owner = seq_owner.get((getattr(e, "fwd_thread", e.thread), e.sequence_nr))
            if owner is None:
                continue
            b = bwd.setdefault(owner, {"cpu": 0.0, "cuda": 0.0})
            b["cpu"] += e.cpu_time_total
            if on_cuda:
                b["cuda"] += e.device_time_total
    # Containers that are never called themselves (ModuleList, ModuleDict) get a row summing their
    # direct submodules, so the tree has no holes.
    missing = set()
    for name in order:
        parts = name.split(".") if name else []
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in fwd:
                missing.add(parent)
    if order and "" not in fwd:
        missing.add("")
    for name in sorted(missing, key=lambda n: -(n.count(".") + 1 if n else 0)):
        kids = [c for c in fwd if _is_child(c, name)]
        fwd[name] = {"calls": 0, "cpu": sum(fwd[c]["cpu"] for c in kids), "cuda": sum(fwd[c]["cuda"] for c in kids),
                     "mem": sum(fwd[c]["mem"] for c in kids), "container": True}
        order.append(name)
    rows = []
    for name in order:
        r = fwd[name]
        children = [c for c in order if _is_child(c, name)]
        row = {"name": name, "type": types.get(name, "?"), "calls": r["calls"],
               "cpu_time_us": r["cpu"],
               "self_cpu_time_us": r["cpu"] - sum(fwd[c]["cpu"] for c in children)}
        if on_cuda:
            row["cuda_time_us"] = r["cuda"]
        if train:
            inside = [n for n in bwd if n == name or _is_under(n, name)]
            row["backward_cpu_time_us"] = sum(bwd[n]["cpu"] for n in inside)
            if on_cuda:
                row["backward_cuda_time_us"] = sum(bwd[n]["cuda"] for n in inside)
        if memory:
            row["cpu_memory_bytes"] = int(r["mem"])
        row["depth"] = name.count(".") + 1 if name else 0
        if r.get("container"):
            row["_style"] = "dim"
        rows.append(row)
    rank = {name: i for i, name in enumerate(types)}
    rows.sort(key=lambda r: rank.get(r["name"], len(rank)))
    return rows


def _is_backward_side(evt) -> bool:
    fwd_thread = getattr(evt, "fwd_thread", None)
    if fwd_thread not in (0, None) and fwd_thread != evt.thread:
        return True
    p = evt
    while p is not None:  # CPU backward runs on the calling thread: look for the engine's range
        if p.name.startswith("autograd::engine::evaluate_function:"):
            return True
        p = p.cpu_parent
    return False


def _innermost_module(evt) -> str | None:
    p = evt.cpu_parent
    while p is not None:
        name = module_label(p.name)
        if name is not None:
            return name
        p = p.cpu_parent
    return None


def _is_under(name: str, parent: str) -> bool:
    return parent == "" and name != "" or name.startswith(parent + ".")


def _is_child(name: str, parent: str) -> bool:
    if not _is_under(name, parent):
        return False
    rest = name if parent == "" else name[len(parent) + 1:]
    return "." not in rest


def phase_rows(events) -> list[dict]:
    acc: dict[str, dict] = {}
    for e in events:
        if e.name.startswith(PHASE_PREFIX):
            r = acc.setdefault(e.name[len(PHASE_PREFIX):], {"cpu_time_us": 0.0, "cuda_time_us": 0.0})
            r["cpu_time_us"] += e.cpu_time_total
            r["cuda_time_us"] += e.device_time_total
    return [{"phase": k, **v} for k, v in acc.items()]


def _module_table(rows, opts: Options, on_cuda: bool) -> Table:
    for r in rows:
        d = r["depth"]
        r["_label"] = ROOT_LABEL if d == 0 else ("  " * (d - 1) + r["name"].rsplit(".", 1)[-1] if d > 1 else r["name"])
    shown = [r for r in rows if r["depth"] <= opts.depth]
    cols = [Column("_label", "module"), Column("type", "type"), Column("calls", "calls", "count"),
            Column("cpu_time_us", "fwd CPU", "float", "µs"), Column("share", "%", "pct"),
            Column("self_cpu_time_us", "self", "float", "µs")]
    if on_cuda:
        cols.append(Column("cuda_time_us", "fwd CUDA", "float", "µs"))
    if opts.mode == "train":
        cols.append(Column("backward_cpu_time_us", "bwd CPU", "float", "µs"))
        if on_cuda:
            cols.append(Column("backward_cuda_time_us", "bwd CUDA", "float", "µs"))
    if opts.memory:
        cols.append(Column("cpu_memory_bytes", "net CPU alloc", "bytes"))
    return Table("modules", "Time per module", cols, shown,
                 note=f"depth ≤ {opts.depth}; fwd includes submodules, self excludes them; % = fwd / summed step time"
                      + ("; dim rows: containers never called themselves (sum of their submodules)"
                         if any(r.get("_style") for r in shown) else "")
                      + ("; bwd = backward nodes created in the module's forward" if opts.mode == "train" else ""))
