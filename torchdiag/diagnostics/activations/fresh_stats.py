"""Saturation that only eval mode's untouched BatchNorm statistics make (activations' `saturated-activations`).

A freshly built model's BatchNorm layers hold their statistics as initialised (mean 0, variance 1, no batch tracked),
which describe nothing the model computes: in eval mode they normalise with those, activations grow through the
network, and gates saturate that neither training (batch statistics) nor the trained model (fitted statistics) see
(a sweep: timm efficientnetv2_rw_t, 15 of 29 squeeze-excitation gates 55–99% saturated in eval mode, 0 with the
batch's statistics). A module saturated in eval mode is asked again on a copy whose untouched BatchNorm layers use
the batch's statistics (the rest in eval mode): where it is no longer saturated, the finding is info, with both
fractions. One more forward, only when such a finding and such a layer are there."""
from __future__ import annotations

SATURATED = 0.5   # the warning's threshold (activations._findings)


def untouched_norms(model) -> list:
    """The batch-norm layers that track running statistics and hold them as initialised: no batch tracked, mean 0 and
    variance 1 (a review: statistics loaded from a checkpoint without the count have a count of 0 and are fitted)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
            and m.num_batches_tracked is not None and int(m.num_batches_tracked) == 0
            and m.running_mean is not None and not bool(m.running_mean.any())
            and m.running_var is not None and bool((m.running_var == 1).all())]


def with_batch_statistics(model, inputs, names: list[str], opts, ctx) -> dict[str, float]:
    """{name: saturated fraction} of the `names` on a copy whose untouched batch norms use the batch's statistics;
    {} when there are none or the forward cannot run (a batch of 1 after pooling: the warning stays)."""
    import torch

    from ...core.train import train_copy
    from . import Recorder, row_of

    if not untouched_norms(model):
        return {}
    try:
        work = train_copy(model, "to measure saturation with the batch's statistics")
        work.eval()
        for m in untouched_norms(work):
            m.train()
        rec = Recorder(work, opts, set())
        with torch.no_grad(), ctx.autocast(), rec:
            inputs.call(work)
    except Exception:   # noqa: BLE001 - what cannot run keeps the eval-mode verdict
        return {}
    out = {}
    for n in names:
        if n in rec.stats:
            frac = row_of(rec.stats[n])["saturated_fraction"]
            if frac is not None:
                out[n] = frac
    return out
