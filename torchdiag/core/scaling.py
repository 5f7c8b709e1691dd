"""Loss scaling under --amp fp16: the GradScaler's scale of every update, the updates it skipped, and,
when it skipped them all, the module where the first non-finite gradient appears.

torch's rule (torch.amp.GradScaler, defaults): the scale starts at 2**16; an update whose unscaled
gradients hold an inf/NaN is skipped and the scale is multiplied by 0.5; after 2000 consecutive
updates without one it is multiplied by 2. Every fact stays on the device and is read with the
caller's own per-step read (overfit-batch: its Trainer._read). The training steps of doctor,
overfit-batch and profile go through stepper()."""
from __future__ import annotations

from . import train
from .readback import read_back

INITIAL_SCALE = 2.0 ** 16   # torch.amp.GradScaler's starting scale


def judged_backward(loss, ctx, params, again=None) -> None:
    """The backward whose gradients a diagnostic judges (gradflow, doctor, their re-check runs). Under --amp fp16 a
    training step's backward is scaled by its GradScaler: gradients below float16's range unscaled are not lost
    there (timm edgenext_xx_small's 1e-6 layer scales left its blocks' gradients exactly 0: false `zero-grad`). So,
    after the plain backward, `again()` (a fresh forward and loss, seeded as the first) is run backward times the
    scaler's starting scale, and each parameter takes that gradient divided by the scale (scaler.unscale_) where it
    is finite, its plain one where not (an overflow at that scale: the scaler would skip the step and back off; one
    tensor's NaN no longer costs the others theirs). A fresh forward, not a retained graph: a custom Function may
    free its state in backward. Without fp16 autocast, or without `again`: the plain backward only."""
    import torch

    train.backward(loss)
    if not ctx.precision.scaled or again is None:
        return
    params = [p for p in params if p.requires_grad]
    plain = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        scaled = again()
        if scaled.requires_grad:
            train.backward(scaled * INITIAL_SCALE)
    except Exception:   # noqa: BLE001 - the plain gradients stand (a second forward the model refuses)
        for p, g in zip(params, plain):
            p.grad = g
        return
    with torch.no_grad():
        got = [p.grad for p in params]
        flags = [torch.isfinite(s).all() for s in got if s is not None]
        finite = iter(read_back(flags)) if flags else iter(())   # one read for every tensor
        for p, g, s in zip(params, plain, got):
            p.grad = s.div_(INITIAL_SCALE) if s is not None and next(finite) else g


class ScaledStep:
    """scaler.step + scaler.update behind an optimizer's step(), so core.train.step reports a failure."""

    def __init__(self, scaler, optimizer):
        self.scaler, self.optimizer = scaler, optimizer

    def step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()


def stepper(scaler, optimizer):
    """What core.train.step steps: the optimizer, or under fp16 the GradScaler around it."""
    return optimizer if scaler is None else ScaledStep(scaler, optimizer)


def scale_facts(scaler, optimizer) -> list:
    """[scale used by this update, 1.0 if it found inf/NaN gradients] as 0-d float32 device tensors;
    valid after scaler.unscale_(optimizer), before scaler.update()."""
    import torch

    scale = scaler._get_scale_async()
    found = list(scaler._found_inf_per_device(optimizer).values())
    inf = torch.stack([f.to(scale.device).float().reshape(()) for f in found]).amax() if found else \
        torch.zeros((), device=scale.device)
    return [scale.detach().clone().float().reshape(()), inf]


class GradWatch:
    """Hooks on every leaf module for one backward: a finite flag (on the device) of the gradient
    reaching each output, leaving towards each input, and of each own parameter's gradient, in the
    order autograd produces them."""

    def __init__(self, model):
        self.model = model
        self.events: list = []       # (module, kind, 0-d bool tensor: all finite)
        self._handles: list = []

    def _watch(self, name: str, kind: str, t) -> None:
        import torch

        if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex()):
            self._handles.append(t.register_hook(
                lambda g: self.events.append((name, kind, torch.isfinite(g.detach()).all()))))

    def __enter__(self):
        from .tracking import module_names

        names = module_names(self.model)
        for mod in {id(m): m for m in self.model.modules()}.values():
            if any(True for _ in mod.children()):
                continue
            name = names.get(id(mod), "?")
            self._handles.append(mod.register_forward_pre_hook(self._on_call(name, "input")))
            self._handles.append(mod.register_forward_hook(self._on_call(name, "output")))
            for p in mod.parameters(recurse=False):
                self._watch(name, "param", p)
        return self

    def _on_call(self, name: str, kind: str):
        """A forward (pre-)hook watching the call's inputs or outputs; it returns None (changes nothing)."""
        from .recording import float_tensors

        def hook(mod, args, out=None):
            for t in float_tensors(args if kind == "input" else out):
                self._watch(name, kind, t)
        return hook

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False


def culprit(events, flags) -> tuple[str, str] | None:
    """(module, how) of the first non-finite gradient, from the events in autograd order and their
    read-back finite flags: the first leaf whose own backward made it (input or parameter gradient
    non-finite while every gradient reaching its output was finite), else the first leaf that
    received it at its output (made by code outside any leaf module, e.g. the loss)."""
    bad_out: set[str] = set()
    first_out = None
    for (name, kind, _), ok in zip(events, flags):
        if ok:
            continue
        if kind == "output":
            bad_out.add(name)
            first_out = first_out or name
        elif name not in bad_out:
            what = "its parameter gradient" if kind == "param" else "the gradient towards its input"
            return name, f"its own backward makes {what} non-finite"
    if first_out is not None:
        return first_out, "the gradient reaching its output is already non-finite (made after it: the loss or code outside modules)"
    return None


def find_culprit(trainer, scale: float) -> tuple[str, str] | None:
    """One more forward + backward of the loss times `scale` (the first update's) on the trained copy,
    with GradWatch hooks; its parameters are the starting ones when every update was skipped."""
    from .readback import read_back

    work = trainer.work
    work.zero_grad(set_to_none=True)
    watch = GradWatch(work)
    with trainer.ctx.seeded(), watch:
        with trainer.autocast():
            value = trainer.loss_fn(trainer.batch.call(work))
        train.backward(value * scale)
    work.zero_grad(set_to_none=True)
    events = watch.events
    flags = read_back([e[2] for e in events]) if events else []
    return culprit(events, [f == 1.0 for f in flags])


def scale_summary(scales: list[float], skipped: list[bool]) -> str:
    """'65536 → 2048 (min 2048); 5 of 10 updates skipped' for the summary table."""
    if not scales:
        return "—"
    return (f"first {scales[0]:g}, last {scales[-1]:g}, min {min(scales):g}; "
            f"{sum(skipped)} of {len(skipped)} update(s) skipped")
