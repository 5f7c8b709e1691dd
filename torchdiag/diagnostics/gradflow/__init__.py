"""gradflow: does the gradient reach every parameter, and in what shape?

One forward+backward (train mode unless `eval_mode`) on the user's model in place, leaving no
trace (core/recording.py). Per parameter: shape, grad norm, weight norm, grad/weight ratio, mean and max
|grad| and a status (params.py); why a parameter got no gradient is worked out from the recorded
forward and the autograd graph (core/unreached.py). Per layer, in execution order (layers.py), and
activation health from the same forward (activations.py). Statistics stay on the device and are
read back once (stats.py): a healthy pass makes the same few host syncs at any depth.

Broken or built that way (design.py, recheck.py, gated.py, core/design.py): stochastic depth is off for the judged pass; a
tiny-by-construction parameter is judged by its gradient, a weight feeding a batch-statistics norm by
grad/weight with a wider threshold; biases a normalisation cancels are re-checked on a copy (a shift);
vanishing, exactly-zero gradients and dead units are re-checked with a short training run on a copy and
what grows out of it is info naming the gate (core/gates.py)."""
from __future__ import annotations

import math

from ...core.design import stochastic_depth_off
from ...core.distributed import inner
from ...core.local_leaves import CODE as LOCAL_CODE
from ...core.local_leaves import HINT as LOCAL_HINT
from ...core.local_leaves import message as local_message
from ...core.recording import record_pass
from ...core.repeats import cut as listed
from ...results import Result
from . import display
from .activations import activation_rows
from .findings import param_findings, status_counts, verdict
from .gated import gated
from .layers import bar_scale, frontier, layer_rows
from .options import (
    NEEDS_VALUES,
    OPTIMIZER,
    STATUS_ORDER,
    STATUS_SEVERITY,
    WRAP,
    Options,
)
from .params import param_rows
from .recheck import recheck
from .stats import read_stats
from .underflow import add_fractions, reduced_dtype, smallest_normal

__all__ = ["NEEDS_VALUES", "OPTIMIZER", "WRAP", "Options", "STATUS_ORDER", "STATUS_SEVERITY", "frontier", "run"]



LARGE_LOSS = 1e6   # a loss this large scales every gradient with it (a sweep: a house-price MSE of 9.6e9)

def run(model, inputs, opts: Options, ctx) -> Result:
    result = Result("gradflow")
    result.header["mode"] = ("eval" if opts.eval_mode else "train") + " mode, one forward + backward"
    # under torchrun --wrap ddp|fsdp the judged pass runs through the wrapped copy (every rank makes it;
    # gradients after the reduction); the re-checks the values call for run on `model`, this rank's own
    wrapped = ctx.wrapped_copy(model, "to run the pass wrapped")
    watched = model if wrapped is None else inner(wrapped)
    params = dict(watched.named_parameters())          # unique tensors (ties once)
    known = {id(p) for p in watched.parameters()}      # a forward may register more (gradflow judges these)
    pas = record_pass(watched, inputs, opts, ctx, call=wrapped)
    modules = dict(watched.named_modules())   # with any the forward registered (`self.mid = nn.Linear(...)` in it)
    made = [n for n, p in watched.named_parameters() if id(p) not in known]
    if made:   # not judged here: one pass cannot tell a module built at the first call from one made at every call
        result.notes.append(f"{len(made)} parameter tensor(s) registered by the forward itself ({listed(made, ', ', 3)}), "
                            "not judged: if the forward makes them at every call, no optimizer steps them (`torchdiag "
                            "doctor` runs a second forward and says so: param-recreated)")
    params, pas.grads = ctx.whole(params), ctx.whole(pas.grads)   # fsdp: shards gathered (every rank)
    pas.rec.model = model     # dead units are re-judged on this rank's own model
    result.header["loss"] = pas.loss_text
    if pas.stochastic:
        result.header["mode"] += f"; stochastic depth off for the judged pass ({len(pas.stochastic)} module(s))"
    if ctx.precision.scaled:   # core/scaling.py judged_backward
        result.header["mode"] += "; gradients as a GradScaler gives them (the loss scaled by 2**16, then unscaled)"
    reduced = reduced_dtype(ctx, params)
    stats = read_stats(pas, params, ctx.device, smallest_normal(reduced) if reduced else None)

    allow = ctx.option("allow")
    rows = param_rows(params, pas, stats, modules, opts, ctx.spec.optimizer.learning_rate, getattr(inputs, "chosen", False))
    if wrapped is None:
        _follow_cut_outputs(watched, inputs, rows, pas, ctx, train=not opts.eval_mode)
    if pas.local:   # weights made in forward: no optimizer can hold them; said as the cause
        result.add(LOCAL_CODE, "error", "", local_message(pas.local), LOCAL_HINT)
        result.data["local_weights"] = pas.local
    # the re-checks on a copy remake those weights at each forward, as the user's training does (MaskFormer's zero
    # queries made with requires_grad: skipping them left a starting point's gradient an error; a helper's measure)
    recheck(model, inputs, pas, rows, opts, ctx, result)    # only when a candidate exists
    acts = activation_rows(pas.rec, stats, opts, result, allow, inputs=inputs, ctx=ctx)   # dead units re-judged (dead.py)
    gated(model, inputs, rows, result, opts, ctx, stochastic_depth_off)   # only when something is flagged
    param_findings(result, rows, model, opts, allow)
    if math.isfinite(stats.loss) and abs(stats.loss) > LARGE_LOSS:   # every gradient is as large as the loss is
        # against torchdiag's own unit target the size is the output's (a -1e4 fill in masked logits, which passes no
        # gradient, made the zoo's pp_doclayout 5e7): no target to standardise, and it need not be the gradients' cause
        for f in result.findings:
            if f.code == "exploding-grad" and not pas.made_target:
                f.hint = (f"the loss itself is {stats.loss:.3g}: a target of a large scale (an unstandardised "
                          f"regression target) makes every gradient large; standardise it first. Else: {f.hint}")
    _steep_dropout(model, result, opts)
    _batch_of_one(model, inputs, result, opts)
    if not math.isfinite(stats.loss):
        bad = sum(1 for r in rows if r["nan"] or r["inf"])
        got = sum(1 for r in rows if r["grad_norm"] is not None)
        # counted: an inf loss made of constant padding (Grounding DINO's -inf logits) leaves every gradient finite
        result.add("non-finite-loss", "error", "", f"the loss is {stats.loss} before backward; {bad} of {got} "
                   "parameter tensors with a gradient got NaN/Inf in it",
                   hint="run `torchdiag nancheck` to find where it first goes bad")
    layers = layer_rows(frontier(model, opts.depth), rows, pas.rec.order, modules, known)
    scale = bar_scale(layers)
    if reduced:
        add_fractions(rows, layers, stats.underflow)

    result.data.update({
        "loss_value": stats.loss,
        "thresholds": {"vanishing_ratio": opts.vanishing, "exploding_norm": opts.exploding,
                       "exploding_ratio": opts.exploding_ratio, "dead_fraction": opts.dead,
                       "saturated_fraction": opts.saturated, "saturation_margin": opts.saturation_margin},
        "allow": list(opts.allow), "strict": opts.strict,
        "status_counts": status_counts(rows),
    })
    if wrapped is not None:   # the total gradient norm after the wrapper's reduction: the same on every rank
        result.data["reduced_grad_norm"] = _reduced_norm(rows, params, pas.grads, ctx, result)
    display.decorate(rows, layers, acts, scale, result.findings)
    display.tables(result, rows, layers, acts, scale, opts, reduced)
    if opts.histograms:
        _histograms(result, params, pas.grads)
    verdict(result, rows, opts, stats.loss, ctx.option("strict"))
    if acts:
        result.summary.append(display.activation_line(acts, opts))
    return result


def _batch_of_one(model, inputs, result: Result, opts: Options) -> None:
    """Vanishing gradients at a batch of 1 through BatchNorm in train mode: its statistics come from one sample, which
    can leave the loss nearly independent of the input (a sweep: timm's starnet_s050 at -i 1x3x224x224 had 101 tensors
    of rounding noise, told "saturating activations, depth ..., or tiny initialisation")."""
    from torch.nn.modules.batchnorm import _BatchNorm

    if opts.eval_mode or getattr(inputs, "batch_size", None) != 1 or not any(
            isinstance(m, _BatchNorm) for m in model.modules()):
        return
    for f in result.findings:
        if f.code == "vanishing-grad":
            f.hint = ("the batch is 1: BatchNorm in train mode takes its statistics from that one sample, which can "
                      "erase what the sample was (doctor says when it does); run with a batch of 2 or more (-i 2x...). "
                      f"Else: {f.hint}")


def _follow_cut_outputs(model, inputs, rows, pas, ctx, train: bool) -> None:
    """no-grad rows cut off at a module whose output never reached the loss: followed through one more forward
    (core/discarded.py), so the no-grad error says what became of it: returned by a component and thrown away by
    its caller (discarded), dropped inside the forward that holds it (dropped), in the model's output but not in
    the loss (left-out), or used by an op that carries no gradient (detached, as before)."""
    from ...core.unreached import discarded_why, dropped_why, fates, left_out_why

    says = {"discarded": discarded_why, "dropped": dropped_why, "left-out": left_out_why}   # 'cut': as it was
    cut = [r["name"] for r in rows if r["status"] == "no-grad" and r["reason"] == "detached"]
    by_name = {r["name"]: r for r in rows}
    for name, (fate, module) in fates(model, inputs, cut, pas.rec, pas.reach, ctx, pas.rng, train).items():
        if fate in says:
            by_name[name].update(reason=fate, why=says[fate](module, pas.rec))


def _reduced_norm(rows, params, grads, ctx, result) -> float | None:
    """The total gradient norm after the reduction; None under DDP when a trainable parameter got no
    gradient: DDP then never launches that bucket's allreduce, so what this rank holds is partly its own."""
    if ctx.spec.wrap == "ddp" and any(p.requires_grad and grads.get(n) is None for n, p in params.items()):
        result.notes.append("some parameters got no gradient, so DDP did not finish its reduction: the gradients "
                            "judged are partly this rank's own (reduced_grad_norm is null)")
        return None
    return math.sqrt(sum(r["grad_norm"] ** 2 for r in rows if r["grad_norm"] is not None))


def _histograms(result, params, grads) -> None:
    """Weights and gradients as arrays for TensorBoard (--tb): one copy to the host per tensor,
    non-finite values dropped there."""
    import numpy as np

    from .stats import grad_values

    def host(t):
        a = t.detach().float().flatten().cpu().numpy()
        return a[np.isfinite(a)]

    for n, p in params.items():
        result.histograms[f"gradflow/weight/{n}"] = host(p)
        if grads[n] is not None:
            result.histograms[f"gradflow/grad/{n}"] = host(grad_values(grads[n]))


STEEP_DROPOUT = 0.9   # a dropout whose p scales what survives by 10x or more in train mode


def _steep_dropout(model, result, opts) -> None:
    """An exploding gradient's hint names a dropout of p >= STEEP_DROPOUT in train mode: it scales the values that
    survive by 1/(1-p) (a zoo re-run: transformers' MobileNetV1 config defaults to classifier_dropout_prob 0.999,
    TensorFlow's keep probability read as a drop probability, and its classifier's grad/weight was 196)."""
    from torch.nn.modules.dropout import _DropoutNd

    exploding = [f for f in result.findings if f.code == "exploding-grad"]
    steep = [(n, m) for n, m in model.named_modules() if isinstance(m, _DropoutNd) and m.p >= STEEP_DROPOUT
             and not opts.eval_mode] if exploding else []
    if not steep:
        return
    name, module = steep[0]
    p = module.p
    scales = f"scales what survives by {1 / (1 - p):,.0f}x" if p < 1 else "zeroes everything"
    said = f"{name or '(root)'} (a {type(module).__name__}) has p = {p:g}: in train mode it {scales}" + (
        f" ({len(steep) - 1} more such dropout module(s))" if len(steep) > 1 else "")
    for f in exploding:
        f.hint = f"{said}; a p that large is usually a keep probability given as the drop probability. Else: {f.hint}"
