"""batchnorm-batch-1: BatchNorm computing batch statistics over one value per channel raises. An error
when the given batch fails in train mode; a warning when a batch of 1 would (the last batch of an
epoch), found by a probe. The fact is the failing module and what it received, never the error text."""
from __future__ import annotations

from ...core.tracking import ModuleTracker
from ...errors import one_line
from .checklist import Checklist
from .shared import batch_one, failing_call, name


def bn_modules(model) -> list[str]:
    from torch.nn.modules.batchnorm import _BatchNorm

    return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]


def one_value_per_channel(module, args) -> bool:
    """`module` is a BatchNorm using batch statistics (train mode, or no running stats) and its input
    has a single value per channel: exactly the case BatchNorm refuses."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    if not isinstance(module, _BatchNorm) or not (module.training or module.running_mean is None):
        return False
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if x is None or x.dim() < 2:
        return False
    values = x.shape[0]
    for d in x.shape[2:]:
        values *= d
    return values == 1


def report_train_failure(ck: Checklist, call, batch) -> None:
    """The train-mode forward of the given batch failed in BatchNorm `call`."""
    where = call.name if call else ""
    ck.find("batchnorm", "batchnorm-batch-1", "error", name(where),
            f"{name(where)} ({call.type if call else 'BatchNorm'}) raises in train mode with batch size "
            f"{batch}: BatchNorm needs more than one value per channel to compute batch statistics",
            "train with batches of 2 or more (DataLoader(drop_last=True) avoids a last batch of 1), "
            "or use GroupNorm/LayerNorm",
            verdict=f"train-mode forward fails at batch size {batch} in {name(where)}")


def two_samples(inputs, seed: int):
    """A batch of 2 from a batch of 1 (the sample and a perturbed copy: an exact duplicate would make
    BatchNorm's variance 0), for the other training checks; None when the inputs are not all float."""
    import torch

    batched = [t for _, t in inputs.tensors() if t.dim() and t.shape[0] == 1]
    if not batched or not all(t.is_floating_point() for t in batched):
        return None
    g = torch.Generator(device=batched[0].device).manual_seed(seed)

    def two(t):
        if not (t.dim() and t.shape[0] == 1):
            return t
        noise = torch.randn(t.shape, generator=g, device=t.device, dtype=t.dtype)
        return torch.cat([t, t + noise * (t.detach().float().std().nan_to_num(1.0).clamp_min(1e-3)).to(t.dtype)])

    return inputs.map(two)


def bn_batch1_probe(work, inputs, ck: Checklist) -> None:
    import torch

    bns = bn_modules(work)
    batch = inputs.batch_size
    if "batchnorm" in ck.rows:
        return
    if not bns:
        ck.row("batchnorm", "ok", "no BatchNorm modules")
        return
    if batch is None or batch <= 1:
        ck.row("batchnorm", "ok", f"train-mode forward works with batch size {batch}")
        return
    work.train()
    tracker = ModuleTracker(work, record_shapes=False)
    try:
        with torch.no_grad(), tracker:
            batch_one(inputs, batch).call(work)
    except Exception as exc:
        call, module, args = failing_call(tracker, work)
        if one_value_per_channel(module, args):
            where = call.name
            ck.find("batchnorm", "batchnorm-batch-1", "warning", name(where),
                    f"with a batch of 1 (e.g. the last batch of an epoch) {name(where)} raises in train mode: "
                    f"BatchNorm needs more than one value per channel",
                    "DataLoader(drop_last=True) avoids a last batch of 1; or use GroupNorm/LayerNorm",
                    verdict=f"a batch of 1 fails in train mode in {name(where)} (batch {batch} works)")
            return
        ck.row("batchnorm", "skipped", f"batch-1 probe failed for another reason: {one_line(exc, 100)}")
        return
    erased = _one_sample_erased(work, inputs, batch)
    if erased is not None:
        ck.find("batchnorm", "batchnorm-batch-1", "warning", "model",
                f"with a batch of 1 in train mode (e.g. the last batch of an epoch) the output does not depend on the "
                f"input: two different samples give outputs within {erased[0]:.2g} of each other (in eval mode they "
                f"differ by {erased[1]:.3g}): batch statistics over one sample erase it, so such a step trains "
                "nothing before the BatchNorm that erases it (the gradients there are rounding noise)",
                "DataLoader(drop_last=True) avoids a last batch of 1; or use GroupNorm/LayerNorm",
                verdict="a batch of 1 gives the same output for any input in train mode")
        return
    ck.row("batchnorm", "ok", f"{len(bns)} BatchNorm module(s); train mode works even with batch size 1")


def _one_sample_erased(work, inputs, batch: int) -> tuple[float, float] | None:
    """(largest difference in train mode, in eval mode) where the first two samples, fed one at a time, give the
    same outputs in train mode and different ones in eval mode: BatchNorm over one sample's positions, then a mean
    of them (a sweep: timm's starnet_s050 gives the head norm.bias whatever the image, and doctor said ok). Each
    pair runs under one seed (dropout alike); None when the samples are alike or the outputs cannot be compared."""
    import torch

    from ...core.recording import float_tensors

    pair = [inputs.map(lambda t, i=i: t[i:i + 1] if t.dim() and t.shape[0] == batch else t) for i in (0, 1)]
    given = [float_tensors(list(p.tensors())) for p in pair]
    if not given[0] or all(torch.equal(a, b) for a, b in zip(*given)):
        return None
    gaps = []
    for training in (True, False):
        work.train(training)
        outs = []
        for p in pair:
            with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(work)):
                torch.manual_seed(0)
                outs.append([o.detach().float() for o in float_tensors(p.call(work))])
        if not outs[0] or [o.shape for o in outs[0]] != [o.shape for o in outs[1]]:
            return None
        scale = max(float(o.abs().max()) for o in outs[0] + outs[1] if o.numel())
        gaps.append(max(float((a - b).abs().max()) for a, b in zip(*outs) if a.numel()) / max(scale, 1e-30))
    work.train()
    return (gaps[0], gaps[1]) if gaps[0] <= 1e-5 and gaps[1] > 1e-3 else None


def _cuda_devices(model) -> list:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
