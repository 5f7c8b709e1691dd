"""Loader traps: a training loader with shuffle=False over labels sorted by class; a last batch of one
sample with a model whose BatchNorm1d refuses it in train mode."""
import torch
from data_fake import FakeData
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def sorted_labels(batch_size=32):
    x = torch.randn(640, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    y = torch.arange(640) // 64           # 0 × 64, 1 × 64, ... sorted
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def last_batch_of_one():
    return DataLoader(FakeData(161), batch_size=32, shuffle=True)     # 161 = 5 × 32 + 1


def batchnorm_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def drop_last_shuffled():
    """97 samples, batches of 32, drop_last=True: 3 batches an epoch, 1 sample left out, drawn anew each epoch."""
    x = torch.randn(97, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    return DataLoader(TensorDataset(x, torch.arange(97) % 4), batch_size=32, shuffle=True, drop_last=True)


def drop_last_sequential():
    """The same in order: the last sample is never trained on."""
    x = torch.randn(97, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    return DataLoader(TensorDataset(x, torch.arange(97) % 4), batch_size=32, shuffle=False, drop_last=True)
