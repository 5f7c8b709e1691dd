"""Python API: each diagnostic over a model and inputs, returning the Result the CLI renders.

    import torchdiag
    r = torchdiag.flops(model, torch.randn(1, 3, 224, 224))
    r.data["forward_macs"], r.findings, r.to_dict()

`inputs` may be a tensor, a tuple/list (positional), a dict (keyword) or None (the model's
`example_input_array`). Run-wide keywords, the same on every function that uses them: `loss` (a rule
name: auto, cross_entropy, mse, sum; or a callable fn(output, target) -> scalar), `target` (a fixed
target tensor), `seed`, `optimizer`/`lr`/`momentum` (commands that take steps), `dtype` ("float32",
"bfloat16", "float16": the diagnostic runs on a cast copy), `amp` ("bf16", "fp16"; True = the device's
own: fp16 on CUDA, bf16 elsewhere). Every
other keyword is the diagnostic's own option, named as on the command line with `_` for `-`. The
model's own device is used. Nothing heavy is imported until a function is called."""
from __future__ import annotations

from typing import Any

from .commands import COMMANDS, RUN_OPTIONS

# the run-wide keywords of a Python call (the rest are the diagnostic's Options); loss is its own
RUN_KEYS = tuple(o.name for o in RUN_OPTIONS if o.python)
OPTIMIZER_KEYS = {"optimizer": "name", "lr": "lr", "momentum": "momentum"}


def as_inputs(model, inputs=None):
    """A ModelInputs from what a Python caller has at hand."""
    import torch

    from .core.inputs import ModelInputs
    from .errors import UsageError

    if isinstance(inputs, ModelInputs):
        return inputs
    if inputs is None:
        inputs = getattr(model, "example_input_array", None)
        if inputs is None:
            raise UsageError("no inputs: pass inputs=… or set model.example_input_array")
    if isinstance(inputs, torch.Tensor):
        return ModelInputs((inputs,), {}, "python").refuse_empty()
    if isinstance(inputs, dict):
        return ModelInputs((), dict(inputs), "python").refuse_empty()
    if isinstance(inputs, (tuple, list)):
        return ModelInputs(tuple(inputs), {}, "python").refuse_empty()
    raise UsageError(f"inputs must be a tensor, tuple, list or dict, not {type(inputs).__name__}")


def make_loss(loss: Any = "auto", target=None, seed: int = 0):
    """The loss rule object the diagnostics use (a rule name or a callable fn(output, target))."""
    from .core.context import loss_rule

    return loss_rule(loss, None, target, seed)


def _options(module, **kw):
    """Options(**kw), rejecting names the diagnostic does not have with a clear error."""
    import dataclasses

    from .errors import UsageError

    names = {f.name for f in dataclasses.fields(module.Options)}
    unknown = sorted(set(kw) - names)
    if unknown:
        raise UsageError(f"{module.__name__.rsplit('.', 1)[-1]}: unknown option(s) {', '.join(unknown)}",
                         hint=f"known: {', '.join(sorted(names))}")
    return module.Options(**kw)


def run_spec(command: str, diagnostic=None, *, loss: Any = "auto", **kw):
    """The RunSpec of a Python call: run-wide keywords are taken out of `kw` (the rest are Options)."""
    from .errors import OptionError
    from .runner.job import run_spec as build

    if "checkpoint" in kw:   # the model is the caller's own: torchdiag never changes it
        raise OptionError("checkpoint", "is for models torchdiag builds (the command line, check); in Python, load the "
                          "weights into your model first", hint="model.load_state_dict(safetensors.torch.load_file(path)) "
                          "or torch.load(path, weights_only=True), then call torchdiag")
    given = {field: kw.pop(key) for key, field in OPTIMIZER_KEYS.items() if key in kw}
    if given and getattr(diagnostic, "OPTIMIZER", None) is None:   # nothing trains: the keys would be ignored
        key = next(k for k, f in OPTIMIZER_KEYS.items() if f in given)
        raise OptionError(key, f"{command} takes no optimizer steps", hint=f"leave {key} out")
    if given and kw.get("mode") == "inference":   # as the command line says (a review: memory took it silently)
        key = next(k for k, f in OPTIMIZER_KEYS.items() if f in given)
        raise OptionError(key, f"{command} in mode 'inference' takes no optimizer steps",
                          hint=f"leave {key} out, or use mode='train'")
    run = {k: kw.pop(k) for k in RUN_KEYS if k in kw}
    if isinstance(run.get("amp"), bool):  # memory's amp=True: autocast in the device's own low precision
        run["amp"] = "auto" if run["amp"] else None
    return build(command, diagnostic, caller="python", optimizer=given, loss=loss if isinstance(loss, str) else "auto",
                 **run)


def run(command: str, model, inputs=None, *, loss: Any = "auto", target=None, **options):
    """Any diagnostic by its command name: `torchdiag.api.run("gradflow", model, x, strict=True)`."""
    from .commands import BY_NAME, get
    from .core.context import context_for, precision_header
    from .core.lazy import materialise
    from .core.loading import DENSE_GRAD_COMMANDS, dense_embeddings, eager
    from .core.precision import cast_copy, cast_inputs, cast_overflow
    from .runner.local import invoke

    if command not in BY_NAME:   # a KeyError before (a review)
        from .errors import UsageError

        raise UsageError(f"unknown command {command!r}", hint="one of: " + ", ".join(sorted(BY_NAME)))
    entry = get(command)
    # no model to hand it: check reads pyproject.toml, watch wraps a loop, data reads a loader, gradcheck a function
    if entry.target != "model":   # (reviews: tracebacks)
        from .errors import UsageError

        if entry.python is None:
            raise UsageError(f"{command} runs from the command line only (it reads its models from pyproject.toml)",
                             hint=f"torchdiag {command}; in Python, run each diagnostic it configures by name")
        raise UsageError(f"{command} takes no model and inputs", hint=f"call torchdiag.{entry.python}(...)")
    d = entry.diagnostic_module()
    spec = run_spec(command, d, loss=loss, **options)   # pops the run-wide keywords from options
    for key in (*RUN_KEYS, *OPTIMIZER_KEYS):
        options.pop(key, None)
    opts = _options(d, **options)
    said: dict = {}
    model = eager(model, command, said)   # a torch.compile'd model: the module it wraps (profile: as it is)
    ctx = context_for(model, spec, loss=loss, target=target, spread=entry.spread)
    ctx.header.update(said)
    raw = as_inputs(model, inputs) if getattr(d, "TAKES_INPUTS", True) else None
    materialise(model, raw, ctx.header)   # lazy modules: as the caller's own first forward would (core/lazy.py)
    # dtype=: the diagnostic gets a cast copy and cast float inputs; the caller's model is never changed
    ctx.overflow = cast_overflow(model, spec.dtype)
    precision_header(ctx)
    work = cast_copy(model, spec.dtype)
    given = cast_inputs(raw, spec.dtype) if raw is not None else None
    ctx.observe(work, given)   # the auto loss sees what the inputs feed (a language model's ids)
    switched = dense_embeddings(work, ctx.header) if command in DENSE_GRAD_COMMANDS else []
    try:
        return invoke(d, work, given, opts, ctx)
    finally:
        for m in switched:   # the caller's embeddings as they were
            m.sparse = True


def _command(command: str, doc: str):
    """torchdiag.<command>(model, inputs=None, **options): `run(command, ...)` under the command's own name."""
    def call(model, inputs=None, **options):
        return run(command, model, inputs, **options)

    call.__name__ = call.__qualname__ = command.replace("-", "_")
    call.__doc__ = doc
    return call


# torchdiag.<command>(model, inputs=None, **options) for every command the registry gives a plain Python
# function; embeddings, gradcam, gradcheck and data take other arguments, and watch is a context manager
# around the caller's loop: they are written out below
_OWN_SIGNATURE = ("embeddings", "gradcam", "gradcheck", "data", "watch")
for _c in COMMANDS:
    if _c.python and _c.python not in _OWN_SIGNATURE:
        globals()[_c.python] = _command(_c.name, f"{_c.summary} Options: those of `torchdiag {_c.name}`, with _ for -.")


def embeddings(model, inputs=None, *, layer: str, logdir=None, labels=None, **options):
    """The layer's output per sample; with `logdir`, the TensorBoard projector data is written under
    logdir/embeddings/ (by torchdiag.render.embeddings.write_projector, which you may also call yourself)."""
    result = run("embeddings", model, inputs, layer=layer, labels=labels, **options)
    if logdir is not None:
        from .render.embeddings import write_projector

        result.data["projector_dir"] = write_projector(result, logdir)
    return result


def gradcam(model, image, *, layer: str, **options):
    """Grad-CAM of `layer` for one image file (PNG/JPEG); options as `torchdiag gradcam` (size, mean,
    std, channels, target_class, alpha, topk). The heatmap (H×W in [0, 1]) is result.artefacts["heatmap"]."""
    return run("gradcam", model, None, layer=layer, image=str(image), **options)


def gradcheck(target, *inputs, **options):
    """Analytical vs numerical gradients (float64) of an autograd.Function subclass, an nn.Module or a
    function, at the given input tensors: `torchdiag.gradcheck(MyFn, torch.randn(3), torch.randn(3))`.
    Options: second_order, eps, atol, rtol, params (nn.Module parameters too), max_elements."""
    from .diagnostics import gradcheck as d

    return d.check_callable(target, inputs, _options(d, **options))


def data(dataset_or_loader, val=None, model=None, *, loss: Any = "auto", device=None, **options):
    """The data and its loader (`torchdiag data`): `dataset_or_loader` (and `val`) a Dataset, a DataLoader, an
    IterableDataset or any iterable of batches; `model` an nn.Module (never changed: its steps run on a copy).
    Options as `torchdiag data`, with _ for -: batch_size, samples, batches, timeout, input_field,
    target_field, classes, workers, sweep (False: --no-sweep), speed (False: --no-speed), per_class,
    pictures; run-wide: seed, loss, dtype/amp (for the model), device (default: the model's, else auto).
    A sample that raises is a ModelError naming its index (`.partial`: what was measured)."""
    from .core.context import context_for
    from .core.precision import cast_copy
    from .diagnostics import data as d
    from .errors import OptionError

    if "classes" in options:   # --classes on the command line; the Options field is num_classes
        options["num_classes"] = options.pop("classes")
    spec = run_spec("data", d, loss=loss, **options)   # pops the run-wide keywords from options
    for key in (*RUN_KEYS, *OPTIMIZER_KEYS):
        options.pop(key, None)
    opts = _options(d, **options)
    if model is None:
        for name in ("dtype", "amp"):
            if getattr(spec, name):
                raise OptionError(name, "applies to the model, and no model is given", hint="pass model=...")
        ctx = d.context("auto" if device is None else device, spec.seed, loss if isinstance(loss, str) else "auto")
        work = None
    else:
        if device is not None:
            raise OptionError("device", "is the model's own in Python", hint="move the model: model.to(device)")
        ctx = context_for(model, spec, loss=loss)
        work = cast_copy(model, spec.dtype)
    result = d.run_data(dataset_or_loader, opts, ctx, val=val, model=work)
    ctx.finish(result)
    return result


def watch(model=None, optimizer=None, *, every: int = 50, logdir=None, **options):
    """Watch the caller's own training loop: `with torchdiag.watch(model, optimizer) as w: ...`, then
    `w.result()` (a UsageError, exit 2, when no optimizer step was seen). optimizer=None: every optimizer
    that steps the model's parameters; model=None too: every model any optimizer trains. `w.log(name,
    value)` records a metric the loop computes, `w.set_epoch(epoch)` names the epoch in findings. logdir:
    TensorBoard events under logdir/watch/ while the run goes. Options: those of `torchdiag watch`, with _
    for - (accumulate, status, histograms, replay, spike, explode, ratio_high). Under torchrun, call w.result()
    on every rank: rank 0's Result holds every rank's findings, tagged with their ranks."""
    from .diagnostics.watch import Options, Watch
    from .render.watch import Live

    opts = Options(every=every, logdir=None if logdir is None else str(logdir), **options)
    live = Live(status=opts.status, logdir=opts.logdir)
    return Watch(model, optimizer, opts=opts, gather=_ranks_gather(), **live.callbacks())


def _ranks_gather():
    """Under torchrun: w.result() on every rank hands its report to rank 0, which returns them merged (the same
    exchange and merge as `torchdiag watch` under torchrun); None in one process."""
    from .core.distributed import current

    ranks = current()
    if ranks is None:
        return None
    from .runner.scripts import run_on_ranks

    return lambda own: run_on_ranks(ranks, own, others_own=True)


def watch_callback(kind: str, *, logdir=None, **options):
    """watch inside a trainer that owns the loop: kind "hf" (a transformers TrainerCallback; needs transformers
    and accelerate) or "lightning" (a lightning.pytorch Callback). `cb.result` is the Result once training
    ended; options as torchdiag.watch's."""
    from .diagnostics.watch import Options
    from .diagnostics.watch.callbacks import hf_callback, lightning_callback
    from .errors import UsageError
    from .render.watch import Live

    makers = {"hf": hf_callback, "lightning": lightning_callback}
    if kind not in makers:
        raise UsageError(f"watch_callback: kind must be one of {', '.join(makers)}, not {kind!r}")
    opts = Options(logdir=None if logdir is None else str(logdir), **options)   # checked before the trainer runs
    live = Live(status=opts.status, logdir=opts.logdir)
    return makers[kind](**options, logdir=opts.logdir, **live.callbacks())


__all__ = [*(c.python for c in COMMANDS if c.python), "as_inputs", "make_loss", "run", "watch_callback"]
