"""Tensor-level memory accounting: which tensor storages are alive, in which category, and when
the peak happens.

`LiveTensors` is a TorchDispatchMode: every op's outputs are looked at, each new storage is
recorded once with its size and category, and a weak-reference callback takes it off the books
when the storage is freed. It works the same on real (CPU, CUDA), meta and fake tensors, so one
code path both measures (real tensors: exactly the bytes the tensors hold) and estimates (fake
tensors: nothing is allocated).

Categories: parameters, buffers, inputs, gradients, optimizer_state, activations (tensors autograd
saved for backward), temporaries (everything else allocated during the step). New storages start
as temporaries; a saved-tensors hook moves the ones autograd keeps to activations; a
post-accumulate-grad hook moves `.grad` to gradients; the caller registers parameters, buffers,
inputs and optimizer state up front.

Per module: the forward window (pre-hook → hook) and backward window (gradient of the module's
outputs ready → gradient of its inputs ready, via multi-grad hooks as torch.utils.module_tracker
does) give each module's peak of live bytes during its forward and its backward, and each storage
remembers the innermost module whose forward allocated it, for "activation bytes this module's
forward leaves alive"."""
from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("parameters", "buffers", "inputs", "gradients", "optimizer_state", "activations", "temporaries", "other")
PHASES = ("setup", "forward", "backward", "optimizer")


@dataclass
class Record:
    nbytes: int
    category: str
    module: str | None      # innermost module whose forward allocated it (None outside forward)
    phase: str


@dataclass
class ModuleStats:
    name: str
    type: str
    calls: int = 0
    fw_peak: int = 0
    bw_peak: int = 0
    fw_delta: int = 0            # live bytes after its forward minus before (summed over calls)
    activation_bytes: int = 0    # saved-for-backward bytes its forward allocated, alive after forward
    ran_backward: bool = False


def storages(t):
    """Untyped storages behind a tensor (tensor subclasses are flattened)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    out, todo = [], [t]
    while todo:
        obj = todo.pop()
        if is_traceable_wrapper_subclass(obj):
            attrs, _ = obj.__tensor_flatten__()
            todo.extend(getattr(obj, a) for a in attrs if _is_tensor(getattr(obj, a)))
            continue
        try:
            out.append(obj.untyped_storage())
        except (RuntimeError, NotImplementedError, TypeError):  # sparse and friends: no storage
            pass
    return out


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def make_tracker(round_to: int = 1, resizable: bool = False):
    """A LiveTensors instance (the class is built lazily so importing this module needs no torch).
    `resizable`: storages may be resized in place (FSDP): sizes are re-read at every op."""
    return _tracker_class()(round_to, resizable)


def _tracker_class():
    from .live_tensors import LiveTensors

    return LiveTensors
