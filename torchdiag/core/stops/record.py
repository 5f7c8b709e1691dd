"""The measuring pass of core.stops: one forward + backward on a copy with hooks on every module's float inputs
and outputs and on every autograd node a wanted parameter feeds, read back once.

Per module call: each input's autograd node (a leaf by its id), whether it got a gradient, its largest |value|;
each output's node and whether it got a gradient. Per autograd node between a wanted parameter and the loss:
the gradient at its outputs and on each input edge. Which parameters feed a node is read from the graph (a
walk from the loss, a bitset per node), never from names. The graph is kept (retain_graph) so that what an
op saved (the other operand of a product, a mask) can be looked at afterwards."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..readback import read_back
from ..tracking import run_forward

MAX_CALLS = 20_000     # module calls recorded (a bound on the hooks of a pathological forward)
MAX_DEPTH = 6          # how deep inputs and outputs are searched for tensors


@dataclass
class Input:
    node: Any        # the autograd node that made it, or id(tensor) for a leaf
    flag: int        # index of its gradient flag
    size: int        # index of its largest |value|
    tensor: int      # id(tensor): to find it again in the call's arguments


@dataclass
class Call:
    module: str
    ins: list[Input]
    outs: list = field(default_factory=list)   # (node, flag index)
    args: tuple | None = None                  # (args, kwargs), kept for a module that holds a zero value
    index: int = 0                             # call order
    done: int = -1                             # return order


@dataclass
class Measured:
    calls: list[Call]
    grads: list[float]       # per flag: the largest |gradient| (0: none reached it)
    sizes: list[float]       # per input: its largest |value|
    fed_storages: dict       # owner module -> the storages of its float inputs
    feeds: dict              # autograd node -> bitset of the wanted parameters it depends on
    bit: dict                # id(parameter) -> its bit
    ops: Any                 # record.OpHooks
    cut: bool                # the forward made more than MAX_CALLS module calls: the rest were not recorded
    loss: Any = None         # keeps the graph alive for the ops' saved values

    def passes(self, flag: int) -> bool:
        return self.grads[flag] > 0

    def reach(self, node) -> int:
        """The wanted parameters a tensor made by `node` (or a leaf, by id) depends on, as a bitset."""
        if isinstance(node, int):
            return 1 << self.bit[node] if node in self.bit else 0
        return self.feeds.get(node, 0)

    def outs_pass(self, call: Call) -> bool:
        return any(self.passes(f) for _, f in call.outs)


def floats(obj, depth: int = 0) -> list:
    """The floating (and complex and bool-free) tensors in a forward's arguments or output: tensors, lists,
    tuples, mappings and dataclasses, MAX_DEPTH deep (a cache object is not searched)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() or obj.is_complex() else []
    if depth >= MAX_DEPTH:
        return []
    if isinstance(obj, (list, tuple)):
        items = list(obj)
    elif isinstance(obj, Mapping):
        items = list(obj.values())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    else:
        return []
    return [t for x in items for t in floats(x, depth + 1)]


def measure(work, inputs, wanted: list[str], params: dict, ctx, loss_fn, owners: set[str], keep: set[str]) -> Measured:
    """The forward with the module hooks, the op hooks on the graph it made, the backward, one read back.
    `owners`: modules whose inputs' storages are kept; `keep`: modules whose call arguments are kept."""
    import torch

    rec = _Recorder(work, owners, keep)
    bit = {id(params[n]): i for i, n in enumerate(wanted)}
    work.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = loss_fn(run_forward(work, inputs, phase="forward (where a zero gradient stops)"))
        feeds = _feeds(loss.grad_fn, bit)
        ops = OpHooks(feeds)
        loss.backward(retain_graph=True)
    finally:
        rec.remove()
    zero = torch.zeros((), device=ctx.device)
    flags = [f if torch.is_tensor(f) else zero for f in rec.flags]
    values = read_back(flags + rec.sizes + ops.tensors(zero))
    a, b = len(flags), len(flags) + len(rec.sizes)
    ops.absorb(values[b:])
    return Measured(rec.calls, values[:a], values[a:b], rec.storages, feeds, bit, ops, rec.cut, loss)


class _Recorder:
    """The module hooks of the measuring pass (see the module doc)."""

    def __init__(self, work, owners: set[str], keep: set[str]):
        self.calls: list[Call] = []
        self.flags: list = []
        self.sizes: list = []
        self.storages: dict[str, set] = {}    # owner module -> the storages of its float inputs
        self.owners, self.keep = owners, keep
        self.names = {id(m): n for n, m in work.named_modules()}
        self.open: dict[int, list] = {}       # id(module) -> its calls in progress (a module may re-enter)
        self.returned = 0
        self.cut = False
        self.handles = []
        for m in work.modules():
            self.handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post, with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()

    def _flag(self, t) -> int:
        i = len(self.flags)
        self.flags.append(None)

        def hook(g, i=i):
            if g is not None:   # an output nothing used (a chunk left out) gets None
                g = g.detach()
                self.flags[i] = (g.abs().amax() if g.numel() else g.new_zeros(())).float()
        t.register_hook(hook)
        return i

    def _size(self, t) -> int:
        import torch

        with torch.no_grad():
            self.sizes.append(t.detach().abs().amax().float() if t.numel() else t.new_zeros((), dtype=torch.float32))
        return len(self.sizes) - 1

    def _pre(self, mod, args, kwargs):
        import torch

        if not torch.is_grad_enabled():
            return
        if len(self.calls) >= MAX_CALLS:
            self.cut = True
            return
        name = self.names.get(id(mod), "?")
        found = floats((args, kwargs))
        if name in self.owners and found:
            self.storages.setdefault(name, set()).update(storage(t) for t in found)
        ins = [Input(t.grad_fn if t.grad_fn is not None else id(t), self._flag(t), self._size(t), id(t))
               for t in found if t.requires_grad]
        call = Call(name, ins, args=(args, kwargs) if name in self.keep else None, index=len(self.calls))
        self.calls.append(call)
        self.open.setdefault(id(mod), []).append(call)

    def _post(self, mod, args, kwargs, output):
        if not self.open.get(id(mod)):
            return
        call = self.open[id(mod)].pop()
        self.returned += 1
        call.done = self.returned
        call.outs = [(t.grad_fn if t.grad_fn is not None else id(t), self._flag(t))
                     for t in floats(output) if t.requires_grad]


def storage(t) -> int:
    """A tensor's storage (views of one tensor share it)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return id(t)


def _feeds(root, bit: dict[int, int]) -> dict:
    """Per autograd node reachable from `root`: the bitset of the wanted parameters it depends on."""
    if root is None:
        return {}
    memo: dict = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if node in memo and not done:
            continue
        kids = [k for k, _ in node.next_functions if k is not None]
        if not done:
            memo.setdefault(node, 0)
            stack.append((node, True))
            stack.extend((k, False) for k in kids if k not in memo)
            continue
        j = bit.get(id(getattr(node, "variable", None)))
        acc = 0 if j is None else 1 << j
        for k in kids:
            acc |= memo.get(k, 0)
        memo[node] = acc
    return memo


class OpHooks:
    """Hooks on every autograd node a wanted parameter feeds: per node, the largest |gradient| at its outputs
    and on each input edge (0-d device tensors, read back with the rest)."""

    def __init__(self, feeds: dict):
        self.nodes = [node for node, bits in feeds.items() if bits and not hasattr(node, "variable")]
        self.index = {node: k for k, node in enumerate(self.nodes)}
        self.leaves = {id(node.variable): node for node in feeds if hasattr(node, "variable")}
        self.seen: list = [None] * len(self.nodes)
        self.values: list = [None] * len(self.nodes)
        self.parents: dict = {}
        for node in feeds:
            for kid, _ in node.next_functions:
                if kid is not None:
                    self.parents.setdefault(kid, []).append(node)
        for k, node in enumerate(self.nodes):
            node.register_hook(self._hook(k))

    def _hook(self, k: int):
        def hook(grad_inputs, grad_outputs):
            self.seen[k] = (_amax(grad_outputs), [_amax((g,)) for g in grad_inputs])
        return hook

    def tensors(self, zero) -> list:
        out = []
        for s in self.seen:
            if s is not None:
                out.append(zero if s[0] is None else s[0])
                out.extend(zero if g is None else g for g in s[1])
        return out

    def absorb(self, values: list) -> None:
        pos = 0
        for k, s in enumerate(self.seen):
            if s is not None:
                self.values[k] = (values[pos], values[pos + 1:pos + 1 + len(s[1])])
                pos += 1 + len(s[1])

    def start(self, node):
        """The node a walk starts from: an autograd node as it is, a leaf (by id) as its AccumulateGrad."""
        return self.leaves.get(node) if isinstance(node, int) else node

    def first_stop(self, starts: list, j: int, feeds: dict, within: set | None = None):
        """The node nearest to `starts` on the wanted parameter j's paths (towards the loss) whose output gets a
        gradient while every edge back from the walk gets none; only among `within` (a module's own nodes) when
        given; (that node, the node below it on the walk), or None when there is none."""
        frontier, seen = [s for s in starts if s is not None], set()
        while frontier:
            nxt = []
            for kid in frontier:
                for node in self.parents.get(kid, []):
                    if node in seen or not feeds.get(node, 0) >> j & 1 or (within is not None and node not in within):
                        continue
                    seen.add(node)
                    v = self.values[self.index[node]] if node in self.index else None
                    if v is not None and v[0] > 0:
                        edges = [i for i, (k, _) in enumerate(node.next_functions) if k is kid]
                        if all(i >= len(v[1]) or v[1][i] == 0 for i in edges):
                            return node, kid
                    nxt.append(node)
            frontier = nxt
        return None


def made_between(outs: list, ins: list) -> set:
    """The autograd nodes a module call made: those its outputs' nodes reach before its inputs' nodes."""
    stop = {i for i in ins if not isinstance(i, int)}
    found: set = set()
    stack = [n for n in outs if not isinstance(n, int) and n not in stop]
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        stack.extend(k for k, _ in node.next_functions if k is not None and k not in stop and k not in found)
    return found


def _amax(grads):
    """The largest |value| over the defined gradients, as a 0-d float tensor; None when none is defined."""
    import torch

    parts = [g.detach().abs().amax().float() for g in grads if g is not None and g.numel()]
    return None if not parts else parts[0] if len(parts) == 1 else torch.stack(parts).amax()
