"""memory: where the memory of a training step (or an inference forward) goes.

One engine, two ways to run it (torchdiag/core/memtrack.py): a TorchDispatchMode that keeps the
books of every live tensor storage by category.
- measured: on the real device, on a deep copy of the model (real tensors: the bytes tensors
  hold; on CUDA the caching allocator's own peak allocated/reserved are read as well);
- estimated: on fake tensors (torch's FakeTensorMode, fake CPU tensors): the same step runs,
  shapes and dtypes propagate, nothing is allocated. Used for --device meta (a 7B model in
  seconds), for every --batch-sizes entry and for the --budget search.

The step is a steady-state training step: optimizer state already exists (created by one
zero-gradient step before tracking), gradients start as None (zero_grad(set_to_none=True)),
then forward + loss, backward, optimizer.step()."""
from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.guard import leave_no_trace
from ..errors import ModelError, UsageError, one_line
from ..results import Column, Result, Table

OPTIMIZERS = ("adam", "adamw", "sgd")
DTYPES = ("float32", "bfloat16", "float16")
MAX_BATCH = 1 << 20                 # --batch-sizes and the --budget search stop here
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass
class Options:
    mode: str = "train"                 # train | inference
    optimizer: str = "adam"
    dtype: str | None = None            # cast parameters and float inputs
    amp: bool = False                   # autocast (bfloat16 on CPU, float16 on CUDA)
    batch_sizes: list[int] = field(default_factory=list)
    budget: int | None = None           # bytes
    top: int = 10
    depth: int = 3
    shard: int = 1
    snapshot: str | None = None         # CUDA allocation history pickle
    loss: Callable | None = None        # () -> Loss (a fresh loss rule per run)


# ---------------------------------------------------------------- parsing helpers (CLI uses them)
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
    try:
        sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"bad --batch-sizes '{text}'", hint="comma-separated positive integers, e.g. 1,8,32") from None
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"bad --batch-sizes '{text}'", hint="comma-separated positive integers, e.g. 1,8,32")
    if max(sizes) > MAX_BATCH:
        raise UsageError(f"--batch-sizes {max(sizes)} is too large: batch sizes up to {MAX_BATCH:,} are estimated",
                         hint=f"give sizes from 1 to {MAX_BATCH}")
    return sorted(set(sizes))


def check_options(opts: Options) -> None:
    if opts.mode not in ("train", "inference"):
        raise UsageError(f"unknown mode '{opts.mode}'", hint="choose train or inference")
    if opts.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer '{opts.optimizer}'", hint="choose " + "|".join(OPTIMIZERS))
    if opts.dtype is not None and opts.dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{opts.dtype}'", hint="choose " + "|".join(DTYPES))
    if opts.amp and opts.dtype not in (None, "float32"):
        raise UsageError("--amp keeps float32 weights and autocasts ops; it cannot be combined with --dtype " + opts.dtype,
                         hint="use --amp alone (mixed precision) or --dtype alone (everything in that dtype)")
    if opts.shard < 1:
        raise UsageError("--shard must be ≥ 1")
    if opts.top < 0:
        raise UsageError("--top must be ≥ 0")


# ---------------------------------------------------------------- the step
@dataclass
class StepReport:
    method: str
    peak: int
    peak_phase: str
    peak_modules: tuple
    at_peak: dict[str, int]
    phase_peaks: dict[str, int]
    phase_at_peak: dict[str, dict[str, int]]
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    modules: list
    cuda: dict[str, Any] | None = None


def _unique(ts):
    return list({id(t): t for t in ts}.values())


def _make_optimizer(name: str, params, device_type: str):
    import torch

    foreach = device_type in ("cuda", "meta")  # torch's default on CUDA; single-tensor on CPU
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=foreach)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)


def _state_tensors(opt):
    import torch

    out = []
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def _nbytes(tensors) -> int:
    from ..core.memtrack import storages

    seen = {}
    for t in tensors:
        for st in storages(t):
            seen[st._cdata] = int(st.nbytes())
    return sum(seen.values())


def run_step(model, inputs, opts: Options, *, emulate: str, round_to: int = 1, method: str = "") -> StepReport:
    """One tracked step on `model` (a copy we own, on its final device/dtype) with `inputs`."""
    import torch

    from ..core.memtrack import make_tracker
    from ..core.tracking import ModuleTracker, forward_error

    train = opts.mode == "train"
    params = _unique(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    buffers = _unique(model.buffers())
    opt = None
    model.train(train)
    if train:
        if not trainable:
            raise UsageError("the model has no trainable parameters: nothing to train",
                             hint="use --mode inference")
        opt = _make_optimizer(opts.optimizer, trainable, emulate)
        # Steady state: optimizer state exists before the step (as from step 2 on).
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)

    tracker = make_tracker(round_to)
    for p in params:
        tracker.register(p, "parameters")
    for b in buffers:
        tracker.register(b, "buffers")
    for _, t in inputs.tensors():
        tracker.register(t, "inputs")
    if opt is not None:
        for t in _state_tensors(opt):
            tracker.register(t, "optimizer_state")
    param_bytes, buffer_bytes = _nbytes(params), _nbytes(buffers)
    input_bytes = _nbytes([t for _, t in inputs.tensors()])
    optimizer_bytes = _nbytes(_state_tensors(opt)) if opt is not None else 0

    names = ModuleTracker(model)
    tracker.watch_modules(model)
    if train:
        tracker.watch_grads(trainable)
    amp_ctx = contextlib.nullcontext()
    if opts.amp:
        dev = "cuda" if emulate == "cuda" and next(iter(params), torch.empty(0)).is_cuda else "cpu"
        amp_ctx = torch.autocast(device_type=dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16)
    loss_rule = opts.loss() if (train and opts.loss) else None
    if train and loss_rule is not None and loss_rule.target is not None:
        loss_rule.target = _resize_like(loss_rule.target, inputs)
    activation_bytes = grad_bytes = 0
    try:
        with tracker, names, torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
            with contextlib.ExitStack() as stack:
                if not train:
                    stack.enter_context(torch.no_grad())
                tracker.set_phase("forward")
                try:
                    with amp_ctx:
                        out = inputs.call(model)
                except (UsageError, ModelError):
                    raise
                except Exception as exc:
                    raise forward_error(exc, names) from exc
                if train:
                    with amp_ctx:
                        loss = loss_rule(out) if loss_rule is not None else _default_loss(out)
                tracker.attribute_activations()
                activation_bytes = int(tracker.by_cat.get("activations", 0))
                if train:
                    tracker.set_phase("backward")
                    try:
                        loss.backward()
                    except Exception as exc:
                        raise ModelError(f"backward failed: {one_line(exc)}",
                                         hint="the model's backward raised; check custom autograd functions") from exc
                    tracker.end_backward()
                    grad_bytes = _nbytes([p.grad for p in trainable if p.grad is not None])
                    tracker.set_phase("optimizer")
                    try:
                        opt.step()
                    except Exception as exc:
                        raise ModelError(f"optimizer step failed: {one_line(exc)}") from exc
                    optimizer_bytes = _nbytes(_state_tensors(opt))
                del out
                if train:
                    del loss
    finally:
        tracker.remove_hooks()
    modules = [m for m in tracker.modules.values() if m.calls]
    return StepReport(
        method=method, peak=int(tracker.peak), peak_phase=tracker.peak_phase,
        peak_modules=tracker.peak_modules, at_peak={k: int(v) for k, v in tracker.peak_by_cat.items() if v},
        phase_peaks=dict(tracker.phase_peak), phase_at_peak={k: dict(v) for k, v in tracker.phase_peak_by_cat.items()},
        param_bytes=param_bytes, buffer_bytes=buffer_bytes, input_bytes=input_bytes, grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes, activation_bytes=activation_bytes, modules=modules)


def _default_loss(out):
    from ..core.loss import Loss

    return Loss("auto")(out)


def _resize_like(target, inputs):
    """A --batch target resized along dim 0 to the inputs' batch size (estimates at other sizes)."""
    import torch

    bs = inputs.batch_size
    if not isinstance(target, torch.Tensor) or bs is None or target.dim() == 0 or target.shape[0] == bs:
        return target
    return torch.zeros((bs,) + tuple(target.shape[1:]), dtype=target.dtype, device=target.device)


# ---------------------------------------------------------------- measured (real tensors)
def measure(model, inputs, opts: Options, device) -> StepReport:
    import torch

    dtype = getattr(torch, opts.dtype) if opts.dtype else None
    cuda = device.type == "cuda"
    snap = None
    if cuda:
        with torch.cuda.device(device):
            # the cuBLAS handle and its workspace (allocator memory, kept for the process) exist
            # before `base`, so a first matmul in the step does not count them as step memory
            torch.cuda.current_blas_handle()
        torch.cuda.synchronize(device)
        if opts.snapshot:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
            snap = opts.snapshot
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        work = copy.deepcopy(model)
        if dtype is not None:
            work = work.to(dtype)
        ins = _cast_inputs(inputs.clone(), dtype)
        report = run_step(work, ins, opts, emulate=device.type, round_to=512 if cuda else 1,
                          method=f"measured on {device} (tensor-level{', CUDA allocator' if cuda else ''})")
        if cuda:
            torch.cuda.synchronize(device)
            report.cuda = {
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
                "step_peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device) - base),
                "total_bytes": int(torch.cuda.get_device_properties(device).total_memory),
                "memory_summary": torch.cuda.memory_summary(device, abbreviated=True),
            }
            if snap:
                try:
                    torch.cuda.memory._dump_snapshot(snap)
                except OSError as exc:
                    raise UsageError(f"--snapshot {snap}: cannot write it: {one_line(exc)}",
                                     hint="give a file in a writable folder, e.g. --snapshot mem.pickle") from exc
                report.cuda["snapshot"] = snap
        del work, ins
        return report
    finally:
        if snap:
            torch.cuda.memory._record_memory_history(enabled=None)


def _cast_inputs(inputs, dtype):
    if dtype is None:
        return inputs
    return inputs.map(lambda t: t.to(dtype) if t.is_floating_point() else t)


# ---------------------------------------------------------------- estimated (fake tensors)
def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def _fake_copy(model, dtype):
    """A copy of `model` whose parameters and buffers are fake CPU tensors (call inside the fake
    mode). Nothing is copied from the original: ties between parameters are kept."""
    import torch
    from torch import nn

    memo: dict[int, Any] = {}
    for p in _unique(model.parameters()):
        dt = dtype if (dtype is not None and p.is_floating_point()) else p.dtype
        memo[id(p)] = nn.Parameter(torch.empty(tuple(p.shape), dtype=dt, device="cpu"), requires_grad=p.requires_grad)
    others = list(model.buffers())
    for mod in model.modules():  # plain tensor attributes (masks, example_input_array …)
        others += [v for v in vars(mod).values() if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter)]
    for b in _unique(others):
        if id(b) in memo:
            continue
        dt = dtype if (dtype is not None and b.is_floating_point()) else b.dtype
        memo[id(b)] = torch.empty(tuple(b.shape), dtype=dt, device="cpu")
    return copy.deepcopy(model, memo)


def _fake_inputs(inputs, batch_size, dtype):
    import torch

    old = inputs.batch_size

    def make(t):
        shape = tuple(t.shape)
        if batch_size is not None and old is not None and shape and shape[0] == old:
            shape = (batch_size,) + shape[1:]
        dt = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        return torch.zeros(shape, dtype=dt, device="cpu")

    return inputs.map(make)


def estimate(model, inputs, opts: Options, batch_size: int | None = None, emulate: str = "cpu") -> StepReport:
    import torch

    dtype = getattr(torch, opts.dtype) if opts.dtype else None
    with _fake_mode():
        work = _fake_copy(model, dtype)
        ins = _fake_inputs(inputs, batch_size, dtype)
        try:
            return run_step(work, ins, opts, emulate=emulate, method="estimated on fake tensors (nothing allocated)")
        except ModelError as exc:
            if _data_dependent(exc):
                raise UsageError("cannot estimate without allocating: the model's code reads tensor values "
                                 f"({exc.message})", hint="measure it on a real device instead (--device cpu or cuda, "
                                 "without --batch-sizes/--budget)") from exc
            raise


def _data_dependent(exc) -> bool:
    text = str(getattr(exc, "message", exc))
    return any(k in text for k in ("DataDependent", "data-dependent", "Cannot copy out of meta", "item()",
                                   "DynamicOutputShape", "UnsupportedOperator"))


# ---------------------------------------------------------------- batch sizes and budget
def sweep(model, inputs, opts: Options, sizes, emulate, cache):
    rows = []
    for bs in sizes:
        peak = _peak_at(model, inputs, opts, bs, emulate, cache)
        rows.append({"batch_size": bs, "peak_bytes": peak,
                     "fits": None if opts.budget is None else peak <= opts.budget})
    return rows


def _peak_at(model, inputs, opts, bs, emulate, cache) -> int:
    if bs not in cache:
        cache[bs] = estimate(model, inputs, opts, bs, emulate).peak
    return cache[bs]


def largest_fitting(model, inputs, opts: Options, emulate, cache, limit: int = MAX_BATCH) -> int:
    """Largest batch size whose estimated peak ≤ budget (0 if even 1 does not fit). Peak memory
    is close to affine in the batch size, so a line through sizes 1 and 2 proposes a size and
    estimates at and around it confirm it; a bisection over estimates settles anything else."""
    budget = opts.budget
    p1 = _peak_at(model, inputs, opts, 1, emulate, cache)
    if p1 > budget:
        return 0
    p2 = _peak_at(model, inputs, opts, 2, emulate, cache)
    if p2 > budget:
        return 1
    slope = max(p2 - p1, 1)
    guess = max(2, min(limit, 1 + (budget - p1) // slope))
    lo, hi = 2, None  # lo fits; hi does not
    if _peak_at(model, inputs, opts, guess, emulate, cache) <= budget:
        lo = guess
        if guess >= limit:
            return limit
        if _peak_at(model, inputs, opts, guess + 1, emulate, cache) > budget:
            return guess
        step = max(1, guess // 16)
        while hi is None:
            nxt = min(limit, lo + step)
            if _peak_at(model, inputs, opts, nxt, emulate, cache) <= budget:
                lo = nxt
                if nxt >= limit:
                    return limit
                step *= 2
            else:
                hi = nxt
    else:
        hi = guess
        if _peak_at(model, inputs, opts, guess - 1, emulate, cache) <= budget:
            return guess - 1
        hi = guess - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _peak_at(model, inputs, opts, mid, emulate, cache) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------- sharding (ZeRO / FSDP)
def shard_rows(report: StepReport, n: int, unit_bytes: int, train: bool) -> list[dict]:
    """Per-device peak when parameters / gradients / optimizer state are split over n devices.

    Per phase, from the category bytes at that phase's peak: ZeRO-1 divides optimizer state,
    ZeRO-2 also gradients, ZeRO-3/FSDP also parameters but gathers one wrapped unit at a time
    (plus the next one prefetched) and holds that unit's full gradient before reduce-scatter.
    The optimizer step runs on shards: with sharded state its temporaries are divided as well.
    Activations, inputs, buffers and temporaries stay per device (data parallel: each device runs
    the batch given). Communication buffers and allocator fragmentation are not counted."""
    stages = [("ddp (no sharding)", 1, 1, 1, 0), ("zero-1", 1, 1, n, 0), ("zero-2", 1, n, n, 0),
              ("zero-3 / fsdp", n, n, n, 1)]
    rows = []
    for name, dp, dg, do, gathered in stages:
        worst, worst_phase = 0, ""
        for phase, cats in report.phase_at_peak.items():
            p, g, o = cats.get("parameters", 0), cats.get("gradients", 0), cats.get("optimizer_state", 0)
            rest = sum(v for k, v in cats.items() if k not in ("parameters", "gradients", "optimizer_state"))
            if do > 1 and phase == "optimizer":  # the step's temporaries are per shard too
                t = cats.get("temporaries", 0)
                rest = rest - t + t // do
            extra = 0
            if gathered and phase != "optimizer":  # the step runs on shards; fwd/bwd gather units
                extra = min(2 * unit_bytes, p - p // dp)
                if train and phase == "backward":
                    extra += min(unit_bytes, g - g // dg)
            total = p // dp + g // dg + o // do + rest + extra
            if total > worst:
                worst, worst_phase = total, phase
        rows.append({"stage": name, "devices": n, "per_device_peak_bytes": int(worst), "phase": worst_phase})
    return rows


def fsdp_unit_bytes(model) -> tuple[int, str]:
    """The largest wrapping unit: elements of ModuleList/Sequential containers (transformer
    layers), else the root's children; its parameter bytes (in the step's dtype, fp32 otherwise)."""
    from torch import nn

    units = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)):
            units += [(f"{name}.{k}" if name else k, c) for k, c in mod.named_children()]
    if not units:
        units = list(model.named_children()) or [("(root)", model)]
    best = ("", 0)
    for name, mod in units:
        b = sum(p.numel() * p.element_size() for p in _unique(mod.parameters()))
        if b > best[1]:
            best = (name, b)
    return best[1], best[0]


# ---------------------------------------------------------------- run
def run(model, inputs, opts: Options | None = None, device=None) -> Result:
    import torch

    opts = opts or Options()
    check_options(opts)
    if device is None:
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    if opts.snapshot and device.type != "cuda":
        raise UsageError("--snapshot records the CUDA allocator's history; it needs --device cuda",
                         hint="without a GPU, use the tensor-level table (and --json) instead")
    if (opts.batch_sizes or opts.budget) and inputs.batch_size is None:
        raise UsageError("--batch-sizes/--budget need a tensor input with a batch dimension",
                         hint="give an input with -i, e.g. -i 8x3x32x32")
    emulate = "cuda" if device.type in ("cuda", "meta") else "cpu"
    dtype_name = opts.dtype or _param_dtype(model)
    result = Result("memory", header={
        "mode": "training step (forward, backward, optimizer step)" if opts.mode == "train" else "inference (forward, no grad)",
    })
    if opts.mode == "train":
        result.header["optimizer"] = opts.optimizer + (" (momentum 0.9)" if opts.optimizer == "sgd" else "")
    result.header["dtype"] = dtype_name + (" + autocast " + ("float16" if device.type == "cuda" else "bfloat16")
                                           if opts.amp else "")

    with leave_no_trace(model):
        if device.type == "meta":
            report = estimate(model, inputs, opts, None, emulate)
            est_peak = None
        else:
            report = measure(model, inputs, opts, device)
            try:  # the fake-tensor estimate of the same step, for comparison
                est_peak = estimate(model, inputs, opts, None, "cpu" if device.type == "cpu" else emulate).peak
            except UsageError as exc:
                if opts.batch_sizes or opts.budget:
                    raise
                est_peak = None
                result.notes.append(f"measured only: {exc.message}")
        cache: dict[int, int] = {}
        if inputs.batch_size is not None and device.type == "meta":
            cache[inputs.batch_size] = report.peak
        budget_for_fit = opts.budget
        if budget_for_fit is None and report.cuda:
            budget_for_fit = report.cuda["total_bytes"]
        sweep_opts = copy.copy(opts)
        sweep_opts.budget = budget_for_fit
        best = largest_fitting(model, inputs, sweep_opts, emulate, cache) if opts.budget else None
        wanted = set(opts.batch_sizes)
        if best is not None:  # the boundary the search found: the largest size that fits and the next one
            wanted |= {max(best, 1)} | ({best + 1} if best < MAX_BATCH else set())
        sizes = sweep(model, inputs, sweep_opts, sorted(wanted), emulate, cache) if wanted else []
        unit, unit_name = fsdp_unit_bytes(model) if opts.shard > 1 else (0, "")
        if unit and opts.dtype:
            unit = unit * getattr(torch, opts.dtype).itemsize // 4

    _fill(result, report, opts, device, est_peak, sizes, best, budget_for_fit, unit, unit_name, inputs)
    return result


def _param_dtype(model) -> str:
    for p in model.parameters():
        return str(p.dtype).replace("torch.", "")
    return "float32"


def _fill(result, r: StepReport, opts, device, est_peak, sizes, best, budget, unit, unit_name, inputs) -> None:
    from ..render.fmt import human_bytes

    train = opts.mode == "train"
    result.header["method"] = r.method
    temporaries_at_peak = r.at_peak.get("temporaries", 0)
    result.data.update({
        "peak_bytes": r.peak, "peak_phase": r.peak_phase,
        "peak_module": (r.peak_modules[-1] if r.peak_modules else None),
        "param_bytes": r.param_bytes, "buffer_bytes": r.buffer_bytes, "input_bytes": r.input_bytes,
        "grad_bytes": r.grad_bytes, "optimizer_bytes": r.optimizer_bytes, "activation_bytes": r.activation_bytes,
        "temporary_bytes_at_peak": temporaries_at_peak,
        "at_peak": {k: r.at_peak.get(k, 0) for k in ("parameters", "buffers", "inputs", "gradients",
                                                     "optimizer_state", "activations", "temporaries", "other")},
        "phase_peaks": r.phase_peaks, "batch_size": inputs.batch_size,
    })
    if est_peak is not None:
        result.data["estimate_peak_bytes"] = est_peak
        result.data["estimate_error"] = (est_peak - r.peak) / r.peak if r.peak else 0.0
    if r.cuda:
        summary = r.cuda.pop("memory_summary")
        result.data["cuda"] = r.cuda
        result.text["memory/cuda_memory_summary"] = "```\n" + summary + "\n```"
    cats = [("parameters", r.param_bytes, r.at_peak.get("parameters", 0)),
            ("buffers", r.buffer_bytes, r.at_peak.get("buffers", 0)),
            ("inputs", r.input_bytes, r.at_peak.get("inputs", 0))]
    if train:
        cats += [("gradients", r.grad_bytes, r.at_peak.get("gradients", 0)),
                 ("optimizer state", r.optimizer_bytes, r.at_peak.get("optimizer_state", 0)),
                 ("activations (saved for backward)", r.activation_bytes, r.at_peak.get("activations", 0))]
    cats += [("temporaries", None, temporaries_at_peak)]
    if r.at_peak.get("other"):
        cats.append(("other (pre-existing tensors)", None, r.at_peak["other"]))
    rows = [{"category": c, "total_bytes": t, "at_peak_bytes": a, "share_of_peak": (a / r.peak if r.peak else 0.0)}
            for c, t, a in cats]
    result.tables.append(Table("categories", "Where the memory goes", [
        Column("category", "category"), Column("total_bytes", "size", "bytes"),
        Column("at_peak_bytes", "alive at peak", "bytes"), Column("share_of_peak", "of peak", "pct")], rows,
        note="size: parameters/buffers/inputs as held; gradients after backward; optimizer state after the step; "
             "activations alive at the end of forward + loss"))
    phase_rows = [{"phase": ph, "peak_bytes": r.phase_peaks[ph],
                   "at_peak": {k: int(v) for k, v in r.phase_at_peak.get(ph, {}).items() if v}}
                  for ph in ("forward", "backward", "optimizer") if ph in r.phase_peaks]
    result.tables.append(Table("phases", "Peak per phase", [Column("phase", "phase"),
                                                              Column("peak_bytes", "peak live", "bytes")], phase_rows))
    mods = [m for m in r.modules if m.name != "(root)" and m.name.count(".") + 1 <= opts.depth]
    if train:
        mods.sort(key=lambda m: (-m.activation_bytes, -m.fw_peak, m.name))
    else:  # nothing is saved for backward: rank by what the forward needs
        mods.sort(key=lambda m: (-m.fw_peak, -m.fw_delta, m.name))
    top = mods if opts.top == 0 else mods[: opts.top]
    mod_rows = [{"name": m.name, "type": m.type, "calls": m.calls, "activation_bytes": m.activation_bytes,
                 "fw_delta_bytes": m.fw_delta, "fw_peak_bytes": m.fw_peak,
                 "bw_peak_bytes": (m.bw_peak if m.ran_backward else None)} for m in top]
    cols = [Column("name", "module"), Column("type", "type"), Column("activation_bytes", "saved", "bytes"),
            Column("fw_delta_bytes", "fwd leaves", "bytes"), Column("fw_peak_bytes", "peak in fwd", "bytes"),
            Column("bw_peak_bytes", "peak in bwd", "bytes")]
    if not train:
        cols = [c for c in cols if c.key not in ("activation_bytes", "bw_peak_bytes")]
    by = "activation memory" if train else "peak during forward"
    result.tables.append(Table("modules", f"Modules by {by} (top {len(top)} of {len(mods)}, depth ≤ {opts.depth})", cols, mod_rows,
        note="saved: saved-for-backward bytes the module's forward (submodules included) allocated, alive at the "
             "end of forward; fwd leaves: live bytes after its forward minus before (output included); peaks are "
             "whole-step live totals while the module runs",
        tb_scalars=tuple(c.key for c in cols if c.kind == "bytes")))
    if sizes:
        result.tables.append(Table("batch_sizes", "Estimated peak per batch size", [
            Column("batch_size", "batch size", "int"), Column("peak_bytes", "peak", "bytes"), Column("fits", "fits")], sizes,
            note=None if budget is None else f"fits: peak ≤ {human_bytes(budget)}"))
    if opts.shard > 1:
        srows = shard_rows(r, opts.shard, unit, train)
        result.tables.append(Table("shard", f"Per-device peak sharded over {opts.shard} devices", [
            Column("stage", "stage"), Column("per_device_peak_bytes", "per-device peak", "bytes"),
            Column("phase", "at")], srows,
            note=f"ZeRO-1: optimizer state /N; ZeRO-2: + gradients /N; ZeRO-3/FSDP: + parameters /N, one unit "
                 f"({unit_name or '—'}, {human_bytes(unit)}) gathered plus one prefetched, and its full gradient in "
                 f"backward; each device runs the batch given; communication buffers not counted"))
    if opts.budget is not None:
        result.data["budget_bytes"] = opts.budget
        result.data["max_batch_size"] = best
        result.data["max_batch_size_capped"] = best >= MAX_BATCH  # the search stopped: larger sizes may fit too
        if best == 0:
            result.add("no-batch-fits", "error", "", f"even batch size 1 does not fit in {human_bytes(opts.budget)}: "
                       f"estimated peak {human_bytes(sizes[0]['peak_bytes'])}",
                       hint="try --dtype bfloat16, --amp, --optimizer sgd, or --shard N")
        elif r.peak > opts.budget:
            result.add("over-budget", "warning", "", f"batch size {inputs.batch_size} peaks at {human_bytes(r.peak)}, "
                       f"above the budget of {human_bytes(opts.budget)}; the largest batch size that fits is {best}")
    result.summary += [("Peak", f"{human_bytes(r.peak)} ({r.peak:,} bytes) during {r.peak_phase}"
                        + (f", in {r.peak_modules[-1]}" if r.peak_modules else ""))]
    if est_peak is not None:
        result.summary.append(("Estimate (fake tensors)", f"{human_bytes(est_peak)} "
                               f"({100 * result.data['estimate_error']:+.1f}% vs measured)"))
    if r.cuda:
        result.summary.append(("CUDA allocator", f"peak allocated {human_bytes(r.cuda['peak_allocated_bytes'])}, "
                               f"reserved {human_bytes(r.cuda['peak_reserved_bytes'])} (whole process)"))
        if r.cuda.get("snapshot"):
            result.summary.append(("Snapshot", f"{r.cuda['snapshot']} (open at https://pytorch.org/memory_viz)"))
    if opts.budget is not None:
        if best >= MAX_BATCH:
            result.summary.append(("Budget", f"{human_bytes(opts.budget)}: batch size {best} (where the search stops) "
                                   f"fits; larger ones may too (estimated)"))
        else:
            result.summary.append(("Budget", f"{human_bytes(opts.budget)}: largest batch size that fits ≈ {best} (estimated)"))
    if device.type == "meta":
        result.notes.append("estimated on fake tensors: the step ran with shapes only, nothing was allocated; "
                            "optimizer uses torch's CUDA default (foreach), so its temporaries are counted as on a GPU")
    result.notes.append("tensor-level bytes (what tensors hold); a CUDA caching allocator reserves more "
                        "(block rounding, fragmentation), and the CUDA context itself takes several hundred MiB")
