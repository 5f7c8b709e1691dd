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


def _sentences(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 50, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g) for _ in range(n)]


def _padded(batch):
    """Pads token ids to the batch's longest (id 0), with the attention mask and all-zero token_type_ids."""
    length = max(len(s) for s, _ in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (s, _) in enumerate(batch):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.tensor([y for _, y in batch])}


TEXT_TRAIN = _sentences(120, 0)


def text_train():
    """Variable-length sentences in batches of 16, padded per batch."""
    return DataLoader([(s, i % 2) for i, s in enumerate(TEXT_TRAIN)], batch_size=16, collate_fn=_padded)


def text_val_leaky(batch_size: int = 1):
    """40 new sentences and 20 of the training split's, read one at a time (no padding) or in batches."""
    data = [(s, i % 2) for i, s in enumerate(_sentences(40, 1) + TEXT_TRAIN[:20])]
    return DataLoader(data, batch_size=batch_size, collate_fn=_padded)


def text_val_leaky_batched():
    return text_val_leaky(7)


def imbalanced_weighted_once():
    """The imbalanced set under a WeightedRandomSampler without replacement: each sample once an epoch, whatever the
    weights (the classes drawn as they are in the set)."""
    ds = imbalanced()
    y = ds.tensors[1]
    weights = (1.0 / torch.bincount(y).double())[y]
    return DataLoader(ds, batch_size=32, sampler=WeightedRandomSampler(weights, len(weights), replacement=False))


def balanced_weighted_wrongly():
    """Balanced classes drawn 10:1 and 1:20 by wrong weights (class 0 ten times, class 1 a twentieth)."""
    y = torch.arange(N) % 10
    weights = torch.where(y == 0, 10.0, 1.0).double() * torch.where(y == 1, 0.05, 1.0).double()
    return DataLoader(TensorDataset(_x(), y), batch_size=32, sampler=WeightedRandomSampler(weights, N))


def _pixels():
    """64 RGB images in [0, 1] with ImageNet-like statistics per channel."""
    g = torch.Generator().manual_seed(3)
    return (torch.rand(64, 3, 16, 16, generator=g) * 0.9 + 0.05).clamp(0, 1), torch.arange(64) % 4


def normalised_at_255():
    """0–255 pixels normalised with [0, 1] statistics (PILToTensor + float, then Normalize(ImageNet))."""
    x, y = _pixels()
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    return TensorDataset((x * 255 - mean) / std, y)


def normalised_at_1():
    """[0, 1] pixels normalised with 0–255 statistics."""
    x, y = _pixels()
    mean, std = torch.tensor([125.3, 123.0, 113.9])[:, None, None], torch.tensor([63.0, 62.1, 66.7])[:, None, None]
    return TensorDataset((x - mean) / std, y)


def one_class_blank():
    """Images of 4 classes; every image of class 2 is black (a transform that blanked it)."""
    x, y = _pixels()
    x[y == 2] = 0.0
    return TensorDataset(x, y)
