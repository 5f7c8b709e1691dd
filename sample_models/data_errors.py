"""Bad input for `torchdiag data`: a factory that returns something else; a data set raising at one index."""
import torch
from torch.utils.data import DataLoader, Dataset

from data_fake import FakeData

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
