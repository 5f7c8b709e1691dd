"""A ported program's training and validation data as `torchdiag data` specs (issue 32).

`torchdiag data bench/bugs/dataspec.py:train --val bench/bugs/dataspec.py:val --arg script=<variant>.py`:
the script's own `main()` runs up to its `H.fit` call, which is caught before any training, so the loader
holds exactly the tensors, batch size and shuffling the script trains with. Targets come as the script's
loss reads them: float, as `H.fit` holds them, and class indices (`.long()`, truncating) for sparse
cross-entropy, the dtype a torch user's `cross_entropy` needs.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402


class _Caught(Exception):
    pass


@functools.lru_cache(maxsize=4)
def _fit_arguments(script: str, seed: int) -> dict:
    """The arguments the script hands `H.fit` for this seed (its main stops there; once per process, for both
    splits)."""
    path = Path(script).resolve()
    spec = importlib.util.spec_from_file_location(f"bugs_{path.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen: dict = {}

    def fit(model, loss_name, opt, x, y, **kw):
        seen.update(kw, x=x, y=y, indices=loss_name == "sparse_categorical_crossentropy")
        raise _Caught

    with mock.patch.object(H, "fit", fit), mock.patch.object(sys, "argv", [str(path), "--seed", str(seed)]):
        try:
            mod.main()
        except _Caught:
            return seen
    raise RuntimeError(f"{script} finished without calling H.fit")


def _loader(kw: dict, x, y, shuffle: bool) -> DataLoader:
    x = torch.as_tensor(np.asarray(x), dtype=torch.float32)    # as H.fit holds them
    y = torch.as_tensor(np.asarray(y), dtype=torch.float32)
    return DataLoader(TensorDataset(x, y.long() if kw["indices"] else y), batch_size=kw["batch_size"], shuffle=shuffle)


def train(script: str, seed: str = "0") -> DataLoader:
    kw = _fit_arguments(script, int(seed))
    return _loader(kw, kw["x"], kw["y"], kw.get("shuffle", True))


def val(script: str, seed: str = "0") -> DataLoader:
    """The split the script evaluates on; only for a script that has one (`has_val`)."""
    kw = _fit_arguments(script, int(seed))
    if not _held_apart(kw):
        raise ValueError(f"{script} evaluates on its training data: it has no validation split")
    return _loader(kw, kw["x_val"], kw["y_val"], False)


def _held_apart(kw: dict) -> bool:
    # a script that passes its training arrays themselves as validation data (no others exist) has no split; nor one
    # that passes a copy of them (so_52800582's quartic() hands the same points back as "held out": the post fits and
    # plots them; asked as a split, `data` said all of it overlapped, of a script that has no validation data)
    xv, yv = kw.get("x_val"), kw.get("y_val")
    if xv is None or xv is kw["x"]:
        return False
    return not (_same(xv, kw["x"]) and _same(yv, kw["y"]))


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b))


def has_val(script: str) -> bool:
    return _held_apart(_fit_arguments(script, 0))


if __name__ == "__main__":   # `python dataspec.py SCRIPT`: does it have a validation split (the harness asks)
    print(has_val(sys.argv[1]))
