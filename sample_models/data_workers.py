"""Worker traps: a dataset whose random augmentation comes from a generator it owns (copied into every
worker: augmentations repeat across workers and epochs); one that uses numpy's global RNG (torch seeds
it per worker: healthy); a worker that dies; pin_memory on a machine without CUDA."""
import os

import numpy as np
import torch
from data_fake import FakeData
from torch.utils.data import DataLoader, Dataset

CRASH_AT = 5


class OwnRng(Dataset):
    def __init__(self):
        self.base = FakeData(64)
        self.rng = np.random.default_rng(0)      # made once, copied into each worker

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x, y = self.base[i]
        return x + torch.from_numpy(self.rng.normal(0, 0.1, x.shape).astype(np.float32)), y


class GlobalRng(OwnRng):
    def __getitem__(self, i):
        x, y = self.base[i]
        return x + torch.from_numpy(np.random.normal(0, 0.1, x.shape).astype(np.float32)), y


def own_rng():
    return DataLoader(OwnRng(), batch_size=8, num_workers=2, shuffle=True)


def global_rng():
    return DataLoader(GlobalRng(), batch_size=8, num_workers=2, shuffle=True)


class Crash(Dataset):
    def __init__(self, at: int = CRASH_AT):
        self.base, self.at = FakeData(64), at

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == self.at and torch.utils.data.get_worker_info() is not None:
            os._exit(7)       # a native crash, as a segfault in a decoder would be
        return self.base[i]


def crash():
    return DataLoader(Crash(), batch_size=8, num_workers=2)


def crash_later():
    """The crash after batches went through: the main process may meet the dying worker's last batch (a broken
    connection to its shared memory) before it sees the death."""
    return DataLoader(Crash(at=40), batch_size=4, num_workers=2)


def pinned():
    return DataLoader(FakeData(256), batch_size=32, shuffle=True, drop_last=True, pin_memory=True)


def _slow_init(worker_id):
    import time

    time.sleep(START_S)      # an expensive worker start (opening files, a connection, loading an index)


START_S = 0.8


def slow_start():
    return DataLoader(FakeData(256), batch_size=32, shuffle=True, drop_last=True, num_workers=1,
                      worker_init_fn=_slow_init)
