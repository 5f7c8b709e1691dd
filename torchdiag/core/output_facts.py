"""What a loss finds undefined in a finite model output: rows all exactly 0 (a loss that divides by a row's sum) and
values <= 0 (a log's domain). Said where a loss went non-finite from a finite output (nancheck, watch's replay), with
the module that made the output: a ReLU on the class outputs under a row-normalising loss (bench/bugs so_47352366)."""
from __future__ import annotations

import math


def storage_ptr(t) -> int:
    """The address of a tensor's storage; 0 where it has none to give (sparse, nested, a subclass)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - only an identity: a tensor without one matches nothing
        return 0


SQUARE_OVERFLOW = 1.8446744e19   # sqrt of float32's largest value: a square beyond it is Inf


def output_facts(t, maker: str | None = None, loss: float | None = None) -> str:
    """`t`: the model's (first floating) output; `maker`: "name (Type)" of the module that made it; `loss`: the
    non-finite loss's value where known. "" when the output holds neither values too large to square, rows all 0 nor
    values <= 0, or cannot be read so (not a strided tensor). One read."""
    import torch

    from .readback import read_back

    if t is None or t.layout != torch.strided or not t.is_floating_point() or not t.numel():
        return ""
    x = t.detach().float()
    rows = x.reshape(x.shape[0], -1) if x.dim() >= 2 else x.reshape(1, -1)
    logs = torch.log_softmax(x, 1) if x.dim() >= 2 and x.shape[1] > 1 else torch.nn.functional.logsigmoid(x)
    zero_rows, nonpos, lo, hi, in_logs = read_back([(rows == 0).all(1).sum(), (x <= 0).sum(), x.min(), x.max(),
                                                    torch.isfinite(logs).all()])
    top = max(abs(lo), abs(hi))
    # a helper's MSE run blown up to 1.6e37 was told of logs and divisions only; the loss is not known here, so the
    # size is said beside the other facts, with what it overflows (a review: log_softmax's difference, a sum)
    huge = (f"it reaches {top:.4g} in magnitude: beyond {SQUARE_OVERFLOW:.3g} a square overflows float32 (a squared "
            "error is Inf), and near float32's largest value a sum or log_softmax's difference does; values this "
            "large mean the run has blown up") if top > SQUARE_OVERFLOW else ""
    if not zero_rows and not nonpos and not huge:
        return ""
    said = [f"{int(zero_rows)} of {rows.shape[0]} rows all exactly 0"] if zero_rows else []
    said += [f"{int(nonpos)} of {x.numel()} values <= 0"] if nonpos and (zero_rows or not huge) else []
    held = f"holds {' and '.join(said)}" if said else "is finite"
    # signed values, no zero row, a finite log_softmax: logits, whose probabilities are never 0 until the loss makes
    # them so (a sweep: softmax, a mask, then log; the hint blamed the Linear's 145 negative logits). An infinite loss
    # is the loss's own arithmetic; a NaN one a log of the negative values themselves (a review) or 0/0 (a mean over
    # an empty mask: a third review)
    logits = not zero_rows and lo < 0 and bool(in_logs) and loss is not None and not math.isfinite(loss)
    soft = "log_softmax over dim 1" if x.dim() >= 2 and x.shape[1] > 1 else "logsigmoid"
    why = (f": signed, as logits are, and its {soft} is finite, so the infinity came from the loss's own arithmetic on "
           "it: a log of a probability the loss made exactly 0 (a softmax or sigmoid, then a mask or an underflow, then "
           "a log: work in log space, cross_entropy or log_softmax on the logits, logsigmoid; or clamp before the "
           "log), a non-zero value divided by 0, or an exp or a square that overflowed (a target too large)"
           if logits and loss is not None and math.isinf(loss) else
           f": signed, as logits are, and its {soft} is finite: a log taken of the output itself is NaN at its values "
           "below 0; 0/0 is NaN (a mean over an empty selection: a mask of zeros, every target ignored), so are "
           "0 × log 0 (a hand-written cross-entropy whose sigmoid or softmax saturated to exactly 0 where the target "
           "is 0: use the logits' own loss) and ∞ − ∞ (a log-sum-exp written without its max)"
           if logits else ": a log of 0 or below, or a division by a row's sum of 0, is undefined there")
    return (f"the output {held} (min {lo:.4g}, max {hi:.4g})" + (f", made by {maker}" if maker else "")
            + (why if said else "")
            + (f"; {huge}" if huge and said else f": {huge}" if huge else ""))
