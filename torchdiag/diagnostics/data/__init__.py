"""`data`: the data and the input pipeline — what goes in, and whether it keeps up.

Entry point for the runner: `run_data(train, opts, ctx, val=None, model=None) -> Result`, where `train`
and `val` are core.datasets.LoadedData (from `load_data(spec, args)`) or the objects themselves (a
Dataset, a DataLoader, any iterable of batches), `model` an nn.Module or None, `ctx` a core Context
(`context()` builds one for a caller without a model spec).

Order: the loader as configured is probed first (the first batch within --timeout, else `loader-hang`
with each process's stack; then its batches/s and label order); the content pass over each split; the
checks that need a model (labels within its output size, targets its single output can reach (reach.py),
raw pixels it scales itself (core/input_scale.py), a last batch of one); the worker randomness
check; the num_workers sweep, with the model's training step when given. Ctrl-C returns what was measured
(exit 130); a sample that raises is exit 3 naming its index, with the partial result."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from ...errors import DiagError, interrupt_code
from .options import INPUT_BOUND, NEEDS_VALUES, Options  # noqa: F401  (the runner reads them here)

OPTIMIZER = None   # the training step uses the run's optimizer (ctx.optimizer); none of its own


@dataclass
class State:
    """Everything measured so far: a partial Result is built from it at any point."""

    train: Any
    val: Any
    model: Any
    opts: Options
    ctx: Any
    probe: Any = None                 # speed.Timing of the loader as configured
    order: dict | None = None         # traps.label_runs of the probe's labels
    hang: Any = None                  # core.fetch.Hang
    hang_phase: str = ""
    scans: dict = field(default_factory=dict)   # split -> scan.SplitScan
    classes: int | None = None        # the model's output size (C ≥ 2 classes)
    one_output: bool = False          # the model gives one value per sample: its targets are values, not classes
    per_position: bool = False        # ... one per position of a target of its own shape (a binary token tagger)
    scaling: Any = None               # core.input_scale.Seen: what the model's weighted layers read (with --model)
    standardising: Any = None         # core.input_scale.Standardising: what standardising first changes (with --model)
    box: tuple | None = None          # reach.output_box: the bound of a single squashed output (with --model)
    batch_of_one: str | None = None   # the error a batch of one raises in train mode
    last: tuple | None = None         # (epoch samples, last batch samples)
    last_size: int | None = None      # the batch size that leaves it
    repeat: dict | None = None
    sweep: list = field(default_factory=list)
    training: Any = None              # speed.Timing with the model's steps, the loader as configured
    skipped: list = field(default_factory=list)
    interrupted: int | None = None
    phase: str = "starting"
    first_batch: Any = None
    roles: Any = None                 # core.batches.Roles of the training data
    model_timed: bool = True


def context(device: str = "auto", seed: int = 0, loss: str = "auto", caller: str = "python"):
    """A Context for `run_data` when the runner has none (no model spec to prepare)."""
    from ...core.context import Context
    from ...core.device import resolve_device
    from ...core.run import RunSpec

    spec = RunSpec("data", device=device, seed=seed, loss=loss, needs_inputs=False, caller=caller)
    return Context(spec, resolve_device(device))


def as_data(obj, what: str):
    from ...core.datasets import LoadedData, loaded

    if obj is None or isinstance(obj, LoadedData):
        return obj
    return loaded(obj, what, what)


def run_data(train, opts: Options | None = None, ctx=None, val=None, model=None):
    """See the module docstring."""
    from . import report

    opts = opts or Options()
    ctx = ctx or context()
    st = State(as_data(train, "the data"), as_data(val, "the validation data"), model, opts, ctx)
    try:
        with _rng_kept(ctx.seed):   # shuffling draws from the global RNGs: seeded, and restored afterwards
            _stages(st)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM: keep what was measured
        st.interrupted = int(interrupt_code(exc))
    except DiagError as exc:
        if getattr(exc, "partial", None) is None and hasattr(exc, "partial"):
            exc.partial = report.build(st, partial=f"stopped during {st.phase}: {exc.message}")
        raise
    return report.build(st)


@contextlib.contextmanager
def _rng_kept(seed: int):
    """torch's RNG seeded for the run and restored (core.train.seeded); Python's and numpy's global RNGs
    (a dataset may draw from them in this process) restored too."""
    import random

    import numpy as np

    from ...core.train import seeded

    saved = random.getstate(), np.random.get_state()
    try:
        with seeded(seed):
            yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def _stages(st: State) -> None:
    from ...core.batches import batch_size
    from ...core.datasets import loader_for
    from ...core.fetch import Hang
    from . import reach, speed, traps
    from . import scan as S

    opts, ctx = st.opts, st.ctx
    if st.train.kind == "iterable" and iter(st.train.obj) is st.train.obj:
        if opts.speed:
            st.skipped.append("a one-shot iterator (a generator): the content pass goes on where the loader timing "
                              "stopped; return a re-iterable object (a Dataset, a DataLoader) to read it from the start")
        else:   # the one batch the probe reads for the fields goes back to the content pass (a sweep: 29 of 30 read)
            st.train.obj = _GivenBack(st.train.obj)
    loader = loader_for(st.train, opts.batch_size, ctx.seed)
    st.phase = "the first batches of the loader as configured"
    try:
        st.probe = speed.Timing(getattr(loader, "num_workers", None), bool(getattr(loader, "pin_memory", False)))
        roles = _probe(st, loader)
    except Hang as h:
        st.hang, st.hang_phase = h, st.phase
        return
    from ...core.batches import model_inputs

    for split, data in (("train", st.train), ("val", st.val)):
        if data is None:
            continue
        st.phase = f"the content pass over the {split} split"
        st.scans[split] = S.SplitScan(split)
        try:
            S.scan_into(st.scans[split], data, opts, roles if split == "train" else None,
                        st.scans.get("train") if split == "val" else None, ctx.seed, model_inputs(st.model))
        except Hang as h:
            st.hang, st.hang_phase = h, st.phase
            return
    _order(st)
    first = st.first_batch
    if st.model is not None and first is not None:
        st.phase = "the model's output size"
        width, st.per_position = speed.output_size(st.model, first, roles, ctx, _beyond_binary(st, roles))
        st.classes, st.one_output = (width, False) if width != 1 else (None, True)
        if _unscaled_input(st):   # one more forward of a copy, only when a raw-pixels finding exists
            st.scaling = speed.input_scaling(st.model, first, roles, ctx)
        if _unstandardised_input(st):   # one more, only when a far not-standardised finding exists
            st.standardising = speed.input_standardising(st.model, first, roles, ctx)
        if st.one_output and _targets_beyond_unit(st):   # one output per sample: can it reach the targets?
            st.box = reach.output_box(st.model, first, roles, ctx, batch_size(first))
    _last_batch(st, loader, roles)
    ds = st.train.dataset
    if ds is not None and opts.speed:
        st.phase = "the worker randomness check"
        try:
            st.repeat = traps.workers_repeat(ds, st.train.loader, opts.timeout)
        except Hang as h:
            st.hang, st.hang_phase = h, st.phase
            return
    _speed(st, loader, roles, ds)


def _beyond_binary(st: State, roles) -> bool | None:
    """Whether the target field holds, in any split scanned, a value other than 0 and 1 (an ignore index, a
    regression's values, a class past 1); None when no split read it."""
    fields = [s.fields[roles.target] for s in st.scans.values() if roles.target in s.fields]
    fields = [f for f in fields if f.values]
    if not fields:
        return None
    return any(not (f.integral and f.lo >= 0 and f.hi <= 1) for f in fields)


def _targets_beyond_unit(st: State) -> bool:
    """Some split's targets leave [0, 1], the narrowest box a squashed output could be caught in."""
    from .findings import target_range

    spans = [target_range(f) for s in st.scans.values() for f in s.fields.values() if f.role == "target"]
    return any(r is not None and (r[0] < 0 or r[1] > 1) for r in spans)


def _unscaled_input(st: State) -> bool:
    from .findings import range_finding

    return any(f.role == "input" and (range_finding(f) or ("",))[0] == "raw-pixels"
               for s in st.scans.values() for f in s.fields.values())


def _unstandardised_input(st: State) -> bool:
    from .findings import range_finding

    return any(f.role == "input" and (range_finding(f) or ("", ""))[:2] == ("not-standardised", "warning")
               for s in st.scans.values() for f in s.fields.values())


class _GivenBack:
    """A one-shot iterator whose items read before `give_back()` are handed out again, first, after it."""

    def __init__(self, it):
        self._it, self._read, self._again = it, [], []

    def __iter__(self):
        return self

    def __next__(self):
        if self._again:
            return self._again.pop(0)
        item = next(self._it)
        if self._read is not None:
            self._read.append(item)
        return item

    def give_back(self) -> None:
        self._again, self._read = self._read or [], None


def _probe(st: State, loader):
    """The loader as configured: first batch (hang check), batches/s, labels in the order given."""
    from ...core import batches as B
    from . import speed, traps
    from .scan import Ragged

    opts = st.opts
    roles_box = {}

    def remember(batch):
        parts = batch.parts if isinstance(batch, Ragged) else [batch]
        if "roles" not in roles_box:
            roles_box["roles"] = B.find_roles(parts[0], opts.input_field, opts.target_field,
                                              lambda n: "--" + n.replace("_", "-"), B.model_inputs(st.model))
            _keywords_taken(roles_box["roles"], st.model)
            st.first_batch = parts[0] if len(parts) == 1 else None
        target = roles_box["roles"].target
        if target is not None and len(st.probe.labels) < 100_000:
            st.probe.labels.extend(speed.labels_of(parts, target))

    speed.time_loader(loader, opts, dataset=st.train.dataset, look=remember, label="the training loader",
                      timing=st.probe, limit=opts.batches if opts.speed else 0)
    if isinstance(st.train.obj, _GivenBack):
        st.train.obj.give_back()
    roles = roles_box.get("roles")
    if roles is None:
        from ...errors import UsageError

        raise UsageError("the training data gave no batch (it is empty)")
    st.order = traps.label_runs(st.probe.labels, None) if st.train.kind != "dataset" else None
    st.roles = roles
    return roles


def _keywords_taken(roles, model) -> None:
    """Exit 2 where a dict batch's keys would reach the model's forward as keywords it does not take (batches'
    unread_keywords), naming the options that say which field is which."""
    from ...core import batches as B
    from ...errors import UsageError

    bad = B.unread_keywords(roles, model)
    if bad:
        keys = [n for n in roles.names if "." not in n]
        raise UsageError(f"the batch's dict keys {', '.join(roles.inputs)} would go to {type(model).__name__}.forward() "
                         f"as keywords, and it takes no {' or '.join(repr(k) for k in bad)}",
                         hint=f"name the fields: --input-field KEY --target-field KEY (the batch's keys: "
                              f"{', '.join(keys)})")


def _order(st: State) -> None:
    """The probe's label runs against what shuffling gives with the whole split's class frequencies."""
    from . import traps

    scan = st.scans.get("train")
    target = st.roles.target if st.roles is not None else None
    f = scan.fields.get(target) if scan is not None and target else None
    if st.order is not None and f is not None and f.classes and f.integral:
        st.order = traps.label_runs(st.probe.labels, dict(f.classes))


def _last_batch(st: State, loader, roles) -> None:
    from . import speed, traps

    if st.train.kind not in ("dataloader", "dataset"):   # a Dataset: the loader built at --batch-size (a sweep: its
        return                                           # last batch of one crashed the timing, exit 3)
    st.last = traps.last_batch(loader)
    st.last_size = getattr(loader, "batch_size", None)
    if st.last and st.last[1] == 1 and st.model is not None and st.first_batch is not None:
        st.phase = "a batch of one through the model"
        st.batch_of_one = speed.batch_of_one_fails(st.model, st.first_batch, roles, st.ctx)


def _speed(st: State, loader, roles, ds) -> None:
    from . import speed

    opts, ctx = st.opts, st.ctx
    if not opts.speed or _ragged(st):
        if _ragged(st):
            st.skipped.append("throughput: the samples' shapes differ, so the loader fails as configured")
        return
    from .findings import labels_outside

    if st.model is not None and labels_outside(st):
        st.skipped.append("training step not timed: labels outside the model's output size (labels-out-of-range)")
        st.model_timed = False
    skip_one = st.batch_of_one is not None
    if st.model is not None and st.model_timed and st.first_batch is not None and ctx.custom_loss is None \
            and ctx.spec.loss == "auto":   # a loss the user named is theirs to fix: its errors end the run
        _loss_fits(st, speed.TrainStep(st.model, ctx, roles, skip_one))
    step = (lambda: speed.TrainStep(st.model, ctx, roles, skip_one)) if st.model is not None and st.model_timed else None
    if step is not None:
        st.phase = "the training steps against the loader as configured"
        st.training = speed.Timing(getattr(loader, "num_workers", None), bool(getattr(loader, "pin_memory", False)))
        speed.time_loader(loader, opts, dataset=ds, step=step(), label="the training loader", timing=st.training)
    if opts.sweep and ds is not None and hasattr(loader, "collate_fn"):
        st.phase = "the num_workers sweep"
        st.sweep = []
        for t in speed.sweep(loader, opts, ctx, ds, step):
            st.sweep.append(t)
    elif opts.sweep:
        st.skipped.append("num_workers sweep: only for a map-style Dataset (an iterable's workers would each "
                          "give the whole stream)")


def _loss_fits(st: State, step) -> None:
    """One training step on the first batch: the auto loss refusing the output and target (cross_entropy on a
    one-output model, a target shaped (N,) against an (N, 1) output) leaves the step untimed, with the reason,
    instead of ending the run."""
    from ...errors import UsageError

    st.phase = "a first training step"
    try:
        step(st.first_batch)
    except UsageError as exc:
        st.skipped.append(f"training step not timed: {exc.message} (--loss names the loss to time it with)")
        st.model_timed = False


def _ragged(st: State) -> bool:
    return any(f.ragged_at is not None for s in st.scans.values() for f in s.fields.values())
