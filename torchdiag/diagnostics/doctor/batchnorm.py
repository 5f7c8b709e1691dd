"""batchnorm-batch-1: BatchNorm computing batch statistics over one value per channel raises, or over one sample
erases what the sample was (the output the same for any input). An error when the given batch does so in train mode;
a warning when a batch of 1 would erase silently, info when it would raise (loudly, and only if the loader makes
one, which doctor does not see), found by probes. The fact is the failing module and
what it received, or the outputs compared, never the error text.

batchnorm-momentum: running statistics that keep mostly the last batch, or never move (core/bn_momentum.py)."""
from __future__ import annotations

from ...core.seeds import second_sample
from ...core.tracking import ModuleTracker
from ...errors import one_line
from .checklist import Checklist
from .shared import batch_one, failing_call, name, values_kept


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


def bn_batch1_probe(work, inputs, ck: Checklist, erased: tuple[float, float] | None = None) -> None:
    """`erased`: one_sample_erased on the weights as given (before the training checks)."""
    import torch

    bns = bn_modules(work)
    batch = inputs.batch_size
    if "batchnorm" in ck.rows:
        return
    if not bns:
        ck.row("batchnorm", "ok", "no BatchNorm modules")
        return
    if batch is None or batch <= 1:
        if erased is not None:   # the user's own batch (a sweep: mobilevitv2 at -i 1x... said "ok", then failed on
            ck.find("batchnorm", "batchnorm-batch-1", "error", "model",   # param-not-updated, blaming a gate)
                    f"at your batch size of 1 in train mode the output does not depend on the input: {_gaps(erased)}: "
                    "BatchNorm's statistics over one sample erase it, so a step trains nothing before that BatchNorm "
                    "(the gradients there are rounding noise)",
                    "train with batches of 2 or more; or use GroupNorm/LayerNorm",
                    verdict="a batch of 1 gives the same output for any input in train mode")
            return
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
            # info: whether a batch of 1 ever comes is the loader's, which doctor does not see, and the failure is
            # loud (a port's 750 samples in 16s never make one; `data --model` tells, as last-batch-of-one)
            ck.find("batchnorm", "batchnorm-batch-1", "info", name(where),
                    f"a batch of 1 (e.g. the last batch of an epoch) would raise in train mode in {name(where)}: "
                    f"BatchNorm needs more than one value per channel; `torchdiag data --model` says whether your "
                    f"loader makes one",
                    "DataLoader(drop_last=True) avoids a last batch of 1; or use GroupNorm/LayerNorm",
                    verdict=f"a batch of 1 fails in train mode in {name(where)} (batch {batch} works)")
            return
        ck.row("batchnorm", "skipped", f"batch-1 probe failed for another reason: {one_line(exc, 100)}")
        return
    if erased is not None:
        ck.find("batchnorm", "batchnorm-batch-1", "warning", "model",
                f"with a batch of 1 in train mode (e.g. the last batch of an epoch) the output does not depend on the "
                f"input: {_gaps(erased)}: BatchNorm's statistics over one sample erase it, so such a step trains "
                "nothing before that BatchNorm (the gradients there are rounding noise)",
                "DataLoader(drop_last=True) avoids a last batch of 1; or use GroupNorm/LayerNorm",
                verdict="a batch of 1 gives the same output for any input in train mode")
        return
    ck.row("batchnorm", "ok", f"{len(bns)} BatchNorm module(s); train mode works even with batch size 1")


def bn_momentum(work, ck: Checklist) -> None:
    """batchnorm-momentum on the copy the training checks trained: what its BatchNorms' running statistics keep.
    Only those train mode trains: a BatchNorm that the model's own train() keeps in eval (frozen) keeps the
    statistics it was given, whatever its momentum."""
    from ...core.bn_momentum import CODE, kept_statistics

    work.train()
    trained = {n for n, m in work.named_modules() if m.training}
    for kept in kept_statistics(work, only=trained):
        names = [name(n) for n in kept.names]
        ck.find("batchnorm", CODE, "warning", names[0] if len(names) == 1 else "model", kept.message, kept.hint,
                verdict=kept.verdict, members=kept.members)


def _gaps(erased: tuple[float, float]) -> str:
    return (f"two different samples fed one at a time give outputs within {erased[0]:.2g} of each other, where fed "
            f"together they differ by {erased[1]:.3g}")


ERASED = 1e-3   # the difference alone at most this share of the one together (float32): the input is gone


def one_sample_erased(work, inputs) -> tuple[float, float] | None:
    """_erased with the model's BatchNorm statistics, mode and parameters as they were (the train-mode forwards move
    running statistics); None without BatchNorm or a batch size."""

    batch = inputs.batch_size
    if not bn_modules(work) or not batch:
        return None
    wide = _float32(work, inputs)
    if wide is not None:   # the erasure is the architecture's: asked in float32 (a sweep: bfloat16's rounding, 8 ulps
        try:               # = 6%, read 0.9% left by mobilenet_v3 as erased)
            return _erased(wide[0], wide[1], batch)
        except Exception:   # noqa: BLE001 - a forward that refuses float32 (it casts its own input): asked as it is
            pass            # (a review: exit 4; a BatchNorm1d's batch of one raising there too)
    modes = {m: m.training for m in work.modules()}
    try:
        with values_kept(work, parameters=False):
            return _erased(work, inputs, batch)
    except Exception:   # noqa: BLE001 - the probe's forwards failing says nothing here (the batch-1 forward is asked)
        return None
    finally:
        for m, training in modes.items():
            m.training = training


def _float32(work, inputs):
    """(a float32 copy of a reduced-precision model, its inputs in float32); None for a model whose weights are
    float32 already, or one that cannot be copied (asked in its own dtype then, as before: a review's model holding a
    lock lost a real erasure)."""
    import copy

    import torch

    from ...core.rounding import is_reduced

    if not any(is_reduced(p.dtype) for p in work.parameters()):
        return None
    try:
        wide = copy.deepcopy(work).float()
    except Exception:   # noqa: BLE001 - a model that cannot be copied
        return None
    return wide, inputs.map(lambda t: t.float() if torch.is_tensor(t) and t.is_floating_point() else t)


def _erased(work, inputs, batch: int) -> tuple[float, float] | None:
    """(largest difference fed one at a time, fed together) where two samples, each alone in train mode, give outputs
    that differ by _limit of what they do as a batch of 2 or less: BatchNorm over one sample's positions, then a mean
    of them (a sweep: timm's starnet_s050 gives the head norm.bias whatever the image, and doctor said ok). Against
    the pair's own batch, not the outputs' size (a freshly built model's may be ~1e-8 throughout: mobilevitv2) nor
    eval mode (a BatchNorm without running statistics erases there too: a review). The first two samples, or for a
    batch of 1 the sample and a perturbed copy (float inputs only). Each forward runs under one seed (dropout alike);
    None when the samples are alike or the outputs cannot be compared."""
    import torch

    if batch == 1:
        inputs, batch = two_samples(inputs, second_sample(0)), 2
        if inputs is None:
            return None
    two = inputs.map(lambda t: t[:2] if t.dim() and t.shape[0] == batch else t)
    pair = [inputs.map(lambda t, i=i: t[i:i + 1] if t.dim() and t.shape[0] == batch else t) for i in (0, 1)]
    given = [[t for _, t in p.tensors()] for p in pair]   # ids too (a review: a text CNN's were skipped)
    if not given[0] or all(torch.equal(a, b) for a, b in zip(*given)):
        return None
    work.train()
    first, second, together = _rows(work, pair[0], 1), _rows(work, pair[1], 1), _rows(work, two, 2)
    if not first or not second or not together or [o.shape for o in first] != [o.shape for o in second] \
            or len(together) != len(first):
        return None
    gap = max(float((a - b).abs().max()) for a, b in zip(first, second))
    ref = max(float((o[0] - o[1]).abs().max()) for o in together)
    scale = max(float(o.abs().max()) for o in together)
    # fed together the two must differ beyond rounding (outputs read from the input at all: a zero head's do not)
    return (gap, ref) if ref > 1e-4 * scale and gap <= _limit(work) * ref else None


def _rows(work, inputs, n: int) -> list | None:
    """The float outputs with n rows, of one train-mode forward under seed 0 (None where one is not finite)."""
    import torch

    from ...core.recording import float_tensors

    with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(work)):
        torch.manual_seed(0)
        outs = [o.detach().float() for o in float_tensors(inputs.call(work)) if o.dim() and o.shape[0] == n]
    return outs if all(bool(torch.isfinite(o).all()) for o in outs) else None


def _limit(work) -> float:
    """ERASED in float32; 8 roundings of a coarser dtype (bfloat16's 2^-7 left a real erasure at 0.027: a review)."""
    import torch

    dtype = next((p.dtype for p in work.parameters() if p.is_floating_point()), torch.float32)
    return max(ERASED, 8 * torch.finfo(dtype).eps)


def _cuda_devices(model) -> list:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
