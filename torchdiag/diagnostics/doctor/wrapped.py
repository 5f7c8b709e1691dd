"""doctor under torchrun --wrap ddp|fsdp: the train-mode pass (forward, backward, one optimizer step, the
forward after it) runs on a wrapped copy, so the gradients judged are the reduced ones and the step is the
one the user's training makes.

Every collective (DDP's allreduce, FSDP's all-gather/reduce-scatter, DDP's construction, the exchanges
below) must be made by every rank in the same order. So: before the wrapped copy is made every rank says
whether it got there (`failing`: a rank that raised or stopped earlier says so before it raises); after the
wrapped forward and after the wrapped backward the ranks agree whether each ran everywhere, and if not every
rank runs the checks on its own plain copy instead. Under FSDP parameters and gradients are DTensor shards:
the update check compares local shards and sums its per-parameter counts over the ranks (`combine`), so a
whole parameter is judged the same on every rank. The zero-gradient re-check runs on a plain local copy
(core.distributed.unwrapped; under FSDP every rank gathers, its decision being already the same everywhere)."""
from __future__ import annotations

from ...core.distributed import agree, inner, unwrapped


class Wrapped:
    """The wrapped copy of doctor's working copy `plain` for one rank."""

    def __init__(self, model, plain, device):
        self.model = model
        self.plain = plain
        self.device = device
        self.sharded = any(hasattr(p, "to_local") for p in model.parameters())

    @property
    def user(self):
        """The user's module inside the wrapper: the user's parameter names."""
        return inner(self.model)

    def combine(self, scalars: list, always: bool = False) -> list:
        """Device scalars summed over the ranks (one all_reduce, read back later by the caller) when the
        parameters are sharded (or `always`); as they are otherwise. A flag summed is > 0 when any rank set it."""
        if not scalars or not (self.sharded or always):
            return scalars
        import torch
        import torch.distributed as dist

        t = torch.stack([s.detach().reshape(()).to(torch.float64) for s in scalars])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return list(t.unbind())

    def failing(self, failed: bool) -> list[int]:
        """The ranks that set `failed` (one all_reduce; every rank calls it at the same point)."""
        return failing(self.device, failed)

    def forward_model(self):
        """What the forward after the step runs: DDP's inner module (no collective, the same parameters);
        the fully_shard root itself (its all-gather, every rank)."""
        return self.model if self.sharded else self.user

    def resharded(self) -> None:
        """A fully_shard root keeps its parameters unsharded after a forward: shard them again, so
        named_parameters() are the DTensors the step updated."""
        if self.sharded and hasattr(self.model, "reshard"):
            self.model.reshard()

    def local_copy(self, why: str):
        """A plain copy holding the wrapped copy's state (under FSDP: gathered, every rank must call it)."""
        return unwrapped(self.plain, self.model, why)


def failing(device, failed: bool) -> list[int]:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    flags = agree([failed and i == rank for i in range(world)], device)
    return [i for i, f in enumerate(flags) if f]


def make(work, ctx) -> Wrapped | None:
    """The wrapped copy of `work` (ctx.wrapped_copy); None without a wrapper."""
    if ctx.pass_wrapper is None:
        return None
    model = ctx.wrapped_copy(work, "to run the training checks wrapped")
    return Wrapped(model, work, ctx.device)


def ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
