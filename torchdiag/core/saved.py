"""What autograd keeps for a backward: the bytes of the tensors the nodes of a graph saved, each storage once.

Read from the nodes without unpacking anything: `SavedTensor.data` hands back what was stored (or what the
model's own pack hook made of it) and runs no unpack hook, so a checkpointed block is not recomputed and an
offloaded tensor is not fetched (the `_saved_*` attributes unpack: a checkpointed GPT-2 recomputed every block
and ran out of memory). A custom Function's `save_for_backward` tensors are read the same way. What a pack hook
turned into something else than tensors (a checkpoint's handle) holds nothing here; tensors a Function keeps as
plain attributes of its ctx are not seen. A copy of the model run backward on the same batch keeps as much again
(core.train.room_for_copy)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

# node type -> its `_raw_saved_*` attribute names; weak: torch.compile and per-call custom Functions make node types
# that must be able to go with their graphs
_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Saved:
    """Bytes saved on one device; `floating`: the bytes of floating activations, `elements`: their elements (what a
    copy cast to another floating dtype keeps instead); `casts`: the bytes of autocast's reduced-precision copies of
    the weights (its weight cache), which a copy run without autocast does not make."""
    total: int = 0
    floating: int = 0
    elements: int = 0
    casts: int = 0

    def bytes_in(self, dtype=None) -> int:
        """The bytes as saved (None: a copy run as the pass was), or those of a copy cast to `dtype` and run without
        autocast: its floating activations in `dtype`, no weight casts."""
        if dtype is None or not dtype.is_floating_point:
            return self.total
        return self.total - self.floating - self.casts + self.elements * dtype.itemsize


def saved_bytes(root, own=(), casts_of=()) -> dict:
    """{device: Saved} for the graph under `root` (a loss's grad_fn): each storage once, those of the tensors in
    `own` left out (the model's parameters and buffers, which a copy counts as its own tensors, and the inputs, which
    a copy's pass on the same batch shares). `casts_of`: the parameters, when the pass ran under autocast: a saved
    float16/bfloat16 tensor that is a whole storage of one's size and shape (or its transpose) is its cast."""
    import torch

    skip = {_key(t) for t in own if isinstance(t, torch.Tensor)}
    shapes = {(p.numel(), tuple(sorted(p.shape))) for p in casts_of if p.is_floating_point()}
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
            if shapes and _a_cast(t, nbytes, shapes):
                row.casts += nbytes
            elif t.is_floating_point():
                row.floating += nbytes
                row.elements += nbytes // t.element_size()
    return out


def _a_cast(t, nbytes: int, shapes: set) -> bool:
    import torch

    return (t.dtype in (torch.float16, torch.bfloat16) and nbytes == t.numel() * t.element_size()
            and (t.numel(), tuple(sorted(t.shape))) in shapes)


def _nodes(root):
    seen: dict = {}   # id -> node, held: a node's Python wrapper may be made anew per access, its id then reused
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        yield node
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None and id(nxt) not in seen)


def _saved_tensors(node):
    """The tensors `node` keeps for its backward, as stored (no unpack hook runs); none once it is freed."""
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
            yield from _tensors_in(data)


def _tensors_in(data, depth: int = 0):
    """The tensors in what a pack hook returned: a tensor, or tuples, lists and dicts of them (a few levels)."""
    import torch

    if isinstance(data, torch.Tensor):
        yield data
    elif depth < 4 and isinstance(data, (tuple, list, dict)):
        for item in data.values() if isinstance(data, dict) else data:
            yield from _tensors_in(item, depth + 1)


def _key(t):
    """(device, storage address); None for a tensor with no storage of its own (meta, sparse, a wrapper subclass)."""
    if t.device.type == "meta":
        return None
    try:
        return t.device, t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - no storage to count
        return None
