"""A model for `torchdiag doctor` under torchrun (tests/test_distributed_doctor.py), built the same on every
rank (seeded); what differs by rank comes from torchrun's RANK variable, read in forward.

`masked`: body (an MLP) plus three Linear(8, 4) branches added to its output, each with a hook on its
output's gradient (a hook on the activation, not on the parameter: fully_shard replaces parameters and
drops their hooks, an activation's hook stays):
  - `dead`: the gradient is zeroed on every rank: dead.weight and dead.bias get an all-zero gradient, so a
    step leaves them unchanged (param-not-updated, on every rank, wrapped or not);
  - `lone`: zeroed on rank 1 only: each rank's own gradient is zero on rank 1, but the gradient DDP or FSDP
    reduces (the mean over ranks) is rank 0's half, non-zero: lone.* change after the step on every rank
    when the step is the wrapped one;
  - `split`: output features 0 and 1 zeroed on every rank: rows 0-1 of split.weight and split.bias[0:2] get a
    zero gradient, the rest not. Under fully_shard over 2 ranks those rows are rank 0's shard exactly (Shard(0):
    rows 0-1 on rank 0, 2-3 on rank 1): judged shard by shard rank 0 would call split.* not updated; judged
    whole they change.
and `pre` → `head`, added too: `head` (Linear(8, 4)) is initialised to exactly zero, so pre.weight and pre.bias
get an all-zero gradient at the start and a non-zero one after a step: zero-init (info), not a bug; doctor
re-checks them on a plain local copy of the stepped wrapped one (under fully_shard: gathered on every rank).
`gain` (ones, multiplying the output): every forward writes 1 into gain[0:2] (`.data[:2] = 1.0`), over the
step: param-not-updated ("the next forward overwrites it") on every rank. Under fully_shard the write lands
on the all-gathered gain the forward uses, never on the shards, and only in rank 0's rows (Shard(0): [0:2]
on rank 0, [2:4] on rank 1): each rank sees it only by comparing the whole parameter its forward used.
And body.0.weight carries a gradient hook (a clamp at ±100 these gradients never reach): fully_shard
drops it (param-hook-dropped, warning under fsdp only).
Input: example_inputs(), 8 x 8."""
import os

import torch
from torch import nn


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _hook(t, fn):
    if t.requires_grad:   # not in no_grad forwards
        t.register_hook(fn)
    return t


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.dead = nn.Linear(8, 4)
        self.lone = nn.Linear(8, 4)
        self.split = nn.Linear(8, 4)
        self.pre = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x):
        dead = _hook(self.dead(x), torch.zeros_like)
        lone = self.lone(x)
        if _rank() == 1:
            _hook(lone, torch.zeros_like)
        keep = torch.tensor([0.0, 0.0, 1.0, 1.0], device=x.device)
        split = _hook(self.split(x), lambda g: g * keep)
        self.gain.data[:2] = 1.0     # the bug: every forward writes over the step (its first two entries)
        return (self.body(x) + dead + lone + split + self.head(self.pre(x))) * self.gain


def masked() -> nn.Module:
    torch.manual_seed(0)
    model = _Masked()
    # a hook on a parameter (a clamp these gradients never reach): kept by DDP, dropped by fully_shard
    model.body[0].weight.register_hook(lambda g: g.clamp(-100.0, 100.0))
    return model


def frozen_on_one() -> nn.Module:
    """A layer frozen on rank 1 only: DistributedDataParallel refuses to wrap models that differ across ranks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model[0].requires_grad_(_rank() != 1)
    return model


def example_inputs():
    return (torch.randn(8, 8, generator=torch.Generator().manual_seed(1)),)
