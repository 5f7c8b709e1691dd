"""Bad input for `torchdiag data`: a factory that returns something else; a data set raising at one index."""
import torch
from data_fake import FakeData
from torch.utils.data import DataLoader, Dataset

RAISES_AT = 57


def a_number():
    return 42


def a_tensor():
    return torch.zeros(10, 3)


class Raising(Dataset):
    def __init__(self):
        self.base = FakeData(128)

    def __len__(self):
        return 128

    def __getitem__(self, i):
        if i == RAISES_AT:
            raise ValueError(f"cannot decode image {i}")
        return self.base[i]


def raising():
    return DataLoader(Raising(), batch_size=16, shuffle=True)


def raising_in_workers():
    return DataLoader(Raising(), batch_size=16, shuffle=True, num_workers=2)


def factory_raises():
    raise RuntimeError("the data folder is not mounted")


def stream():
    """An infinite generator of (x, y) batches: bounded by --samples / --batches."""
    def gen():
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
    return gen()


class Interrupting(Dataset):
    """Ctrl-C (KeyboardInterrupt) at the 71st sample loaded: the partial result must keep what was measured."""

    def __init__(self):
        self.calls = 0

    def __len__(self):
        return 100

    def __getitem__(self, i):
        self.calls += 1
        if self.calls == 71:
            raise KeyboardInterrupt
        return torch.full((4,), float(i)), i % 2


def interrupting():
    return Interrupting()
