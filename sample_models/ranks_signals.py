"""A model that holds its forward, for Ctrl-C and SIGTERM under torchrun (tests/test_distributed_signals.py).

Every forward on a rank in `hold` (RANK, torchrun's variable; "all" = every rank) first writes
`<marker>.rank<R>.pid` holding the process id (so a test knows that rank reached its forward and which
process to look for afterwards), then sleeps `seconds`: a test sends its signal while the ranks are in
there. A rank not in `hold` also writes its marker, then goes on, so it waits for the held ones in the
next collective (DDP's allreduce, or torchdiag's gather). With `start` = k, the first k forwards of the
process (all its copies count) neither write nor hold: the signal then comes mid-training. With `aux_on`,
a second layer runs on those ranks only: under DDP its gradient bucket is reduced on one rank, which then
waits in native code for a peer that never joins, and that peer in the next collective (both blocked).
Input: example_inputs(), 8 × 8."""
import os
import time

import torch
from torch import nn

_calls = [0]   # forwards so far in this process, over every copy of the model


class Held(nn.Module):
    def __init__(self, marker: str, hold: str, seconds: float, start: int, aux_on: str = ""):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.aux = nn.Linear(8, 4) if aux_on else None   # unused everywhere otherwise: DDP would refuse it
        self.marker, self.hold, self.seconds, self.start, self.aux_on = marker, hold, seconds, start, aux_on

    def forward(self, x):
        rank = os.environ.get("RANK", "0")
        _calls[0] += 1
        if _calls[0] <= self.start:
            return self.fc(x)
        if self.marker:
            path = f"{self.marker}.rank{rank}.pid"
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(path + ".tmp", path)   # whole, so a reader never sees an empty file
        if self.hold == "all" or rank in str(self.hold).split(","):
            time.sleep(self.seconds)
        return self.fc(x) + (self.aux(x) if self.aux is not None and rank in self.aux_on.split(",") else 0)


def build(marker: str = "", hold: str = "all", seconds: float = 3600.0, start: int = 0, aux_on: str = "") -> nn.Module:
    return Held(marker, str(hold), seconds, start, str(aux_on))


def example_inputs():
    return (torch.randn(8, 8),)
