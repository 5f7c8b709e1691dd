"""scikit-learn's digits (1,797 8x8 images, bundled with scikit-learn: nothing is downloaded) as a real data
set: a stratified train/validation split with no sample in both, standardised per pixel position with the
training split's statistics, in shuffled DataLoaders. Healthy: no warning."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.images.astype(np.float32)
    xtr, xva, ytr, yva = train_test_split(x, d.target, test_size=0.25, random_state=0, stratify=d.target)
    mean, std = xtr.mean(), xtr.std()
    norm = lambda a: torch.from_numpy((a - mean) / std).unsqueeze(1)  # noqa: E731  (N, 1, 8, 8)
    return (norm(xtr), torch.from_numpy(ytr).long()), (norm(xva), torch.from_numpy(yva).long())


def train(batch_size=64):
    (x, y), _ = _split()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(0))


def val(batch_size=256):
    _, (x, y) = _split()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def raw():
    """The digits as scikit-learn gives them: pixel values 0–16, not standardised."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return TensorDataset(torch.from_numpy(d.images.astype(np.float32)).unsqueeze(1), torch.from_numpy(d.target).long())


def leaky_val(batch_size=256):
    """A validation split with 30 training samples copied in (the leak the check must find)."""
    (xt, yt), (x, y) = _split()
    return DataLoader(TensorDataset(torch.cat([x, xt[:30]]), torch.cat([y, yt[:30]])), batch_size=batch_size)


def model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
