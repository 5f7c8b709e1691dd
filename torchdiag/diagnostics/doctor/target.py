"""target-out-of-range: class targets (from --batch, or target= in Python) against the output width;
softmax-before-cross-entropy: the output a cross-entropy loss reads is already probabilities."""
from __future__ import annotations

from ...core.tracking import describe
from .checklist import Checklist


def check_target(eval_out, loss, target, ck: Checklist) -> bool:
    """True when the class targets cannot be used with this output (training then uses random targets)."""
    import torch

    from ...core.loss import primary_output, target_range_hint

    if target is None and _own_loss(eval_out):   # a sweep: "random valid ones used" beside the batch's labels
        ck.row("target", "ok", "the model computes its own loss (output['loss'], from the labels it was given)")
        return False
    lm = getattr(loss, "lm", None)
    # (a new user: "random valid ones used" beside a header's next tokens); only where the output is next-token
    # logits of those ids (a sweep: a sequence-classification head's (N, C) logits were said to train on next tokens)
    with torch.no_grad():   # as the eval output was made: the pick one level down asks no gradient of it (a zoo
        y = primary_output(eval_out)[0] if lm is not None else None   # re-run: InstructBLIP-Video, exit 2)
    if target is None and lm is not None and isinstance(y, torch.Tensor) and lm.fits(y):
        ck.row("target", "ok", f"no targets given: the next tokens of {lm.name} (a language model) are the targets"
               if lm.shift else f"no targets given: the ids of {lm.name} at their own positions (a bidirectional "
               "model over them, a masked LM's objective with nothing masked) are the targets")
        return False
    if target is None or not isinstance(target, torch.Tensor):
        ck.row("target", "ok" if target is None else "skipped",
               "no targets given (random valid ones used)" if target is None
               else f"target is a {type(target).__name__}")
        return False
    if target.is_floating_point() or target.dtype == torch.bool:
        ck.row("target", "ok", f"{str(target.dtype).replace('torch.', '')} target (not class indices)")
        return False
    if loss is not None and loss.kind not in ("auto", "cross_entropy"):
        ck.row("target", "skipped", f"loss '{loss.kind}' does not take class indices")
        return False
    try:
        y, picked = primary_output(eval_out)
    except Exception:   # no tensor in the output: nothing to compare with
        ck.row("target", "skipped", "no tensor output to compare targets with")
        return False
    if y.dim() < 2:
        ck.row("target", "skipped", f"output {describe(y)} has no class dimension")
        return False
    classes = int(y.shape[1])
    t = target.detach()
    valid = t[t != -100]
    if valid.numel() == 0:
        ck.row("target", "ok", "all targets are ignore_index (-100)")
        return False
    lo, hi = int(valid.min()), int(valid.max())
    outside = (valid < 0) | (valid >= classes)
    bad = int(outside.sum())
    if bad:
        ck.find("target", "target-out-of-range", "error", picked,
                f"class targets span [{lo}, {hi}] but {picked} has {classes} classes (valid 0…{classes - 1}); "
                f"{bad:,} of {valid.numel():,} targets are out of range",
                target_range_hint(lo, hi, classes, valid[outside].unique().tolist(), bad < valid.numel()),
                verdict=f"targets reach {hi} but the output has {classes} classes" if hi >= classes
                else f"negative targets ({lo})")
        return True
    ck.row("target", "ok", f"class targets in [{lo}, {hi}], output has {classes} classes")
    return False


def _own_loss(eval_out) -> bool:
    from ...core.loss import primary_output

    try:
        return primary_output(eval_out)[1] == "output['loss']"
    except Exception:
        return False


def check_probabilities(eval_out, loss, ck: Checklist) -> None:
    """An output that cross-entropy reads (the loss asked for, or auto's choice for (N, C) scores) is a probability
    distribution over dim 1: a softmax at the end of the model. CrossEntropyLoss applies log_softmax itself, so
    training it so squashes the gradients (a sweep: gradflow and doctor passed it; overfit-batch alone warned)."""
    import torch

    from ...core.loss import primary_output, probabilities_floor

    if loss is None or loss.custom is not None or loss.kind not in ("auto", "cross_entropy"):
        return
    try:
        y, picked = primary_output(eval_out)
    except Exception:
        return
    if not (isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() >= 2 and y.shape[1] > 1):
        return
    if loss.kind == "auto" and loss.auto_kind(y, picked) != "cross_entropy":   # mse on a float target (a review)
        return
    with torch.no_grad():
        p = y.detach().float()
        flags = torch.stack([p.min() >= 0, p.max() <= 1, (p.sum(1) - 1).abs().max() < 1e-3]).tolist()
    if not all(flags):
        return
    classes = int(y.shape[1])
    floor = probabilities_floor(classes)
    ck.find("target", "softmax-before-cross-entropy", "warning", picked,
            f"{picked} is a probability distribution over its {classes} classes (every value in [0, 1], each row "
            "summing to 1): a softmax at the end of the model. Trained with cross-entropy, which applies log_softmax "
            f"itself, its gradients are squashed and the loss cannot fall below {floor:.4g}",
            "return the logits (drop the final softmax) and apply softmax only for predictions; a model meant to "
            "output probabilities trains with NLLLoss on their log",
            verdict=f"{picked} is already probabilities")
