"""An input-bound pipeline: every sample costs SAMPLE_S of sleeping in __getitem__ (an expensive decode),
num_workers=0, and a model whose step is much shorter than a batch's loading."""
import time

from torch import nn
from torch.utils.data import DataLoader, Dataset

from data_fake import FakeData

SAMPLE_S = 0.002


class Slow(Dataset):
    def __init__(self, size=2048):
        self.base = FakeData(size)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        time.sleep(SAMPLE_S)
        return self.base[i]


def slow(batch_size=16):
    return DataLoader(Slow(), batch_size=batch_size, shuffle=True)


def model():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))


class VerySlow(Slow):
    def __getitem__(self, i):
        time.sleep(VERY_SLOW_S)
        return self.base[i]


VERY_SLOW_S = 0.02


def very_slow():
    """80 ms of loading per batch of 4 at num_workers=0, against a step on a (4, 768) batch."""
    return DataLoader(VerySlow(48), batch_size=4, shuffle=True)
