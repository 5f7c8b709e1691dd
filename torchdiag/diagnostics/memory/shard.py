"""Sharding maths (ZeRO-1/2/3, FSDP): the per-device peak from the category bytes at each phase's peak.

The ZeRO-3 / FSDP row follows what torch's fully_shard (FSDP2, torch/distributed/fsdp/_fully_shard)
allocates on each rank, unit by unit (a unit: the parameters one fully_shard call groups):
- always alive: the parameter shards and the optimizer state of the shards (1/n each);
- unshard (forward, and backward for a unit resharded after forward): one flat all-gather output of
  the unit's full size, then the unit's unsharded parameters (full size) copied out of it; in forward
  the all-gather output is kept until the next unit's unshard (the last one's until the root's forward
  returns): twice the unit while it runs;
- the root unit is not resharded after forward (backward needs it at once): its full parameters stay
  from its unshard to the end of backward; units below the root are freed after their forward and
  gathered again in backward, where the next unit in backward order is prefetched;
- backward: a unit's gradients are full size until its post-backward, which frees its unsharded
  parameters, copies its full gradients into a flat reduce-scatter input (full size, padded) and only
  then frees them; the input is kept until the next unit's post-backward (one buffer in flight) and
  the reduce-scatter output is the sharded gradient (1/n); gloo (CPU) reduce-scatters a full-size copy
  of the input;
- the optimizer step runs on shards: its temporaries are divided as well;
- on one device (n = 1) the unsharded parameters are copied from the shards: no all-gather buffer.
Activations, inputs, buffers and temporaries stay per device (data parallel: each device runs the batch
given). Allocator fragmentation and gloo/NCCL's own staging memory are not counted; padding of a
parameter's dim 0 to a multiple of n is ignored (at most n - 1 rows per parameter)."""
from __future__ import annotations

from dataclasses import dataclass

from .step import StepReport, unique

_SHARDED = ("parameters", "gradients", "optimizer_state")


@dataclass
class Units:
    """How a model is cut into FSDP units: the largest unit below the root (0: the root alone holds every
    parameter, as torchdiag's --wrap fsdp shards it) and the parameter bytes the root unit itself holds."""
    largest: int
    root: int
    name: str = ""
    second: int = 0      # the second-largest unit below the root (0: no other): the neighbour prefetched


def shard_rows(report: StepReport, n: int, units: Units | int, train: bool, gloo: bool = False) -> list[dict]:
    """Per-device peak when parameters / gradients / optimizer state are split over n devices: ZeRO-1
    divides optimizer state, ZeRO-2 also gradients, ZeRO-3/FSDP also parameters (fsdp_peaks)."""
    if not isinstance(units, Units):   # a unit size alone: units of that size below a root holding nothing
        units = Units(int(units), 0, "", int(units))
    rows = []
    for name, dp, dg, do in (("ddp (no sharding)", 1, 1, 1), ("zero-1", 1, 1, n), ("zero-2", 1, n, n)):
        worst, worst_phase = 0, ""
        for phase, cats in report.phase_at_peak.items():
            p, g, o = (cats.get(k, 0) for k in _SHARDED)
            rest = sum(v for k, v in cats.items() if k not in _SHARDED)
            if do > 1 and phase == "optimizer":  # the step's temporaries are per shard too
                t = cats.get("temporaries", 0)
                rest = rest - t + t // do
            total = p // dp + g // dg + o // do + rest
            if total > worst:
                worst, worst_phase = total, phase
        rows.append({"stage": name, "devices": n, "per_device_peak_bytes": int(worst), "phase": worst_phase})
    peaks = fsdp_peaks(report, n, units, train, gloo)
    phase = max(peaks, key=lambda k: peaks[k]) if peaks else ""
    rows.append({"stage": "zero-3 / fsdp", "devices": n, "per_device_peak_bytes": int(peaks.get(phase, 0)),
                 "phase": phase.split(" ")[0]})
    return rows


def fsdp_peaks(report: StepReport, n: int, units: Units, train: bool, gloo: bool = False) -> dict[str, int]:
    """The FSDP per-device live bytes at each moment the module docstring names, from the unsharded
    step's category bytes at each phase's peak. Keys: forward, backward, "backward (reduce-scatter)",
    optimizer. `gloo`: the ranks communicate with gloo (CPU), whose reduce-scatter works on a full-size
    copy of its input (measured: bench/README.md); NCCL's does not."""
    U, R = units.largest, units.root
    gloo = gloo and n > 1
    ag = 1 if n > 1 else 0      # one device: the unsharded copy is made from the shard, no all-gather buffer
    P = report.param_bytes
    G = report.grad_bytes if train else 0
    g_root = G * R // P if P else 0           # the root unit's share of the gradients
    out: dict[str, int] = {}
    for phase, cats in report.phase_at_peak.items():
        p, g, o = (cats.get(k, 0) for k in _SHARDED)
        rest = sum(v for k, v in cats.items() if k not in _SHARDED)
        shards = p // n + o // n
        if phase == "optimizer":
            t = cats.get("temporaries", 0)
            out[phase] = shards + g // n + rest - t + t // n
        elif phase == "forward":
            # a unit's all-gather output is kept until the next unit's unshard (the root's own: to the end of
            # the root's forward when no unit follows): two copies of the unit running now, and of the root's
            start = shards + (1 + ag) * R + report.input_bytes + report.buffer_bytes
            out[phase] = max(start, shards + R + ((1 + ag) * U if U else ag * R) + rest)
        elif phase == "backward":
            # root: full parameters and full gradients; a unit below: its parameters and full gradients and
            # the next one's all-gather output (prefetched: a neighbour, at most the second-largest unit); the
            # gradients of units done are shards. The previous unit's reduce-scatter input, kept until this
            # one's post-backward, is not counted here: at the phase's peak (activations at their largest,
            # backward's start) no unit has reduced yet, and later the activations freed outweigh it
            full_g = min(g, g_root + U)
            units_now = U + ag * units.second if U else 0
            out[phase] = shards + R + full_g + (g - full_g) // n + units_now + rest
            if U and train:   # a unit's post-backward: its gradients copied into the reduce-scatter input, then
                # (gloo) the input, gloo's copy and the output; the next unit prefetched
                comm = 2 * U + (U // n if gloo else 0)
                out["backward (reduce-scatter)"] = (shards + R + full_g - U + (g - full_g) // n + comm
                                                    + ag * units.second + rest)
    if train and "optimizer" in report.phase_at_peak:
        # the root's post-backward: parameters resharded, with what the optimizer step starts from (inputs,
        # output, loss, buffers): its full gradients copied into the reduce-scatter input (both alive), then
        # on gloo the input, gloo's copy of it and the output (the gradient shard)
        cats = report.phase_at_peak["optimizer"]
        base = sum(v for k, v in cats.items() if k not in _SHARDED and k != "temporaries")
        p, o = report.param_bytes, report.optimizer_bytes
        comm = 2 * g_root + (g_root // n if gloo else 0)
        root_rs = p // n + o // n + (G - g_root) // n + comm + base
        out["backward (reduce-scatter)"] = max(out.get("backward (reduce-scatter)", 0), root_rs)
    return out


def fsdp_units(model) -> Units:
    """Units as fully_shard would be applied per layer: elements of ModuleList/Sequential containers
    (transformer layers), else the root's children; the largest one's parameter bytes (in the step's
    dtype, fp32 otherwise) and the bytes left to the root."""
    from torch import nn

    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)):
            found += [(f"{name}.{k}" if name else k, c) for k, c in mod.named_children()]
    if not found:
        found = list(model.named_children()) or [("(root)", model)]
    sizes, seen = [], set()
    for name, mod in found:       # outermost first (named_modules is pre-order): a nested unit adds nothing
        ps = [p for p in unique(mod.parameters()) if id(p) not in seen]
        seen |= {id(p) for p in ps}
        sizes.append((sum(p.numel() * p.element_size() for p in ps), name))
    sizes.sort(key=lambda x: -x[0])
    best = (sizes[0][1], sizes[0][0])
    second = sizes[1][0] if len(sizes) > 1 else 0
    total = sum(p.numel() * p.element_size() for p in unique(model.parameters()))
    held = sum(p.numel() * p.element_size() for p in unique(model.parameters()) if id(p) in seen)
    if best[0] == "(root)":
        return Units(0, total, "(root)")
    return Units(best[1], total - held, best[0], second)


def fsdp_unit_bytes(model) -> tuple[int, str]:
    """The largest wrapping unit (fsdp_units): its parameter bytes and its name."""
    u = fsdp_units(model)
    return (u.largest or u.root), u.name
