"""doctor under torchrun --wrap ddp|fsdp: the train-mode pass (forward, backward, one optimizer step, the
forward after it) runs on a wrapped copy, so the gradients judged are the reduced ones and the step is the
one the user's training makes.

Every collective (DDP's allreduce, FSDP's all-gather/reduce-scatter, DDP's construction, the exchanges
below) must be made by every rank in the same order. So: before the wrapped copy is made every rank says
whether it got there (`failing`: a rank that raised or stopped earlier says so before it raises); after the
wrapped forward and after the wrapped backward the ranks agree whether each ran everywhere, and if not every
rank runs the checks on its own plain copy instead. Under FSDP parameters and gradients are DTensor shards:
the update check compares local shards and sums its per-parameter counts over the ranks (`combine`), so a
whole parameter is judged the same on every rank; the forward after the step is judged on the whole
parameters it used (`forward_inputs`: an edit there never reaches the shards). The zero-gradient re-check
runs on a plain local copy (core.distributed.unwrapped; under FSDP every rank gathers, its decision being
already the same everywhere). Hooks on parameters that fully_shard drops are reported (param-hook-dropped)."""
from __future__ import annotations

import contextlib

from ...core.distributed import agree, inner, is_sharded, unwrapped
from ...errors import ModelError, one_line


class Wrapped:
    """The wrapped copy of doctor's working copy `plain` for one rank."""

    def __init__(self, model, plain, device):
        self.model = model
        self.plain = plain
        self.device = device
        self.sharded = is_sharded(model.parameters())

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

    @contextlib.contextmanager
    def forward_inputs(self, seen: dict):
        """Around a forward of the fully_shard root: `seen` gets each parameter as the all-gather handed it
        to this rank's forward, whole (a forward pre-hook, running after fully_shard's own), cloned."""
        def keep(module, args):
            seen.update({n: p.detach().clone() for n, p in module.named_parameters()})

        handle = self.model.register_forward_pre_hook(keep)
        try:
            yield seen
        finally:
            handle.remove()

    def own_chunk(self, t):
        """This rank's rows of a whole parameter, as fully_shard's Shard(0) cuts it (torch.chunk)."""
        import torch.distributed as dist

        if not t.dim():
            return t
        parts, rank = t.chunk(dist.get_world_size(), 0), dist.get_rank()
        return parts[rank] if rank < len(parts) else t[:0]

    def local_copy(self, why: str):
        """A plain copy holding the wrapped copy's state (under FSDP: gathered, every rank must call it)."""
        return unwrapped(self.plain, self.model, why)


HOOK_HINT = ("under fully_shard register it on the sharded parameter, after sharding, with "
             "p.register_post_accumulate_grad_hook (FSDP2 runs those on the sharded gradient), or change the "
             "gradient inside forward (a hook on the activation)")


def report_dropped_hooks(w: Wrapped, result) -> None:
    """param-hook-dropped (warning): gradient hooks the user's parameters carry and the fully_shard copy's do
    not. fully_shard replaces each parameter with a sharded one; a hook registered on the old tensor never
    runs (the training checks run without it, as FSDP training does)."""
    if not w.sharded:
        return
    lost = [n for n in _hooked(w.plain) if n not in set(_hooked(w.user))]
    if not lost:
        return
    shown = ", ".join(lost[:6]) + (f" … (+{len(lost) - 6} more)" if len(lost) > 6 else "")
    result.add("param-hook-dropped", "warning", lost[0],
               f"{len(lost)} parameter(s) carry gradient hooks that never run under fully_shard ({shown}): it replaces "
               "each parameter with a sharded one and the hooks stay on the old tensor; the training checks ran "
               "without them, as FSDP training does", HOOK_HINT)


def _hooked(model) -> list[str]:
    return [n for n, p in model.named_parameters()
            if getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)]


class Gate:
    """The exchange every rank makes once before the wrapped training checks: did any rank stop before them
    (raised, or its eval forward failed as predicted)? A rank that raises anywhere before it still makes it
    (doctor.run), so its peers do not wait for it in the wrapped copy's collectives."""

    def __init__(self, ctx, result):
        self.device, self.result = ctx.device, result
        self.crossed = False

    def cross(self, stopped: bool) -> bool:
        """True when the wrapped pass must not run: a rank stopped (this one, or a peer: then a note); no-op
        after the first call."""
        if self.crossed:
            return stopped
        self.crossed = True
        try:
            ranks = failing(self.device, stopped)
        except Exception as exc:   # a peer never came (it failed before doctor ran): no collective after this
            if not stopped:
                self.result.notes.append(f"the training checks ran on this rank's own copy, not the wrapped one: "
                                         f"the ranks could not agree to start them ({one_line(exc, 160)})")
            return True
        if ranks and not stopped:
            self.result.notes.append(f"the training checks ran on this rank's own copy, not the wrapped one: "
                                     f"{ranks_text(ranks)} stopped before them")
        return bool(ranks)


def failing(device, failed: bool) -> list[int]:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    flags = agree([failed and i == rank for i in range(world)], device)
    return [i for i, f in enumerate(flags) if f]


def make(work, ctx, result) -> Wrapped | None:
    """The wrapped copy of `work` (ctx.wrapped_copy); None (with a note) when the model cannot be copied or
    wrapped: a fact of the model, the same on every rank."""
    try:
        model = ctx.wrapped_copy(work, "to run the training checks wrapped")
    except ModelError as exc:
        result.notes.append(f"the training checks ran on this rank's own copy, not the wrapped one: {exc.message}")
        if exc.message.startswith("wrapping the model in"):   # the user's own wrapping fails so: an error (a sweep:
            result.add("wrap-failed", "error", "", f"{exc.message}: training under it fails the same way",   # PASS)
                       hint="the wrapper needs the same parameters on every rank (shapes, and requires_grad: a layer "
                            "frozen on one rank only)")
        return None
    return Wrapped(model, work, ctx.device)


def ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
