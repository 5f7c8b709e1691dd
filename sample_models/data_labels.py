"""Broken labels for `torchdiag data`: every label 0; a class 20× rarer; a class absent; labels past the
model's 10 outputs."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

N = 600
OUT_OF_RANGE_AT = 77     # the first sample labelled 10 or 11


def _x():
    return torch.randn(N, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def all_zero():
    return TensorDataset(_x(), torch.zeros(N, dtype=torch.long))


def imbalanced():
    y = torch.arange(N) % 10
    y[(y == 3)] = torch.where(torch.arange(int((y == 3).sum())) < 3, 3, 4)   # class 3 keeps 3 samples of 60
    return TensorDataset(_x(), y)


def imbalanced_weighted(power: float = 1.0):
    """The imbalanced set drawn by a WeightedRandomSampler at 1 / count**power per sample: 1 balances the classes."""
    ds = imbalanced()
    y = ds.tensors[1]
    weights = (1.0 / torch.bincount(y).double() ** power)[y]
    return DataLoader(ds, batch_size=32, sampler=WeightedRandomSampler(weights, len(weights)))


def imbalanced_weighted_weakly():
    return imbalanced_weighted(0.25)


def absent():
    y = torch.arange(N) % 10
    y[y == 7] = 8
    return TensorDataset(_x(), y)


def out_of_range():
    y = torch.arange(N) % 10
    y[OUT_OF_RANGE_AT] = 10
    y[OUT_OF_RANGE_AT + 100] = 11
    return TensorDataset(_x(), y)


def dict_batches():
    """Dict samples {"image", "label"} with every label 0 (fields found by name)."""
    class D(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"image": torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(i)), "label": 0}
    return D()


def model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
