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
from dataclasses import dataclass, field

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
    # (a 0-d bool on the device: is it a weight's cast, bytes, elements) for the half tensors of a parameter's shape,
    # read only when a copy asks (bytes_in): a pass that makes no copy makes no host sync for them
    pending: list = field(default_factory=list)

    def bytes_in(self, dtype=None) -> int:
        """The bytes as saved (None: a copy run as the pass was), or those of a copy cast to `dtype` and run without
        autocast: its floating activations in `dtype`, no weight casts."""
        if dtype is None or not dtype.is_floating_point:
            return self.total
        self._resolve()
        return self.total - self.floating - self.casts + self.elements * dtype.itemsize

    def _resolve(self) -> None:
        from .readback import read_back

        if not self.pending:
            return
        for (_, nbytes, elements), cast in zip(self.pending, read_back([m for m, _, _ in self.pending])):
            if cast:
                self.casts += nbytes
            else:
                self.floating += nbytes
                self.elements += elements
        self.pending = []


def saved_bytes(root, own=(), casts_of=()) -> dict:
    """{device: Saved} for the graph under `root` (a loss's grad_fn): each storage once, those of the tensors in
    `own` left out (the model's parameters and buffers, which a copy counts as its own tensors, and the inputs, which
    a copy's pass on the same batch shares). `casts_of`: the parameters, when the pass ran under autocast: a saved
    float16/bfloat16 tensor that is a whole storage of one's shape (or its transpose) and holds its first values,
    cast, is its cast (compared on the device, one read)."""
    import torch

    skip = {_key(t) for t in own if isinstance(t, torch.Tensor)}
    by_shape: dict = {}
    for p in casts_of:
        if p.is_floating_point() and p.dim():
            by_shape.setdefault(tuple(sorted(p.shape)), []).append(p)
    counted: set = set()
    floating: list = []   # (row, tensor, bytes, the cast it may be or None)
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
                floating.append((row, t, nbytes, _cast_match(t, nbytes, by_shape)))
    _split(floating)
    return out


def _cast_match(t, nbytes: int, by_shape: dict):
    """A 0-d bool tensor: whether half tensor `t` (a whole storage) starts as a parameter of its shape cast to it
    does; None where no parameter has its shape."""
    import torch

    if t.dtype not in (torch.float16, torch.bfloat16) or not t.dim() or nbytes != t.numel() * t.element_size():
        return None
    same = []
    for p in by_shape.get(tuple(sorted(t.shape)), ()):
        for view in (t,) + ((t.t(),) if t.dim() == 2 else ()):
            if view.shape == p.shape:
                lead = (0,) * (p.dim() - 1)
                same.append((view[lead][:16] == p.detach()[lead][:16].to(t.dtype)).all())
    return torch.stack(same).any() if same else None


def _split(floating: list) -> None:
    """Each saved floating tensor's bytes to its row: the floating activations', or, for one that may be a weight's
    cast, pending until a copy asks (Saved.bytes_in)."""
    for row, t, nbytes, match in floating:
        if match is not None:
            row.pending.append((match, nbytes, nbytes // t.element_size()))
        else:
            row.floating += nbytes
            row.elements += nbytes // t.element_size()


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
