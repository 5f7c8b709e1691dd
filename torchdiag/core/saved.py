"""What autograd keeps for a backward: the bytes of the tensors the nodes of a graph saved, each storage once.

Read from the nodes without unpacking anything: `SavedTensor.data` hands back what was stored (or what the
model's own pack hook made of it) and runs no unpack hook, so a checkpointed block is not recomputed and an
offloaded tensor is not fetched (the `_saved_*` attributes unpack: a checkpointed GPT-2 recomputed every block
and ran out of memory). A custom Function's `save_for_backward` tensors are read the same way. What a pack hook
turned into something else than tensors (a checkpoint's handle) holds nothing here; tensors a Function keeps as
plain attributes of its ctx are not seen. A copy of the model run backward on the same batch keeps as much again
(core.train.room_for_copy)."""
from __future__ import annotations

from dataclasses import dataclass

_NAMES: dict = {}   # node type -> its `_raw_saved_*` attribute names


@dataclass
class Saved:
    """Bytes saved on one device; `floating`: the bytes of floating tensors, `elements`: their elements (what a
    copy cast to another floating dtype keeps instead)."""
    total: int = 0
    floating: int = 0
    elements: int = 0

    def bytes_in(self, dtype=None) -> int:
        """The bytes with the floating tensors in `dtype` (as saved when None)."""
        if dtype is None or not dtype.is_floating_point:
            return self.total
        return self.total - self.floating + self.elements * dtype.itemsize


def saved_bytes(root, own=()) -> dict:
    """{device: Saved} for the graph under `root` (a loss's grad_fn): each storage once, those of the tensors in
    `own` left out (the model's parameters and buffers, which a copy counts as its own tensors, and the inputs, which
    a copy's pass on the same batch shares)."""
    import torch

    skip = {_key(t) for t in own if isinstance(t, torch.Tensor)}
    counted: set = set()
    out: dict = {}
    for node in _nodes(root):
        for t in _saved_tensors(node):
            key = _key(t)
            if key is None or key in skip or key in counted:
                continue
            counted.add(key)
            nbytes = t.untyped_storage().nbytes()
            row = out.setdefault(t.device, Saved())
            row.total += nbytes
            if t.is_floating_point():
                row.floating += nbytes
                row.elements += nbytes // t.element_size()
    return out


def _nodes(root):
    seen: set = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None and id(nxt) not in seen)


def _saved_tensors(node):
    """The tensors `node` keeps for its backward, as stored (no unpack hook runs); none once it is freed."""
    import torch

    kind = type(node)
    if kind not in _NAMES:
        _NAMES[kind] = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
    for attr in _NAMES[kind]:
        try:
            raw = getattr(node, attr)
        except Exception:   # noqa: BLE001 - freed by a backward, or not bound for this node
            continue
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            try:
                data = saved.data
            except Exception:   # noqa: BLE001 - freed
                continue
            for t in data if isinstance(data, (tuple, list)) else (data,):   # a pack hook's (device, tensor) too
                if isinstance(t, torch.Tensor):
                    yield t


def _key(t):
    """(device, storage address); None for a tensor with no storage of its own (meta, sparse, a wrapper subclass)."""
    if t.device.type == "meta":
        return None
    try:
        return t.device, t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - no storage to count
        return None
