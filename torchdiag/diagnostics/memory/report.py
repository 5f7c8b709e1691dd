"""memory's run: the step measured (or, on meta, estimated), the batch-size sweep and budget search,
sharding; then the Result (data rows, and the sentences people read, built here and only here)."""
from __future__ import annotations

from ...core.guard import leave_no_trace
from ...errors import OptionError, UsageError
from ...results import Column, Result, Table
from .batch import Peaks, largest_fitting, sweep
from .estimated import estimate
from .measured import measure
from .options import MAX_BATCH, Options
from .ranks import fsdp_check
from .shard import Units, fsdp_units, shard_rows
from .step import StepReport

CATEGORIES = ("parameters", "buffers", "inputs", "gradients", "optimizer_state", "activations", "temporaries", "other")


def run(model, inputs, opts: Options | None, ctx) -> Result:
    opts = opts or Options()
    if opts.mode == "inference":
        inputs = ctx.inference_inputs(model, inputs)
    if opts.snapshot and not ctx.on_cuda:
        raise OptionError("snapshot", "records the CUDA allocator's history; it needs a CUDA device",
                          hint="without a GPU, use the tensor-level table (and the JSON document) instead")
    if (opts.batch_sizes or opts.budget) and inputs.batch_size is None:
        raise UsageError(f"{ctx.option('batch_sizes')}/{ctx.option('budget')} need a tensor input with a batch "
                         "dimension", hint="give an input with -i, e.g. -i 8x3x32x32")
    emulate = "cuda" if ctx.device.type in ("cuda", "meta") else "cpu"
    result = _header(model, opts, ctx)
    with leave_no_trace(model):
        report, est_peak = _step(result, model, inputs, opts, ctx, emulate)
        peaks = Peaks(model, inputs, opts, ctx, emulate,
                      {inputs.batch_size: report.peak} if ctx.on_meta and inputs.batch_size is not None else None)
        budget = opts.budget if opts.budget is not None else (report.cuda or {}).get("total_bytes")
        best = largest_fitting(peaks, opts.budget) if opts.budget else None
        wanted = set(opts.batch_sizes)
        if best is not None:  # the boundary the search found: the largest size that fits and the next one
            wanted |= {max(best, 1)} | ({best + 1} if best < MAX_BATCH else set())
        sizes = sweep(peaks, sorted(wanted), budget) if wanted else []
        units = _unit(model, opts, ctx)
    if report.snapshot is not None:
        result.artefacts["snapshot"] = report.snapshot    # written by render/memory.py
    _fill(result, report, opts, ctx, est_peak, inputs)
    if report.op_dtypes is not None:
        from ...core import op_dtypes

        op_dtypes.report(result, report.op_dtypes, ctx, "the measured step")
    _batch_tables(result, report, opts, ctx, sizes, best, budget, units, inputs)
    _estimate_off(result, sizes)
    _summary(result, report, opts, ctx, est_peak, best)
    fsdp_check(result, model, inputs, opts, ctx)   # under torchrun --wrap fsdp only (memory/ranks.py)
    return result


def _header(model, opts: Options, ctx) -> Result:
    train = opts.mode == "train"
    result = Result("memory", header={
        "mode": "training step (forward, backward, optimizer step)" if train else "inference (forward, no grad)",
    })
    optimizer = ctx.spec.optimizer
    if train:
        result.header["optimizer"] = optimizer.name + (f" (momentum {optimizer.momentum:g})"
                                                       if optimizer.name == "sgd" else "")
    amp = ctx.autocast_dtype
    result.header["dtype"] = (ctx.spec.dtype or _param_dtype(model)) + (f" + autocast {amp}" if amp else "")
    return result


def _param_dtype(model) -> str:
    for p in model.parameters():
        return str(p.dtype).replace("torch.", "")
    return "float32"


def _step(result, model, inputs, opts: Options, ctx, emulate: str) -> tuple[StepReport, int | None]:
    """The step (estimated on meta, measured elsewhere) and, when measured, the estimate of the same
    step for comparison (None when it cannot be estimated: a note says so)."""
    if ctx.on_meta:
        return estimate(model, inputs, opts, ctx, None, emulate), None
    report = measure(model, inputs, opts, ctx)
    try:
        est = estimate(model, inputs, opts, ctx, None, "cpu" if ctx.device.type == "cpu" else emulate,
                       ran_for_real=True)
    except UsageError as exc:   # ran_for_real: a failure on fake tensors is a UsageError
        if opts.batch_sizes or opts.budget:
            raise
        result.notes.append(f"measured only: {exc.message}")
        return report, None
    return report, est.peak


def _unit(model, opts: Options, ctx) -> Units:
    """FSDP units as fully_shard per layer makes them (the largest one, the root's own parameters), in
    bytes of the step's dtype."""
    if opts.shard <= 1:
        return Units(0, 0)
    units = fsdp_units(model)
    if ctx.spec.dtype:
        import torch

        size = getattr(torch, ctx.spec.dtype).itemsize
        units = Units(units.largest * size // 4, units.root * size // 4, units.name, units.second * size // 4)
    return units


def _fill(result: Result, r: StepReport, opts: Options, ctx, est_peak, inputs) -> None:
    """The step's data and its tables: categories, phases, modules."""
    result.header["method"] = r.method
    if r.loss:
        result.header["loss"] = r.loss
    result.data.update({
        "peak_bytes": r.peak, "peak_phase": r.peak_phase,
        "peak_module": innermost(r.peak_modules, r.peak_phase),
        "param_bytes": r.param_bytes, "buffer_bytes": r.buffer_bytes, "input_bytes": r.input_bytes,
        "grad_bytes": r.grad_bytes, "optimizer_bytes": r.optimizer_bytes, "activation_bytes": r.activation_bytes,
        "temporary_bytes_at_peak": r.at_peak.get("temporaries", 0),
        "at_peak": {k: r.at_peak.get(k, 0) for k in CATEGORIES},
        "phase_peaks": r.phase_peaks, "batch_size": inputs.batch_size,
    })
    if est_peak is not None:
        result.data["estimate_peak_bytes"] = est_peak
        result.data["estimate_error"] = (est_peak - r.peak) / r.peak if r.peak else 0.0
    if r.cuda:
        cuda = dict(r.cuda)
        summary = cuda.pop("memory_summary")
        result.data["cuda"] = cuda
        result.text["memory/cuda_memory_summary"] = "```\n" + summary + "\n```"
    result.tables.append(_category_table(r, opts.mode == "train"))
    phase_rows = [{"phase": ph, "peak_bytes": r.phase_peaks[ph],
                   "at_peak": {k: int(v) for k, v in r.phase_at_peak.get(ph, {}).items() if v}}
                  for ph in ("forward", "backward", "optimizer") if ph in r.phase_peaks]
    result.tables.append(Table("phases", "Peak per phase", [Column("phase", "phase"),
                                                              Column("peak_bytes", "peak live", "bytes")], phase_rows))
    result.tables.append(_module_table(r, opts))


def _category_table(r: StepReport, train: bool) -> Table:
    cats = [("parameters", r.param_bytes, r.at_peak.get("parameters", 0)),
            ("buffers", r.buffer_bytes, r.at_peak.get("buffers", 0)),
            ("inputs", r.input_bytes, r.at_peak.get("inputs", 0))]
    if train:
        cats += [("gradients", r.grad_bytes, r.at_peak.get("gradients", 0)),
                 ("optimizer state", r.optimizer_bytes, r.at_peak.get("optimizer_state", 0)),
                 ("activations (saved for backward)", r.activation_bytes, r.at_peak.get("activations", 0))]
    cats += [("temporaries", None, r.at_peak.get("temporaries", 0))]
    if r.at_peak.get("other"):
        cats.append(("other (pre-existing tensors)", None, r.at_peak["other"]))
    rows = [{"category": c, "total_bytes": t, "at_peak_bytes": a, "share_of_peak": (a / r.peak if r.peak else 0.0)}
            for c, t, a in cats]
    return Table("categories", "Where the memory goes", [
        Column("category", "category"), Column("total_bytes", "size", "bytes"),
        Column("at_peak_bytes", "alive at peak", "bytes"), Column("share_of_peak", "of peak", "pct")], rows,
        note="size: parameters/buffers/inputs as held; gradients after backward; optimizer state after the step; "
             "activations alive at the end of forward + loss")


def _module_table(r: StepReport, opts: Options) -> Table:
    train = opts.mode == "train"
    mods = [m for m in r.modules if m.name != "(root)" and m.name.count(".") + 1 <= opts.depth]
    if train:
        mods.sort(key=lambda m: (-m.activation_bytes, -m.fw_peak, m.name))
    else:  # nothing is saved for backward: rank by what the forward needs
        mods.sort(key=lambda m: (-m.fw_peak, -m.fw_delta, m.name))
    top = mods if opts.top == 0 else mods[: opts.top]
    rows = [{"name": m.name, "type": m.type, "calls": m.calls, "activation_bytes": m.activation_bytes,
             "fw_delta_bytes": m.fw_delta, "fw_peak_bytes": m.fw_peak,
             "bw_peak_bytes": (m.bw_peak if m.ran_backward else None)} for m in top]
    cols = [Column("name", "module"), Column("type", "type"), Column("activation_bytes", "saved", "bytes"),
            Column("fw_delta_bytes", "fwd leaves", "bytes"), Column("fw_peak_bytes", "peak in fwd", "bytes"),
            Column("bw_peak_bytes", "peak in bwd", "bytes")]
    if not train:
        cols = [c for c in cols if c.key not in ("activation_bytes", "bw_peak_bytes")]
    by = "activation memory" if train else "peak during forward"
    saved = ("saved: saved-for-backward bytes the module's forward (submodules included) allocated, alive at the end "
             "of forward; " if train else "")   # (a sweep: the inference table's note described columns it lacks)
    return Table("modules", f"Modules by {by} (top {len(top)} of {len(mods)}, depth ≤ {opts.depth})", cols, rows,
                 note=saved + "fwd leaves: live bytes after its forward minus before (output included); "
                      "peaks are whole-step live totals while the module runs",
                 tb_scalars=tuple(c.key for c in cols if c.kind == "bytes"))


def _batch_tables(result: Result, r: StepReport, opts: Options, ctx, sizes, best, budget, units, inputs) -> None:
    """Batch sizes, sharding, and the budget's data and findings."""
    from ...fmt import human_bytes

    if sizes:
        result.tables.append(Table("batch_sizes", "Estimated peak per batch size", [
            Column("batch_size", "batch size", "int"), Column("peak_bytes", "peak", "bytes"), Column("fits", "fits")],
            sizes, note=None if budget is None else f"fits: peak ≤ {human_bytes(budget)}"))
    sharded = shard_rows(r, opts.shard, units, opts.mode == "train") if opts.shard > 1 else []
    if opts.shard > 1:
        result.tables.append(Table("shard", f"Per-device peak sharded over {opts.shard} devices", [
            Column("stage", "stage"), Column("per_device_peak_bytes", "per-device peak", "bytes"),
            Column("phase", "at")], sharded,
            note=f"ZeRO-1: optimizer state /N; ZeRO-2: + gradients /N; ZeRO-3/FSDP (torch's fully_shard per layer): "
                 f"+ parameters /N; the root's own parameters ({human_bytes(units.root)}) gathered from forward to the end "
                 f"of backward, one unit ({units.name or '—'}, {human_bytes(units.largest)}) at a time gathered (all-gather "
                 f"buffer and copy) and one prefetched in backward, full gradients until each unit's reduce-scatter "
                 f"(its input buffer as large); each device runs the batch given"))
    if opts.budget is None:
        return
    result.data["budget_bytes"] = opts.budget
    result.data["max_batch_size"] = best
    result.data["max_batch_size_capped"] = best >= MAX_BATCH  # the search stopped: larger sizes may fit too
    if best == 0:
        fit = [row for row in sharded[1:] if row["per_device_peak_bytes"] <= opts.budget]
        # the batch sizes are one unsharded device's; the shard table says what sharding does at the batch run
        shard = (f"; sharded over {opts.shard} devices, batch {inputs.batch_size} peaks at "
                 f"{human_bytes(fit[0]['per_device_peak_bytes'])} per device under {fit[0]['stage']}, which fits"
                 if fit else "")
        result.add("no-batch-fits", "warning" if fit else "error", "", f"even batch size 1 does not fit in {human_bytes(opts.budget)} on one "
                   f"device: estimated peak {human_bytes(sizes[0]['peak_bytes'])}{shard}",
                   hint=_smaller(ctx, opts, r, sharded, units))
    elif r.peak > opts.budget:
        result.add("over-budget", "warning", "", f"batch size {inputs.batch_size} peaks at {human_bytes(r.peak)}, "
                   f"above the budget of {human_bytes(opts.budget)}; the largest batch size that fits is {best}")


def _smaller(ctx, opts: Options, r: StepReport, sharded=(), units=None) -> str:
    """What would lower the peak, of what the run does not do already (a sweep: `--amp` offered to a run under
    `--amp fp16`, `--optimizer sgd` to an inference one). `--amp` keeps float32 weights: `--dtype bfloat16` still
    halves them. A smaller input only where the model's own tensors leave room for one (a review: weights and
    gradients alone over the budget, batch 1 peaking as batch 4 does, and a smaller input was all it offered)."""
    from ...fmt import human_bytes

    o, p, train = ctx.option, ctx.precision, opts.mode == "train"
    ways = [] if p.reduced and not p.amp else [f"{o('dtype')} bfloat16"] + ([] if p.reduced else [o("amp")])
    if train:
        ways += [f"{o('optimizer')} sgd"] if ctx.spec.optimizer.name != "sgd" else []
        ways += [f"{o('shard')} N"] if opts.shard == 1 else []
    own = _own_bytes(r, opts, train, sharded, units)
    what = "parameters, buffers, gradients and optimizer state" if train else "parameters and buffers"
    what += f" (sharded over {opts.shard} devices)" if opts.shard > 1 else ""
    said = "" if own < (opts.budget or 0) else f"the model's own {what} take {human_bytes(own)}, over the budget at any input: "
    if said:   # autocast casts activations only: its weights, gradients and state stay float32
        ways = [w for w in ways if w != o("amp")]
    else:   # with what the input makes of the peak measured: the part a smaller one can shrink (a review: offered where
        # a 1×1 image's conv weights, their gradients and Adam's temporaries were all of it)
        made = r.at_peak.get("inputs", 0) + r.at_peak.get("activations", 0)
        if str(r.peak_phase).startswith("forward"):   # a forward's temporaries grow with the input too (a review: 33%
            made += r.at_peak.get("temporaries", 0)      # of an inference peak left out); a backward's are the weights'
            # gradients as well (a second: W @ W.T in backward counted)
        share = (f"; what grows with it (inputs, activations, temporaries) is {made / r.peak:.0%} of the peak "
                 "measured") if r.peak else ""
        ways.append(f"a smaller input (a shorter sequence, a smaller image{share})")
    ways.append("a device with more memory")
    return said + "try " + ", ".join(ways[:-1]) + " or " + ways[-1]


def _own_bytes(r: StepReport, opts: Options, train: bool, sharded=(), units=None) -> int:
    """What the model's own tensors take on a device whatever the input: parameters, buffers and, in train mode,
    gradients and optimizer state. Under --shard N the least of the stages, each the larger of two lower bounds: what
    it keeps by construction (ZeRO-1/2 the weights whole, ZeRO-3 the root's own and one unit gathered) and the shard
    table's per-device peak less what the input makes at that phase (inputs, activations, a forward's or backward's
    temporaries). A review: "over the budget at any input" beside a stage that fit at 1/8; a second: counted as 1/N of
    all, then with only the root and a unit gathered, a smaller input was offered where FSDP's unit gradients and
    prefetched neighbour put every stage over the budget at any input."""
    p, b = r.param_bytes, r.buffer_bytes
    g, o = (r.grad_bytes, r.optimizer_bytes) if train else (0, 0)
    n = opts.shard
    if n <= 1:
        return p + b + g + o
    gathered = (units.root + units.largest) if units is not None else p
    kept = [p + b + g + o, p + b + g + o // n, p + b + (g + o) // n, b + (p + g + o) // n + gathered]

    def static(row) -> int:
        cats = r.phase_at_peak.get(row.get("phase", ""), {})
        made = cats.get("inputs", 0) + cats.get("activations", 0)
        if not str(row.get("phase", "")).startswith("optimizer"):   # the step's temporaries are the weights' size
            made += cats.get("temporaries", 0)
        return row["per_device_peak_bytes"] - made
    rows = list(sharded)   # ddp, zero-1, zero-2, zero-3 / fsdp: the order of `kept`
    if len(rows) != len(kept):
        return min(kept)
    return min(max(k, static(row)) for k, row in zip(kept, rows))


ESTIMATE_OFF = 0.10   # the fake-tensor estimate of the measured step further than this from the measurement


def _estimate_off(result: Result, sizes) -> None:
    """The batch-size and budget rows are fake-tensor estimates; where the estimate of the step measured here is
    more than ESTIMATE_OFF from its measurement, they are said to be in doubt (a sweep: an LSTM's estimate 23% under
    at batch 4, and 6x under at the batch the budget picked: its fused kernel runs another way on fake tensors)."""
    err = result.data.get("estimate_error")
    if not sizes or err is None or abs(err) <= ESTIMATE_OFF:
        return
    result.add("estimate-off", "warning", "", f"the fake-tensor estimate of the step measured here is "
               f"{100 * err:+.1f}% off its measurement: the estimated batch sizes and budget above may be off by as "
               "much or more (an op that runs another way on fake tensors, such as a fused LSTM kernel)",
               hint="measure the batch size you plan to use: run memory again with that input (-i)")


def _summary(result: Result, r: StepReport, opts: Options, ctx, est_peak, best) -> None:
    from ...fmt import human_bytes

    result.summary.append(("Peak", f"{human_bytes(r.peak)} ({r.peak:,} bytes) during {r.peak_phase}"
                           + (f", in {innermost(r.peak_modules, r.peak_phase)}" if r.peak_modules else "")))
    if est_peak is not None:
        result.summary.append(("Estimate (fake tensors)", f"{human_bytes(est_peak)} "
                               f"({100 * result.data['estimate_error']:+.1f}% vs measured)"))
    if r.cuda:
        result.summary.append(("CUDA allocator", f"peak allocated {human_bytes(r.cuda['peak_allocated_bytes'])}, "
                               f"reserved {human_bytes(r.cuda['peak_reserved_bytes'])} (whole process)"))
    if opts.budget is not None:
        if best >= MAX_BATCH:
            result.summary.append(("Budget", f"{human_bytes(opts.budget)}: batch size {best} (where the search stops) "
                                   f"fits; larger ones may too (estimated)"))
        else:
            result.summary.append(("Budget", f"{human_bytes(opts.budget)}: largest batch size that fits ≈ {best} (estimated)"))
    if ctx.on_meta:
        result.notes.append("estimated on fake tensors: the step ran with shapes only, nothing was allocated; "
                            "optimizer uses torch's CUDA default (foreach), so its temporaries are counted as on a GPU")
    result.notes.append("tensor-level bytes (what tensors hold); a CUDA caching allocator reserves more "
                        "(block rounding, fragmentation), and the CUDA context itself takes several hundred MiB")


def innermost(modules, phase: str = "backward") -> str | None:
    """The module running at the peak. In forward, the top of the call stack. In backward, the last to receive its
    gradient, or the deepest module inside it that is in backward too: a container and its last child receive their
    gradient together, the container last (a review: starnet_s050's peak said in stages.2, a whole stage, for
    stages.2.3). Not the deepest of all: a module whose inputs carry no gradient never leaves the list (a review: a
    side branch fed by the raw input, done before the peak, was named)."""
    if not modules:
        return None
    last = modules[-1]
    if phase != "backward":
        return last
    inside = [m for m in modules if m.startswith(last + ".")]
    return max(inside, key=lambda m: m.count("."), default=last)
