"""Where does a zero gradient stop? (issue 26) For parameters whose gradient stays exactly zero, one more
forward + backward on a copy finds, by measurement, the module that cuts their path: the first module the
parameter feeds whose output gets a gradient while its inputs get none. What that module holds that
explains it is read from its values: a buffer that is zero everywhere (a frozen scale of 0, which no
training step can open), or a frozen parameter at zero; otherwise an op inside it has a zero derivative.

How: forward hooks on every module record, for each call, the autograd node of each float input and
output, with a gradient hook on each (a hook registered before an in-place op still sees the gradient of
the value it was registered on). After backward, one read back: per tensor, whether its gradient was
non-zero. Which parameters feed an input is read from the autograd graph (a walk from the loss, each
node's set of parameters as a bitset), never from names."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .module_paths import owner
from .readback import read_back
from .tracking import run_forward

MAX_CALLS = 20_000     # module calls recorded (a bound on the hooks of a pathological forward)


@dataclass
class Stop:
    module: str                 # where the gradient stops
    kind: str                   # the module's class
    zero_buffers: list[str] = field(default_factory=list)   # its float buffers that are 0 everywhere
    zero_frozen: list[str] = field(default_factory=list)    # its frozen parameters that are 0 everywhere
    later: int = 0              # more modules on the parameter's paths that stop it too
    zero_input: bool = False    # the parameter's own module got an input of 0 everywhere at every call
    after: bool = False         # no module stops it: its output gets no gradient, what uses it is not a module
    op: str | None = None       # the op on the parameter's path that stops it (its autograd node's op)
    stopper: bool = False       # `module` is a module that stops it (else: op or after)

    def describe(self) -> str:
        if self.zero_input:
            return (f"its module {self.module} ({self.kind}) gets an input that is 0 everywhere at every call, and a "
                    "weight that multiplies zero gets no gradient")
        if not self.stopper and self.op is not None:
            where = (f"after {self.module} ({self.kind}), the last module it passes" if self.after
                     else f"in the forward of {self.module} ({self.kind}), which uses it")
            return (f"the gradient stops at a `{self.op}` op {where}: the op's output gets a gradient, and none of it "
                    "passes back towards this parameter")
        if not self.stopper:
            return (f"the gradient is already 0 at the output of {self.module} ({self.kind}), the last module on its "
                    "path: what uses that output outside any module passes it none (an op with a zero derivative, a "
                    "mask or selection that leaves it out, or an output the loss does not cover)")
        at = f"the gradient stops at {self.module} ({self.kind}): its output gets a gradient, its input none"
        if self.zero_buffers:
            what = ", ".join(f"`{b}`" for b in self.zero_buffers)
            at += f"; its buffer {what} is 0 everywhere, and a buffer is never trained, so no step can open it"
        elif self.zero_frozen:
            what = ", ".join(f"`{b}`" for b in self.zero_frozen)
            at += f"; its frozen parameter {what} is 0 everywhere (requires_grad=False: no step can open it)"
        else:
            at += f"; an op inside it has a zero derivative{f' (`{self.op}`)' if self.op else ''}"
        return at + (f" ({self.later} more module(s) on its paths stop it too)" if self.later else "")

    def hint(self) -> str:
        if self.zero_input:
            return ("a zero input is often by construction (zero-initialised queries, a padded stream): then the "
                    "weight is unused and can be frozen or removed; else find where that input is zeroed")
        if self.zero_buffers or self.zero_frozen:
            return ("give that value what it is meant to start from (the checkpoint the model is built for, or a "
                    "non-zero init), or make it a trained parameter")
        if not self.stopper:
            op = f"the `{self.op}` op" if self.op else "what the code around that output does with it"
            return (f"look at {op}: a round, sign, argmax or comparison needs a straight-through estimator to pass a "
                    "gradient; a mask or selection that never picks it means the input never exercises it")
        return "replace the zero-derivative op (round, sign, argmax, comparison) or use a straight-through estimator"


@dataclass
class _Call:
    module: str
    ins: list        # (autograd node, or a leaf's id; flag index)
    outs: list       # (autograd node, flag index)
    args: tuple = ()  # the call's (args, kwargs), to test the stopping module alone
    done: int = -1    # the order in which the call returned


def stops(work, inputs, names: list[str], ctx, loss_fn) -> dict[str, Stop]:
    """For each parameter name of `work` (a copy, in the mode of the judged pass) whose gradient is zero:
    where it stops, when that is found."""
    params = dict(work.named_parameters())
    wanted = [n for n in names if n in params]
    if not wanted:
        return {}
    ms = _measure(work, inputs, wanted, params, ctx, loss_fn)
    modules = dict(work.named_modules())
    stoppers = [(c, ms.reach(c.ins)) for c in ms.calls
                if ms.passes(c.outs) and c.ins and not ms.passes(c.ins) and ms.reach(c.ins)]
    silent = [(c, ms.reach(c.outs)) for c in ms.calls if c.outs and not ms.passes(c.outs)]
    first: dict[str, _Call] = {}
    for c, _ in stoppers:
        first.setdefault(c.module, c)
    out: dict[str, Stop] = {}
    described: dict[str, Stop] = {}
    for j, n in enumerate(wanted):
        m = owner(n)
        if ms.fed.get(m, 1.0) == 0.0:
            out[n] = Stop(m or "(root)", type(modules[m]).__name__, zero_input=True)
            continue
        op = ms.ops.first_stop(params[n], j, ms.feeds)
        on = _innermost([c.module for c, bits in stoppers if bits >> j & 1])
        if on:
            if on[0] not in described:
                described[on[0]] = _describe(on[0], modules[on[0]], first[on[0]], ctx)
            out[n] = replace(described[on[0]], later=len(on) - 1, op=op)
            continue
        last = max((c for c, bits in silent if bits >> j & 1), key=lambda c: c.done, default=None)
        if op is not None or last is not None:   # no module stops it: an op outside any module does
            at = last.module if last is not None else m
            out[n] = Stop(at or "(root)", type(modules[at]).__name__, after=last is not None, op=op)
    return out


@dataclass
class _Measured:
    calls: list            # _Call per module call
    nonzero: list          # per gradient flag: its largest |gradient| (0: none)
    fed: dict              # owner module -> the largest |input| over its calls
    feeds: dict            # autograd node -> bitset of the wanted parameters it depends on
    bit: dict              # id(parameter) -> its bit
    ops: _OpHooks

    def passes(self, ends) -> bool:
        """Did any of these tensors get a non-zero gradient?"""
        return any(self.nonzero[i] > 0 for _, i in ends)

    def reach(self, ends) -> int:
        """The wanted parameters these tensors depend on (a bitset)."""
        bits = 0
        for node, _ in ends:
            if isinstance(node, int):   # a leaf, by id: the parameter itself
                bits |= 1 << self.bit[node] if node in self.bit else 0
            else:
                bits |= self.feeds.get(node, 0)
        return bits


def _measure(work, inputs, wanted: list[str], params: dict, ctx, loss_fn) -> _Measured:
    """The forward with the module hooks, the op hooks on the graph it made, the backward, one read back."""
    import torch

    calls, flags, inmax, handles = _hooks(work, {owner(n) for n in wanted})
    bit = {id(params[n]): i for i, n in enumerate(wanted)}
    work.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = loss_fn(run_forward(work, inputs, phase="forward (where a zero gradient stops)"))
        feeds = _feeds(loss.grad_fn, bit)
        ops = _OpHooks(feeds)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    zero = torch.zeros((), device=ctx.device)
    values = read_back([f if torch.is_tensor(f) else zero for f in flags] + [t for _, t in inmax] + ops.tensors(zero))
    nonzero, sizes = values[:len(flags)], values[len(flags):len(flags) + len(inmax)]
    ops.absorb(values[len(flags) + len(inmax):])
    fed: dict[str, float] = {}
    for (m, _), v in zip(inmax, sizes):
        fed[m] = max(fed.get(m, 0.0), v)
    return _Measured(calls, nonzero, fed, feeds, bit, ops)


class _OpHooks:
    """Hooks on every autograd node a wanted parameter feeds: per node, the largest |gradient| at its outputs
    and on each input edge (0-d device tensors, read back with the rest)."""

    def __init__(self, feeds: dict):
        self.nodes = [node for node, bits in feeds.items() if bits and not hasattr(node, "variable")]
        self.index = {node: k for k, node in enumerate(self.nodes)}
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

    def first_stop(self, param, j: int, feeds: dict) -> str | None:
        """The op nearest to the parameter on its paths whose output gets a gradient while the edge back
        towards the parameter gets none (a walk from the parameter's AccumulateGrad towards the loss)."""
        start = next((n for n in feeds if getattr(n, "variable", None) is param), None)
        frontier, seen = [start] if start is not None else [], set()
        while frontier:
            nxt = []
            for kid in frontier:
                for node in self.parents.get(kid, []):
                    if node in seen or not feeds.get(node, 0) >> j & 1:
                        continue
                    seen.add(node)
                    v = self.values[self.index[node]] if node in self.index else None
                    if v is not None and v[0] > 0:
                        edges = [i for i, (k, _) in enumerate(node.next_functions) if k is kid]
                        if all(i >= len(v[1]) or v[1][i] == 0 for i in edges):
                            return _op_name(node)
                    nxt.append(node)
            frontier = nxt
        return None


def _amax(grads):
    """The largest |value| over the defined gradients, as a 0-d float tensor; None when none is defined."""
    import torch

    parts = [g.detach().abs().amax().float() for g in grads if g is not None and g.numel()]
    return None if not parts else parts[0] if len(parts) == 1 else torch.stack(parts).amax()


def _op_name(node) -> str:
    """An autograd node's op: `RoundBackward0` -> `round`."""
    import re

    return re.sub(r"Backward\d*$", "", type(node).__name__).lower() or type(node).__name__


def _hooks(work, owners: set[str]):
    """Forward hooks on every module: per call, its inputs' autograd nodes (a leaf that requires grad by its
    id) and gradient flags on its inputs and outputs (0-d device tensors, set by tensor hooks at backward);
    for the modules in `owners`, the largest |value| of their float inputs per call."""
    import torch

    from .recording import float_tensors

    calls: list[_Call] = []
    flags: list = []
    names = {id(m): n for n, m in work.named_modules()}
    open_calls: dict[int, list] = {}     # id(module) -> its calls in progress (a module may re-enter)
    inmax: list = []                     # (owner module, 0-d device tensor)
    returned = [0]                       # calls returned so far

    def flag(t) -> int:
        i = len(flags)
        flags.append(None)

        def hook(g, i=i):
            g = g.detach()
            flags[i] = (g.abs().amax() if g.numel() else g.new_zeros(())).float()
        t.register_hook(hook)
        return i

    def pre(mod, args, kwargs):
        if len(calls) >= MAX_CALLS or not torch.is_grad_enabled():
            return
        ins = []
        floats = float_tensors((args, kwargs))
        name = names.get(id(mod), "?")
        if name in owners:
            with torch.no_grad():
                sizes = [t.detach().abs().amax().float() for t in floats if t.numel()]
                if sizes:
                    inmax.append((name, torch.stack(sizes).amax()))
        for t in floats:
            if t.requires_grad:
                ins.append((t.grad_fn if t.grad_fn is not None else id(t), flag(t)))
        calls.append(_Call(name, ins, [], (args, kwargs)))
        open_calls.setdefault(id(mod), []).append(calls[-1])

    def post(mod, args, kwargs, output):
        if not open_calls.get(id(mod)):
            return
        call = open_calls[id(mod)].pop()
        returned[0] += 1
        call.done = returned[0]
        call.outs = [(t.grad_fn if t.grad_fn is not None else id(t), flag(t))
                     for t in float_tensors(output) if t.requires_grad]

    handles = []
    for m in work.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    return calls, flags, inmax, handles


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


def _innermost(found: list[str]) -> list[str]:
    """The stopping modules in call order, a container left out when a module inside it stops the path too."""
    keep = [m for m in dict.fromkeys(found)
            if not any(o != m and (m == "" or o.startswith(m + ".")) for o in found)]
    return keep


def _describe(name: str, mod, call: _Call, ctx) -> Stop:
    """The stopping module, and which of its zero values (a buffer, a frozen parameter) closes it: the module
    alone is run again on a copy of its input with that value set to 1, and passes a gradient then."""
    def zero(t) -> bool:
        return t is not None and t.is_floating_point() and t.numel() > 0 and not bool(t.detach().any())

    buffers = [(b, t) for b, t in mod.named_buffers(recurse=False) if zero(t)]
    frozen = [(p, t) for p, t in mod.named_parameters(recurse=False) if not t.requires_grad and zero(t)]
    opens = [b for b, t in buffers + frozen if _opens(mod, call, t, ctx)]
    return Stop(name or "(root)", type(mod).__name__, stopper=True,
                zero_buffers=[b for b, _ in buffers if b in opens], zero_frozen=[p for p, _ in frozen if p in opens])


def _opens(mod, call: _Call, value, ctx) -> bool:
    """Does the module pass a gradient to its input once `value` (zero everywhere) is 1? On the copy; the
    value is put back."""
    import torch

    from .recording import float_tensors

    args, kwargs = call.args
    fresh: dict[int, Any] = {}

    def copy(obj):
        if torch.is_tensor(obj) and obj.requires_grad and obj.is_floating_point():
            return fresh.setdefault(id(obj), obj.detach().clone().requires_grad_())
        if isinstance(obj, (list, tuple)):
            return type(obj)(copy(o) for o in obj) if not hasattr(obj, "_fields") else type(obj)(*map(copy, obj))
        if isinstance(obj, dict):
            return {k: copy(v) for k, v in obj.items()}
        return obj

    saved = value.detach().clone()
    try:
        with torch.no_grad():
            value.fill_(1)
        a, k = copy(args), copy(kwargs)
        with torch.enable_grad(), ctx.autocast():
            outs = [t for t in float_tensors(mod(*a, **k)) if t.requires_grad]
        if not outs or not fresh:
            return False
        grads = torch.autograd.grad([o.float().sum() for o in outs], list(fresh.values()), allow_unused=True)
        return any(g is not None and bool(g.ne(0).any()) for g in grads)
    except Exception:   # the module alone does not run on these: no claim
        return False
    finally:
        with torch.no_grad():
            value.copy_(saved)
