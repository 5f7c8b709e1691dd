"""DATA_SPEC → what the user's data is: a map-style Dataset, a DataLoader, an IterableDataset or any
iterable of batches.

`path/to/file.py:factory` and `dotted.module:factory` are loaded as model specs are (core.loading:
split_spec, import_module, find_factory, parse_args): the factory is called with `--arg key=value`.
`torchvision:NAME` builds a torchvision dataset already on disk (`--arg root=DIR`; never downloads;
torchvision must be installed, see core.sources.require)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError, UsageError, one_line
from . import loading, sources

DATA_FORMS = "path/to/file.py:factory, dotted.module:factory or torchvision:NAME (with --arg root=DIR)"
WHAT = "a torch Dataset, a DataLoader or an iterable of batches"


@dataclass
class LoadedData:
    obj: Any              # what the factory returned
    spec: str
    kind: str             # dataloader | dataset | iterable-dataset | iterable
    label: str            # for the header: "data.py:build_train() → DataLoader"

    @property
    def loader(self):
        return self.obj if self.kind == "dataloader" else None

    @property
    def dataset(self):
        """The map-style dataset behind it (None for iterables)."""
        if self.kind == "dataset":
            return self.obj
        if self.kind == "dataloader" and is_map_style(self.obj.dataset):
            return self.obj.dataset
        return None


def is_map_style(obj) -> bool:
    from torch.utils.data import IterableDataset

    return not isinstance(obj, IterableDataset) and hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def kind_of(obj, what: str) -> str:
    """dataloader | dataset | iterable-dataset | iterable; anything else is a usage error naming it."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(obj, DataLoader):
        return "dataloader"
    if isinstance(obj, IterableDataset):
        return "iterable-dataset"
    refused = isinstance(obj, (str, bytes, dict, torch.Tensor, torch.nn.Module)) or obj is None
    if not refused and is_map_style(obj) and (not isinstance(obj, (list, tuple)) or _holds_samples(obj)):
        return "dataset"
    if not refused and (hasattr(obj, "__iter__") or hasattr(obj, "__next__")):
        return "iterable"
    name = type(obj).__name__ if type(obj).__module__ == "builtins" else f"{type(obj).__module__}.{type(obj).__qualname__}"
    got = "None" if obj is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
    shape = f" of shape {tuple(obj.shape)}" if isinstance(obj, torch.Tensor) else ""
    raise UsageError(f"{what} returned {got}{shape}, not {WHAT}",
                     hint="return the Dataset or DataLoader itself (e.g. torch.utils.data.TensorDataset(x, y)); "
                          "a tensor of samples can be wrapped in TensorDataset")


def _holds_samples(seq) -> bool:
    """Is a list a list of samples rather than of batches? DataLoader's collate gives every field of a batch one
    leading batch size, and makes numbers tensors: a first item whose tensors differ in leading size (an input and
    its one-hot label) is a sample, and so is one holding a Python number or a 0-d tensor beside at most one tensor
    (`(x, 3)`). A number beside tensors sharing a leading size is a batch's own field (a loss weight, a step: a
    review). Tensors alone, sharing one leading size, stay batches: the two readings are not told apart there (a
    review: reading a dict of 1-D tensors as a sample misread recommender batches {"user": (B,), "item": (B,)}); the
    header says which reading was taken (_list_reading)."""
    if not seq:
        return False
    arrays, numbers = _array_types()   # numpy's arrays and scalars as torch's (a sweep: (ndarray, np.int64) pairs)
    first = seq[0]
    fields = first.values() if isinstance(first, dict) else first if isinstance(first, (list, tuple)) else (first,)
    fields = list(fields)
    tensors = [f for f in fields if isinstance(f, arrays) and f.ndim >= 1]
    if len({t.shape[0] for t in tensors}) > 1:
        return True
    scalar = any(isinstance(f, numbers) or (isinstance(f, arrays) and f.ndim == 0) for f in fields)
    return scalar and len(tensors) <= 1


def _split(spec: str, option: str) -> tuple[str, str]:
    """(file or module, factory) of a data spec; a model source (timm:, hf:) or a malformed spec is a UsageError."""
    if sources.is_source(spec):
        raise UsageError(f"{option} '{spec}': {spec.partition(':')[0]}: names models, not data",
                         hint=f"write it as {DATA_FORMS}")
    try:
        return loading.split_spec(spec)
    except UsageError as exc:
        raise UsageError(exc.message.replace("MODEL_SPEC", option), hint=f"write it as {DATA_FORMS}") from None


def check_data_spec(spec: str, option: str = "DATA_SPEC") -> None:
    """Refuse a spec whose form or .py file is wrong before any work (check's configuration), without importing it:
    the file's own code runs once, when the data is loaded."""
    import os

    if spec.startswith("torchvision:"):
        return
    where, _ = _split(spec, option)
    # a dotted module is left to the load (a review: finding it here ran its package's __init__ and missed the folder
    # the loader puts on sys.path)
    if where.endswith(".py") and not os.path.exists(where):
        from .spec_check import file_not_found

        raise file_not_found(where, "data file")


def load_data(spec: str, arg_pairs: list[str] | None = None, seed: int | None = 0, option: str = "DATA_SPEC") -> LoadedData:
    """Import and call the factory (seeded, like a model factory); say what it returned otherwise."""
    kwargs = loading.parse_args(arg_pairs)
    if spec.startswith("torchvision:"):
        obj, label = _torchvision_dataset(spec.partition(":")[2], kwargs)
        return LoadedData(obj, spec, kind_of(obj, label), label)
    where, name = _split(spec, option)
    module = loading.import_module(where, "data file")
    factory = loading.find_factory(module, name, where)
    obj = _call(factory, name, kwargs, seed)
    return loaded(obj, spec, f"{name}()", f"{name}() → ")


def loaded(obj, spec: str, what: str, label: str = "") -> LoadedData:
    """What a data factory (or a caller) handed over, read: `X, y` arrays as a TensorDataset (as_columns), else as
    it is, its kind told (kind_of); `label` leads the header's description."""
    made = as_columns(obj)
    if made is not None:
        return LoadedData(made, spec, "dataset", f"{label}({', '.join(type(c).__name__ for c in obj)}) as a TensorDataset")
    kind = kind_of(obj, what)
    return LoadedData(obj, spec, kind, f"{label}{type(obj).__name__}{_list_reading(obj, kind)}")


def _list_reading(obj, kind: str) -> str:
    """For the header: how a list was read, where the other reading was possible (a sweep: Hugging Face-style
    {"input_ids": (L,), "labels": (L,)} items were read as batches of L scalars, unsaid)."""
    if not isinstance(obj, (list, tuple)) or not obj:
        return ""
    if kind == "dataset":
        return f" of {len(obj)} samples"
    return (f" of {len(obj)} batch{'es' if len(obj) != 1 else ''} (each item's tensors share one leading size; a list "
            "of samples? return a Dataset, or DataLoader(the list, batch_size=...))")


def _array_types() -> tuple[tuple, tuple]:
    """(array types, number types): torch's, and numpy's where numpy is imported already."""
    import sys

    import torch

    np = sys.modules.get("numpy")
    return ((torch.Tensor,) + ((np.ndarray,) if np is not None else ()),
            (bool, int, float) + ((np.generic,) if np is not None else ()))


def as_columns(obj):
    """`return X, y` (scikit-learn's arrays, or tensors): a tuple of 2–8 arrays sharing one leading size is a
    dataset's columns, read as TensorDataset(X, y) (a sweep: two numpy arrays were read as two batches, and their
    duplicates and shapes reported on that). None for anything else (a list stays a list of batches or samples)."""
    import torch

    arrays, _ = _array_types()
    if not (isinstance(obj, tuple) and 2 <= len(obj) <= 8 and all(isinstance(c, arrays) for c in obj)):
        return None
    if any(c.ndim < 1 for c in obj) or len({c.shape[0] for c in obj}) != 1 or obj[0].shape[0] < 2:
        return None
    from torch.utils.data import TensorDataset

    def tensor(c):   # a flipped (negative-stride) or big-endian array copied to one torch can hold (a review)
        import numpy as np

        return c if isinstance(c, torch.Tensor) else torch.as_tensor(np.ascontiguousarray(c, c.dtype.newbyteorder("=")))

    try:
        return TensorDataset(*[tensor(c) for c in obj])
    except Exception:   # an object or string array torch cannot hold: read as it comes
        return None


def _call(factory, name: str, kwargs: dict, seed: int | None):
    import torch

    try:
        if seed is not None:
            torch.manual_seed(seed)
        return factory(**kwargs)
    except TypeError as exc:
        try:
            inspect.signature(factory).bind(**kwargs)
        except TypeError:
            raise UsageError(f"{name}() does not accept these --arg values: {one_line(exc)}") from exc
        except ValueError:
            pass
        raise ModelError(f"{name}() raised {one_line(exc)}") from exc
    except Exception as exc:
        raise ModelError(f"{name}() raised {one_line(exc)}",
                         hint="the data factory itself failed; run it in Python to see the traceback") from exc


def _torchvision_dataset(name: str, kwargs: dict):
    """torchvision.datasets.NAME(root, train=..., download=False, transform=ToTensor()) from disk."""
    sources.require("torchvision")
    datasets = sources.require("torchvision.datasets")
    cls = getattr(datasets, name, None)
    if not isinstance(cls, type):
        known = [n for n in dir(datasets) if isinstance(getattr(datasets, n), type) and not n.startswith("_")]
        raise sources.unknown_name("torchvision", name, known, "data set")   # (a review: "no model named")
    kwargs = dict(kwargs)
    if kwargs.pop("download", False):
        raise UsageError(f"torchvision:{name}: --arg download=True would download it; {sources.NO_NETWORK}",
                         hint="download it once yourself, then give --arg root=DIR")
    if "root" not in kwargs:
        raise UsageError(f"torchvision:{name} needs --arg root=DIR (the folder the data set is in)")
    params = inspect.signature(cls).parameters
    if "download" in params:
        kwargs["download"] = False
    if "transform" in params and "transform" not in kwargs:
        transforms = sources.require("torchvision.transforms")
        kwargs["transform"] = transforms.ToTensor()
    try:
        return cls(**kwargs), f"torchvision {name}"
    except (RuntimeError, FileNotFoundError, OSError) as exc:   # "Dataset not found or corrupted"
        raise UsageError(f"torchvision:{name} could not be read from {kwargs['root']}: {one_line(exc)}",
                         hint=f"{sources.NO_NETWORK}: put the data set under root (download=True once, elsewhere)") from exc
    except TypeError as exc:
        raise UsageError(f"torchvision:{name} does not accept these --arg values: {one_line(exc)}") from exc


# ---- DataLoaders: read their configuration, and rebuild it with our wrappers ---------------------------

def settings(loader) -> dict:
    """A DataLoader's configuration as plain values (for the header, JSON and the trap checks)."""
    from torch.utils.data import RandomSampler, SequentialSampler

    sampler = loader.sampler
    bs = loader.batch_sampler
    shuffle = True if isinstance(sampler, RandomSampler) else False if isinstance(sampler, SequentialSampler) else None
    return {"batch_size": loader.batch_size if loader.batch_size is not None else getattr(bs, "batch_size", None),
            "num_workers": loader.num_workers, "pin_memory": bool(loader.pin_memory),
            "persistent_workers": bool(loader.persistent_workers), "drop_last": bool(loader.drop_last),
            "prefetch_factor": loader.prefetch_factor, "sampler": type(sampler).__name__,
            "batch_sampler": type(bs).__name__ if bs is not None else None, "shuffle": shuffle,
            "timeout": loader.timeout}


def rebuild(loader, **changes):
    """A new DataLoader over the same dataset, sampler, collate_fn and settings, with `changes`
    (num_workers, pin_memory, batch_sampler, worker_init_fn, persistent_workers). The user's loader is
    not touched."""
    from torch.utils.data import DataLoader, IterableDataset

    kw = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
              timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
              multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
              persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor)
    if isinstance(loader.dataset, IterableDataset):   # no sampler: the dataset's own order, batched by size
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif "batch_sampler" not in changes:
        if loader.batch_sampler is not None:
            kw["batch_sampler"] = loader.batch_sampler
        else:   # automatic batching off: one sample per step
            kw.update(batch_size=None, sampler=loader.sampler)
    kw.update(changes)
    if kw["num_workers"] == 0:
        kw.update(persistent_workers=False, prefetch_factor=None, timeout=0)
    elif kw.get("prefetch_factor") is None:
        kw["prefetch_factor"] = 2
    return DataLoader(loader.dataset, **kw)


def _length(dataset) -> int | None:
    """len(dataset); None for a map-style Dataset without __len__. A __len__ that raises is the user's code (exit 3),
    not ours (a sweep: RandomSampler's call to it was an internal error)."""
    if not hasattr(type(dataset), "__len__"):
        return None
    try:
        return len(dataset)
    except Exception as exc:   # noqa: BLE001 - the dataset's own code
        raise ModelError(f"len() of the {type(dataset).__name__} raised {one_line(exc)}",
                         hint="the dataset's __len__ must return its number of samples") from exc


def loader_for(data: LoadedData, batch_size: int, seed: int = 0):
    """What a training loop would iterate: the user's DataLoader as it is; a Dataset in a DataLoader
    (batch_size, shuffled, seeded); an IterableDataset batched; an iterable as it is."""
    import torch
    from torch.utils.data import DataLoader

    if data.kind == "dataloader" or data.kind == "iterable":
        return data.obj
    g = torch.Generator().manual_seed(seed)
    if data.kind == "dataset":   # an empty one gives no batch (said by the caller): RandomSampler refuses length 0;
        n = _length(data.obj)     # one without __len__ cannot be shuffled (RandomSampler asks its length)
        return DataLoader(data.obj, batch_size=batch_size, shuffle=bool(n), generator=g)
    return DataLoader(data.obj, batch_size=batch_size)
