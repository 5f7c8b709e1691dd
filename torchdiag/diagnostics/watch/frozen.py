"""A model no optimizer trains, run under no_grad (or with its weights frozen) in train mode while another one trains:
a frozen teacher whose `.eval()` was forgotten, called at the top of the loop or inside a distiller's forward. Its
dropout draws new noise into every target it gives, and its BatchNorm running statistics follow the training batches
instead of the ones it was trained with. Seen while watch looks for the models (discovery, the first steps: `watch
--` and `Watch()` without a model; with models given, the steps up to the first read and the step after each read); judged at each read (with the read's values, no sync of its own, so a model the
script let go by the end keeps its last verdict): still in train mode, weights in no optimizer and unchanged, and a
dropout with p > 0 or a BatchNorm whose batch count grew. A module run again inside a backward is a checkpointed
layer of the trained model (any checkpoint recomputes there; a teacher is not run in a backward), and not judged.
A copy of the trained model (compared before the first update, one read) is said to be one: an EMA or target update
may come after the run's steps. Cost: a scan of the
module's submodules at its first such call, one read at the first step, and a few values per read."""
from __future__ import annotations

import weakref

from ...core.device import wide_float


class Probe:
    """What a module called under no_grad held at its first such call."""

    def __init__(self, module, step: int, sensitive: tuple):
        import torch

        from .engine import inner
        from .names import user_names

        m = inner(module)
        self.ref, self.step = weakref.ref(module), step
        self.name = ""
        dropout, bn = sensitive
        self.dropout = [n for n, s in m.named_modules() if isinstance(s, dropout) and s.training and s.p > 0]
        self.bns = [(n, weakref.ref(s), s.num_batches_tracked.detach().clone()) for n, s in m.named_modules()
                    if isinstance(s, bn) and s.training and s.track_running_stats and s.num_batches_tracked is not None]
        params = [p for p in m.parameters()]
        self.relevant = bool(params) and m.training and bool(self.dropout or self.bns)
        # weights that require grad, called with grad on: a teacher whose output the loop detaches, or the trained
        # model itself (dropped at the first read that finds its weights trained or given a gradient)
        self.trainable = any(p.requires_grad for p in params)
        # the gradients its weights held at first sight (a teacher trained before the run keeps its last .grad; a
        # review): only a gradient given since says a backward reaches it
        self.grads = [weakref.ref(p.grad) if p.grad is not None else None for p in params]
        with torch.no_grad():
            self.sum = torch.stack([_fingerprint(p).to(params[0].device) for p in params]).sum() \
                if self.relevant else None
        self.verdict: dict | None = None   # as of the last read (take)
        self.copy_checked = False          # compared with the trained weights before the first update (copies)
        self.copy = False                  # ... and found a copy of them
        if self.relevant:   # the name the calling frames give it (`teacher`), else its type
            names = user_names(module, lambda v: v is module)
            self.name = names[0] if names else type(m).__name__


LATER = object()   # frozen_probe: its lazy weights are not made yet, ask at its next call


def has_weights(module) -> bool:
    return next(iter(module.parameters()), None) is not None


def worth_asking(module, grad: bool, outer: bool, top: bool) -> bool:
    """Where the search makes a probe: the outermost call under no_grad (its caller had grad), or a call with grad at
    the top (a teacher whose output the loop detaches; the trained model too, until a read finds it trained)."""
    return (not grad and outer) or (grad and top and has_weights(module))


def recomputed(probe) -> None:
    """Run again inside a backward with grad on: a checkpoint's recomputation, a layer of the trained model (any
    checkpoint recomputes there; a teacher recomputed under no_grad by a fused loss's backward is not)."""
    if probe is not None:
        probe.relevant, probe.verdict = False, None


def passed_through(probe, output) -> None:
    """After a call with grad: frozen weights and an output a backward can go through are on the trained path."""
    if probe is not None and probe.relevant and not probe.trainable and probe.dropout and _requires_grad(output):
        on_trained_path(probe)


def _requires_grad(output) -> bool:
    from ...core.recording import float_tensors

    return any(t.requires_grad for t in float_tensors(output))


def frozen_probe(module, step: int, sensitive: tuple):
    """A Probe of `module` when it is worth judging (weights, train mode, a dropout or BatchNorm); None when not;
    LATER while a lazy weight is not made (a dry run under no_grad materialises them: a review's lazy student
    stopped watch). A failure here is never the run's: None."""
    from torch.nn.parameter import is_lazy

    from .engine import inner

    try:
        if not inner(module).training:   # in eval now (an evaluate() helper before training): asked again at its
            return LATER                  # next call, which may be in train mode (a review: cached as not judged)
        if any(is_lazy(p) for p in module.parameters()):
            return LATER
        if any(p.is_meta for p in module.parameters()):
            return None   # weights not there
        probe = Probe(module, step, sensitive)
    except Exception:   # noqa: BLE001 - a help, never a new failure of the run
        return None
    return probe if probe.relevant else None


def _fingerprint(p):
    """A weight's sum, as a real float (a complex weight's real and imaginary parts: a review's cast warned)."""
    import torch

    t = p.detach()
    return (torch.view_as_real(t) if t.is_complex() else t).float().sum()


TWINS = 0.9   # of a model's weights with an equal twin among the trained ones: a copy of the trained model


def prints(tensors: list) -> list[tuple]:
    """Each tensor's (shape, sum, sum of squares) in its device's widest float: one read (a device's values each moved
    to the CPU)."""
    return read_prints(pending_prints(tensors))


def pending_prints(tensors: list) -> tuple[list, list]:
    """prints' values still on their devices, unread: (shapes, [sum and sum of squares per tensor])."""
    import torch

    with torch.no_grad():
        real = [torch.view_as_real(q.detach()) if q.is_complex() else q.detach() for q in tensors]
        wide = [q.to(wide_float(q.device)) for q in real]
        return [tuple(q.shape) for q in tensors], [torch.stack([q.sum(), q.square().sum()]) for q in wide]


def read_prints(pending: tuple[list, list]) -> list[tuple]:
    import torch

    shapes, values = pending
    if not shapes:
        return []
    got = torch.stack([v.cpu() for v in values]).tolist()
    return [(shape, *v) for shape, v in zip(shapes, got)]


def copies(probes: list, trained: list, first: list | None = None) -> None:
    """Probes whose weights (at least TWINS of them) equal trained parameters as they were before the first update,
    shape and values (prints), are copies of the trained model: an EMA teacher or a target network whose update may
    come after the run's steps (a review: one updated every 50 steps was warned in a 40-step run), or a reference
    model that never changes (PPO's, DPO's: a later review, whose dropout in train mode is that bug). Still judged;
    the message says it is a copy. `first`: the trained parameters' (id, print) kept from before the first update,
    for a probe made later (a teacher inside a given wrapper, seen from step 2: a review); else taken now."""
    live = [(p, list(p.ref().parameters())) for p in probes if p.ref() is not None and not p.copy_checked]
    if not live or not (trained or first):
        return
    keys = prints([q for _, ps in live for q in ps] + ([] if first is not None else trained))
    theirs = first if first is not None else list(zip(map(id, trained), keys[-len(trained):]))
    at = 0
    for probe, ps in live:
        mine = keys[at:at + len(ps)]
        at += len(ps)
        own = {id(q) for q in ps}   # its own weights in the optimizer (over a distiller's parameters) are no twins
        twins = {k for i, k in theirs if i not in own}
        probe.copy_checked = True
        probe.copy = bool(ps) and sum(k in twins for k in mine) >= TWINS * len(ps)


def observe(probe: Probe, trained: set[int]):
    """What a read takes of a probe: (still in train mode, the names of its BatchNorms still there, the device values
    to read: [weights unchanged, each one's batch count now, then at first sight]), or None when the module is gone
    or trains (any weight one of `trained`, or given a gradient since first sight)."""
    import torch

    from .engine import inner

    module = probe.ref()
    if module is None or probe.sum is None or not probe.relevant:
        return None
    m = inner(module)
    params = list(m.parameters())
    if not params:
        return None
    # trained: weights that require grad in an optimizer (one never given a gradient is never-gets-grad: a teacher
    # never frozen in an optimizer over a distiller, or a model the loop cut off by mistake, which no read can tell
    # apart), or given a gradient since first sight (a backward reaches it)
    held = any(id(p) in trained and p.requires_grad for p in params)
    if held or (probe.trainable and _new_grad(probe, params)):
        probe.relevant, probe.verdict = False, None   # a model that trains, or one a backward reaches: not this
        return None
    live = [(n, bn, before) for n, r, before in probe.bns if (bn := r()) is not None]
    with torch.no_grad():
        now = torch.stack([_fingerprint(p).to(params[0].device) for p in params]).sum()
        wide = wide_float(now.device)
        values = torch.stack([(now == probe.sum.to(now.device)).to(wide)]
                             + [b.num_batches_tracked.to(now.device, wide) for _, b, _ in live]
                             + [before.to(now.device, wide) for _, _, before in live])
    return m.training, [n for n, _, _ in live], values


def _new_grad(probe: Probe, params: list) -> bool:
    if len(probe.grads) != len(params):
        return any(p.grad is not None for p in params)
    return any(p.grad is not None and (g is None or g() is not p.grad) for p, g in zip(params, probe.grads))


def on_trained_path(probe: Probe) -> None:
    """Frozen weights, an output a backward goes through: its input is trained (prompt tuning's soft prompt into a
    frozen LM, whose dropout the recipe keeps on). Its dropout is the recipe's; a BatchNorm whose count grows still
    follows the batches (a frozen perceptual network left in train mode: a review)."""
    probe.dropout = []
    if not probe.bns:
        probe.relevant, probe.verdict = False, None


def take(probe: Probe, training: bool, names: list[str], read: list) -> None:
    """A read's values (observe's): the probe's verdict as of that read, kept for the end (the model may be gone).
    Its weights changed (an EMA teacher, a copy loaded now and then): not this, whatever an earlier read said. Put in
    eval since: what an earlier read saw stands (a review: the usual `model.eval()` after training hid a teacher that
    gave 40 steps of targets in train mode)."""
    if not probe.relevant or read[0] != 1.0:
        probe.verdict = None
        return
    k = len(names)
    grew = [(n, int(read[1 + k + i]), int(read[1 + i])) for i, n in enumerate(names)
            if read[1 + i] > read[1 + k + i]]
    if training and (grew or probe.dropout):
        probe.verdict = {"name": probe.name, "step": probe.step, "dropout": probe.dropout, "bns": grew,
                         "copy": probe.copy}
