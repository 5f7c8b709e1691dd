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
