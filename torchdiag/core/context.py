"""A run's context: the RunSpec turned into torch objects once (device, loss rule, optimizer factory,
batch target, model factory), handed to every diagnostic as `run(model, inputs, opts, ctx)`.

The CLI and `check` get one from `prepare(spec)` (which also loads the model and its inputs); the
Python API from `context_for(model, spec)`, which takes the device from the model it was given."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ExitCode, UsageError, option_name
from . import train
from .lazy import materialise
from .places import model_places
from .precision import overflow_words, refuse_scaled_complex
from .run import RunSpec

META_HINT = "use --device cpu or cuda (meta has shapes only: summary, flops and memory work there)"
META_FAILED_HINT = ("on --device meta tensors have shapes but no values: if the model's code reads values "
                    "(.item(), `if` on a tensor, nonzero …) it fails there; run it with --device cpu")


@dataclass
class Context:
    spec: RunSpec
    device: Any                          # torch.device, resolved once
    loaded: Any = None                   # core.loading.LoadedModel (CLI/check); None from the Python API
    batch_target: Any = None             # the target from --batch (or target= in Python)
    custom_loss: Any = None              # a Python callable fn(output, target) -> scalar
    header: dict[str, Any] = field(default_factory=dict)   # choices made for the user
    checkpoints: list = field(default_factory=list)        # core.checkpoint.Report of each file loaded
    wrapper: Any = None                  # under torchrun: wraps a train copy (core.distributed.wrap); else None
    pass_wrapper: Any = None             # under torchrun (WRAP mode "pass"): wraps the one main pass's copy
    rows: Any = None                     # under torchrun: (start, stop, n), this rank's rows of the batch
    places: Any = None                   # core.places.model_places of the model: findings in model order
    lm: Any = None                       # core.loss.LanguageModel: integer ids feeding an embedding (auto loss)
    observed: Any = None                 # (model, inputs) the run judges, as observe() saw them
    _fills: Any = None                   # core.fills.Fills of the observed forward, asked once (fills())
    # {device: core.saved.Saved}: the most a train-mode pass of the model kept for its backward (saw_activations);
    # a copy run backward on the same batch keeps as much again (train_copy), on `share` of its samples that part
    activations: dict = field(default_factory=dict)
    share: float = 1.0
    overflow: dict = field(default_factory=dict)   # core.precision.cast_overflow of the --dtype cast

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def on_meta(self) -> bool:
        return self.device.type == "meta"

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def factory(self):
        """(factory, kwargs) that built the model, or None when the caller passed the model itself."""
        return None if self.loaded is None else (self.loaded.factory_fn, self.loaded.kwargs)

    @property
    def autocast_dtype(self) -> str | None:
        """bfloat16/float16 when the run autocasts (the spec's amp resolved for this device), else None."""
        return self.precision.amp

    @property
    def precision(self):
        """core.precision.Precision: --dtype and --amp resolved for this device (compute dtype, facts)."""
        from .precision import precision_of

        return precision_of(self.spec, self.device.type)

    def autocast(self):
        """`with ctx.autocast():` torch.autocast in the run's amp dtype, or nothing without --amp."""
        from .precision import autocast

        return autocast(self.precision, self.device)

    def grad_scaler(self):
        """A fresh torch.amp.GradScaler for fp16 autocast (where a step runs), else None."""
        from .precision import grad_scaler

        return grad_scaler(self.precision, self.device)

    def option(self, name: str) -> str:
        """An option as the caller writes it (--flag, keyword, or pyproject key)."""
        return option_name(name, self.spec.caller)

    def require_values(self) -> None:
        """The one refusal of the meta device for diagnostics that need real values."""
        if self.on_meta:
            raise_meta(self.spec.command)

    def loss(self, rule: str | None = None):
        """A fresh loss rule (DESIGN.md "Targets and loss"): it fixes its random target on first use, under
        torchrun cut to this rank's rows. `rule`: that rule with a random target of its own instead of the
        run's rule and target (doctor's training checks when the given targets are out of range)."""
        if rule is None:
            made = loss_rule(self.custom_loss or self.spec.loss, self.loaded, self.batch_target, self.seed)
        else:
            made = loss_rule(rule, None, None, self.seed)
        made.rows = self.rows
        made.lm = self.lm
        made.fills = self.fills if self.observed is not None else None
        return made

    def fills(self, training: bool = True):
        """core.fills.Fills of the observed model's forward on its inputs in that mode: which ops made its ±inf
        values (one forward per mode, asked once, only by whoever meets a non-finite output)."""
        if self._fills is None:
            self._fills = {}
        if training not in self._fills:
            from .fills import ask

            self._fills[training] = ask(*self.observed, self, training)
        return self._fills[training]

    def optimizer(self, params, spec=None, *, foreach: bool | None = None):
        params = list(params)
        refuse_scaled_complex(params, self.precision, self.option("amp"))
        return train.make_optimizer(params, spec or self.spec.optimizer, foreach=foreach)

    def seeded(self):
        """`with ctx.seeded():` the global RNG seeded with the run's seed, restored afterwards."""
        return train.seeded(self.seed)

    def saw_activations(self, loss, model, inputs) -> None:
        """What the graph under `loss` (a train-mode pass of `model` on `inputs`) keeps for its backward, beyond the
        model's own tensors and the inputs (core.saved): kept where it is the most seen on its device."""
        from .saved import saved_bytes

        own = (*model.parameters(), *model.buffers(), *(t for _, t in inputs.tensors()))
        try:
            seen = saved_bytes(getattr(loss, "grad_fn", None), own, model.parameters() if self.precision.amp else ())
        except Exception:   # noqa: BLE001 - a size for later room checks only: a graph it cannot read is not measured
            return
        for device, saved in seen.items():
            if device not in self.activations or saved.total > self.activations[device].total:
                self.activations[device] = saved

    def activation_bytes(self, dtype=None) -> dict:
        """{device: bytes} a pass of the model kept for backward (saw_activations), in `dtype` for a copy cast to it
        (and run without autocast), for `share` of the samples (core.fewer's retry on the first of them)."""
        return {device: int(saved.bytes_in(dtype) * self.share) for device, saved in self.activations.items()}

    def train_copy(self, model, why: str = "to train it", dtype=None, *, backward: bool = False, steps: bool = False,
                   optimizer=None):
        """A train-mode copy (core/train.py), its room checked in `dtype` when the caller will cast it, with its
        gradients when it will run `backward`, and the state of the optimizer it is trained with (`optimizer`, an
        OptimizerSpec; the run's by default) beside them when it `steps`; with the activations a pass of the model
        kept for backward (saw_activations), in `dtype`, when it runs either."""
        trained = (optimizer or self.spec.optimizer) if steps else None
        acts = self.activation_bytes(dtype) if backward or steps else None
        if self.wrapper is None:
            return train.train_copy(model, why, dtype, backward=backward, optimizer=trained, activations=acts)
        from .distributed import on_every_rank

        # under torchrun: DDP/FSDP the copy, made on every rank or on none
        ddp = self.spec.wrap == "ddp" and (backward or steps)
        return self.wrapper(on_every_rank(lambda: train.train_copy(model, why, dtype, backward=backward, optimizer=trained,
                                                                    activations=acts, buckets=ddp), self.device))

    def wrapped_copy(self, model, why: str):
        """Under torchrun (pass_wrapper set): a train copy, wrapped, for the one pass every rank makes
        whatever its values; None otherwise (the command runs the model itself)."""
        if self.pass_wrapper is None:
            return None
        from .distributed import on_every_rank

        acts = self.activation_bytes()
        ddp = self.spec.wrap == "ddp"
        return self.pass_wrapper(on_every_rank(lambda: train.train_copy(model, why, backward=True, activations=acts,
                                                                         buckets=ddp), self.device))

    def whole(self, named: dict) -> dict:
        """{name: tensor or None}; under --wrap fsdp the sharded ones (DTensors) gathered whole, the same on
        every rank (core.distributed.gathered: every rank calls it, in the same order)."""
        if self.spec.wrap != "fsdp" or (self.wrapper is None and self.pass_wrapper is None):
            return named
        from .distributed import gathered

        return gathered(named, self.device)

    def explain(self, error) -> None:
        """A model error on the meta device, or in reduced precision: say so (a fact we know), whatever
        the error's text says."""
        if getattr(error, "code", None) != ExitCode.MODEL:
            return
        if self.on_meta:
            error.hint = META_FAILED_HINT
        elif self._lr_overflows(error):
            p = self.precision
            error.hint = (f"{self.option('lr')} {self.spec.optimizer.learning_rate:g} is beyond {p.dtype}'s largest "
                          f"value ({p.facts.max:g}): the update cannot be computed in the weights' dtype; lower it, or "
                          f"keep float32 weights ({self.option('amp')})")
        elif self.precision.reduced:   # replaces the generic "the model raised" hint: this one is a known fact
            p, amp = self.precision, self.option("amp")
            given = f"{amp} {self.spec.amp}" if p.amp else f"{self.option('dtype')} {p.dtype}"
            instead = "without it (float32)" if p.amp else f"with {amp} instead (autocast keeps such ops in float32)"
            error.hint = (f"the model ran in {p.compute} ({given}); if it runs in float32, an op here has no "
                          f"{p.compute} kernel on {self.device.type} or needs matching dtypes: try {instead}")
        elif (guessed := self._guessed_ids(error)) is not None:
            error.hint = (f"the integer input values {guessed} were torchdiag's guess, not a range the model was seen "
                          "to read; give the range your data has: -i SHAPE:int64[LOW,HIGH) for each integer input")

    def _guessed_ids(self, error) -> str | None:
        """An index out of bounds in the model's code where torchdiag chose an integer input's values without seeing
        what reads them (a sweep: FT-Transformer's per-column offsets into a buffer got ids up to 30 of 27 rows, exit
        3 and "the model's own code raised"): that input's note."""
        from .tracking import RAISED_HINT

        text = str(getattr(error, "message", ""))
        # a tensor's index out of its bounds (an id past a buffer or a table), not a list's or a ModuleList's (a review:
        # heads[3] of 2 was blamed on the ids)
        if error.hint != RAISED_HINT or not re.search(r"out of bounds for dimension|index out of range in self", text):
            return None
        notes = getattr(self.observed[1], "notes", []) if self.observed else []
        return next((n.partition("integer values ")[2] for n in notes
                     if "integer values in [" in n and "consumes it" not in n), None)

    def _lr_overflows(self, error) -> bool:
        """The optimizer's step failed because its learning rate does not fit the weights' dtype (a review: SGD at lr
        1e6 on float16 weights was told an op has no float16 kernel)."""
        p, opt = self.precision, getattr(self.spec, "optimizer", None)
        lr = getattr(opt, "learning_rate", None)
        return (p.dtype is not None and p.reduced and lr is not None and abs(lr) > p.facts.max
                and "without overflow" in str(getattr(error, "message", "")))

    def observe(self, model, inputs) -> None:
        """What the auto loss learns from the model and its inputs before any forward: integer ids that
        feed an embedding make (N, T, V) logits a language model's (core.loss.language_model)."""
        from .guard import WRITTEN
        from .loss import language_model

        WRITTEN.clear()   # a run that raised before finish() left its own
        self.observed = (model, inputs) if inputs is not None else None
        if self.spec.loss == "auto" and self.batch_target is None and inputs is not None:
            self.lm = language_model(model, inputs)

    def inference_inputs(self, model, inputs):
        """`inputs` for a forward that computes no loss (profile's and memory's inference): a source's default loses
        the labels given so the model trains with its own loss (core.inputs.without_labels), and the header says the
        inputs it runs with."""
        from .inputs import without_labels

        out = without_labels(inputs, model)
        if out is not inputs and "inputs" in self.header:
            self.header["inputs"] = out.describe()
            self.header["input_source"] = out.source
            self.header["input_notes"] = out.notes
        return out

    def finish(self, result) -> None:
        """Put the choices made for the user in front of the diagnostic's own header."""
        header = dict(self.header)
        header.update(result.header)
        result.header = header
        for report in self.checkpoints:   # keys that did not fit (--no-strict): findings of every command
            report.add_findings(result)
        _written(result)
        unfit = sum(len(r.missing) + len(r.unexpected) + len(r.mismatched) for r in self.checkpoints)
        if unfit and (not result.verdict or result.verdict.startswith("PASS")):
            # those errors set the exit code: the last line says so, not PASS (a sweep: exit 1 under a PASS line),
            # and a command with no verdict line of its own (summary, flops) gets this one (a review)
            result.verdict = (f"FAIL: {unfit} checkpoint key(s) did not fit (run on with --no-strict-checkpoint)"
                              + (f"; the command itself: {result.verdict}" if result.verdict else ""))
        from .tracking import TRANSFORMED

        if TRANSFORMED:
            names = sorted(TRANSFORMED)
            result.notes.append(f"{len(names)} module(s) ran inside a torch.func transform (torch.vmap, grad, ...) and "
                                f"were not measured there: {', '.join(names[:6])}{' …' if len(names) > 6 else ''}")
        from .places import sort_findings

        result.findings = sort_findings(result.findings, None if result.ordered else self.places)


def loss_rule(rule, loaded=None, target=None, seed: int = 0):
    """A core.loss.Loss from a rule name / PATH:fn (resolved in the user's module) or a Python callable."""
    from .loss import Loss, resolve_loss

    if callable(rule) and not isinstance(rule, str):
        loss = Loss("custom", seed, target, custom=rule)
        loss.custom_name = getattr(rule, "__name__", "loss") + "()"
        return loss
    return resolve_loss(str(rule), loaded, target, seed)


def raise_meta(command: str):
    raise UsageError(f"{command} needs real values; the meta device has none", hint=META_HINT)


def prepare(spec: RunSpec, *, needs_values: bool = False):
    """Device, model, inputs (or --batch) and the context, for the CLI and `check`: (model, inputs, ctx)."""
    from . import sources
    from .device import resolve_device
    from .inputs import ModelInputs, resolve_inputs
    from .loading import (
        DENSE_GRAD_COMMANDS,
        dense_embeddings,
        eager,
        load_model,
        own_step_note,
    )
    from .precision import cast_inputs, cast_model, cast_overflow, check_supported

    device = resolve_device(spec.device)
    if needs_values and device.type == "meta":  # refused before the model is built
        raise_meta(spec.command)
    check_supported(spec, device)
    loaded = load_model(spec.model, list(spec.args), device, spec.seed, spec.download, run=spec)
    loaded.model = eager(loaded.model, spec.command, loaded.header)
    if sources.samples(spec.command) > 1:
        sources.for_samples(loaded, sources.samples(spec.command))
    if sources.trains(spec.command):
        sources.for_training(loaded, spec.command)   # a source's default batch of 1 breaks BatchNorm in train mode
        own_step_note(loaded.model, loaded.header)
        if spec.command in DENSE_GRAD_COMMANDS:
            dense_embeddings(loaded.model, loaded.header)   # the CLI's model is ours: not switched back
    checkpoints = load_checkpoints(spec, loaded, device)
    overflow = cast_overflow(loaded.model, spec.dtype)
    cast_model(loaded.model, spec.dtype)   # --dtype, once, after the weights: the CLI's model is ours
    batch_target = None
    if spec.batch:
        from .loss import load_batch

        inputs, batch_target = load_batch(spec.batch, device, spec.seed)
    elif spec.needs_inputs:
        # (dtype: a source's probe forwards run on the model cast above, their float inputs cast as these will be)
        inputs = resolve_inputs(list(spec.inputs), loaded, device, spec.seed, dtype=spec.dtype)
    else:
        inputs = ModelInputs()
    inputs = cast_inputs(inputs, spec.dtype)
    ctx = Context(spec, device, loaded, batch_target, header=_header(spec, device, loaded, inputs), checkpoints=checkpoints,
                  places=model_places(loaded.model))
    materialise(loaded.model, inputs if spec.needs_inputs or spec.batch else None, ctx.header)
    ctx.observe(loaded.model, inputs)
    if checkpoints:
        ctx.header["checkpoint"] = [r.describe() for r in checkpoints]
    ctx.overflow = overflow
    precision_header(ctx)
    return loaded.model, inputs, ctx


def precision_header(ctx: Context) -> None:
    """The precision in the header when the run asked for one (float32 runs keep their header as it was)."""
    if ctx.spec.dtype or ctx.spec.amp:
        ctx.header["precision"] = ctx.precision.describe() + (
            f"; {overflow_words(ctx.overflow, ctx.spec.dtype)}" if ctx.overflow and ctx.spec.dtype else "")


def load_checkpoints(spec: RunSpec, loaded, device) -> list:
    """--checkpoint, else the weights that came with the spec (hf: *.safetensors), into the built model."""
    from .checkpoint import load

    files = [spec.checkpoint] if spec.checkpoint else list(loaded.weights)
    off = {"cli": "--no-strict-checkpoint", "python": "strict_checkpoint=False"}.get(spec.caller, "strict-checkpoint = false")
    # --arg task put another head on a saved model (an MLM folder under a classifier, the usual fine-tuning start):
    # the keys only the new head has, and those only the saved one had, are what from_pretrained starts and drops
    saved = None if spec.checkpoint else getattr(loaded, "saved_keys", None)
    return [load(loaded.model, f, device, spec.strict_checkpoint, off, saved) for f in files]


def _header(spec: RunSpec, device, loaded, inputs) -> dict[str, Any]:
    header: dict[str, Any] = {"model": spec.model, "device": str(device), "seed": spec.seed}
    header.update(loaded.header)
    said = ("" if spec.checkpoint else header.pop("random", "")) + _unread(spec, loaded, header.pop("unread", []))
    header.pop("random", None)   # --checkpoint: the weights are the file's (a review: "random weights" beside it)
    if said:
        header["source"] = header.get("source", "") + said
    if loaded.kwargs:
        header["factory_args"] = {k: repr(v) if not isinstance(v, (int, float, str, bool, type(None))) else v
                                  for k, v in loaded.kwargs.items()}
    if loaded.built_on:
        header["built_on_meta_via"] = loaded.built_on
    if spec.needs_inputs:
        header["inputs"] = inputs.describe()
        header["input_source"] = inputs.source
        if inputs.notes:
            header["input_notes"] = inputs.notes
    return header


def _unread(spec: RunSpec, loaded, unread: list[str]) -> str:
    """The hf: folder's safetensors files not read: beside the weights from_pretrained reads, or all of them where
    --checkpoint replaced those (a review: the file given was said "not read")."""
    import os

    if spec.checkpoint:
        folder = os.path.dirname(loaded.weights[0]) if loaded.weights else ""
        given = os.path.realpath(spec.checkpoint)
        names = [n for n in [os.path.basename(w) for w in loaded.weights] + list(unread)
                 if os.path.realpath(os.path.join(folder, n)) != given]
        return f"; {', '.join(names[:3])}{', ...' if len(names) > 3 else ''} in the folder not read (--checkpoint given)" \
            if names else ""
    if not unread:
        return ""
    read = ", ".join(os.path.basename(w) for w in loaded.weights)
    why = f"from_pretrained reads {read}" if read else "a PEFT adapter is not the model's weights"
    return (f"; {', '.join(unread[:3])}{', ...' if len(unread) > 3 else ''} in the folder not read ({why}; "
            "--checkpoint FILE reads another)")


def model_device(model):
    """The device of a model a Python caller hands us (its first parameter or buffer; cpu if none)."""
    import torch

    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def context_for(model, spec: RunSpec, *, loss=None, target=None, spread=False) -> Context:
    """The Python API's context: the device is the model's own; `loss` may be a callable. `spread`: a model
    partly on meta is the command's to diagnose (Command.spread), not refused."""
    from .distributed import refuse_sharded
    from .loading import refuse_scripted
    from .meta import refuse_meta_tensors
    from .precision import check_supported

    refuse_scripted(model, "the model given")
    refuse_sharded(model, "the model given")
    if not spread:
        refuse_meta_tensors(model, "the model given", partly=True)
    custom = loss if callable(loss) and not isinstance(loss, str) else None
    ctx = Context(spec, model_device(model), None, target, custom_loss=custom, places=model_places(model))
    check_supported(spec, ctx.device)
    precision_header(ctx)
    return ctx


def _written(result) -> None:
    """Parameters the model's own forward wrote in place while the diagnostic ran it (guard.WRITTEN): said (info), as
    the run left them changed. Not a fault in itself: an Embedding's max_norm renormalises its rows in place as
    torch documents, a data-dependent init (Glow's ActNorm) writes on its first call (a review of a warning)."""
    from .guard import WRITTEN

    if not WRITTEN:
        return
    names = list(WRITTEN)
    WRITTEN.clear()
    shown = ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
    result.add("param-written-in-forward", "info", names[0] if len(names) == 1 else "model",
               f"the model's forward wrote {len(names)} parameter(s) in place ({shown}): the diagnostic's own calls "
               "left them changed, as a call of yours does",
               "as intended (an Embedding's max_norm, a data-dependent init) this is no fault; otherwise a weight "
               "should change only in the optimizer's step (w + 1, not w.add_(1)), and state the forward updates "
               "belongs in a buffer",
               members=names if len(names) > 1 else None)
