"""mode-dependent: Dropout/BatchNorm-family modules (or forward code reading self.training) make the
train and eval outputs differ (info)."""
from __future__ import annotations

import math

from ...results import Result
from .checklist import Checklist
from .shared import finite, max_diff, name, scale

MODE_TYPES_HINT = "call model.eval() before validation/inference and model.train() before training steps"


def mode_modules(model) -> list[tuple[str, str]]:
    """Modules whose output depends on train/eval mode: dropout with p > 0, batch-statistics norms, stochastic
    depth (a sweep: swin_t's 12 StochasticDepth, which the training checks turn off, read "no Dropout/BatchNorm;
    train = eval output")."""
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.instancenorm import _InstanceNorm

    from ...core.design import is_stochastic_depth

    out = []
    for n, m in model.named_modules():
        if is_stochastic_depth(m):
            out.append((n, type(m).__name__))
        elif isinstance(m, (_DropoutNd, nn.AlphaDropout, nn.FeatureAlphaDropout)) and getattr(m, "p", 0) > 0:
            out.append((n, type(m).__name__))
        elif isinstance(m, _BatchNorm) or (isinstance(m, _InstanceNorm) and m.track_running_stats):
            out.append((n, type(m).__name__))
        elif isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
            out.append((n, type(m).__name__))
        elif isinstance(m, nn.RNNBase) and m.dropout > 0 and m.num_layers > 1:   # dropout between its layers (a sweep)
            out.append((n, type(m).__name__))
    return out


def idle_dropouts(model) -> int:
    """Dropout modules at p=0 (many Hugging Face configs): there, yet not mode-dependent."""
    from torch import nn
    from torch.nn.modules.dropout import _DropoutNd

    kinds = (_DropoutNd, nn.AlphaDropout, nn.FeatureAlphaDropout)
    return sum(isinstance(m, kinds) and getattr(m, "p", 0) == 0 for m in model.modules())


def check_modes(model, eval_out, train_out, ck: Checklist, result: Result, depth_off: int = 0,
                fresh: bool = False) -> None:
    """The outputs of one eval and one train forward of `model` (`depth_off` stochastic depth modules turned off
    in it; `fresh`: fresh_statistics of it when the eval output was made)."""
    mods, idle = mode_modules(model), idle_dropouts(model)
    # "no Dropout" beside 12 Dropout(p=0) modules read as false (a sweep's HF models)
    none = f"no active Dropout/BatchNorm ({idle} Dropout with p=0)" if idle else "no Dropout/BatchNorm"
    bad = [w for w, out in (("eval", eval_out), ("train", train_out)) if not finite(out)]
    diff = None if bad else max_diff(eval_out, train_out)   # NaN compares unequal: no difference to state
    dtxt = "" if diff is None else f" (max |train − eval| output difference {diff:.4g})"
    if bad:
        dtxt = f" (the {' and '.join(bad)} output{'s hold' if len(bad) > 1 else ' holds'} NaN/Inf: not compared)"
    if mods:   # by design in most models: one compact generic note, said once
        kinds, where = _kinds(mods), ", ".join(name(n) for n, _ in mods[:3]) + (" …" if len(mods) > 3 else "")
        if dtxt and depth_off:   # the outputs compared had stochastic depth off (training.py): its part is not in it
            # (and where it is all there is, the number measured nothing: swin_tiny's 22 DropPath "differ (… 0 …)")
            dtxt = " (not measured: the outputs were compared with stochastic depth off)" if not bad and \
                _only_depth(model, mods) else dtxt[:-1] + ", stochastic depth off)"
        if not depth_off and diff is not None and diff <= 1e-5 * scale(eval_out) + 1e-6:   # (a sweep: "differ (…
            # difference 0)": dropout inside attention-bias MLPs whose output starts at zero, swinv2_cr)
            said = f"{kinds} can make train and eval outputs differ; here they agree{dtxt}: none of them changes " \
                   "the output yet (on a branch that starts closed)"
        else:
            said = f"{kinds} make train and eval outputs differ{dtxt}"
        result.add("mode-dependent", "info", where, f"{said}, as designed: "
                   "model.eval() for validation/inference, model.train() for training"
                   + (FRESH if fresh and diff is not None else ""))
        ck.row("modes", "info", said.replace("make train and eval outputs differ", "differ in train and eval"), where,
               "", "mode-dependent")
    elif diff is not None and diff > 1e-5 * scale(eval_out) + 1e-6:   # beyond kernel-choice rounding
        if ck.rows.get("determinism", {}).get("status") in ("error", "warning"):
            # eval differs from itself: a train/eval difference says nothing about self.training
            ck.row("modes", "skipped", f"{none}; train and eval outputs cannot be compared: the eval "
                   "output is random (see eval determinism)")
        else:
            result.add("mode-dependent", "info", "(root)",
                       f"{none}, yet train and eval outputs differ{dtxt}: forward code reads self.training",
                       MODE_TYPES_HINT)
            ck.row("modes", "info", f"train and eval outputs differ{dtxt} (custom self.training code)", "(root)",
                   MODE_TYPES_HINT, "mode-dependent")
    elif bad:
        ck.row("modes", "skipped", f"{none}; train and eval outputs not compared{dtxt}")
    else:
        ck.row("modes", "ok", f"{none}; train = eval output")
    if not bad and diff:   # (outputs that agree hold no dropout: no read for them)
        output_dropout(eval_out, train_out, ck)


# a sweep: timm's mobileone_s0 as built, "difference 1.197e+15 ... as designed", read as a broken model
FRESH = ("; the BatchNorm running statistics had seen no batch when the eval output was made (a model as built: "
         "mean 0, variance 1), so that output normalises with them and can be far off; a trained or loaded model's "
         "differ far less")


def fresh_statistics(model) -> bool:
    """Are the running statistics of every BatchNorm that tracks them as built: no batch counted, mean 0, variance 1?
    Asked before doctor's train-mode pass (which counts one). The values too, not the count alone: a checkpoint saved
    without num_batches_tracked loads trained statistics beside a count of 0 (a review). One read."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    stats: list = [(m.running_mean, m.running_var, m.num_batches_tracked) for m in model.modules()
                   if isinstance(m, _BatchNorm) and m.track_running_stats and isinstance(m.running_mean, torch.Tensor)
                   and isinstance(m.running_var, torch.Tensor)]
    if not stats:
        return False
    from ...core.readback import read_back

    device = stats[0][0].device
    as_built = [((mean == 0).all() & (var == 1).all()
                 & ((count == 0) if isinstance(count, torch.Tensor) else torch.tensor(True, device=mean.device))
                 ).to(device) for mean, var, count in stats]
    return bool(read_back([torch.stack(as_built).all()])[0])


def _only_depth(model, mods) -> bool:
    """Every mode-dependent module found is stochastic depth."""
    from ...core.design import is_stochastic_depth

    modules = dict(model.named_modules())
    return all(n in modules and is_stochastic_depth(modules[n]) for n, _ in mods)


def _kinds(mods) -> str:
    """'12 BatchNorm2d', '2 Dropout + 1 BatchNorm1d': the modules counted by type, in order of appearance."""
    counts: dict[str, int] = {}
    for _, t in mods:
        counts[t] = counts.get(t, 0) + 1
    return " + ".join(f"{k} {t}" for t, k in counts.items())


def output_dropout(eval_out, train_out, ck: Checklist) -> None:
    """dropout-into-loss: the train-mode output is the eval-mode output with a share of its values zeroed and the rest
    scaled by one constant c > 1 (inverted dropout's 1 / (1 - p)) — a dropout on the output the loss reads (a sweep:
    Dropout(0.5) after the head, cross-entropy 0.742 in train mode against 0.503 in eval). Judged from the two
    forwards' values alone; anything else that moves in train mode (BatchNorm's batch statistics, a dropout before
    the head) makes the ratio vary, and nothing is said; so does AlphaDropout, which sets what it drops to a constant.
    One read."""
    import torch

    from ...core.loss import primary_output
    from ...core.readback import read_back

    with torch.no_grad():   # as the eval output was made (a zoo re-run: EfficientLoFTR's feature maps, exit 2)
        e = primary_output(eval_out)[0]
    t = primary_output(train_out)[0]
    if not (isinstance(e, torch.Tensor) and isinstance(t, torch.Tensor)) or e.shape != t.shape \
            or not e.is_floating_point() or e.numel() < 8:
        return
    # the ratio of two values rounded in a half dtype spreads by a few of its ulps (a review: Dropout(0.1) in
    # bfloat16, 6.7e-3 against a tolerance of 1e-3), whatever the output's own dtype (a third: bfloat16 logits cast
    # to float32, and --amp bf16): bfloat16's, a tenth of what BatchNorm or a dropout before the head moves a ratio
    spread = 4 * torch.finfo(torch.bfloat16).eps
    e, t = e.detach().float(), t.detach().float()
    kept = (t != 0) & (e != 0)
    ratio = torch.where(kept, t / torch.where(e != 0, e, torch.ones_like(e)), torch.zeros_like(e))
    top, low = ratio.max(), torch.where(kept, ratio, torch.full_like(ratio, float("inf"))).min()
    zeroed, whole, n_kept, hi, lo = read_back([((t == 0) & (e != 0)).sum(), (e != 0).sum(), kept.sum(), top, low])
    if not (whole and n_kept and math.isfinite(hi) and math.isfinite(lo)):
        return
    share = zeroed / whole
    if not 0.01 <= share <= 0.99 or not lo > 1.0 or hi - lo > spread * hi:
        return
    ck.find("modes", "dropout-into-loss", "warning", "(output)",
            f"in train mode the model's output is its eval output with {share:.0%} of the values zeroed and the rest "
            f"scaled by {(lo + hi) / 2:.3g}: a dropout on the output, so the loss judges values the model did not give, corrupted "
            "anew each step (in eval mode they are whole)",
            "drop the dropout after the last layer (a dropout belongs before a layer that learns from its output, not "
            "on the output the loss reads); a backbone whose output feeds a head of your own (timm's num_classes=0 "
            "with drop_rate) has it before that head, where it belongs",
            verdict=f"the output is dropped out in train mode ({share:.0%})")


def dropout_rate(work, ck: Checklist) -> None:
    """dropout-rate on the model in train mode: dropout modules that keep a fifth of their input or less."""
    from ...core.dropout_rate import CODE, dropping_most, said

    work.train()
    found = dropping_most(work)
    if found:
        message, hint = said(found)
        ck.find("modes", CODE, "warning", name(found[0][0]) if len(found) == 1 else "model", message, hint,
                verdict=f"dropout drops {max(p for _, p in found):.0%} in train mode",
                members=[n for n, _ in found] if len(found) > 1 else None)
