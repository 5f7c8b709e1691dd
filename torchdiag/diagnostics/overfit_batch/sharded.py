"""overfit-batch on an FSDP-sharded copy (--wrap fsdp under torchrun). fully_shard makes every parameter
and gradient a DTensor holding this rank's shard (Shard(0)), and DTensors do not mix with the plain
tensors the loop stacks for its one read per step. So the loop reads the local shards (no collective)
and combines them across ranks only where a number needs the whole tensor: the gradient norm (one
all_reduce per update, which every rank makes since the stop is agreed), and after the loop, on every
rank, `localise` gathers the trained state and sums the per-shard flags and counts once."""
from __future__ import annotations


def local_view(p):
    """This rank's shard of `p` as a plain tensor carrying its shard of p.grad (what core.rounding's
    counts read); no collective."""
    from ...core.distributed import local_shard

    t = local_shard(p.detach())
    t.grad = None if p.grad is None else local_shard(p.grad).detach()
    return t


def global_norm(local, device, group=None):
    """The L2 norm of the whole gradients from the L2 norm of this rank's shards (`local`, a 0-d device
    tensor): one all_reduce (SUM) of the squares. Every rank must call it at every update (FSDP's
    gradients are None on every rank or on none, so every rank has a norm to give)."""
    import torch
    import torch.distributed as dist

    sq = (local.to(device, torch.float64) ** 2).reshape(1)
    dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=group)
    return sq.sqrt().float().reshape(())


def localise(trainer, model, why: str) -> None:
    """After the loop, on every rank (it gathers): the trainer's copy, parameters and start values
    replaced by whole plain tensors (core.distributed.unwrapped: the trained state, gathered under
    FSDP), so the causes' extra passes make no collective; under FSDP the per-shard "ever non-zero"
    flags and rounding counts are summed across ranks (one all_reduce) first."""
    from ...core.design import dropout_off
    from ...core.distributed import gathered, unwrapped

    plain = unwrapped(model, trainer.work, why)
    dropout_off(plain)   # as the trained copy ran
    trainer.quiet.attach(plain)
    if trainer.sharded:
        trainer.start = gathered(trainer.start, trainer.ctx.device)
        _sum_flags(trainer)
        params = dict(plain.named_parameters())
        trainer.trainable = [(n, params[n]) for n, _ in trainer.trainable]
    trainer.work = plain


def _sum_flags(trainer) -> None:
    """ever_nonzero: true when true on some rank's shard; the rounding counts: summed over the shards.
    The list of counts is the same on every rank (which parameters have a gradient and their dtypes are)."""
    import torch
    import torch.distributed as dist

    device, k = trainer.ctx.device, len(trainer.trainable)
    ever = trainer.ever_nonzero if trainer.ever_nonzero is not None else torch.zeros(k, dtype=torch.bool)
    parts = [ever.to(device, torch.float64)] + [c.to(device, torch.float64).reshape(-1) for _, c in trainer.stagnation]
    total = torch.cat(parts)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=trainer.group)
    trainer.ever_nonzero = total[:k] > 0
    at = k
    for i, (n, c) in enumerate(trainer.stagnation):
        trainer.stagnation[i] = (n, total[at:at + c.numel()].reshape(c.shape))
        at += c.numel()
