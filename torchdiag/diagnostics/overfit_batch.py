"""overfit-batch: can this model memorise one fixed batch?

A COPY of the model (`copy.deepcopy`, train mode) is trained on one batch with the loss rules of
core/loss.py. Step k evaluates the loss (``loss[k]``); when the target is reached, the budget is
spent or the loss is non-finite the run stops, otherwise one backward and one optimizer step follow.
So ``loss`` has ``steps + 1`` entries: ``loss[0]`` is the initial loss, ``loss[-1]`` the loss after
the last update; ``grad_norm``/``learning_rate`` have one entry per update.

Pass: ``final ≤ target_ratio × initial`` (and batch accuracy 100% when the loss is cross-entropy),
or ``final ≤ target_loss``. On failure the likely causes are checked on the trained copy:
non-finite loss, parameters without gradients, parameters that never changed, a loss flat from the
start, outputs identical across the samples of the batch (and the first module that makes them so),
outputs squashed into [0, 1] or [-1, 1] where cross-entropy needs logits (the target then lies below
the lowest reachable loss).
Ctrl-C inside the loop returns the partial result with ``interrupted: true`` (exit 130).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..core.guard import leave_no_trace
from ..errors import DiagError, ExitCode, ModelError, UsageError, one_line
from ..results import Column, Result, Table

OPTIMIZERS = ("adam", "adamw", "sgd")
DEFAULT_LR = {"adam": 1e-3, "adamw": 1e-3, "sgd": 1e-2}
AMP = ("none", "bf16", "fp16")
FLAT_REL = 1e-3          # best loss within 0.1% of the initial loss: "flat from the start"
SAME_REL = 1e-6          # samples whose outputs differ by less than this (relative) are "identical"


@dataclass
class Options:
    steps: int = 500
    optimizer: str = "adam"
    lr: float | None = None           # None: DEFAULT_LR[optimizer]
    seed: int = 0
    target_ratio: float = 0.01
    target_loss: float | None = None
    amp: str = "none"
    loss: Any = None                  # core.loss.Loss; None: auto
    on_step: Callable[[int, float], None] | None = None   # called after each loss evaluation
    max_names: int = 10


def _sample_tensor(out, batch: int | None):
    """The first floating tensor of the output whose leading dimension is the batch."""
    import torch

    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() and out.dim() >= 1 and (batch is None or out.shape[0] == batch) else None
    items = out.values() if isinstance(out, dict) or hasattr(out, "keys") else out if isinstance(out, (tuple, list)) else ()
    for v in items:
        t = _sample_tensor(v, batch)
        if t is not None:
            return t
    return None


def same_across_samples(t) -> tuple[bool, float]:
    """(every sample along dim 0 equals the first, max absolute difference)."""
    import torch

    if t is None or t.dim() == 0 or t.shape[0] < 2:
        return False, float("nan")
    t = t.detach()
    if not t.is_floating_point():
        return bool(torch.equal(t, t[:1].expand_as(t))), 0.0
    t = t.float()
    diff = float((t - t[:1]).abs().amax())
    scale = float(t.abs().amax())
    return diff <= SAME_REL * scale + 1e-30, diff


def accuracy(out, loss) -> float | None:
    """Batch accuracy for cross-entropy losses (argmax over dim 1; ignore_index -100 skipped)."""
    import torch

    if getattr(loss, "chosen", "") != "cross_entropy" or loss.target is None:
        return None
    from ..core.loss import primary_output

    y, _ = primary_output(out)
    target = loss.target.to(y.device)
    with torch.no_grad():
        pred = y.detach().argmax(1)
        if target.is_floating_point():   # class probabilities
            target = target.argmax(1)
        keep = target != -100
        n = int(keep.sum())
        if n == 0:
            return None
        return float(((pred == target) & keep).sum()) / n


def entropy_floor(target) -> float:
    """Lowest cross-entropy any batch-constant prediction can reach: the entropy of the labels."""
    counts: dict[int, int] = {}
    for v in target.reshape(-1).tolist():
        counts[v] = counts.get(v, 0) + 1
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values())


def output_box(out, loss) -> tuple[float, float] | None:
    """For cross-entropy with class-index targets: the interval every logit lies in, when the output
    is squashed to [0, 1] (sigmoid, softmax) or [-1, 1] (tanh); None otherwise."""
    import torch

    if getattr(loss, "chosen", "") != "cross_entropy" or loss.target is None or loss.target.is_floating_point():
        return None
    from ..core.loss import primary_output

    try:
        y, _ = primary_output(out)
    except Exception:
        return None
    if not isinstance(y, torch.Tensor) or y.dim() < 2 or y.shape[1] < 2 or not y.is_floating_point():
        return None
    y = y.detach().float()
    if not bool(torch.isfinite(y).all()):
        return None
    lo, hi = float(y.amin()), float(y.amax())
    eps = 1e-6
    if lo >= -eps and hi <= 1 + eps:
        return 0.0, 1.0
    if lo >= -1 - eps and hi <= 1 + eps:
        return -1.0, 1.0
    return None


def bounded_floor(classes: int, box: tuple[float, float]) -> float:
    """Lowest cross-entropy reachable when every logit lies in `box`: the true class at the top of
    the box and every other class at the bottom, log(1 + (C - 1) e^-(hi - lo))."""
    return math.log1p((classes - 1) * math.exp(-(box[1] - box[0])))


def make_optimizer(name: str, params, lr: float):
    import torch

    if name == "adam":
        return torch.optim.Adam(params, lr=lr), "Adam"
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr), "AdamW (weight_decay 0.01)"
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9), "SGD (momentum 0.9)"
    raise UsageError(f"unknown optimizer '{name}'", hint="choose adam, adamw or sgd")


def _check_options(opts: Options) -> None:
    if opts.steps < 1:
        raise UsageError(f"--steps must be ≥ 1 (got {opts.steps})")
    if opts.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer '{opts.optimizer}'", hint="choose adam, adamw or sgd")
    if opts.lr is not None and not (opts.lr > 0 and math.isfinite(opts.lr)):
        raise UsageError(f"--lr must be a positive number (got {opts.lr})")
    if not (0 < opts.target_ratio < 1):
        raise UsageError(f"--target-ratio must be between 0 and 1 (got {opts.target_ratio})",
                         hint="e.g. 0.01: pass when the loss falls to 1% of its initial value")
    if opts.amp not in AMP:
        raise UsageError(f"unknown --amp '{opts.amp}'", hint="choose none, bf16 or fp16")


def _forward(work, batch, step: int):
    """One forward; a failure becomes a ModelError naming the module (re-run under a tracker)."""
    from ..core.tracking import run_forward

    try:
        return batch.call(work)
    except DiagError:
        raise
    except Exception as exc:
        try:
            run_forward(work, batch, phase=f"forward (step {step})")
        except ModelError as named:
            raise named from exc
        except Exception:
            pass
        raise ModelError(f"forward (step {step}) failed: {one_line(exc)}",
                         hint="the model's own code raised; fix it or the inputs and run again") from exc


def find_collapse(work, batch) -> dict | None:
    """Forward hooks on every module: the first module (in completion order) whose input
    differs across the samples of the batch while its output is the same for every sample.
    Returns {"module", "type"} or {"inputs_identical": True} or None."""
    import torch

    bsz = batch.batch_size
    if not bsz or bsz < 2:
        return None
    names = {id(m): n for n, m in work.named_modules()}
    found: list[dict] = []
    root_inputs_same = []

    def varies(obj) -> bool | None:
        ts = []
        _tensors(obj, ts)
        ts = [t for t in ts if t.dim() >= 1 and t.shape[0] == bsz]
        if not ts:
            return None
        return any(not same_across_samples(t)[0] for t in ts)

    def hook(mod, args, kwargs, output):
        if found:
            return
        name = names.get(id(mod), "?")
        v_in = varies((args, kwargs))
        out = _sample_tensor(output, bsz)
        if name == "":
            root_inputs_same.append(v_in is False)
        if v_in and out is not None and same_across_samples(out)[0]:
            found.append({"module": name or "(root)", "type": type(mod).__name__})

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in {id(m): m for m in work.modules()}.values()]
    try:
        with torch.no_grad():
            batch.call(work)
    except Exception:
        return None
    finally:
        for h in handles:
            h.remove()
    if found:
        return found[0]
    if root_inputs_same and root_inputs_same[0]:
        return {"inputs_identical": True}
    return None


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


def _names(names: list[str], limit: int) -> str:
    return ", ".join(names[:limit]) + (f" … (+{len(names) - limit} more)" if len(names) > limit else "")


def run(model, inputs, opts: Options | None = None) -> Result:
    import torch

    from ..core.loss import Loss

    opts = opts or Options()
    _check_options(opts)
    loss_fn = opts.loss if opts.loss is not None else Loss("auto", opts.seed)
    lr = opts.lr if opts.lr is not None else DEFAULT_LR[opts.optimizer]
    device = next((t.device for _, t in inputs.tensors()), None) or next(
        (p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "meta" or any(p.is_meta for p in model.parameters()):
        raise UsageError("overfit-batch trains the model: meta tensors hold no values",
                         hint="use --device cpu or cuda")
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(opts.amp)
    if amp_dtype is torch.float16 and device.type not in ("cuda", "cpu"):
        raise UsageError(f"--amp fp16 needs a CUDA or CPU device (got {device.type})", hint="use --amp bf16")

    result = Result("overfit-batch")
    with leave_no_trace(model):
        torch.manual_seed(opts.seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(opts.seed)
        try:
            work = copy.deepcopy(model)
        except Exception as exc:
            raise ModelError(f"cannot copy the model to train it (copy.deepcopy raised {one_line(exc)})",
                             hint="overfit-batch trains a copy so your model is untouched; make the model deep-copyable") from exc
        work.train()
        trainable = [(n, p) for n, p in work.named_parameters() if p.requires_grad]
        frozen = sum(1 for _, p in work.named_parameters() if not p.requires_grad)
        for _, p in work.named_parameters():
            p.grad = None
        batch = inputs.clone()
        if not trainable:
            raise UsageError("the model has no trainable parameters (requires_grad is False everywhere)",
                             hint="nothing can be trained: unfreeze some parameters")
        optimizer, opt_desc = make_optimizer(opts.optimizer, [p for _, p in trainable], lr)
        scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16) \
            if amp_dtype is torch.float16 else None
        start = {n: p.detach().clone() for n, p in trainable}
        ever_nonzero = {n: False for n, _ in trainable}

        losses: list[float] = []
        grad_norms: list[float] = []
        lrs: list[float] = []
        accs: list[float] = []
        missing: list[str] = []
        no_graph = False
        nonfinite_at = None
        reached_at = None
        interrupted = False
        first_same = None
        first_box = None
        step = 0
        t0 = time.perf_counter()

        def autocast():
            import contextlib

            if amp_dtype is None:
                return contextlib.nullcontext()
            return torch.autocast(device_type=device.type, dtype=amp_dtype)

        def partial_result(why: str):
            p = Result("overfit-batch")
            p.data.update({"steps": step, "loss": list(losses)})
            if losses:
                p.summary += [("Loss before the error", f"{losses[0]:.6g} → {losses[-1]:.6g} ({len(losses)} evaluations)")]
            p.notes.append(why)
            return p

        try:
            while True:
                optimizer.zero_grad(set_to_none=True)
                try:
                    with autocast():
                        out = _forward(work, batch, step)
                        value = loss_fn(out)
                except ModelError as e:
                    if step and e.partial is None:
                        e.partial = partial_result(f"the error came at step {step}")
                    raise
                except UsageError:
                    raise
                except Exception as exc:
                    raise ModelError(f"loss (step {step}) failed: {one_line(exc)}",
                                     hint="check the loss/target: --loss, --batch") from exc
                lv = float(value.detach().float())
                losses.append(lv)
                acc = accuracy(out, loss_fn)
                if acc is not None:
                    accs.append(acc)
                if step == 0:
                    first_same = same_across_samples(_sample_tensor(out, batch.batch_size))[0]
                    first_box = output_box(out, loss_fn)
                    if lv < 0 and opts.target_loss is None and math.isfinite(lv):
                        raise UsageError(f"the initial loss is {lv:.6g} (< 0): a ratio to it says nothing",
                                         hint="give an absolute target with --target-loss, or a loss ≥ 0 (--loss)")
                if opts.on_step:
                    opts.on_step(step, lv)
                if not math.isfinite(lv):
                    nonfinite_at = step
                    break
                if _reached(lv, losses[0], acc, opts):
                    reached_at = step
                    break
                if step >= opts.steps:
                    break
                if not value.requires_grad:
                    no_graph = True
                    break
                try:
                    (scaler.scale(value) if scaler else value).backward()
                except Exception as exc:
                    raise ModelError(f"backward (step {step}) failed: {one_line(exc)}",
                                     hint="the model's backward raised; try `torchdiag gradflow`",
                                     partial=partial_result(f"backward failed at step {step}")) from exc
                if scaler:
                    scaler.unscale_(optimizer)
                if step == 0:
                    missing = [n for n, p in trainable if p.grad is None]
                norms = []
                for n, p in trainable:
                    if p.grad is not None:
                        g = p.grad.detach()
                        norms.append(g.float().norm())
                        if not ever_nonzero[n] and bool((g != 0).any()):
                            ever_nonzero[n] = True
                grad_norms.append(float(torch.stack(norms).norm()) if norms else 0.0)
                lrs.append(float(optimizer.param_groups[0]["lr"]))
                try:
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                except Exception as exc:
                    raise ModelError(f"optimizer step {step} failed: {one_line(exc)}",
                                     partial=partial_result(f"the optimizer failed at step {step}")) from exc
                step += 1
        except KeyboardInterrupt:
            interrupted = True
        seconds = time.perf_counter() - t0

        unchanged = [n for n, p in trainable if step > 0 and torch.equal(p.detach(), start[n])]
        zero = [n for n, _ in trainable if step > 0 and not ever_nonzero[n] and n not in missing]
        collapse = None
        final_same = False
        bounded = None
        if not interrupted and not no_graph and nonfinite_at is None and reached_at is None and losses:
            with torch.no_grad(), autocast():
                try:
                    final_out = batch.call(work)
                    final_same, _ = same_across_samples(_sample_tensor(final_out, batch.batch_size))
                    box = output_box(final_out, loss_fn)
                    if box is not None and box == first_box:
                        from ..core.loss import primary_output

                        classes = int(primary_output(final_out)[0].shape[1])
                        floor_ce = bounded_floor(classes, box)
                        needed = max(opts.target_ratio * losses[0],
                                     opts.target_loss if opts.target_loss is not None else -math.inf)
                        if needed < floor_ce:
                            bounded = {"box": box, "classes": classes, "floor": floor_ce, "needed": needed}
                except Exception:
                    final_same = False
            if final_same:
                collapse = find_collapse(work, batch)
        floor = None
        if collapse and getattr(loss_fn, "chosen", "") == "cross_entropy" and loss_fn.target is not None \
                and not loss_fn.target.is_floating_point() and loss_fn.target.dim() == 1:
            floor = entropy_floor(loss_fn.target.cpu())

    return _build(result, opts, loss_fn, lr, opt_desc, device, losses, grad_norms, lrs, accs, step, seconds,
                  reached_at, nonfinite_at, interrupted, no_graph, missing, zero, unchanged, trainable, frozen,
                  first_same, final_same, collapse, floor, batch, bounded)


def _reached(lv: float, initial: float, acc: float | None, opts: Options) -> bool:
    if opts.target_loss is not None and lv <= opts.target_loss:
        return True
    if initial < 0:
        return False
    return lv <= opts.target_ratio * initial and (acc is None or acc >= 1.0)


def _build(result, opts, loss_fn, lr, opt_desc, device, losses, grad_norms, lrs, accs, steps, seconds,
           reached_at, nonfinite_at, interrupted, no_graph, missing, zero, unchanged, trainable, frozen,
           first_same, final_same, collapse, floor, batch, bounded=None) -> Result:
    from ..render.fmt import sparkline

    initial = losses[0] if losses else None
    final = losses[-1] if losses else None
    finite = [v for v in losses if math.isfinite(v)]
    best = min(finite) if finite else None
    passed = reached_at is not None
    final_acc = accs[-1] if accs and final is not None and math.isfinite(final) else None
    target_desc = f"loss ≤ {opts.target_ratio:g} × initial" + (" and batch accuracy 100%" if accs else "")
    if opts.target_loss is not None:
        target_desc += f", or loss ≤ {opts.target_loss:g}"

    # Header keys must not collide with data/series keys ("loss" is the per-step list in JSON).
    result.header.update({
        "loss_rule": loss_fn.describe(),
        "training": f"{opt_desc}, lr {lr:g}, at most {opts.steps} steps, train mode, on a copy"
                    + (f", autocast {opts.amp}" if opts.amp != "none" else ""),
        "target": target_desc,
    })
    result.data.update({
        "passed": passed, "interrupted": interrupted, "steps": steps, "max_steps": opts.steps,
        "initial_loss": initial, "final_loss": final, "best_loss": best,
        "steps_to_target": reached_at, "target_ratio": opts.target_ratio, "target_loss": opts.target_loss,
        "final_accuracy": final_acc, "optimizer": opts.optimizer, "lr": lr, "amp": opts.amp, "seed": opts.seed,
        "seconds": round(seconds, 3), "steps_per_second": round(steps / seconds, 2) if seconds > 0 else None,
        "batch_size": batch.batch_size, "trainable_tensors": len(trainable), "frozen_tensors": frozen,
    })
    result.series["loss"] = losses
    result.series["grad_norm"] = grad_norms
    result.series["learning_rate"] = lrs
    if accs:
        result.series["accuracy"] = accs

    def fmt(v):
        return "—" if v is None else f"{v:.6g}"

    result.summary += [
        ("Initial loss", fmt(initial)),
        ("Final loss", fmt(final) + (f"  ({final / initial:.3g} × initial)" if initial and final is not None
                                     and initial > 0 and math.isfinite(final) else "")),
        ("Best loss", fmt(best)),
    ]
    if final_acc is not None:
        result.summary.append(("Batch accuracy", f"{100 * final_acc:.1f}%"))
    result.summary += [
        ("Steps", f"{steps} of {opts.steps}" + (f" (target reached at step {reached_at})" if passed else "")),
        ("Time", f"{seconds:.2f} s ({steps / seconds:.1f} steps/s)" if seconds > 0 else "—"),
        ("Loss curve", sparkline(_thin(losses, 60)) or "—"),
    ]

    limit = opts.max_names
    if interrupted:
        result.code = ExitCode.INTERRUPTED
        result.verdict = f"INTERRUPTED after {steps} step(s): partial result (loss {fmt(initial)} → {fmt(final)})"
        result.notes.append("interrupted with Ctrl-C: no verdict; the numbers above are up to the last step")
        return result

    # Causes, checked on the trained copy. Warnings: they explain, cannot-overfit decides.
    causes = 0
    if nonfinite_at is not None:
        causes += 1
        result.add("non-finite-loss", "warning", "", f"the loss became {final} at step {nonfinite_at}"
                   + (" (the very first forward)" if nonfinite_at == 0 else ""),
                   hint="run `torchdiag nancheck` on this model to find the first module with a non-finite value")
    if no_graph:
        causes += 1
        result.add("no-grad", "warning", "", "the loss does not require grad: no trainable parameter is connected to it "
                   "(forward under torch.no_grad(), detach(), or outputs built from non-trainable tensors)",
                   hint="run `torchdiag gradflow` on this model")
    elif missing:
        causes += 1
        result.add("no-grad", "warning", missing[0],
                   f"{len(missing)} of {len(trainable)} trainable parameter tensor(s) got no gradient: {_names(missing, limit)}",
                   hint="they are not connected to the loss (unused, detached, or under no_grad); run `torchdiag gradflow`")
    if zero:
        causes += 1
        result.add("zero-grad", "warning", zero[0],
                   f"{len(zero)} parameter tensor(s) had a gradient of exactly zero at every step: {_names(zero, limit)}",
                   hint="dead activations or a saturated path upstream; run `torchdiag gradflow`")
    if unchanged:
        causes += 1
        result.add("unchanged-params", "warning", unchanged[0],
                   f"{len(unchanged)} of {len(trainable)} trainable parameter tensor(s) never changed in {steps} step(s): "
                   f"{_names(unchanged, limit)}")
    if steps >= 2 and initial is not None and best is not None and initial != 0 and \
            (initial - best) <= FLAT_REL * abs(initial) and nonfinite_at is None:
        causes += 1
        result.add("flat-loss", "warning", "", f"the loss is flat from the start: best {best:.6g} vs initial {initial:.6g} "
                   f"over {steps} steps", hint="gradients vanish or the output ignores the parameters; try `torchdiag gradflow`")
    if final_same:
        causes += 1
        where, what = "", "every sample of the batch gets the same output"
        if collapse and collapse.get("module"):
            where = collapse["module"] if collapse["module"] != "(root)" else ""
            what += (f"; {collapse['module']} ({collapse['type']}) is the first module whose inputs differ across "
                     "samples but whose output does not")
        elif collapse and collapse.get("inputs_identical"):
            what += "; the inputs themselves are identical across samples"
        if first_same:
            what += " (already before training)"
        if floor is not None:
            what += f"; a batch-constant prediction cannot go below the label entropy {floor:.4g}"
        result.add("identical-outputs", "warning", where, what,
                   hint="look for a mean, pooling or normalisation over the batch dimension (dim 0), "
                   "or a layer that maps every input to the same value (dead ReLU, saturation)")

    if bounded:
        causes += 1
        lo, hi = bounded["box"]
        result.add("bounded-output", "warning", "",
                   f"every output value stays within [{lo:g}, {hi:g}] (a {'sigmoid or softmax' if lo == 0 else 'tanh'} "
                   f"at the end?): with {bounded['classes']} classes cross-entropy cannot go below "
                   f"{bounded['floor']:.4g}, and the target needs {bounded['needed']:.4g}",
                   hint="cross-entropy expects unbounded logits: drop the final squashing (the loss applies "
                        "log-softmax itself), or pick a loss that fits the output (--loss mse, --loss PATH:fn, --batch)")
    if not passed and nonfinite_at is None and steps >= 20 and final is not None:
        tail = losses[int(0.9 * steps)]
        if final < 0.999 * tail:
            result.notes.append(f"the loss was still falling at the end ({100 * (final / tail - 1):.1f}% over the last "
                                f"10% of steps): more --steps or a larger --lr may reach the target")
    if not passed:
        bits = [f"final loss {fmt(final)}"]
        if initial is not None and initial > 0 and final is not None and math.isfinite(final):
            bits.append(f"{final / initial:.3g} × initial (target {opts.target_ratio:g})")
        if final_acc is not None and final_acc < 1:
            bits.append(f"batch accuracy {100 * final_acc:.1f}%")
        result.add("cannot-overfit", "error", "", f"could not memorise one batch of {batch.batch_size} in {steps} step(s): "
                   + ", ".join(bits),
                   hint=None if causes else f"no mechanical cause found: try more --steps (now {opts.steps}) or another --lr (now {lr:g})")
        result.verdict = f"FAIL: cannot overfit one batch ({', '.join(bits)})"
    else:
        result.verdict = (f"PASS: loss {fmt(initial)} → {fmt(final)} in {reached_at} step(s)"
                          + (f", batch accuracy {100 * final_acc:.0f}%" if final_acc is not None else ""))
    return result


def _thin(values: list[float], width: int) -> list[float]:
    """At most `width` points for the sparkline: the minimum of each bucket (keeps drops visible)."""
    if len(values) <= width:
        return values
    out = []
    for i in range(width):
        lo, hi = i * len(values) // width, (i + 1) * len(values) // width
        chunk = [v for v in values[lo:hi] if math.isfinite(v)]
        out.append(min(chunk) if chunk else float("nan"))
    return out
