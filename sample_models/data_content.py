"""Broken data sets for `torchdiag data`'s content checks, one factory per check (FakeData-like images,
32 samples per batch). Each breaks exactly one thing; the index that is broken is a module constant."""
import torch
from torch.utils.data import DataLoader, Dataset

from data_fake import FakeData

NAN_AT = 137          # the first sample holding a NaN
SHAPE_AT = 40         # the sample whose shape differs
DUPLICATE_OF = {300: 12, 301: 12, 450: 99}   # sample -> the earlier sample it repeats


class Changed(Dataset):
    """FakeData with `change(i, x, y) -> (x, y)` applied to every sample."""

    def __init__(self, change, size=512, image_size=(3, 16, 16)):
        self.base, self.change = FakeData(size, image_size), change

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return self.change(i, x, y)


def _nan(i, x, y):
    if i in (NAN_AT, NAN_AT + 200):
        x = x.clone()
        x[1, 3, 4] = float("nan")
    return x, y


def non_finite():
    return Changed(_nan)


def _uint8(i, x, y):
    return (x.clamp(-2, 2) * 63 + 128).round().to(torch.uint8), y


def uint8_pixels():
    return Changed(_uint8)


def _float255(i, x, y):
    return (x.clamp(-2, 2) * 63 + 128).round(), y


def float_pixels():
    """ToTensor forgotten after a manual conversion: float pixels in 0–255."""
    return Changed(_float255)


def _shifted(i, x, y):
    return x * torch.tensor([0.05, 0.06, 0.07]).view(3, 1, 1) + torch.tensor([0.45, 0.50, 0.55]).view(3, 1, 1), y


def unstandardised():
    """Scaled to [0, 1]-ish but never normalised: mean ≈ (0.45, 0.50, 0.55), std ≈ (0.05, 0.06, 0.07)."""
    return Changed(_shifted)


def _shape(i, x, y):
    return (x[:, :12, :12].contiguous() if i == SHAPE_AT else x), y


def inconsistent_shapes():
    return Changed(_shape)


def _zero(i, x, y):
    return torch.zeros_like(x), y


def constant():
    return Changed(_zero)


class Duplicated(Dataset):
    def __init__(self):
        self.base = FakeData(512)

    def __len__(self):
        return 512

    def __getitem__(self, i):
        return self.base[DUPLICATE_OF.get(i, i)]


def duplicates():
    return Duplicated()


def tabular():
    """(N, 6) features where features 2 and 5 never vary: info only."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=g)
    x[:, 2] = 0.0
    x[:, 5] = 1.0
    y = torch.randint(0, 3, (400,), generator=g)
    return DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50, shuffle=True)
