"""Python API: each diagnostic over a model and inputs, returning the Result the CLI renders.

    import torchdiag
    r = torchdiag.flops(model, torch.randn(1, 3, 224, 224))
    r.data["forward_macs"], r.findings, r.to_dict()

`inputs` may be a tensor, a tuple/list (positional), a dict (keyword) or None (the model's
`example_input_array`). `loss` is a rule name (auto, cross_entropy, mse, sum) or a callable
fn(output, target) -> scalar; `target` a fixed target tensor. Nothing heavy is imported until
a function is called, so `import torchdiag` stays fast."""
from __future__ import annotations

from typing import Any


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
        return ModelInputs((inputs,), {}, "python")
    if isinstance(inputs, dict):
        return ModelInputs((), dict(inputs), "python")
    if isinstance(inputs, (tuple, list)):
        return ModelInputs(tuple(inputs), {}, "python")
    raise UsageError(f"inputs must be a tensor, tuple, list or dict, not {type(inputs).__name__}")


def make_loss(loss: Any = "auto", target=None, seed: int = 0):
    from .core.loss import Loss, resolve_loss

    if callable(loss) and not isinstance(loss, str):
        rule = Loss("custom", seed, target, custom=loss)
        rule.custom_name = getattr(loss, "__name__", "loss") + "()"
        return rule
    return resolve_loss(str(loss), None, target, seed)


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


def summary(model, inputs=None, **options):
    from .diagnostics import summary as d

    return d.run(model, as_inputs(model, inputs), _options(d, **options))


def flops(model, inputs=None, *, loss="auto", target=None, **options):
    from .diagnostics import flops as d

    if options.get("backward"):
        options["loss"] = make_loss(loss, target)
    return d.run(model, as_inputs(model, inputs), _options(d, **options))


def _with_loss(name, model, inputs, loss, target, options, *, loss_factory=False):
    import importlib

    d = importlib.import_module(f"torchdiag.diagnostics.{name}")
    rule = (lambda: make_loss(loss, target)) if loss_factory else make_loss(loss, target)
    return d.run(model, as_inputs(model, inputs), _options(d, loss=rule, **options))


def nancheck(model, inputs=None, *, loss="auto", target=None, **options):
    return _with_loss("nancheck", model, inputs, loss, target, options)


def gradflow(model, inputs=None, *, loss="auto", target=None, **options):
    return _with_loss("gradflow", model, inputs, loss, target, options)


def overfit_batch(model, inputs=None, *, loss="auto", target=None, **options):
    return _with_loss("overfit_batch", model, inputs, loss, target, options)


def profile(model, inputs=None, *, loss="auto", target=None, **options):
    return _with_loss("profiling", model, inputs, loss, target, options)


def memory(model, inputs=None, *, loss="auto", target=None, **options):
    return _with_loss("memory", model, inputs, loss, target, options, loss_factory=True)


def doctor(model, inputs=None, *, loss="auto", target=None, **options):
    options.setdefault("batch_target", target)
    return _with_loss("doctor", model, inputs, loss, target, options)


def activations(model, inputs=None, **options):
    from .diagnostics import activations as d

    return d.run(model, as_inputs(model, inputs), _options(d, **options))


def attention(model, inputs=None, **options):
    from .diagnostics import attention as d

    return d.run(model, as_inputs(model, inputs), _options(d, **options))


def embeddings(model, inputs=None, *, layer: str, logdir=None, labels=None, **options):
    """The layer's output per sample; with logdir, TensorBoard projector data under logdir/embeddings/."""
    from .diagnostics import embeddings as d

    return d.run(model, as_inputs(model, inputs),
                 _options(d, layer=layer, logdir=None if logdir is None else str(logdir), labels=labels, **options))


def gradcam(model, image, *, layer: str, **options):
    """Grad-CAM of `layer` for one image file (PNG/JPEG, read as RGB); the model's own device is used.
    The heatmap (H×W in [0, 1]) is `result._heatmap`; options as `torchdiag gradcam` (size, mean, std,
    target_class, out, alpha, topk)."""
    from .diagnostics import gradcam as d

    tensors = list(model.parameters()) + list(model.buffers())
    device = tensors[0].device if tensors else "cpu"
    for key in ("mean", "std", "size"):
        if isinstance(options.get(key), list):
            options[key] = tuple(options[key])
    return d.run(model, device, _options(d, layer=layer, image=str(image), **options))


def gradcheck(target, *inputs, **options):
    """Analytical vs numerical gradients (float64) of an autograd.Function subclass, an nn.Module or a
    function, at the given input tensors: `torchdiag.gradcheck(MyFn, torch.randn(3), torch.randn(3))`.
    Options: second_order, eps, atol, rtol, params (nn.Module parameters too), max_elements."""
    import torch

    from .diagnostics import gradcheck as d
    from .errors import UsageError

    opts = _options(d, **options)
    label = getattr(target, "__qualname__", None) or type(target).__name__
    kind, fn = d.resolve_target(target, {}, label)
    if not inputs:
        raise UsageError(f"gradcheck needs inputs: torchdiag.gradcheck({label}, torch.randn(3), ...)")
    tensors = [t.detach().double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    d.check_arity(kind, fn, len(tensors), label)
    checked = d.build(kind, fn, tensors, [f"input[{i}]" for i in range(len(tensors))], opts, label)
    return d.run(checked, opts)


__all__ = ["summary", "flops", "nancheck", "gradflow", "overfit_batch", "profile", "memory", "doctor",
           "activations", "attention", "embeddings", "gradcam", "gradcheck", "as_inputs", "make_loss"]
