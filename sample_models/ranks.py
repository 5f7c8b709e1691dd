"""Models for runs under torchrun (tests/test_distributed.py), each built the same on every rank (the
factory is seeded); what differs by rank comes from torchrun's RANK variable, read in forward.

`healthy`: an MLP; ranks stay identical under DDP.
`diverging`: `scale` is nudged in place (outside autograd) by 0.01 × rank in every train-mode forward,
   so under DDP it differs across ranks from step 1; a BatchNorm1d whose running statistics differ
   across ranks (each rank's own rows: info, not a bug); `side` is a Linear DDP is told to ignore
   (the attribute DDP's `_set_params_and_buffers_to_ignore_for_model` sets), so its gradients are
   never reduced.
`unused`: `extra` (a Linear) never runs in forward: under DDP, extra.weight and extra.bias get no
   gradient on any rank.
`fails_on_rank`: forward raises on rank `rank` only (the others finish).
`branch_on_rank`: `aux` (a Linear) runs in forward on rank 0 only (a data-dependent branch): under DDP
   the ranks' gradient buckets disagree; under fully_shard the reduce-scatters differ in size.
`nan_on_rank`: module `poison` turns its output to NaN on rank `rank` only.
`build_fails_on_rank`: the factory itself raises on rank `rank` (the others build the healthy MLP); `exits`: it calls
   sys.exit(3) there instead.
`buffer_on_rank`: the healthy MLP with a buffer registered on rank `rank` only; with `dtype_only`, on every rank, in
   float64 on rank `rank` and float32 on the others (the same values); with `ignored`, on every rank, of another shape
   on rank `rank`, and DDP told to ignore it (a rank-local cache).
`extra_on_rank`: the healthy MLP with one more Linear at its end on rank `rank` only (a factory that reads the rank).
`full_on_rank`: the healthy MLP, on a rank whose memory is full: on rank `rank` every copy of the model is refused
   for want of room (torchdiag's room check is made to refuse there: a GPU another job fills, simulated).
Input for all: example_inputs(), 8 × 8."""
import os

import torch
from torch import nn


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class _Drifting(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
        self.scale = nn.Parameter(torch.ones(4))
        self.side = nn.Linear(8, 4)
        # the second bug: DDP leaves these out of its allreduce (each rank keeps its own gradient)
        self._ddp_params_and_buffers_to_ignore = ["side.weight", "side.bias"]

    def forward(self, x):
        if self.training:
            with torch.no_grad():   # the bug: a rank-dependent update autograd (and DDP) never sees
                self.scale.add_(0.01 * _rank())
        return self.body(x) * self.scale + self.side(x)


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.extra = nn.Linear(8, 4)        # the bug: built, never called

    def forward(self, x):
        return self.body(x)


class _FailsOnRank(nn.Module):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        if _rank() == self.rank:
            raise RuntimeError(f"this model fails on rank {self.rank}")
        return self.body(x)


class _Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.aux = nn.Linear(8, 4)

    def forward(self, x):
        y = self.body(x)
        return y + self.aux(x) if _rank() == 0 else y


class _Poison(nn.Module):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        return x * float("nan") if _rank() == self.rank else x


def healthy() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def diverging() -> nn.Module:
    return _Drifting()


def unused() -> nn.Module:
    return _Unused()


def fails_on_rank(rank: int = 1) -> nn.Module:
    return _FailsOnRank(rank)


def build_fails_on_rank(rank: int = 1, exits: bool = False) -> nn.Module:
    if _rank() == rank:
        if exits:
            import sys

            sys.exit(3)
        raise RuntimeError(f"this factory fails on rank {rank}")
    return healthy()


def buffer_on_rank(rank: int = 1, dtype_only: bool = False, ignored: bool = False) -> nn.Module:
    model = healthy()
    if ignored:
        model.register_buffer("extra", torch.zeros(2 if _rank() == rank else 1, 4))
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["extra"])
    elif dtype_only:
        model.register_buffer("extra", torch.ones(3, dtype=torch.float64 if _rank() == rank else torch.float32))
    elif _rank() == rank:
        model.register_buffer("extra", torch.ones(3))
    return model


def extra_on_rank(rank: int = 1) -> nn.Module:
    model = healthy()
    return nn.Sequential(*model, nn.Linear(4, 4)) if _rank() == rank else model


def branch_on_rank() -> nn.Module:
    return _Branch()


def nan_on_rank(rank: int = 1) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), _Poison(rank), nn.Linear(16, 4))


def full_on_rank(rank: int = 1) -> nn.Module:
    if _rank() == rank:
        from torchdiag.core import train

        def full(model, why, *args, **kwargs):
            raise train.NoRoom(f"not enough memory for a copy of the model {why}: rank {rank}'s memory is full")

        train.room_for_copy = full
    return healthy()


def example_inputs():
    return (torch.randn(8, 8),)
