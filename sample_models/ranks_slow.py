"""One rank slower (and hungrier) on purpose, for profile and memory under torchrun.

On rank `slow_rank` (torch.distributed's rank; nothing happens outside a process group) every forward
sleeps `delay` seconds and, with `extra_mib`, allocates a temporary of that size (freed before the
forward returns). The sleep is host time, not compute the machine's load could hide: under DDP the
other ranks wait for this one in the gradient allreduce, which profile shows as their time in
collectives, and names this rank the straggler. Input: -i 8x32 (example_inputs gives it)."""
import time

import torch
from torch import nn


class SlowRank(nn.Module):
    def __init__(self, width: int = 32, classes: int = 4, slow_rank: int = 1, delay: float = 0.1, extra_mib: int = 0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, classes)
        self.slow_rank, self.delay, self.extra_mib = slow_rank, delay, extra_mib

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if _rank() == self.slow_rank:
            if self.delay > 0:              # time.sleep(0) still gives up the CPU: a delay of its own
                time.sleep(self.delay)
            if self.extra_mib:
                extra = torch.ones(self.extra_mib * (1 << 20) // 4, device=x.device)
                h = h + (extra.sum() * 0)       # used, so the allocation cannot be skipped
                del extra
        return self.fc2(h)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else -1


def build(slow_rank: int = 1, delay: float = 0.1, extra_mib: int = 0) -> nn.Module:
    return SlowRank(slow_rank=slow_rank, delay=delay, extra_mib=extra_mib)


def example_inputs():
    return (torch.randn(8, 32),)
