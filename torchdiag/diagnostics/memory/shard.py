"""Sharding maths (ZeRO-1/2/3, FSDP): the per-device peak from the category bytes at each phase's peak."""
from __future__ import annotations

from .step import StepReport, unique


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
        b = sum(p.numel() * p.element_size() for p in unique(mod.parameters()))
        if b > best[1]:
            best = (name, b)
    return best[1], best[0]
