"""memory under torchrun: the measured peak per rank, and with `--wrap fsdp` the sharding estimate
(memory/shard.py's ZeRO-3 / FSDP row for the world size) checked against what each rank measured.

`fsdp_check` runs on each rank (the estimate, data only); `merge_ranks(results, merged)` runs on rank
0 over every rank's JSON document. Each rank measured its own step on its own shard of the batch, so
peaks may differ by rank (uneven data, a rank that does extra work); the estimate comes from each
rank's own step as well."""
from __future__ import annotations

from ...errors import UsageError
from ...fmt import human_bytes
from ...results import Column, Table

FSDP_STAGE = "zero-3 / fsdp"      # the row of memory/shard.py that fully_shard is


def fsdp_check(result, model, inputs, opts, ctx) -> None:
    """Under torchrun with --wrap fsdp, on each rank: the per-device peak memory/shard.py predicts for
    fully_shard over the world size, from this rank's step of the unwrapped `model` on fake tensors, in
    `result.data["fsdp_estimate"]` (merge_ranks checks it against every rank's measured peak)."""
    import torch.distributed as dist

    if ctx.spec.wrap != "fsdp" or not (dist.is_available() and dist.is_initialized()):
        return
    from .estimated import estimate
    from .shard import Units, shard_rows
    from .step import nbytes, unique

    n = dist.get_world_size()
    try:
        est = estimate(model, inputs, opts, ctx, None, "cpu" if ctx.device.type == "cpu" else "cuda", ran_for_real=True)
    except UsageError as exc:       # the model reads values: fake tensors cannot run it
        result.notes.append(f"--wrap fsdp: no sharding estimate to check: {exc.message}")
        return
    # core/distributed.py calls fully_shard at the root only: one unit holding every parameter
    unit = nbytes(unique(model.parameters()))
    row = next(r for r in shard_rows(est, n, Units(0, unit, "(root)"), opts.mode == "train",
                                  gloo=ctx.device.type == "cpu") if r["stage"] == FSDP_STAGE)
    result.data["fsdp_estimate"] = {"per_device_peak_bytes": row["per_device_peak_bytes"], "devices": n,
                                    "phase": row["phase"], "unit": "(root)", "unit_bytes": unit}


def rank_docs(results: list[dict]) -> list[dict]:
    """Each rank's JSON document with its "rank" (from gathered records {"rank", "result": doc} or from
    documents); a rank that failed (no document) is left out. Same rule as profile/ranks.py."""
    return [{**doc, "rank": r.get("rank", i)} for i, r in enumerate(results)
            if (doc := (r.get("result") if "result" in r else r))]


def fsdp_estimate(doc: dict) -> tuple[int, int] | None:
    """(per-device peak estimated for fully_shard, devices) from a rank's document, None without one."""
    est = doc.get("fsdp_estimate")
    return (int(est["per_device_peak_bytes"]), int(est["devices"])) if est else None


def rank_rows(results: list[dict], fsdp: bool) -> list[dict]:
    """One row per rank: measured peak (and the CUDA allocator's), the estimate and its error when `fsdp`."""
    rows = []
    for doc in rank_docs(results):
        peak = int(doc["peak_bytes"])
        row = {"rank": doc["rank"], "peak_bytes": peak, "peak_phase": doc.get("peak_phase")}
        cuda = doc.get("cuda") or {}
        if "peak_allocated_bytes" in cuda:
            row["cuda_peak_allocated_bytes"] = int(cuda["peak_allocated_bytes"])
        est = fsdp_estimate(doc) if fsdp else None
        if est is not None:
            row["estimate_bytes"], row["estimate_devices"] = est
            row["estimate_error_bytes"] = est[0] - peak
            row["estimate_error"] = (est[0] - peak) / peak if peak else None
        rows.append(row)
    return rows


def merge_ranks(results: list[dict], merged) -> None:
    """rank 0's hook: the per-rank peak table and summary lines; with --wrap fsdp, the estimate against
    each rank's measured peak (or a note saying why there is none)."""
    fsdp = _wrap(merged, results) == "fsdp"
    rows = rank_rows(results, fsdp)
    if not rows:
        return
    peaks = [r["peak_bytes"] for r in rows]
    top = max(rows, key=lambda r: (r["peak_bytes"], -r["rank"]))
    merged.data["peak_bytes_per_rank"] = peaks
    merged.data["max_peak_rank"] = top["rank"]
    merged.data["peak_spread_bytes"] = max(peaks) - min(peaks)
    merged.tables.append(_table(rows))
    # the tables and lines above are rank 0's own step: say so; every rank's peak is in rank_memory
    merged.summary = [(f"{k} (rank 0)" if k in ("Peak", "Estimate (fake tensors)") else k, v) for k, v in merged.summary]
    merged.summary.append(("Peak per rank", " · ".join(f"rank {r['rank']} {human_bytes(r['peak_bytes'])}" for r in rows)
                           + f" (largest: rank {top['rank']}, {human_bytes(max(peaks) - min(peaks))} above the smallest)"))
    if not fsdp:
        return
    if any("estimate_bytes" not in r for r in rows):
        merged.notes.append("--wrap fsdp: no sharding estimate to check (a rank's result has none)")
        return
    merged.summary.append(("FSDP estimate", estimate_line(rows)))


def estimate_line(rows: list[dict]) -> str:
    """The estimate against the largest measured peak, and the range of the error over ranks."""
    top = max(rows, key=lambda r: (r["peak_bytes"], -r["rank"]))
    errs = [r["estimate_error"] for r in rows if r["estimate_error"] is not None]
    diff = top["estimate_error_bytes"]
    line = (f"{human_bytes(top['estimate_bytes'])} per device ({top['estimate_devices']} ranks) vs "
            f"{human_bytes(top['peak_bytes'])} measured on rank {top['rank']}: "
            f"{'+' if diff >= 0 else '-'}{human_bytes(abs(diff))}")
    if top["estimate_error"] is not None:
        line += f" ({100 * top['estimate_error']:+.1f}%)"
    if len(errs) > 1:
        line += f"; over all ranks {100 * min(errs):+.1f}% to {100 * max(errs):+.1f}%"
    return line


def _wrap(merged, results) -> str | None:
    """The ranks' wrapper, as the run recorded it (header or data)."""
    for where in (merged.header, merged.data, results[0] if results else {}):
        if where.get("wrap"):
            return str(where["wrap"]).split()[0]
    return None


def _table(rows: list[dict]) -> Table:
    cols = [Column("rank", "rank", "int"), Column("peak_bytes", "peak", "bytes"), Column("peak_phase", "at")]
    if any("cuda_peak_allocated_bytes" in r for r in rows):
        cols.append(Column("cuda_peak_allocated_bytes", "CUDA peak allocated", "bytes"))
    note = "peak: tensor-level bytes live at the peak of each rank's own step (on its shard of the batch)"
    if any("estimate_bytes" in r for r in rows):
        cols += [Column("estimate_bytes", "FSDP estimate", "bytes"), Column("estimate_error_bytes", "estimate - peak", "bytes"),
                 Column("estimate_error", "error", "pct")]
        note += ("; FSDP estimate: the ZeRO-3/FSDP row of --shard for the world size with the root as the one unit, "
                 "from the unwrapped model's step on fake tensors (fully_shard's all-gather and reduce-scatter "
                 "buffers included)")
    return Table("rank_memory", "Peak memory per rank", cols, rows, note=note)
