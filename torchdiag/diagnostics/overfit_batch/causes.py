"""Why a model could not memorise its batch, checked on the trained copy: parameters that never
changed or only ever got zero gradients, outputs identical across the samples (and the module that
makes them so), outputs squashed into a box where cross-entropy needs logits."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ...core.device import widened
from .span import span_floor

SAME_REL = 1e-6          # samples whose outputs differ by less than this (relative) are "identical"
NEAR_SAME = 0.05         # ... or the probabilities they give the batch's labels by less than this, with a
                         # cross-entropy at the label entropy (a collapse short of exact: _near_same)
AT_ENTROPY = 0.01        # ... within this share of it


@dataclass
class Causes:
    unchanged: list[str]
    zero: list[str]
    final_same: bool = False
    collapse: dict | None = None     # find_collapse()
    floor: float | None = None       # label entropy, when a batch-constant prediction is the best possible
    bounded: dict | None = None      # {box, classes, floor, needed}
    rounding: list | None = None     # core.rounding rows: reduced-precision weights whose update rounded away
    rounded_at: int = 0              # ... at this step (0: the first)
    moving: int = 0                  # ... of the elements with a non-zero gradient at that step (every reduced one)
    skip_culprit: tuple | None = None   # (module, how) of the first non-finite gradient when fp16 skipped every update
    own_floor: bool = False          # a custom loss at a minimum of its own: scaling the output does not lower it
    scaled: tuple | None = None      # (k, loss at k × output, loss): a custom loss the trained output's scale holds back
    out_of_range: dict | None = None  # {kind, floor}: mse against torchdiag's own target that the output's range cuts
    term_floors: list | None = None  # several terms, the first of a range: each term's {kind, floor} or None (term_floors)
    stranded: dict | None = None     # stranded.find(): samples a dead layer cuts off from every weight before it
    near_same: float | None = None   # the labels' probabilities alike across samples to this, the loss at the entropy
    batch_floor: Any = None          # () -> the cross-entropy floor of positions alike in input and answer, unlike in
                                     # target (ambiguity.batch_floor: read when a verdict asks)
    nonneg: str | None = None        # cross-entropy on class indices over an output >= 0, not bounded above: "made"
                                     # (torchdiag's random classes: features?) or "real" (given labels: a ReLU on logits?)


def sample_tensor(out, batch: int | None):
    """The first floating tensor of the output whose leading dimension is the batch."""
    import torch

    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() and out.dim() >= 1 and (batch is None or out.shape[0] == batch) else None
    items = out.values() if isinstance(out, dict) or hasattr(out, "keys") else out if isinstance(out, (tuple, list)) else ()
    for v in items:
        t = sample_tensor(v, batch)
        if t is not None:
            return t
    return None


def same_flag(t):
    """On the device, nothing read back: (a bool tensor "every sample along dim 0 equals the first",
    the max absolute difference as a float tensor); None when `t` has fewer than two samples."""
    import torch

    if t is None or t.dim() == 0 or t.shape[0] < 2:
        return None
    t = t.detach()
    if not t.is_floating_point():
        return (t == t[:1]).all(), torch.zeros((), device=t.device)
    t = t.float()
    diff = (t - t[:1]).abs().amax()
    return diff <= SAME_REL * t.abs().amax() + 1e-30, diff


def same_across_samples(t) -> tuple[bool, float]:
    """(every sample along dim 0 equals the first, max absolute difference): one read."""
    import torch

    flag = same_flag(t)
    if flag is None:
        return False, float("nan")
    same, diff = torch.stack([flag[0].float(), flag[1].float()]).tolist()
    return same == 1.0, diff


def accuracy_counts(out, loss):
    """(correct, counted) as tensors on the device, for cross-entropy losses (argmax over dim 1, or the last for a
    class per position there; ignore_index -100 skipped); None for other losses. Nothing is read back here."""
    import torch

    if loss.target is None:
        return None
    from ...core.loss import primary_output

    y, _ = primary_output(out)
    chosen = getattr(loss, "chosen", "")
    if chosen not in ("cross_entropy", "token_cross_entropy") and not _class_target(y, loss):
        return None
    target = loss.target.to(y.device)
    with torch.no_grad():   # (a class per position along the last dimension: a language model's given next ids)
        pred = y.detach().argmax(-1 if chosen == "token_cross_entropy" else 1)
        if target.is_floating_point():   # class probabilities
            target = target.argmax(1)
        keep = target != -100
        return ((pred == target) & keep).sum(), keep.sum()


def _class_target(y, loss) -> bool:
    """A custom loss (label smoothing, focal) whose target is class indices of the (N, C, …) output: its accuracy
    says whether the batch was memorised (a sweep: a label-smoothed loss at its floor was cannot-overfit). Asked
    once (one read), kept on the loss."""
    import torch

    if getattr(loss, "custom", None) is None:
        return False
    if loss.class_target is None:
        t = loss.target
        loss.class_target = bool(
            isinstance(y, torch.Tensor) and isinstance(t, torch.Tensor) and y.dim() >= 2 and y.shape[1] > 1
            and y.is_floating_point()
            and not t.is_floating_point() and t.dtype != torch.bool and tuple(t.shape) == (y.shape[0], *y.shape[2:])
            and bool((((t >= 0) & (t < y.shape[1])) | (t == -100)).all()))
    return loss.class_target


def accuracy(out, loss) -> float | None:
    """Batch accuracy for cross-entropy losses (None when nothing is counted, or another loss)."""
    import torch

    counts = accuracy_counts(out, loss)
    if counts is None:
        return None
    correct, n = torch.stack(counts).tolist()
    return correct / n if n else None


def entropy_floor(target) -> float:
    """Lowest cross-entropy any batch-constant prediction can reach: the entropy of the labels."""
    counts: dict[int, int] = {}
    for v in target.reshape(-1).tolist():
        counts[v] = counts.get(v, 0) + 1
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values())


def logit_range(out, loss) -> tuple[float, float] | None:
    """For cross-entropy with class-index targets: (lowest, highest) of the logits, read back once; None when the
    loss is another, the output is not a (N, C, ...) float tensor with C >= 2, or a value is not finite."""
    import torch

    if getattr(loss, "chosen", "") != "cross_entropy" or loss.target is None or loss.target.is_floating_point():
        return None
    from ...core.loss import primary_output

    try:
        y, _ = primary_output(out)
    except Exception:
        return None
    if not isinstance(y, torch.Tensor) or y.dim() < 2 or y.shape[1] < 2 or not y.is_floating_point():
        return None
    y = y.detach().float()
    finite, lo, hi = torch.stack([torch.isfinite(y).all().float(), y.amin(), y.amax()]).tolist()   # one read
    return (lo, hi) if finite == 1.0 else None


def output_box(span: tuple[float, float] | None) -> tuple[float, float] | None:
    """The interval every logit lies in (logit_range), when the output is squashed to [0, 1] (sigmoid, softmax)
    or [-1, 1] (tanh); None otherwise."""
    if span is None:
        return None
    lo, hi = span
    eps = 1e-6
    if lo >= -eps and hi <= 1 + eps:
        return 0.0, 1.0
    if lo >= -1 - eps and hi <= 1 + eps:
        return -1.0, 1.0
    return None


def nonneg_logits(span: tuple[float, float] | None) -> bool:
    """Cross-entropy against class indices over an output whose every value is >= 0 (logit_range; pooled ReLU
    features: a backbone built without its head). The loss then falls only as the target's own output rises, none
    of the others can go below 0, and the margin grows slowly: a 64-wide conv-BN-ReLU-pool trunk on 2 samples stays
    at 0.42x its start after 2000 Adam steps, 0.002x with a Linear head on it (a sweep: timm's resnet10t with
    num_classes=0, cannot-overfit with no cause found, batch accuracy 100%)."""
    return span is not None and span[0] >= 0


def bounded_floor(classes: int, box: tuple[float, float]) -> float:
    """Lowest cross-entropy reachable when every logit lies in `box`: the true class at the top of
    the box and every other class at the bottom, log(1 + (C - 1) e^-(hi - lo))."""
    return math.log1p((classes - 1) * math.exp(-(box[1] - box[0])))


def sphere_floor(p, classes: int) -> float | None:
    """Rows of norm 1 along the class dimension (an L2 normalisation at the end: an embedding tower): the lowest
    cross-entropy such a row reaches, where the box's floor is not reached. The largest margin between the true logit
    and the others (all equal) on the unit sphere is sqrt(C / (C - 1)) (a = sqrt((C-1)/C), b = -1/sqrt(C(C-1))), so
    the floor is log(1 + (C - 1) e^-sqrt(C / (C - 1))): 3.8616 for 128 classes, where the [-1, 1] box says 2.901 (a
    review's embedding tower ended at 3.8615). None when the rows are not all of norm 1."""
    norms = p.norm(dim=1)
    if not bool(((norms - 1).abs() <= 1e-3).all()) or classes < 2:
        return None
    return math.log1p((classes - 1) * math.exp(-math.sqrt(classes / (classes - 1))))


def find_collapse(work, batch) -> dict | None:
    """Forward hooks on every module: the first module (in completion order) whose input
    differs across the samples of the batch while its output is the same for every sample.
    Returns {"module", "type"} or {"inputs_identical": True} or None. The per-call flags stay on
    the device and are read back once, after the forward (one host sync at any depth)."""
    import torch

    bsz = batch.batch_size
    if not bsz or bsz < 2:
        return None
    names = {id(m): n for n, m in work.named_modules()}
    calls: list[tuple] = []           # (name, type, inputs vary: tensor | None, output same: tensor | None)

    def varies(obj):
        ts = []
        _tensors(obj, ts)
        flags = [same_flag(t) for t in ts if t.dim() >= 1 and t.shape[0] == bsz]
        return torch.stack([~f[0] for f in flags]).any() if flags else None

    def hook(mod, args, kwargs, output):
        out = same_flag(sample_tensor(output, bsz))
        calls.append((names.get(id(mod), "?"), type(mod).__name__, varies((args, kwargs)), out and out[0]))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in {id(m): m for m in work.modules()}.values()]
    try:
        with torch.no_grad():
            batch.call(work)
    except Exception:
        return None
    finally:
        for h in handles:
            h.remove()
    return _first_collapse(calls)


def _first_collapse(calls: list[tuple]) -> dict | None:
    """The verdict of find_collapse from its recorded flags (one read for all of them)."""
    import torch

    flags = [f for _, _, v_in, out in calls for f in (v_in, out) if f is not None]
    read = iter(torch.stack([f.to(flags[0].device) for f in flags]).tolist() if flags else [])
    values = [(name, kind, None if v_in is None else bool(next(read)), None if out is None else bool(next(read)))
              for name, kind, v_in, out in calls]
    for name, kind, v_in, same in values:
        if v_in and same:
            return {"module": name or "(root)", "type": kind}
    root = next((v_in for name, _, v_in, _ in values if name == ""), None)
    return {"inputs_identical": True} if root is False else None


def _tensors(obj, out):
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)


def diagnose(trainer, curve, opts) -> Causes:
    """The causes the report can name, from the trained copy (`trainer.work`) and its curve."""

    step = curve.step
    changed, ever_nonzero = trainer.final_flags() if step > 0 else ([], [])
    names = [n for n, _ in trainer.trainable]
    rounding, rounded_at, moving = _rounding(trainer) if step > 0 else ([], 0, 0)
    stuck = {r["name"] for r in rounding}     # never changed because the update rounds away: said once, there
    causes = Causes(
        unchanged=[n for n, moved in zip(names, changed) if not moved and n not in stuck],
        zero=[n for n, nonzero in zip(names, ever_nonzero) if not nonzero and n not in curve.missing],
        rounding=rounding, rounded_at=rounded_at, moving=moving)
    if curve.skipped and all(curve.skipped) and not curve.interrupted:
        causes.skip_culprit = _skip_culprit(trainer, curve)
    failed_plainly = not curve.interrupted and not curve.no_graph and curve.nonfinite_at is None \
        and curve.reached_at is None and curve.losses
    if failed_plainly:
        _final_output(trainer, curve, opts, causes)
        if causes.final_same:
            causes.collapse = find_collapse(trainer.work, trainer.batch)
        else:
            from .stranded import find

            causes.stranded = find(trainer)
    target = trainer.loss_fn.target
    if (causes.collapse or causes.near_same is not None) and getattr(trainer.loss_fn, "chosen", "") == "cross_entropy" \
            and target is not None \
            and not target.is_floating_point() and target.dim() == 1:
        causes.floor = entropy_floor(target.cpu())
    return causes


def _rounding(trainer) -> tuple[list[dict], int, int]:
    """Reduced-precision weights whose update mostly rounded away (counts read in final_flags), at the first step or
    at the latest later one counted, whichever left more elements unchanged; that step (0: the first); and how many
    elements had a non-zero gradient there (the share that can stop a fall is of those: an EmbeddingBag's rows the
    batch never reads made it 22x too small, a new user's bfloat16 run "too few to stop the fall" with every
    element that had a gradient unchanged)."""
    from ...core.rounding import rounded_away

    params = dict(trainer.trainable)
    best: tuple[list[dict], int, int] = ([], 0, 0)
    for step, counted, values in ((0, trainer.stagnation, trainer.stagnant_counts),
                                  (trainer.late[0], trainer.late[1], trainer.late_counts)):
        names = [n for n, _ in counted]
        dtypes = {n: str(params[n].dtype).replace("torch.", "") for n in names}
        rows = rounded_away(names, values, dtypes) if names else []
        if sum(r["unchanged"] for r in rows) > sum(r["unchanged"] for r in best[0]):
            best = (rows, step, int(sum(values[1::2])))
    return best


def _skip_culprit(trainer, curve):
    """Where the first non-finite gradient appears (core.scaling.find_culprit); None if that pass fails."""
    from ...core.scaling import find_culprit

    try:
        return find_culprit(trainer, curve.scales[0])
    except Exception:   # the training loop ran this model already: a failure here only loses the name
        return None


def _final_output(trainer, curve, opts, causes: Causes) -> None:
    """One more forward of the trained copy: identical outputs across samples, a bounded output."""
    import torch

    from ...core.loss import primary_output
    from .ambiguity import batch_floor, causal

    with torch.no_grad(), trainer.autocast():
        try:
            out = trainer.batch.call(trainer.work)
            causes.final_same, _ = same_across_samples(sample_tensor(out, trainer.batch.batch_size))
            if not causes.final_same:
                causes.near_same = _near_same(out, trainer.loss_fn, curve.losses)
                causes.final_same = causes.near_same is not None
            span = logit_range(out, trainer.loss_fn)
            box = output_box(span)
            if box is not None and box == output_box(curve.first_span):
                classes = int(primary_output(out)[0].shape[1])
                floor = bounded_floor(classes, box)
                needed = max(opts.target_ratio * curve.losses[0],
                             opts.target_loss if opts.target_loss is not None else -math.inf)
                p = primary_output(out)[0].detach().float()
                # (a [0, 1] output trained to one-hot has rows of norm 1 too, and its box's floor is the higher one)
                sphere = sphere_floor(p, classes) if box[0] < 0 else None
                floor = max(floor, sphere) if sphere is not None else floor
                if needed < floor and not _can_grow(trainer, lambda v, b=box: _outside(v, b)):
                    # each row a distribution (a softmax: the double-softmax bug under cross-entropy), or values
                    # bounded one by one (a multi-label sigmoid, a tanh) that the cross-entropy torchdiag chose misreads
                    rows = bool(p.min() >= 0) and bool(((p.sum(1) - 1).abs() <= 1e-3).all())
                    causes.bounded = {"box": box, "classes": classes, "floor": floor, "needed": needed,
                                      "distribution": rows, "sphere": sphere is not None}
            if box is None and nonneg_logits(curve.first_span) and nonneg_logits(span):
                if getattr(trainer.loss_fn, "made_target", False):
                    causes.nonneg = "made"
                elif span is not None and span[0] == 0.0:   # real labels: a value held at exactly 0, as a ReLU does
                    causes.nonneg = "real"                  # (logits shifted up by a bias are no fault: a review)
            causes.own_floor, causes.scaled = _own_floor(out, trainer.loss_fn)
            causes.batch_floor = functools.partial(
                batch_floor, curve.first_answers, out, trainer.loss_fn,
                lambda: causal(trainer.work, trainer.batch, out, trainer.autocast))
            if causes.scaled and _can_grow(trainer, _beyond(out, causes.scaled[0])):
                causes.scaled = None   # the weights scale it themselves: a loss still on its way (a custom dice loss)
            start = curve.first_terms[0][1] if curve.first_terms else curve.losses[0]   # the first output's own term
            causes.out_of_range = made_target_floor(out, trainer.loss_fn, opts.target_ratio * start, trainer.fits,
                                                     curve.first_bounds)
            if causes.out_of_range is None and not curve.first_terms and _made_mse(trainer.loss_fn):
                causes.out_of_range = _span(trainer, out)
            if causes.out_of_range and curve.first_terms:
                causes.term_floors = term_floors(out, trainer.loss_fn, causes.out_of_range, curve.first_terms, opts)
        except Exception:
            causes.final_same = False


GROW_STEPS = (0.25, 1.0, 4.0)   # parameter steps along the gradient of the output's size, in units of their norm


def _can_grow(trainer, reached) -> bool:
    """The trained weights can make the primary output `reached(values)`: a step along the gradient of its squared
    size (each a GROW_STEPS multiple of the parameters' norm) gets there, on the parameters as values
    (functional_call: the copy is not changed). A squashing at the end (a softmax, a tanh, a sigmoid, x 0.05 after
    one) never lets it; a plain Linear head whose logits were still small does (a new user's --steps 10 run was told
    "a tanh at the end?" at a largest logit of 0.59). False where the probe cannot run: the finding stands as
    before."""
    import torch
    from torch.func import functional_call

    from ...core.loss import primary_output

    work, batch = trainer.work, trainer.batch
    params = {n: p for n, p in work.named_parameters() if p.requires_grad and p.is_floating_point()}
    try:
        with torch.enable_grad(), trainer.autocast():
            y = primary_output(batch.call(work))[0]
            grads = torch.autograd.grad(y.float().square().sum(), list(params.values()), allow_unused=True)
        moved = {n: (p, g) for (n, p), g in zip(params.items(), grads) if g is not None}
        gnorm = torch.stack([g.float().norm() for _, g in moved.values()]).norm()
        pnorm = torch.stack([p.detach().float().norm() for p, _ in moved.values()]).norm()
        unit = float(pnorm / gnorm) if float(gnorm) > 0 else 0.0
        with torch.no_grad(), trainer.autocast():
            for a in GROW_STEPS:
                step = {n: p.detach() + (a * unit) * g.to(p.dtype) for n, (p, g) in moved.items()}
                def stepped(*xs, _torchdiag_step=step, **kw):
                    return functional_call(work, _torchdiag_step, xs, kw)
                if unit and reached(primary_output(batch.call(stepped))[0]):
                    return True
    except Exception:   # an explanation only
        return False
    return False


def _outside(y, box: tuple) -> bool:
    """Values half the box's width or more beyond it: no squashing into that box gives them."""
    import torch

    lo, hi = box
    margin = (hi - lo) / 2
    return isinstance(y, torch.Tensor) and bool(((y < lo - margin) | (y > hi + margin)).any())


def _beyond(out, k: float):
    """`reached` for a custom loss that a k x scale of the output lowers: values k times the largest there now."""
    import torch

    from ...core.loss import primary_output

    top = float(primary_output(out)[0].detach().float().abs().amax())
    return lambda y: isinstance(y, torch.Tensor) and top > 0 and float(y.detach().float().abs().amax()) >= k * top


def _span(trainer, out) -> dict | None:
    """span.span_floor on the trained copy; None when it cannot be read (its own failure is no verdict's)."""
    from ...core.loss import primary_output

    try:
        return span_floor(trainer.work, trainer.batch.call, primary_output(out)[0], trainer.loss_fn.target,
                          trainer.start)
    except Exception:   # noqa: BLE001 - a floor not read leaves the verdict as it was
        return None


def _near_same(out, loss, losses: list[float]) -> float | None:
    """A cross-entropy over class indices that levelled at the label entropy (within AT_ENTROPY), the best any answer
    the same for every sample reaches, with the probabilities each sample gives the batch's labels alike across
    samples to NEAR_SAME (absolute): the model collapsed to one answer, short of exactly (a review: timm's ViT-R/S16 at
    Adam 1e-3 gave two samples logits alike to 2e-5, the loss at ln 2, each label at one half for both, and the error
    said no mechanical cause; the other 998 logits may differ and not move the loss). That largest difference, or
    None. A run of fewer than MIN_STEPS steps has not levelled anywhere: a fresh head's near-uniform answer starts
    near that level (a sweep: `--steps 1` on a healthy digits MLP, its loss 2.31 -> 2.29 beside the entropy 2.28,
    was told its outputs collapsed in training)."""
    import torch

    from ...core.loss import primary_output
    from .trend import MIN_STEPS

    last = losses[-1]

    target = loss.target
    y = primary_output(out)[0]
    if getattr(loss, "chosen", "") != "cross_entropy" or target is None or target.is_floating_point() \
            or target.dim() != 1 or not math.isfinite(last) or y.dim() != 2 or y.shape[0] != target.shape[0]:
        return None
    with torch.no_grad():   # on the device, one read: the label entropy and the largest difference
        t = target.to(y.device)
        keep = (t >= 0) & (t < y.shape[1])
        counts = torch.zeros(y.shape[1], device=y.device).scatter_add_(0, t.clamp(0, y.shape[1] - 1), keep.float())
        freq = counts / counts.sum().clamp_min(1)
        entropy = -torch.where(freq > 0, freq * freq.clamp_min(1e-30).log(), 0.0).sum()
        p = torch.softmax(y.detach().float(), dim=1)
        diff = ((p - p[:1]).abs() * (counts > 0)).amax()
        floor, share = torch.stack([entropy, diff.to(entropy.dtype)]).tolist()
    if floor <= 0 or abs(last - floor) > AT_ENTROPY * floor:
        return None
    if len(losses) <= MIN_STEPS:
        return None
    return share if share <= NEAR_SAME else None


def made_target_floor(out, loss, goal: float = 0.0, fits: dict | None = None, start: tuple | None = None) -> dict | None:
    """mse against a target torchdiag drew (N(0, 1)), on an output whose trained values still keep to a range: unit
    length along the last dimension or dimension 1 (normalised embeddings, a channel-first descriptor map), each row
    a distribution (a softmax), every value in [0, 1] or [-1, 1] (a sigmoid or tanh map), or none below 0, where the
    first output kept to that as well (a depth head's 10 x sigmoid, a softplus or ReLU output: GLPN's depth). The
    lowest loss any output in that range reaches is the target's distance to it, mse(projection of the target,
    target). A sweep:
    PP-OCRv5's sigmoid map levelled at 0.46 x its start, ColQwen2's unit rows at 0.65 x, both cannot-overfit. Told
    within the output dtype's rounding (bfloat16 rows are unit to ~4e-3). {kind, floor}, or None (a given target,
    another loss, a single value). `goal`: the loss the run had to reach (a LayerNorm's floor far below
    it is not fitted: `_layernorm_floor`). `fits`: LayerNorm floors fitted before, by dimension (the target is the
    run's own, so a fit holds for the run). With several terms (other outputs covered), the first output's floor
    (each term against its own: `term_floors`, report._at_term_floors). `start`: start_bounds of the first step."""
    from ...core.loss import primary_output

    if not _made_mse(loss):
        return None
    return range_floor(primary_output(out)[0], loss.target, goal, fits, start)


def start_bounds(out, loss) -> tuple | None:
    """(lowest, highest) value of the output a made-up mse target is fitted to, before training (one read), or None:
    a range read at the end holds for the model only where its start kept to it too."""
    import torch

    from ...core.loss import primary_output

    if not _made_mse(loss):
        return None
    y = primary_output(out)[0]
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.numel() < 2:
        return None
    y = y.detach()
    lo, hi = torch.stack([y.amin().float(), y.amax().float()]).tolist()
    return lo, hi



def constant_loss(out, loss) -> float | None:
    """The made-up mse's value for an output that answers every sample with the target's mean (what a model that
    ignores its input reaches), or None: a given target, several terms, fills left out of the loss, one sample, or an
    output of another shape. A property of the target alone (one read, at the start)."""
    import torch
    import torch.nn.functional as F

    from ...core.loss import primary_output

    if not _made_mse(loss) or loss.extra or any(m is not None for m in (getattr(loss, "fill_masks", None) or {}).values()):
        return None
    y, t = primary_output(out)[0], loss.target
    if not isinstance(y, torch.Tensor) or y.shape != t.shape or y.dim() < 1 or y.shape[0] < 2:
        return None
    t = t.detach().float()
    return float(F.mse_loss(t.mean(0, keepdim=True).expand_as(t), t))


def _made_mse(loss) -> bool:
    return getattr(loss, "chosen", "") == "mse" and bool(getattr(loss, "made_target", False)) and loss.target is not None


def term_floors(out, loss, first: dict, starts: list, opts) -> list | None:
    """With other outputs covered (the first keeping to a range, `first`): each term's floor in the loss's order,
    {kind, floor} or None where the output keeps to no range, each against its own made-up target (LayerNorm fits
    made afresh: read once, at the end). None when a term has no floor to tell: a scalar output counted as it is
    (a loss of the model's own), or a target that was given."""
    from ...core.loss import float_outputs

    tensors = dict(float_outputs(out))
    rules = {label: (rule, target) for label, rule, target in loss.extra or ()}
    floors: list = [first]
    for label, start in starts[1:]:
        rule, target = rules.get(label, ("model", None))
        if rule == "same" and loss.chosen == "mse":
            target = loss.target
        elif rule == "same":   # cross_entropy against the first output's classes: no range to read
            floors.append(None)
            continue
        if rule == "model" or target is None or label not in tensors:
            return None
        floors.append(range_floor(tensors[label], target, opts.target_ratio * start, {}))
    return floors


def floor_of(found: dict | None, start: float) -> float:
    """A term's floor from term_floors' entry, 0 where its output keeps to no range (or the floor says nothing)."""
    return found["floor"] if found and 0 < found["floor"] < start else 0.0


def terms_within(values, starts, floors, ratio: float, slack: float = 1.0) -> bool:
    """Each term within `slack` x the target ratio of its fall from its start to its floor (report._at_term_floors,
    and the loop's stop at the floors)."""
    return all(v - f <= slack * ratio * (s - f) for v, s, f in zip(values, starts, floors))


def range_floor(y, t, goal: float = 0.0, fits: dict | None = None, start: tuple | None = None) -> dict | None:
    """made_target_floor's reading of one output `y` against its made-up target `t`; `start`: the (lowest, highest)
    value of the same output before training (start_bounds), which the range must hold too."""
    import torch
    import torch.nn.functional as F

    if not isinstance(y, torch.Tensor) or y.shape != t.shape or y.numel() < 2 or not y.is_floating_point():
        return None
    t = t.to(y.device).float()
    if y.dim() >= 1 and y.shape[0] > 1 and same_across_samples(y)[0]:
        return None   # a stuck output's values tell no range (a review: a head at one prediction, inside [-1, 1])
    tol = max(1e-4, 8 * torch.finfo(y.dtype).eps)
    y = y.detach().float()
    dims = [d for d in ((y.dim() - 1, 1) if y.dim() >= 3 else (y.dim() - 1,)) if y.dim() >= 2 and y.shape[d] > 1]
    checks = [(y.norm(dim=d) - 1).abs().amax() for d in dims]
    checks += [(y.sum(-1) - 1).abs().amax() if y.dim() >= 2 else torch.tensor(math.inf, device=y.device)]
    finite, lo, hi, *off = torch.stack([torch.isfinite(y).all().float(), y.amin(), y.amax(),
                                        *[c.to(y.device).float() for c in checks]]).tolist()   # one read
    if finite != 1.0:
        return None
    if start is not None and all(math.isfinite(v) for v in start):   # the range is the model's only where its first
        lo, hi = min(lo, start[0]), max(hi, start[1])   # output kept to it too (a sweep: GLPN's sigmoid x 10, from 5,
    unit = [d for d, o in zip(dims, off) if o < tol and lo >= -1 - tol and hi <= 1 + tol]   # ran into 0: "[0, 1]")
    if unit:   # first: unit rows keep to [-1, 1] too, and the sphere is the tighter range
        kind, near = "unit length along dimension " + str(unit[0] if unit[0] != y.dim() - 1 else -1), \
            F.normalize(t, dim=unit[0])
    elif lo >= -tol and hi <= 1 + tol and off[-1] < tol:
        kind, near = "rows that are distributions (non-negative, summing to 1)", _simplex(t)
    elif lo >= -tol and hi <= 1 + tol:
        kind, near = "[0, 1]", t.clamp(0, 1)
    elif lo >= -1 - tol and hi <= 1 + tol:
        kind, near = "[-1, 1]", t.clamp(-1, 1)
    elif lo >= -tol and start is not None and (t < -tol).any():   # (the start read too: a free output starts signed)
        kind, near = "[0, ∞) (no value below 0)", t.clamp(min=0)
    else:
        return _layernorm_floor(y, t, dims, tol, goal, fits)
    return {"kind": kind, "floor": float(F.mse_loss(near, t)), "real": real_beyond(kind)}


def real_beyond(kind: str) -> str:
    """The real targets a range cannot fit, said beside a made-up target's floor (a review: a [0, ∞) output was told
    "behind a final sigmoid or tanh", where a ReLU, softplus, exp, abs or square makes it)."""
    if kind.startswith("[0, ∞)"):
        return "a signed regression target behind a final ReLU, softplus, exp, abs or square"
    if kind == "[-1, 1]":
        return "a regression target beyond ±1 behind a final tanh"
    if kind == "[0, 1]":
        return "a regression target outside [0, 1] behind a final sigmoid"
    return "a regression target behind a final sigmoid, tanh or normalisation"


def _layernorm_floor(y, t, dims, tol: float, goal: float, fits: dict | None = None) -> dict | None:
    """Rows along a dimension that a LayerNorm made (each standardised, then one scale and shift per feature), told
    by their values, with at least twice as many rows as unknowns: every row keeps one linear relation, the same
    for all (its mean taken out: the centred rows, columns at unit length, have a singular value near 0, where a
    random matrix's smallest stays far from it), and each row's weighted spread is fixed (`_spread_fixed`). Its
    floor is the best LayerNorm output fitted to the target (`_fit_standardised`). A relation alone is no range: a
    Linear one unit short of its outputs keeps one too, and trains its hyperplane onto the target's best (a review:
    a bottleneck passed). Not fitted when a LayerNorm output made from the target itself (scale 1, shift 0) is
    already below a tenth of `goal`: such a floor cannot move a verdict (a review: 26 s for 0.0005 x the start). A
    sweep: TIPSv2's text model (width 32, 128 token rows) levelled at 0.0113 x the start, cannot-overfit; the
    fitted floor is 0.0109 x."""
    import torch
    import torch.nn.functional as F

    fits = {} if fits is None else fits
    for d in dims:
        if d in fits and fits[d] is None:   # told before in this run: a LayerNorm's range too small to matter
            return None
        rows, trows = (widened(a.movedim(d, -1).reshape(-1, y.shape[d])) for a in (y, t))
        n, k = rows.shape
        if n < 2 * (k + 1):
            continue
        centred = rows - rows.mean(0)
        scale = centred.norm(dim=0)
        if not bool(scale.amin() > tol * scale.amax()):   # a constant column (a dead channel, a zeroed position)
            continue                                       # keeps the relation trivially (a review): no LayerNorm's
        scale = scale.clamp_min(1e-300)
        spread, vecs = torch.linalg.eigh((centred / scale).T @ (centred / scale))   # n·k² work, no SVD copy
        near = F.mse_loss(F.layer_norm(trows, (k,)), trows)   # a LayerNorm output: the floor is at most this
        flat, start = torch.stack([spread[0].clamp_min(0) / spread[-1], near]).tolist()   # one read
        if not flat < tol ** 2 or not _spread_fixed(rows, vecs[:, 0] / scale, tol):   # (0/0: constant rows)
            continue
        if start <= goal / 10:   # (the target is the run's: so at every later extension, without the work above)
            fits[d] = None
            return None
        if d not in fits:
            fits[d] = _fit_standardised(trows)
        where = "the last dimension" if d == y.dim() - 1 else f"dimension {d}"
        return {"kind": f"a LayerNorm's range along {where} (each row standardised, then one scale and shift "
                        "per feature)", "floor": fits[d], "fitted": True}
    return None


SPREAD_TOL = 0.05   # rows that only keep the relation leave ~sqrt(2 / width) of q: 0.25 at width 32
SPREAD_SHARE = 0.2  # ... and a LayerNorm's rows at most this share of that (its eps: below)


def _spread_fixed(rows, a, tol: float) -> bool:
    """With the relation's weights `a` (a LayerNorm's 1 / scale), each row's weighted second moment about one shared
    centre b is the same: sum a²(y - b)² = K, linear in (a²b, K) once expanded, so its residual from a least-squares
    fit on [rows, 1] is ~0 for a LayerNorm's rows and not for rows that only keep the relation (~sqrt(2 / width)).
    The LayerNorm's eps makes a row of variance v spread v / (v + eps), not exactly 1: a trained model's rows left
    0.5-3% of q mid-run (a 16-wide output, pre-norm rows of variance ~1e-3 in some samples), so the bound is a fifth
    of what the relation alone leaves, within SPREAD_TOL, and never under ten times the relation's tolerance (the
    dtype's rounding). Ten times that tolerance alone was the bound before: detection failed until step 11,000 of
    that run, and a --steps 5000 budget ended in a false cannot-overfit."""
    import torch

    q = (rows * a) ** 2 @ torch.ones(rows.shape[1], dtype=rows.dtype, device=rows.device)
    x = torch.cat([rows, torch.ones_like(rows[:, :1])], dim=1)
    fit = x @ torch.linalg.lstsq(x, q.unsqueeze(1)).solution
    left, size = torch.stack([(q - fit.squeeze(1)).norm(), q.norm()]).tolist()
    return left <= min(SPREAD_TOL, max(10 * tol, SPREAD_SHARE * math.sqrt(2 / rows.shape[1]))) * size


FIT_STEPS, FIT_VALUES = 3000, 1 << 20   # the fit's cost: its steps, and the most values it is run on


def _fit_standardised(trows) -> float:
    """The lowest mse a LayerNorm's output (each row standardised, then one scale and shift per feature) reaches on
    the target rows, fitted from the target itself (Adam, FIT_STEPS steps, on at most FIT_VALUES values: beyond,
    an even sample of rows, whose fit is the floor's estimate). An upper estimate of the true floor, so a model
    nearing it has gone as far as its range allows."""
    import torch
    import torch.nn.functional as F

    keep = max(1, trows.shape[0] * trows.shape[1] // FIT_VALUES)
    t = trows[::keep].float()
    with torch.enable_grad():
        u = t.clone().requires_grad_()
        w, b = torch.ones_like(t[0]).requires_grad_(), torch.zeros_like(t[0]).requires_grad_()
        opt = torch.optim.Adam([u, w, b], lr=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, FIT_STEPS)
        for _ in range(FIT_STEPS):
            opt.zero_grad()
            F.mse_loss(F.layer_norm(u, t.shape[-1:], w, b), t).backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        return float(F.mse_loss(F.layer_norm(u, t.shape[-1:], w, b), t))


def _simplex(t):
    """Each last-dimension row of `t` projected onto the probability simplex (the sort-based projection)."""
    import torch

    u = torch.sort(t, dim=-1, descending=True).values
    css = u.cumsum(-1) - 1
    k = torch.arange(1, t.shape[-1] + 1, device=t.device, dtype=t.dtype)
    rho = ((u - css / k) > 0).sum(-1, keepdim=True).clamp_min(1)
    theta = css.gather(-1, rho - 1) / rho.to(t.dtype)
    return (t - theta).clamp_min(0)


SCALES = (0.5, 2.0, 4.0)


def _own_floor(out, loss) -> tuple[bool, tuple | None]:
    """(the floor is the loss's own, (k, loss at k × output, loss) when a scale lowers it by 5% or more). A custom
    loss whose value the trained output cannot lower by being scaled (0.5x, 2x, 4x) is at a minimum of its own (label
    smoothing's margin is reached), not at the output's range; a softmax or a tanh x 0.05 before a custom
    cross-entropy is lowered 2x or 4x over (a review: both were passed as 'memorised at the loss's floor')."""
    import torch

    if getattr(loss, "custom", None) is None or not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return False, None
    here = float(loss(out))
    if not math.isfinite(here):
        return False, None
    at = [(k, float(loss(out * k))) for k in SCALES]
    best = min(at, key=lambda a: a[1])
    lower = best if best[1] < here - 0.05 * abs(here) else None
    return here > 0 and all(v >= here - 1e-3 * abs(here) for _, v in at), (lower + (here,)) if lower else None
