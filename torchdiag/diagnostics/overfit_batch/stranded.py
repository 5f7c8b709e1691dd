"""Samples a dead layer strands (a cause of cannot-overfit). After the run, some samples may get no unit of a
parameter-free activation: its output is exactly 0 for them (every ReLU input below zero) while its input is not.
No weight before that module then changes their output, and they keep whatever loss the layers after it leave
them. A sweep: an MLP with a 3-unit ReLU bottleneck left one label-0 sample among 27 label-1 ones with every
bottleneck unit off; its loss 3.33 was 77% of the plateau, and "no mechanical cause found" said to try more steps.
Claimed only where they all get one output while their targets differ (a floor no weight can lower), and carry at
least half of the final loss (forwards of the two subsets and of the whole batch on the trained copy, which tell a
mean from a sum). Cost: four forwards, on the failure path only."""
from __future__ import annotations

SHARE = 0.5        # the stranded samples' part of the final loss, at least


def find(trainer) -> dict | None:
    """{module, type, samples, batch, share, stranded_loss, rest_loss} or None."""
    import torch

    work, batch = trainer.work, trainer.batch
    bsz = batch.batch_size
    if not bsz or bsz < 2 or trainer.loss_fn.target is None or not isinstance(trainer.loss_fn.target, torch.Tensor):
        return None
    hit = _first_stranding(work, batch, bsz, trainer)
    if hit is None:
        return None
    name, kind, rows, out = hit
    if not _one_answer_for_different_targets(out, trainer.loss_fn.target, rows, bsz):
        return None
    k = len(rows)
    loss_in, loss_out = _subset_loss(trainer, rows), _subset_loss(trainer, [i for i in range(bsz) if i not in rows])
    whole = _subset_loss(trainer, list(range(bsz)))
    if loss_in is None or loss_out is None or whole is None or whole <= 0:
        return None
    # a mean over the samples or a sum: the whole batch's loss says which (another reduction claims nothing)
    if abs(k * loss_in + (bsz - k) * loss_out - bsz * whole) <= 1e-3 * bsz * whole:
        share = k * loss_in / (bsz * whole)
    elif abs(loss_in + loss_out - whole) <= 1e-3 * whole:
        share, loss_in, loss_out = loss_in / whole, loss_in / k, loss_out / (bsz - k)
    else:
        return None
    if share < SHARE:
        return None
    return {"module": name or "(root)", "type": kind, "samples": rows, "batch": bsz, "share": share,
            "stranded_loss": loss_in, "rest_loss": loss_out}


def _first_stranding(work, batch, bsz: int, trainer):
    """The first parameter-free module (in completion order) whose output is exactly 0 for some samples, not all,
    where its input is not: (name, type, sample indices). One read of all the flags."""
    import torch

    names = {id(m): n for n, m in work.named_modules()}
    seen: list = []

    def hook(mod, args, output):
        x = args[0] if args else None
        if not (isinstance(output, torch.Tensor) and isinstance(x, torch.Tensor) and output.is_floating_point()
                and output.dim() >= 2 and output.shape[0] == bsz and x.shape[:1] == output.shape[:1]
                and output[0].numel() > 0):
            return
        out0 = output.detach().reshape(bsz, -1).eq(0).all(1)
        in0 = x.detach().reshape(bsz, -1).eq(0).all(1)
        seen.append((names.get(id(mod), "?"), type(mod).__name__, out0 & ~in0, output.untyped_storage().data_ptr()))

    handles = [m.register_forward_hook(hook) for m in work.modules()
               if not any(True for _ in m.parameters(recurse=True)) and m is not work]
    try:
        with torch.no_grad(), trainer.autocast():
            out = batch.call(work)
    except Exception:
        return None
    finally:
        for h in handles:
            h.remove()
    if not seen:
        return None
    from .causes import sample_tensor

    y = sample_tensor(out, bsz)
    final = y.untyped_storage().data_ptr() if y is not None else None
    flags = torch.stack([f.to(seen[0][2].device) for _, _, f, _ in seen]).tolist()
    for (name, kind, _, ptr), row in zip(seen, flags):
        rows = [i for i, v in enumerate(row) if v]
        # the model's output itself (a ReLU at the end against negative targets) is the output's range, not a dead
        # layer: no seed or width changes it (a review)
        if 0 < len(rows) < bsz and ptr != final:
            return name, kind, rows, out
    return None


def _one_answer_for_different_targets(out, target, rows: list[int], bsz: int) -> bool:
    """The stranded samples get one and the same output (nothing around the dead layer reaches them: no skip
    connection) while their targets differ: no weight can fit them all, a floor. Targets alike are fitted by the
    layers after it (their biases), only slower: no cause (a review of the first version)."""
    import torch

    from .causes import same_across_samples, sample_tensor

    y = sample_tensor(out, bsz)
    if y is None or len(rows) < 2 or not (isinstance(target, torch.Tensor) and target.dim() and target.shape[0] == bsz):
        return False
    index = torch.tensor(rows)
    same, _ = same_across_samples(y.index_select(0, index.to(y.device)))
    t = target.index_select(0, index.to(target.device)).reshape(len(rows), -1)
    return same and bool((t != t[:1]).any())


def _subset_loss(trainer, rows: list[int]) -> float | None:
    """The run's loss on the samples `rows`, a forward of them on the trained copy."""
    import torch

    bsz = trainer.batch.batch_size
    index = torch.tensor(rows)

    def pick(t):
        return t.index_select(0, index.to(t.device)) if t.dim() and t.shape[0] == bsz else t

    loss = trainer.ctx.loss()
    loss.target, loss.made_target = pick(trainer.loss_fn.target), trainer.loss_fn.made_target
    try:
        with torch.no_grad(), trainer.autocast():
            value = float(loss(trainer.batch.map(pick).call(trainer.work)))
    except Exception:
        return None
    return value if value == value and value >= 0 else None
