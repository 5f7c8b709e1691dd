"""The data Result: header, data (every number), tables, findings with the field and sample index, verdict."""
from __future__ import annotations

from ...results import Column, Result, Table
from . import findings as F


def build(st, partial: str | None = None) -> Result:
    r = Result("data")
    _settle_labels(st)
    _header(r, st)
    splits = {name: _split(s) for name, s in st.scans.items()}
    r.data["splits"] = splits
    if st.train is not None and st.train.kind == "dataloader":
        from ...core.datasets import settings

        r.data["loader"] = settings(st.train.obj)
    r.data["order"] = st.order
    r.data["throughput"] = _throughput(st)
    r.data["num_classes"] = F.class_count(st)
    r.data["one_output"] = st.one_output   # the model gives one value per sample: its targets are values
    r.data["interrupted"] = st.interrupted is not None
    if st.hang is not None:
        r.data["hang"] = {"phase": st.hang_phase, "batch": st.hang.batch, "timeout_s": st.hang.seconds,
                          "stacks": st.hang.stacks}
    if "val" in st.scans:
        v = st.scans["val"]
        r.data["overlap"] = {"val_samples_in_train": v.overlap, "val_samples": v.samples,
                             "pairs": [list(p) for p in v.overlap_pairs]}
    _tables(r, st)
    F.add_all(r, st)
    _pictures(r, st)
    _summary(r, st)
    r.notes += [s.note for s in st.scans.values() if s.note] + list(st.skipped)
    if partial:
        r.notes.append(partial)
    # a run that stopped before any sample was read has no numbers above (a sweep: an empty dataset)
    what = ("partial result (the numbers above are what was measured)" if any(t.rows for t in r.tables) or r.summary
            else "nothing was measured")
    if st.interrupted is not None:
        r.code = st.interrupted
        r.verdict = f"INTERRUPTED during {st.phase}: {what}"
    elif partial:   # shown above the error line: never an "OK" for a run that did not finish
        r.verdict = f"STOPPED during {st.phase}: {what}"
    else:
        bad = [f for f in r.findings if f.severity == "error"]
        warn = [f for f in r.findings if f.severity == "warning"]
        # inputs that are no tensors (strings a model's tokenizer reads) were not checked: the verdict says so (a
        # sweep: "OK: no problem found in the data" on a dataset of strings)
        unread = st.roles is not None and not st.roles.inputs
        if unread:
            r.notes.append("no input of a batch is a tensor (strings, or objects a later step turns into tensors): "
                           "only the target was checked")
        r.verdict = (f"FAIL: {len(bad)} error(s): {', '.join(sorted({f.code for f in bad}))}" if bad else
                     f"OK with {len(warn)} warning(s): {', '.join(sorted({f.code for f in warn}))}" if warn else
                     "OK: no problem found in the targets (the inputs are no tensors: not checked)" if unread else
                     "OK: no problem found in the data or the loader")
    return r


def _header(r: Result, st) -> None:
    if st.train is not None:
        r.header["data"] = st.train.spec
        r.header["data_kind"] = f"{st.train.kind} ({st.train.label})"
    if st.val is not None:
        r.header["val_data"] = st.val.spec
        r.header["val_kind"] = f"{st.val.kind} ({st.val.label})"
    if st.roles is not None:
        r.header["fields"] = st.roles.describe()
    r.header.setdefault("device", str(st.ctx.device))


def _settle_labels(st) -> None:
    """Integer (N, C) 0/1 targets read by the model's width (FieldStats.settle): C labels or C one-hot classes."""
    width = None if F.values_not_classes(st) else F.class_count(st)
    for s in st.scans.values():
        for f in s.fields.values():
            if f.role == "target":
                f.settle(width)


def _split(s) -> dict:
    labels = None
    for f in s.fields.values():
        if F.labelled(f):
            labels = F.label_summary(f)
    return {"samples": s.samples, "total": s.total, "subset": s.subset, "batches": s.batches,
            "seconds": s.seconds, "complete": s.done,
            "fields": [f.summary() for f in s.fields.values()], "labels": labels,
            "duplicates": {"count": s.hashes.duplicates, "pairs": [list(p) for p in s.hashes.pairs]}}


def _throughput(st) -> dict:
    out = {}
    if st.probe is not None:
        out["as_configured"] = st.probe.row()
    if st.training is not None:
        out["training"] = st.training.row()
        out["training"]["level"] = F.bound_level(st.training.wait_share)
    if st.sweep:
        out["sweep"] = [t.row() for t in st.sweep]
        out["balanced_workers"] = F.balanced(st)
    return out


def _tables(r: Result, st) -> None:
    rows = []
    for split, s in st.scans.items():
        for f in s.fields.values():
            d = f.summary()
            rows.append({"split": split, **{k: d[k] for k in ("field", "role", "dtype", "shape", "min", "max", "mean",
                                                              "std", "non_finite_samples")}})
    r.tables.append(Table("field_stats", "Fields", [
        Column("split", "split"), Column("field", "field"), Column("role", "role"), Column("dtype", "dtype"),
        Column("shape", "shape per sample"), Column("min", "min", "float"), Column("max", "max", "float"),
        Column("mean", "mean", "float"), Column("std", "std", "float"),
        Column("non_finite_samples", "non-finite samples", "count")], rows))
    counts = F.class_rows(st)
    if counts:
        cols = [Column("class", "class")] + [Column(s, f"{s} samples", "count") for s in st.scans]
        cols += [Column(f"{s}_drawn", f"{s} drawn (sampler)", "pct") for s in st.scans
                 if any(f"{s}_drawn" in row for row in counts)]
        r.tables.append(Table("class_counts", "Samples per class", cols, counts, limit=30))
    timings = ([{"run": "as configured", **st.probe.row()}] if st.probe is not None and st.probe.batches else [])
    if st.training is not None:
        timings.append({"run": "as configured + training step", **st.training.row()})
    timings += [{"run": "sweep", **t.row()} for t in st.sweep]
    if timings:
        cols = [Column("run", "run"), Column("num_workers", "workers", "int"), Column("pin_memory", "pin"),
                Column("first_batch_s", "first batch", "float", "s"), Column("batches_per_s", "batches/s", "float"),
                Column("samples_per_s", "samples/s", "float")]
        if any(t.get("wait_share") is not None for t in timings):
            cols += [Column("step_s", "step", "float", "s"), Column("wait_share", "waiting for data", "pct")]
        r.tables.append(Table("loader_timings", "Loader speed", cols, timings))


def _dropped(data) -> str:
    """A loader with drop_last=True yields fewer samples an epoch than the data set holds, which is what the scan
    reads (a sweep: "97 samples in 4 batches" of a loader giving 3 batches of 32)."""
    loader = getattr(data, "obj", None) if getattr(data, "kind", "") == "dataloader" else None
    bs = getattr(loader, "batch_size", None)
    if loader is None or not getattr(loader, "drop_last", False) or not bs:
        return ""
    try:
        n = len(loader.sampler)
    except TypeError:
        return ""
    left = n % bs
    if not left:
        return ""
    shuffled = type(loader.sampler).__name__ != "SequentialSampler"
    return (f"; the loader gives {n // bs} batches of {bs} an epoch (drop_last=True), leaving out {left} sample(s) "
            + ("drawn anew each epoch" if shuffled else "(the same ones every epoch: never trained on)"))


def _pictures(r: Result, st) -> None:
    if not st.opts.pictures:
        return
    from .pictures import add_pictures

    add_pictures(r, st)


def _summary(r: Result, st) -> None:
    for split, s in st.scans.items():
        of = f" of {s.total:,}" + (" (a random subset)" if s.subset else "") if s.total else ""
        r.summary.append((f"{split.capitalize()} split", f"{s.samples:,} samples{of} in {s.batches} batches, "
                                                         f"read in {s.seconds:.2f} s" + _dropped(getattr(st, split))))
    p = st.probe
    if p is not None and p.batches_per_s:
        r.summary.append(("Loader as configured", f"first batch {p.first_batch_s:.3f} s, then {p.batches_per_s:.1f} "
                                                  f"batches/s ({p.samples_per_s:.0f} samples/s, num_workers={p.num_workers})"))
    t = st.training
    if t is not None and t.wait_share is not None:
        r.summary.append(("Training step", f"{1000 * t.step_s / t.batches:.1f} ms per step, {100 * t.wait_share:.1f}% "
                                           f"of the time waiting for data ({F.bound_level(t.wait_share)})"))
    if st.sweep:
        best = F.balanced(st)
        if best is not None:
            what = F.balance_reason(st, best)
            r.summary.append(("Workers", f"num_workers={best}: {what} (measured)"))
