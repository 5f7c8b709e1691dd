"""A FakeData-like dataset (torchvision's FakeData, which is not installed here): random images with
random labels, each sample fixed by its index; tensors, already standardised. Healthy: no warning."""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class FakeData(Dataset):
    def __init__(self, size=512, image_size=(3, 16, 16), num_classes=10, offset=0):
        self.size, self.image_size, self.num_classes, self.offset = size, image_size, num_classes, offset

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if not 0 <= i < self.size:
            raise IndexError(i)
        g = torch.Generator().manual_seed(self.offset + i)
        return torch.randn(self.image_size, generator=g), int(torch.randint(self.num_classes, (1,), generator=g))


def dataset(size=512):
    return FakeData(size)


def loader(size=512, batch_size=32):
    return DataLoader(FakeData(size), batch_size=batch_size, shuffle=True, drop_last=True)


def val(size=128):
    return FakeData(size, offset=10_000)   # other seeds: no sample shared with the training split


def model():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))
