"""The findings of `data`, each naming the split and field (`train:[0]`, `val:label`) and the sample index
where there is one."""
from __future__ import annotations

import math

from .options import FEATURE_SPREAD, INPUT_BOUND, WAIT_FLOOR_S

IMBALANCE = 10.0          # largest class / smallest present class
RAW_MAX = 2.0             # a float image whose values reach past this (and stay ≥ 0, ≤ 255): raw pixels
FAR_MEAN, FAR_STD = 1.0, (0.1, 3.0)       # |mean| above, or std outside: far from standardised (warning)
NEAR_MEAN, NEAR_STD = 0.25, (0.5, 2.0)    # ... outside these: not standardised (info)
IGNORE_INDEX = -100
VOCAB = 1000              # per-position labels over this many classes or more: a vocabulary (unused ids are the norm)


def _fmt(v) -> str:
    return f"{v:.4g}"


def _vals(vs) -> str:
    return "(" + ", ".join(f"{v:.4f}" for v in vs) + ")"


def add_all(r, st) -> None:
    if st.hang is not None:
        _hang(r, st)
    for split, s in st.scans.items():
        for f in s.fields.values():
            where = f"{split}:{f.name}"
            _non_finite(r, f, where)
            _shapes(r, f, where)
            if f.role == "input":
                only = _only_float_input(s, f)
                _range(r, f, where, st.scaling if only else None, st.standardising if only else None)
                _constant(r, f, where, others=[g.name for g in s.fields.values()
                                                if g.role == "input" and g is not f and not g.constant])
            elif f.role == "target":
                _target_scale(r, f, where)
            if f.role == "target":
                _labels(r, st, f, where, split)
                _label_columns(r, f, where, split)
                _reach(r, st, f, where)
        # every input constant: then every sample repeats by definition (one constant field beside others that vary,
        # an all-ones attention mask, says nothing of repeats)
        ins = [f for f in s.fields.values() if f.role == "input"]
        constant = bool(ins) and all(f.constant for f in ins)
        blanks = _blank(r, s, split) if not constant else 0
        if s.hashes.duplicates > blanks and not constant:   # a constant input repeats by definition, a blank too
            a, b = s.hashes.pairs[0]
            copies = _stream_copies(st, split, s)
            # drawn from a space the split enumerates, or (validation) from the one training enumerates; not where
            # fields were left unread (the samples may differ there: x_cat's 25 combinations beside x_num)
            of = s if space(s) else st.scans.get("train") if split == "val" and s.overlap == s.samples else None
            unread = [f.name for f in s.fields.values() if f.role == "other"]
            size = space(of) if of is not None and not copies and not unread else None
            if size:
                r.add("duplicate-samples", "info", f"{split}:{'+'.join(s.roles.inputs)}",
                      f"{s.hashes.duplicates:,} sample(s) repeat an earlier one exactly (first: sample {b} = sample "
                      f"{a}), by design: {_enumerated(of, size, '' if of is s else 'training ')}, so repeats are the "
                      "data's own frequencies" + ("" if of is s else " (every validation input is one of them)"))
                continue
            # fields not hashed: the repeats may differ there (a second review: hashing every vector field hid true
            # repeats whose metadata differed), or be no repeats at all (x_cat's 25 combinations beside x_num)
            r.add("duplicate-samples", "warning", f"{split}:{'+'.join(s.roles.inputs)}",
                  f"{s.hashes.duplicates:,} sample(s) repeat an earlier one exactly (first: sample {b} = sample {a})"
                  + (f": {copies[1]:.0%} of the samples read, as when each of the loader's {copies[0]} workers yields "
                     "the whole stream" if copies else "")
                  # (a sweep: TensorDataset(x_cat, x_num, y), x_cat's 25 combinations "repeating", x_num unread)
                  + (f"; judged on {'+'.join(s.roles.inputs)} alone: {', '.join(unread[:4])} not read as the model's "
                     "input, and the samples may differ there (--model tells how many inputs its forward takes, "
                     "--input-field names one)" if unread else ""),
                  "shard the IterableDataset by worker (torch.utils.data.get_worker_info() in __iter__)" if copies else
                  "drop the repeats (they weigh some samples twice), unless the repetition is deliberate or the inputs "
                  "are draws from a small discrete space (there repeats are the data's own frequencies)")
    _overlap(r, st)
    _order(r, st)
    _last(r, st)
    _repeat(r, st)
    _settings(r, st)
    _input_bound(r, st)


def _blank(r, s, split: str) -> int:
    """Image samples one value throughout (blank-inputs): how many. Warned, naming a class most of whose samples are
    blank; a few blanks among many are info."""
    n = sum(s.blank.values())
    if not n:
        return 0
    index, value = s.blank_first
    counts = {c: k for c, k in (s.fields[s.roles.target].classes or {}).items()} if s.roles and s.roles.target in \
        s.fields else {}
    whole = [c for c, k in s.blank.items() if c is not None and counts.get(c) and k >= 0.5 * counts[c]]
    said = f"{n:,} sample(s) have an image input that is one value throughout ({value:g}; first: sample {index})"
    if whole:
        said += "; " + ", ".join(f"class {c}: {s.blank[c]:,} of its {counts[c]:,}" for c in whole[:5])
    r.add("blank-inputs", "warning" if whole or n >= 0.01 * max(s.samples, 1) else "info",
          f"{split}:{'+'.join(s.roles.inputs)}", said,
          "look at how those samples load (a file that failed to open, a transform or mask that blanks them)" +
          ("; the model can tell that class by its blankness alone (unless blank is what the class is: an empty "
           "cell, a background tile)" if whole else ""))
    return n


def _overlap(r, st) -> None:
    """An error unless the shared samples are too few to move a validation score beyond its own sampling error:
    a per-sample score averaged over n samples (an accuracy) moves by at most k/n of its range when k of them are
    memorised, and a proportion measured on n samples has a standard error of up to 0.5/sqrt(n) (iris split at
    random shares one of its two alike flowers: 1 of 30, 3.3% against 9.1%). Asked of every class too where the
    targets are classes (a review: all 3 positives of 400 copied make recall on them memorisation), and only where
    both splits were read whole (a subset's count is an estimate; a training subset's undercounts). Whether the
    overlap is chance is not judged (docs/data.md: reviews broke every rule that tried); exact copies are all that
    is counted, so jittered ones beside them are not."""
    v, t = st.scans.get("val"), st.scans.get("train")
    if v is None or not v.overlap:
        return
    a, b = v.overlap_pairs[0]
    n = max(v.samples, 1)
    share = v.overlap / n
    said = (f"{v.overlap:,} of {v.samples:,} validation samples ({100 * share:.1f}%) are also in the training split "
            f"(first: val sample {b} = train sample {a})")
    hint = ("split by a key that identifies a sample (file, subject, source) and remove the shared ones from one side; "
            "where the inputs are draws from a small discrete space, some overlap is chance (docs/data.md)")
    read_all = t is not None and not any(f.role == "other" for sc in (t, v) for f in sc.fields.values())
    # every validation input a training one too: else an unseen input exists (a review: half of validation outside)
    if read_all and v.overlap == v.samples and (size := space(t)):
        r.add("train-val-overlap", "info", f"val:{'+'.join(v.roles.inputs)}",
              f"{said}, by design: {_enumerated(t, size, 'training ')}, so a validation input within it is a "
              "training input, whatever the split, and every one of them is: the validation score measures the fit "
              "to that space, and no unseen input exists to generalise to")
        return
    within = share <= 0.5 / math.sqrt(n) and all(k <= 0.5 * math.sqrt(m) for m, k in v.by_label.values())
    if within and _whole(v) and t is not None and _whole(t):
        r.add("train-val-overlap", "info", f"val:{'+'.join(v.roles.inputs)}",
              f"{said}: they move an accuracy over the validation set by at most {100 * share:.1f} points, under the "
              f"standard error of a proportion measured on {v.samples:,} samples (up to {50 / math.sqrt(n):.1f})"
              + (", and in each class under its own" if v.by_label else ""), hint)
        return
    r.add("train-val-overlap", "error", f"val:{'+'.join(v.roles.inputs)}",
          f"{said}; validation scores are inflated", hint)


def space(s) -> int | None:
    """The size of the discrete space a split's inputs enumerate (stats.Space), else None."""
    return s.space.size(s.samples - s.hashes.duplicates, s.samples)


def _enumerated(s, size: int, which: str = "") -> str:
    return (f"the {which}inputs are every combination of their columns' values, a discrete space of {size:,} inputs "
            f"({s.samples:,} samples read)")


def _whole(s) -> bool:
    return s.done and not s.subset and s.total is not None and s.samples >= s.total


def _hang(r, st) -> None:
    h = st.hang
    where = "; ".join(f"{s['where']} at {s['stack'][-1]}" for s in h.stacks if s["stack"]) or "no stack could be read"
    r.add("loader-hang", "error", "train", f"batch {h.batch} did not arrive within {h.seconds:g} s during "
          f"{st.hang_phase}: stuck in {where}",
          "see data.hang.stacks for each stack; a lock, a network read or a queue in __getitem__/worker_init_fn "
          "waits forever (--timeout sets the limit)")


def _non_finite(r, f, where) -> None:
    if f.non_finite:
        r.add("non-finite", "error", where, f"{f.non_finite:,} sample(s) hold NaN/Inf; the first is sample "
              f"{f.first_non_finite}", "clean or drop them before they reach the model (one NaN makes the loss NaN)")


def _shapes(r, f, where) -> None:
    if f.ragged_at is not None and tuple(f.ragged_shape or ()) == tuple(f.ragged_ref or ()):
        # the same shape, yet not stackable: the samples' structure differs (a review: dicts whose keys and value
        # types alternate said "shape scalar where the others have scalar")
        r.add("inconsistent-shapes", "error", where, f"sample {f.ragged_at} is not laid out like the others (a key or "
              "field missing, or a value of another type): the loader's collate function cannot stack its batch",
              "give every sample the same keys and value types")
    elif f.ragged_at is not None:
        r.add("inconsistent-shapes", "error", where, f"sample {f.ragged_at} has shape {_shape(f.ragged_shape)} where "
              f"the others have {_shape(f.ragged_ref)}: the loader's collate function cannot stack its batch",
              "resize/crop to one shape in the transform, or pad in a collate_fn")
    elif f.other_shape is not None:
        r.add("inconsistent-shapes", "info", where, f"the per-sample shape varies between batches: "
              f"{_shape(f.first_shape)} first, {_shape(f.other_shape)} at sample {f.other_at} (padded per batch?)",
              "fine for padded sequences; otherwise resize to one shape")


def _shape(s) -> str:
    return "x".join(map(str, s)) if s else "scalar"


def _range(r, f, where, scaling=None, standardising=None) -> None:
    """raw-pixels / not-standardised; raw-pixels of a float input is info when the model (--model) rescales it before
    any weighted layer reads it (core.input_scale, measured on the first batch: `scaling`), not-standardised when
    standardising it first changes nothing the model computes in training (an opening BatchNorm: `standardising`)."""
    found = range_finding(f)
    if found is None:
        return
    code, severity, message, hint = found
    if code == "not-standardised" and standardising is not None and standardising.holds():
        severity, message = "info", f"{message}; {standardising.describe()}"
        hint = "nothing to do: the model standardises its input itself (an opening BatchNorm does)"
    if code == "raw-pixels" and "uint8" not in f.dtypes and scaling is not None and scaling.scaled():
        severity, message, hint = "info", (f"image input in [{_fmt(f.lo)}, {_fmt(f.hi)}] (mean {_fmt(f.mean)}), "
                                           f"scaled inside the model: {scaling.describe()}"), \
            "nothing to do: the model scales its input itself"
    r.add(code, severity, where, message, hint)


TARGET_SCALE = 1e3   # a float target's |mean| or std beyond this: a squared error on it is ~1e6 or more


def _target_scale(r, f, where) -> None:
    """A float (regression) target of a large scale: a squared error on it, and its gradients, are that scale squared
    (a sweep: house prices ~1e5 under MSE gave a loss of 1e10, which only gradflow's exploding-grad noticed, with a
    hint to clip). Class indices and probabilities are not judged."""
    if f.mean is None or not f.dtypes or not all(d.startswith(("float", "bfloat", "half")) for d in f.dtypes):
        return
    if abs(f.mean) < TARGET_SCALE and (f.std or 0) < TARGET_SCALE:
        return
    r.add("target-scale", "warning", where, f"the target has mean {_fmt(f.mean)}, std {_fmt(f.std)}: a squared error "
          f"on it is of the order of {_fmt(max(abs(f.mean), f.std or 0) ** 2)}, and its gradients as large",
          f"standardise the target ((y − {_fmt(f.mean)}) / {_fmt(f.std or 1)}) and undo it on the predictions")


def _only_float_input(s, f) -> bool:
    """`f` is the split's only float input field (the one core.input_scale measured)."""
    floats = [g for g in s.fields.values() if g.role == "input" and any(d.startswith(("float", "bfloat", "half"))
                                                                          for d in g.dtypes)]
    return floats == [f]


def range_finding(f) -> tuple[str, str, str, str] | None:
    if f.mean is None:
        return None
    if "uint8" in f.dtypes and f.hi > 1:   # (a uint8 0/1 mask is no pixel range: the indicators below)
        return ("raw-pixels", "warning", f"uint8 input in [{_fmt(f.lo)}, {_fmt(f.hi)}]: pixels not converted to float "
                "nor scaled", "convert and scale (ToTensor, or x.float() / 255), then Normalize" + _norm_hint(f, 255.0))
    ints = bool(f.dtypes) and all(d.startswith("int") for d in f.dtypes)
    # (not int64 class ids shaped as an image: a segmentation mask of classes 0–3 was "raw pixels", a review)
    if f.layout is not None and f.lo >= 0 and RAW_MAX < f.hi <= 255 and not ints:
        return ("raw-pixels", "warning", f"image input in [{_fmt(f.lo)}, {_fmt(f.hi)}] (mean {_fmt(f.mean)}): raw "
                "0–255 pixel values, not normalised", "scale to [0, 1] (x / 255), then Normalize" + _norm_hint(f, 255.0))
    if f.integral and f.lo >= 0 and f.hi <= 1:   # 0/1 indicators (bag of words, one-hot, binary): a unit scale already
        return None
    if ints:
        # integer tensors other than uint8 pixels are taken as indices (token ids into an nn.Embedding, positions,
        # categories), which normalising would break (a sweep: every text set's input_ids read "not-standardised",
        # mean 8028); an int feature a model casts itself is not judged either (docs/data.md says so)
        return None
    ch = f.channel_stats()
    means, stds = ch if ch is not None else ([f.mean], [f.std])
    far = any(abs(m) > FAR_MEAN for m in means) or any(not FAR_STD[0] <= s <= FAR_STD[1] for s in stds if s > 0)
    near = any(abs(m) > NEAR_MEAN for m in means) or any(not NEAR_STD[0] <= s <= NEAR_STD[1] for s in stds if s > 0)
    if not (far or near):
        return None
    what = "per channel" if ch is not None else "over all values"
    return ("not-standardised", "warning" if far else "info",
            f"mean {_vals(means)}, std {_vals(stds)} {what}: " + ("far from 0 and 1" if far else "not standardised"),
            _scale_mismatch(f, stds) or _per_feature(f)
            or f"Normalize(mean={_vals(means)}, std={_vals(stds)}) (measured on {f.count:,} samples)")


def _scale_mismatch(f, stds) -> str | None:
    """Images off by the 255 of a pixel scale: 0–255 pixels normalised with statistics of [0, 1] ones (std ~255 × 0.25)
    or the reverse (std ~0.25 / 255). A second Normalize on top was the hint (a sweep); the scale is the fix."""
    live = [s for s in stds if s > 0]
    if f.layout is None or not live:
        return None
    if all(30 <= s <= 1000 for s in live):
        return ("0–255 pixels normalised with the statistics of [0, 1] ones (std ≈ 255 × theirs): scale to [0, 1] "
                "first (ToTensor, or x / 255, before Normalize)")
    if all(1e-3 <= s <= 1 / 60 for s in live):
        return ("[0, 1] pixels normalised with the statistics of 0–255 ones (std ≈ theirs / 255): divide that "
                "Normalize's mean and std by 255, or give it 0–255 pixels")
    return None


SPAN_FLOOR = 1e-3   # a feature's range under this share of its magnitude: near-constant, not a scale
NEIGHBOUR_JUMP = 10.0   # tabular columns jump in scale from one to the next; a signal's positions change gradually


def _per_feature(f) -> str | None:
    """For 1-D samples whose features span ranges 100x apart or more, the hint is to standardise each (a sweep: wine's
    proline, ~750, beside features ~1 was told one overall Normalize, which leaves them as far apart)."""
    import torch

    if f.f_lo is None:
        return None
    spans = (f.f_hi - f.f_lo).double()
    size = torch.maximum(f.f_hi.abs(), f.f_lo.abs()).double()
    # a column that barely moves for its size (5.0 everywhere but one 5.001: a review) is no scale to standardise to
    live = (spans > SPAN_FLOOR * size).nonzero().flatten()
    if live.numel() < 2:
        return None
    logs = spans[live].log()
    if float((logs[1:] - logs[:-1]).abs().max()) < math.log(NEIGHBOUR_JUMP):
        return None   # ranges 100x apart reached with no jump of 10x between neighbours: a signal's samples (a
        # windowed waveform, a review), whose positions are not features to standardise one by one
    wide, narrow = int(live[spans[live].argmax()]), int(live[spans[live].argmin()])
    ratio = float(spans[wide] / spans[narrow])
    if ratio < FEATURE_SPREAD:
        return None
    return (f"standardise each feature over the training set (sklearn's StandardScaler, or (x - mean) / std per "
            f"column): their ranges are {ratio:.3g}x apart (feature {wide}: {float(spans[wide]):.3g} wide, feature "
            f"{narrow}: {float(spans[narrow]):.3g})")


def _norm_hint(f, scale: float) -> str:
    ch = f.channel_stats()
    means, stds = ch if ch is not None else ([f.mean], [f.std])
    return f": after /{scale:g}, Normalize(mean={_vals([m / scale for m in means])}, std={_vals([s / scale for s in stds])})"


def _copied_stream(st) -> bool:
    scan = st.scans.get("train")
    return scan is not None and _stream_copies(st, "train", scan) is not None


def _stream_copies(st, split: str, s) -> tuple[int, float] | None:
    """(workers, the share of repeats) where the split is an IterableDataset read by a DataLoader with several workers
    and about (workers − 1) / workers of its samples repeat: every worker yielded the same stream, unsharded (a
    sweep: 2,000 repeats said only "drop the repeats")."""
    from torch.utils.data import DataLoader, IterableDataset

    data = st.train if split == "train" else st.val
    loader = getattr(data, "loader", None) if data is not None else None
    n = s.samples
    if not isinstance(loader, DataLoader) or not isinstance(loader.dataset, IterableDataset) or not n:
        return None
    workers, share = loader.num_workers, s.hashes.duplicates / n
    # copies from other workers come in other batches, a whole batch apart (a review: a sharded stream whose source
    # holds each record twice in a row, pairs inside one batch, was told to shard)
    bs = loader.batch_size or 1
    apart = all(b - a >= bs and (b - a) % bs == 0 for a, b in s.hashes.pairs)
    return (workers, share) if workers > 1 and apart and abs(share - (workers - 1) / workers) < 0.1 else None


def _constant(r, f, where, others: list[str] | None = None) -> None:
    if f.constant and others:   # beside inputs that vary (a sweep: an all-ones attention mask of fixed-length inputs)
        r.add("constant-input", "info", where, f"every value of every sample is {_fmt(f.lo)}: this field carries no "
              f"information of its own; {', '.join(others[:4])} {'vary' if len(others) > 1 else 'varies'}",
              "expected for a mask over inputs of one length, or segment ids of one-segment text; else check the "
              "transform (a wrong channel, a field that failed to load)")
        return
    if f.constant:
        r.add("constant-input", "warning", where, f"every value of every sample is {_fmt(f.lo)}: the model sees no "
              "information", "check the transform (a mask, a wrong channel, an image that failed to load)")
        return
    same, n = f.constant_features()
    if same and n and f.other_shape is None and not _reached_by_all(f, same, n):
        # padded per batch: its "features" are positions (a sweep: a mask's first 5 positions, never padding, read as
        # constant features)
        shown = ", ".join(map(str, same[:10])) + (" …" if len(same) > 10 else "")
        r.add("constant-features", "info", where, f"{len(same)} of {n} features never vary (indices {shown})",
              "they carry no information: drop them, or leave them (harmless to most models)")


def _reached_by_all(f, same: list, n: int) -> bool:
    """A field of positions padded to a fixed length: whole numbers in {0, 1}, 8 positions or more, every row in at
    most SEGMENTS runs (a mask's ones then zeros, a sentence pair's segment ids 0…0 1…1 0…0), its never-varying
    positions runs at either end (where every sample, or none, reaches). A sweep: padding="max_length" masks were
    told to drop positions 0-4, which would put the mask out of step with its ids; reviews: one-hot data with a
    constant first column passed as a mask, and a pair's segment ids did not."""
    from .stats import SEGMENTS

    head = next((i for i in range(n) if i not in same), n)   # the run at the start, then the one at the end
    tail = next((i for i in range(n - 1, -1, -1) if i not in same), -1)
    runs = set(same) == set(range(head)) | set(range(tail + 1, n))
    return (f.integral and f.lo == 0 and f.hi == 1 and n >= 8 and f.row_changes <= SEGMENTS and runs)


def labelled(f) -> bool:
    """A target with label counts: class indices (one-hot ones by their argmax) or a multi-label target's columns."""
    return f.role == "target" and (bool(f.classes) and f.integral or f.multi_label)


def label_counts(f) -> dict[int, int]:
    """Samples per class, or per label of a multi-label target (its positives)."""
    return f.positives() if f.multi_label else dict(f.classes or {})


def label_summary(f) -> dict:
    counts = dict(sorted(label_counts(f).items()))
    present = [c for c, n in counts.items() if n and c != IGNORE_INDEX]
    ratio = (max(counts[c] for c in present) / min(counts[c] for c in present)) if present else None
    return {"field": f.name, "counts": {str(k): v for k, v in counts.items()}, "classes_seen": len(present),
            "imbalance_ratio": ratio, "per_element": f.first_shape not in ((), (1,)) and not (
                f.multi_label or f.hot is not None or (f.one_hot and f.columns is not None and not f.int_columns)),
            "multi_label": f.multi_label}


def class_count(st) -> int | None:
    """Classes expected: --classes, else the model's output size."""
    return st.opts.num_classes or st.classes


def values_not_classes(st) -> bool:
    """The model (--model, no --classes) gives one value per sample: a binary logit or a regression, so integer
    targets are values (ages, counts, ±1), not class indices to bound or to find absent."""
    return st.one_output and not st.opts.num_classes


def labels_outside(st) -> bool:
    """Some label of any split is negative (not the ignore index) or past the classes expected."""
    if values_not_classes(st):
        return False
    expected = class_count(st)
    for s in st.scans.values():
        for f in s.fields.values():
            if f.role == "target" and f.classes and f.integral:
                if any(c != IGNORE_INDEX and (c < 0 or (expected is not None and c >= expected)) for c in f.classes):
                    return True
    return False


def _labels(r, st, f, where, split) -> None:
    if f.classes is None or not f.integral or not f.classes:
        return
    counts = {c: n for c, n in f.classes.items() if c != IGNORE_INDEX}
    if not counts:
        return
    expected = class_count(st)
    source = "--classes" if st.opts.num_classes else "the model's output size"
    values = values_not_classes(st)
    outside = [] if values else sorted(c for c in counts if c < 0 or (expected is not None and c >= expected))
    if outside:
        first = f.first_of_class.get(outside[0])
        at = f" (first at sample {first})" if first is not None else ""
        r.add("labels-out-of-range", "error", where, f"labels {outside[:10]} are outside [0, {expected}) "
              f"({source}){at}: {sum(counts[c] for c in outside):,} sample(s)" if expected is not None else
              f"negative labels {outside[:10]}{at}",
              "the model's class dimension must cover every label (cross_entropy fails, or a CUDA assert)")
        return
    if len(counts) == 1 and f.count > 1:
        (only, n), = counts.items()
        r.add("single-class", "error", where, f"every label is {only} ({n:,} samples): nothing to learn",
              "check the label loading (a constant default, a wrong column, a folder structure not read)")
        return
    if values and len(counts) > 2:   # a regression's integer values: no classes to balance or to miss
        if st.per_position and min(counts) >= 0 and max(counts) < 100_000:   # (N, T) logits, labels 0..K per token
            r.add("per-position-values", "info", where, f"the model gives one value per position of the target's "
                  f"shape, and the labels are integers {min(counts)}–{max(counts)} ({len(counts)} values): a "
                  "per-position regression, or a classifier missing its class dimension",
                  f"a token classifier over these labels gives (N, T, {max(counts) + 1}) logits")
        return
    top = max(counts.values())
    low_c = min(counts, key=counts.get)
    drawn = {c: w for c, w in (f.drawn or {}).items() if c in counts}
    if drawn and split == "train":   # what training draws, imbalanced by its weights or balanced by them
        _drawn(r, where, counts, drawn)
    elif top / counts[low_c] >= IMBALANCE and not even_draw(counts):
        # a split held out for evaluation is not trained on: the training hint is wrong there (a sweep); one output
        # per sample (binary, BCEWithLogitsLoss) is weighted by pos_weight, not CrossEntropyLoss's weight
        held_out = split != "train"
        weight = "BCEWithLogitsLoss(pos_weight=...)" if expected == 1 or st.one_output else "CrossEntropyLoss(weight=...)"
        r.add("class-imbalance", "info" if held_out else "warning", where, f"the largest class has "
              f"{top / counts[low_c]:.1f}× the samples of the smallest (class {low_c}: {counts[low_c]:,})",
              "judge it by per-class metrics (balanced accuracy, F1, per-class recall), not accuracy alone" if held_out
              else f"weight the loss ({weight}) or sample by class (WeightedRandomSampler)")
    span = expected if expected is not None else f.columns.numel() if f.columns is not None and f.one_hot \
        and not f.int_columns else (max(counts) + 1 if min(counts) >= 0 and max(counts) < 100_000 else None)
    if span is not None and span <= 100_000 and not values:
        absent = [c for c in range(span) if c not in counts]
        if absent == [0] and expected is None and len(counts) > 2 and sorted(counts) == list(range(1, span)):
            # every class but 0, with no class count given: labels 1..N, off by one (a sweep: "class 0 has no sample")
            r.add("classes-absent", "warning", where, f"the labels run 1–{span - 1} with no 0: one-based (class 0 has "
                  "no sample)", "cross_entropy wants labels 0..N-1: subtract 1 (give --classes or --model to check "
                  "the count)")
        elif absent and not outside:
            # per-position labels over a vocabulary (a language model's next tokens): ids a text never uses are the
            # norm (a sweep: "950 classes of [0, 1000) have no sample" on a GPT-2's data, "a split dropped them")
            vocab = span >= VOCAB and f.first_shape not in ((), (1,)) and f.columns is None
            r.add("classes-absent", "info" if vocab else "warning", where,
                  f"{len(absent)} class(es) of [0, {span}) have no sample: {absent[:20]}"
                  + (" …" if len(absent) > 20 else "")
                  + (f": per-position labels over {span:,} classes, a vocabulary's token ids, of which a text uses "
                     "some" if vocab else ""),
                  "token ids the data never holds are the norm; fewer than you expect may mean a tokenizer other "
                  "than the model's" if vocab else
                  "a split or filter dropped them; the model never learns (or is never tested on) them")


def _label_columns(r, f, where, split: str) -> None:
    """A multi-label target's labels that are 0 in every sample, or 1 in every sample: nothing to learn for them.
    Info on a held-out split: a rare label's absence from a small one is the draw's, and it is not trained on."""
    if not f.multi_label or f.column_rows < 2:
        return
    counts = f.positives()
    never = [c for c, n in counts.items() if n == 0]
    always = [c for c, n in counts.items() if n == f.column_rows]
    tail = f.never_tail()
    never = [c for c in never if c not in tail]
    said = [f"label(s) {never[:20]}{' …' if len(never) > 20 else ''} never 1"] if never else []
    said += [f"label(s) {always[:20]}{' …' if len(always) > 20 else ''} 1 in every sample"] if always else []
    if said:
        r.add("classes-absent", "warning" if split == "train" else "info", where,
              f"multi-label target of {len(counts)} labels: {'; '.join(said)} "
              f"({f.column_rows:,} samples)", "a label column not filled, or a filter that dropped its samples: the model "
              "learns a constant for it (and its recall, precision or AUC is undefined on this split)")
    if tail:   # a per-token tagger's (N, T) logits have a width too (a review): padding, or labels unused
        r.add("classes-absent", "info", where, f"labels {tail[0]}–{tail[-1]} of {len(counts)} are never 1 "
              f"({f.column_rows:,} samples), a run to the row's end: positions past every sequence's length if "
              "these are per-position labels padded to a fixed length; if they are labels, none has a sample",
              "labels: check the label list against the data; padding: nothing to do")


def target_range(f) -> tuple[float, float] | None:
    """A target field's (min, max), the ignore index -100 of integral labels left out; None before any value."""
    if f.mean is None:
        return None
    if f.integral and f.classes:
        kept = [c for c in f.classes if c != IGNORE_INDEX]
        return (min(kept), max(kept)) if kept else None
    return f.lo, f.hi


def _reach(r, st, f, where) -> None:
    """target-out-of-range: targets outside the box the model's single output stays in (reach.output_box)."""
    span = target_range(f)
    if st.box is None or span is None:
        return
    (lo, hi), (t_lo, t_hi) = st.box, span
    if t_lo >= lo - 1e-6 and t_hi <= hi + 1e-6:
        return
    r.add("target-out-of-range", "warning", where,
          f"targets span [{_fmt(t_lo)}, {_fmt(t_hi)}] but the model's one output per sample looks bounded to [{lo:g}, "
          f"{hi:g}]: it is a monotone function of the last weighted layer's output and stays within that range with "
          "that output scaled to ±100 and beyond (a sigmoid, tanh or clamp after it?); the targets outside cannot be "
          "reached",
          "classes: give the last layer one output per class and use cross_entropy on its logits; a regression "
          "target: drop the final squashing, or scale the target into its range")


UNEVEN_Z = 3.0   # a count table is uneven when its chi-square against equal classes is this many sigmas out
UNEVEN_P = 0.00135   # ... or its smallest or largest count this unlikely (3 sigmas' one-sided tail), all classes counted


def even_draw(counts: dict) -> bool:
    """Could the counts be an even draw over their classes? Pearson's chi-square against equal classes, through
    Wilson-Hilferty's normal approximation, under UNEVEN_Z sigmas (a sweep: 600 labels drawn uniformly over 100
    classes, 1 to 11 a class, were "11.0x imbalanced" in 79% of draws; their chi-square, 78 on 99 degrees of freedom,
    is an even draw's), and the smallest and largest counts no rarer than UNEVEN_P for the most extreme of that many
    classes (a review: one class of 1 among 99 of 30-62 left the chi-square an even draw's)."""
    n, k = sum(counts.values()), len(counts) - 1
    if k < 1 or n == 0:
        return True
    e = n / len(counts)
    chi2 = sum((c - e) ** 2 for c in counts.values()) / e
    z = ((chi2 / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    p = 1 / len(counts)
    low, high = min(counts.values()), max(counts.values())
    tails = (_binomial_tail(n, p, low, -1), _binomial_tail(n, p, high, +1))
    return z < UNEVEN_Z and min(tails) * len(counts) >= UNEVEN_P


def _binomial_tail(n: int, p: float, k: int, step: int) -> float:
    """P(Binomial(n, p) ≤ k) (step -1) or ≥ k (step +1), summed from k away from the mean, where the terms only
    shrink: a few standard deviations' worth of terms, not n (token labels count millions). A k within 2 standard
    deviations of the mean is 1.0: no such tail is rare enough to count."""
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    if (k - mean) * step < 2 * sd:
        return 1.0
    log_p, log_q, whole = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    total = 0.0
    while 0 <= k <= n:
        term = math.exp(whole - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        total += term
        if term < 1e-18 * max(total, 1e-300):
            break
        k += step
    return total


def _drawn(r, where, counts: dict, drawn: dict) -> None:
    """An imbalanced data set under a WeightedRandomSampler: what training sees is the weighted draw (a sweep: 45.7x
    was a warning, hinting at the sampler the loader had)."""
    total = sum(drawn.values())
    low_c = min(counts, key=lambda c: drawn.get(c, 0.0))
    ratio = max(drawn.values()) / drawn[low_c] if drawn.get(low_c, 0.0) > 0 else math.inf
    raw = max(counts.values()) / min(counts.values())
    said = (f"the data set's largest class has {raw:.1f}× the samples of the smallest; the loader's "
            f"WeightedRandomSampler draws the most likely class {ratio:.1f}× as often as the rarest (class {low_c}: "
            f"{drawn.get(low_c, 0.0) / total:.1%} of draws)")
    # what it draws, as counts over the data's size: weights that do not depend on the class over an even draw are
    # one too (a review: equal weights, then weights in [0.5, 1.5], kept the even draw's false warning)
    n = sum(counts.values())
    drawn_counts = {c: drawn.get(c, 0.0) / total * n for c in counts}
    if ratio < IMBALANCE and raw >= IMBALANCE and not even_draw(counts):
        r.add("class-imbalance", "info", where, said, "")
    elif ratio >= IMBALANCE and not even_draw(drawn_counts):
        r.add("class-imbalance", "warning", where, said, "weight each sample by 1 / (its class's count)")


def class_rows(st) -> list[dict]:
    per = {}
    for split, s in st.scans.items():
        for f in s.fields.values():
            if labelled(f):
                for c, n in label_counts(f).items():
                    per.setdefault(c, {"class": c})[split] = n
                total = sum((f.drawn or {}).values())
                for c, w in (f.drawn or {}).items():   # a weighted sampler's: the share training draws
                    if total > 0 and c in per:
                        per[c][f"{split}_drawn"] = w / total
    if len(per) > 10_000:
        return []
    return [per[c] for c in sorted(per)]


def _order(r, st) -> None:
    o = st.order
    if st.train is None or st.train.kind == "dataset" or o is None:
        return
    sampler = (getattr(st.train.obj, "sampler", None))
    seq = type(sampler).__name__ == "SequentialSampler"
    if o["not_shuffled"]:
        # measured on the samples the probe read: a run can be no longer (a sweep: runs of ~134 read "longest 32")
        # every sample read of one label (--no-speed reads one batch): the runs are at least that long (a sweep:
        # "runs of 32.0" of a loader whose runs were ~180)
        runs = (f"the first {o['samples']} samples the training loader gives all have one label (its runs are at "
                "least that long)" if o["longest_run"] >= o["samples"] else
                f"the training loader gives labels in runs of {o['mean_run']:.1f} on average (longest "
                f"{o['longest_run']}, in the first {o['samples']} samples read)")
        r.add("not-shuffled", "warning", "train", f"{runs} where shuffled data gives runs of {o['shuffled_mean_run']:.2f}"
              + (" (its sampler is a SequentialSampler)" if seq else ""),
              "shuffle the training loader (DataLoader(..., shuffle=True)): batches of one class make the "
              "gradient swing from class to class")


def _last(r, st) -> None:
    if not st.last or st.last[1] != 1 or st.last[0] < 2:   # one sample in all: no "last" batch (a review)
        return
    n, bs = st.last[0], st.last_size
    mine = st.train.kind == "dataset"   # batched here at --batch-size: the user's own loader may batch otherwise
    at = " (batched at --batch-size: your own DataLoader's batch size may differ)" if mine else ""
    if st.batch_of_one is not None:
        r.add("last-batch-of-one", "warning" if mine else "error", "train", f"{n:,} samples in batches of {bs} leave a "
              f"last batch of 1 sample{at} (drop_last=False), and the model in train mode raises on it: "
              f"{st.batch_of_one}", "set drop_last=True on the training loader, or change batch_size")
    else:
        r.add("last-batch-of-one", "info", "train", f"{n:,} samples in batches of {bs} leave a last batch of 1 sample"
              f"{at} (drop_last=False): one noisy step per epoch", "drop_last=True avoids it")


def _repeat(r, st) -> None:
    rp = st.repeat
    if not rp:
        return
    how = " and ".join(w for w, k in (("between workers", "across_workers"), ("between epochs", "across_epochs")) if rp[k])
    r.add("workers-repeat-randomness", "warning", "train", f"dataset[0] is random (two calls here differ) but repeats "
          f"exactly {how}: every worker starts from the same random state",
          "a generator the dataset owns (np.random.default_rng / random.Random made in __init__) is copied into each "
          "worker; torch seeds random, torch and numpy's global RNG per worker: use those, or reseed yours in "
          "worker_init_fn from torch.utils.data.get_worker_info().seed")


def _settings(r, st) -> None:
    if st.train is None or st.train.kind != "dataloader":
        return
    from .traps import setting_traps

    loader = st.train.obj
    try:
        epoch = len(loader)
    except TypeError:
        epoch = None
    gain = _worker_gain(st)
    for code, sev, msg, hint in setting_traps(loader, st.probe, st.ctx.device, epoch):
        r.add(code, sev, "train", msg + (gain if code == "no-workers" else ""), hint)


def _worker_gain(st) -> str:
    base = next((t for t in st.sweep if t.num_workers == 0 and t.batches_per_s), None)
    best = max((t for t in st.sweep if t.batches_per_s), key=lambda t: t.batches_per_s, default=None)
    if base is None or best is None or best.num_workers == 0:
        return ""
    return f" (measured: {best.batches_per_s / base.batches_per_s:.1f}× faster with num_workers={best.num_workers})"


def _floor_of(share: float) -> float:
    """The threshold of the level `share` is at (a sweep: "highly input-bound: ≥ 5%" showed the moderate one)."""
    return INPUT_BOUND[1] if share >= INPUT_BOUND[1] else INPUT_BOUND[0]


def bound_level(share) -> str | None:
    if share is None:
        return None
    return "not input-bound" if share < INPUT_BOUND[0] else "moderately input-bound" if share < INPUT_BOUND[1] \
        else "highly input-bound"


def balanced(st) -> int | None:
    """The fewest workers whose measured wait share is under 5% (with a model), else whose loader alone
    is the fastest; None without a sweep."""
    runs = [t for t in st.sweep if not t.pin_memory or len(st.sweep) == 1]
    with_model = [t for t in runs if t.wait_share is not None]
    if with_model:
        ok = [t for t in with_model if t.wait_share < INPUT_BOUND[0]]
        pick = min(ok, key=lambda t: t.num_workers) if ok else min(with_model, key=lambda t: t.wait_share)
        return pick.num_workers
    timed = [t for t in runs if t.batches_per_s]
    return max(timed, key=lambda t: t.batches_per_s).num_workers if timed else None


def balance_reason(st, workers: int) -> str:
    """Why `balanced` picked `workers`, as measured: under 5% waiting, the least waiting when none got there, or the
    fastest loader alone (no model)."""
    shares = [t.wait_share for t in st.sweep if t.num_workers == workers and t.wait_share is not None]
    if st.training is None or not shares:
        return "the fastest loader alone"
    if min(shares) < INPUT_BOUND[0]:
        return "the fewest workers with the training step waiting < 5%"
    return f"the least waiting for data of the counts tried ({100 * min(shares):.1f}%; none under 5%)"


def _still_waiting(fix) -> str:
    """The best worker count measured still input-bound: more workers are not the whole fix (a sweep: "set
    num_workers=2" where 2 workers still waited 99% of each step)."""
    if fix is None or fix.wait_share is None or fix.wait_share < INPUT_BOUND[0]:
        return ""
    return (f", the least waiting measured, and make loading cheaper (decode once, cache, lighter transforms): "
            f"{100 * fix.wait_share:.0f}% of each step still waits there")


def _alone_keeps_up(r, st, t) -> bool:
    """The loader as configured, timed alone, delivered a batch in a third or less of what the run with a training
    step waited for one, and that time beside the step is under 5%: the waiting came from a busy machine (a sweep: an
    in-memory set at 0.24 ms a batch alone read 24% waiting, 2.2 ms a batch, in 2 of 7 identical runs under
    --no-sweep, where the sweep's own run of the configuration is missing). Said as info; True when said."""
    alone = getattr(st, "probe", None)
    per = 1 / alone.batches_per_s if alone is not None and alone.batches_per_s and alone.num_workers == t.num_workers \
        and alone.pin_memory == t.pin_memory else None
    waited, step = (t.wait_s / t.batches, t.step_s / t.batches) if t.batches else (None, None)
    if per is None or waited is None or not step or waited < 3 * per or per / (per + step) >= INPUT_BOUND[0]:
        return False
    r.add("input-bound", "info", "train", f"the run with a training step waited {1e3 * waited:.2g} ms a batch for "
          f"data ({100 * t.wait_share:.1f}% of each step), where the loader as configured delivered one in "
          f"{1e3 * per:.2g} ms alone ({100 * per / (per + step):.1f}% beside a {1e3 * step:.2g} ms step): not "
          "input-bound; timings that far apart mean a busy machine", "measure again on a quiet machine")
    return True


def _input_bound(r, st) -> None:
    t = st.training
    if t is None or t.wait_share is None or t.wait_share < INPUT_BOUND[0]:
        return
    # the sweep's run of the same configuration measured it again: a busy machine only adds waiting, so the least is
    # the loader's (a sweep: 44% waiting beside another job, 6.9% and 7% alone; the sweep's own row said 6.9% while
    # the loader as configured said 40.7%, in one run)
    twins = [x.wait_share for x in st.sweep if x is not t and x.num_workers == t.num_workers
             and x.pin_memory == t.pin_memory and x.wait_share is not None]
    if twins and min(twins) < INPUT_BOUND[0]:
        r.add("input-bound", "info", "train", f"the loader as configured (num_workers={t.num_workers}) measured "
              f"{100 * t.wait_share:.1f}% of each training step waiting for data, and {100 * min(twins):.1f}% when the "
              "sweep ran it again: not input-bound; timings that far apart mean a busy machine",
              "measure again on a quiet machine to compare worker counts")
        return
    if _alone_keeps_up(r, st, t):
        return
    best = balanced(st)
    fix = next((x for x in st.sweep if x.num_workers == best and x.wait_share is not None), None)
    measured = (f"; measured with num_workers={best}: {100 * fix.wait_share:.1f}% waiting" if fix is not None else "")
    per = t.wait_s / t.batches if t.batches else None
    # a wait of a fraction of a millisecond a batch is the loader's own overhead beside a step as short (a sweep: a
    # 40 ms epoch of an in-memory set read 62% waiting): said, not a warning
    small = per is not None and per < WAIT_FLOOR_S
    more = [x for x in st.sweep if x.wait_share is not None and (x.num_workers or 0) > (t.num_workers or 0)]
    r.add("input-bound", "info" if small else "warning", "train", f"{100 * t.wait_share:.1f}% of each training step "
          f"waits for data ({bound_level(t.wait_share)}: ≥ {100 * _floor_of(t.wait_share):.0f}%; "
          f"num_workers={t.num_workers}"
          + (f"; {1e3 * per:.2g} ms a batch" if per is not None else "") + ")" + measured
          + (f": under {1e3 * WAIT_FLOOR_S:g} ms a batch, the loader's own overhead beside a step as short" if small
             else ""),
          f"set num_workers={best}" + _still_waiting(fix) if best is not None and best != t.num_workers else
          "make loading cheaper (decode once, cache, lighter transforms)" + (
              "; more workers were no better here" if more else
              # each worker of an unsharded stream adds a whole copy (a sweep: "use more workers" beside the copies)
              "; shard the stream by worker before adding workers" if _copied_stream(st) else " or use more workers"))
