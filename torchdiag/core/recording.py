"""The recording pass: one forward (hooks on every module) + loss + backward on the user's model in
place, leaving no trace. Records execution order, grad mode, the autograd node of every output,
activation statistics (kept on the device, read back later in one go) and every parameter's grad.
Used by gradflow (its judged pass) and by the unused-parameter probe under torchrun (ranks/unused.py)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .design import is_batch_norm_like, stochastic_depth_off
from .reentrant import never_recomputed
from .tracking import ForwardHooks, describe


@dataclass
class Act:
    """Activation statistics of one module, one 0-d device tensor per call (summed on the host)."""
    kind: str                      # relu | saturating | relu+saturating | other
    n: list = field(default_factory=list)       # per-call numel (Python ints)
    s: list = field(default_factory=list)       # per-call sum
    ss: list = field(default_factory=list)      # per-call L2 norm
    zeros: list = field(default_factory=list)
    dead: list = field(default_factory=list)
    units: int = 0
    sat: list = field(default_factory=list)
    shape: str = ""


class Recorder(ForwardHooks):
    """Forward hooks: execution order, grad mode, output autograd nodes, activation statistics."""

    def __init__(self, model, stats_for: set[str], margin: float):
        super().__init__(model)
        self.stats_for = stats_for
        self.margin = margin
        self.order: dict[str, int] = {}
        self.types: dict[str, str] = {}
        self.nodes: dict[str, list] = defaultdict(list)        # module → grad_fn of each output tensor (None: no graph)
        self.grad_enabled: dict[str, bool] = {}
        self.reentrant: set[str] = set()   # modules called with grad off inside a reentrant checkpoint's forward
        self.acts: dict[str, Act] = {}
        self.norm_inputs: dict[int, Any] = {}   # id(grad_fn) → grad_fn of what batch-stat norms received

    def _pre(self, mod, args):
        name = self.names.get(id(mod), "?")
        self.order.setdefault(name, len(self.order))
        self.types[name] = type(mod).__name__
        if is_batch_norm_like(mod):
            for t in float_tensors(args):
                if t.grad_fn is not None:
                    self.norm_inputs[id(t.grad_fn)] = t.grad_fn     # kept alive: ids stay unique

    def feeds_norm(self, name: str) -> bool:
        """Every output of module `name` goes straight into a batch-statistics normalisation."""
        nodes = self.nodes.get(name)
        return bool(nodes) and all(n is not None and id(n) in self.norm_inputs for n in nodes)

    def _post(self, mod, args, output):
        import torch

        name = self.names.get(id(mod), "?")
        enabled = torch.is_grad_enabled()
        self.grad_enabled[name] = self.grad_enabled.get(name, False) or enabled
        if not enabled and never_recomputed():   # a reentrant checkpoint's cut, not a no_grad of the user's
            self.reentrant.add(name)
        tensors = float_tensors(output)
        for t in tensors:
            self.nodes[name].append(t.grad_fn if t.requires_grad else None)
        if name in self.stats_for and tensors:
            self._stats(name, mod, tensors[0])

    def _stats(self, name, mod, y):
        """Reductions only, no read-back: a host sync here would drain a GPU queue once per module."""
        import torch

        y = y.detach()
        cls = kinds(mod)
        act = self.acts.get(name)
        if act is None:
            act = self.acts[name] = Act(cls, shape=describe(y))
        if y.is_complex():   # its real and imaginary parts (a cast to real drops the imaginary, with a warning)
            y = torch.view_as_real(y.resolve_conj())
        yf = y if y.dtype in (torch.float32, torch.float64) else y.float()
        act.n.append(yf.numel())
        act.s.append(yf.sum())
        act.ss.append(torch.linalg.vector_norm(yf))     # sqrt(sum y^2), without a y*y temporary
        if "relu" in cls:
            zero = yf == 0
            act.zeros.append(zero.sum())
            if y.dim() >= 2 and y.shape[0] > 1:
                act.dead.append(zero.reshape(y.shape[0], -1).all(0).sum())
                act.units += y[0].numel()
            else:
                act.dead.append(zero.sum())
                act.units += y.numel()
        if "saturating" in cls:
            act.sat.append(saturated(mod, yf, self.margin))


def kinds(mod) -> str:
    from torch import nn

    found = []
    if isinstance(mod, (nn.ReLU, nn.ReLU6, nn.Threshold, nn.Hardswish)):
        found.append("relu")
    if isinstance(mod, (nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardsigmoid)):
        found.append("saturating")
    return "+".join(found) or "other"


def saturated(mod, y, m):
    from torch import nn

    if isinstance(mod, nn.Tanh):
        return (y.abs() > 1 - m).sum()
    if isinstance(mod, (nn.Sigmoid, nn.Hardsigmoid)):
        return ((y < m) | (y > 1 - m)).sum()
    # Hardtanh / ReLU6: flat beyond its bounds
    return ((y <= mod.min_val) | (y >= mod.max_val)).sum()


def float_tensors(obj) -> list:
    import torch

    out = []
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            out.extend(float_tensors(x))
    elif isinstance(obj, dict) or hasattr(obj, "values") and hasattr(obj, "keys"):
        for x in obj.values():
            out.extend(float_tensors(x))
    return out


def reachable(root) -> set[int]:
    """ids of every autograd node reachable from the loss node."""
    seen: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)
    return seen


def stats_modules(model, depth: int) -> set[str]:
    """Modules whose outputs get activation statistics: every activation of interest, and every
    leaf module down to `depth`."""
    modules = dict(model.named_modules())
    out = {n for n, m in modules.items() if kinds(m) != "other"}
    out |= {n for n, m in modules.items()
            if n and n.count(".") + 1 <= depth and not any(True for _ in m.children())}
    return out


@dataclass
class Pass:
    rec: Recorder
    reach: set[int]                  # autograd nodes reachable from the loss
    grads: dict[str, Any]            # parameter name → its .grad after backward (None: got none)
    loss: Any                        # the loss, detached (read back with the other statistics)
    loss_text: str                   # how the loss was made
    stochastic: list = field(default_factory=list)   # stochastic-depth modules switched off for the pass
    local: list = field(default_factory=list)        # weights made in forward (core/local_leaves.py), described
    rng: Any = None                  # the CPU RNG state the forward started from (a follow-up forward draws the same)
    made_target: bool = False        # the loss's target was drawn by torchdiag (no data's scale in it)


def rng_state(state):
    """The global RNG at `state` for the block (the first forward's draws: dropout alike), put back after."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def kept():
        now = torch.random.get_rng_state()
        torch.random.set_rng_state(state)
        try:
            yield
        finally:
            torch.random.set_rng_state(now)

    return kept()


def record_pass(model, inputs, opts, ctx, call=None) -> Pass:
    """Forward (train mode unless opts.eval_mode; stochastic depth off) + loss + backward. `opts`: gradflow's
    (depth, saturation_margin, eval_mode); None: the gradients alone (no activation statistics, train mode).
    `.grad` tensors are set aside before and put back after, buffers a train-mode forward updates are copied back bit for bit.
    `call`: what the forward calls when it is not `model` itself (under torchrun, the DDP wrapper around
    `model`: the hooks watch `model`, the gradients are the ones after DDP's reduction)."""
    import torch

    from .guard import leave_no_trace
    from .local_leaves import describe_leaf, local_leaves
    from .scaling import judged_backward
    from .tracking import ModuleTracker, run_forward

    params = dict(model.named_parameters())
    stats_for = stats_modules(model, opts.depth) if opts is not None else set()
    rec = Recorder(model, stats_for, opts.saturation_margin if opts is not None else 0.0)
    tracker = ModuleTracker(model, record_shapes=False)
    loss_fn = ctx.loss()
    with leave_no_trace(model, buffers=True):
        model.train(opts is None or not opts.eval_mode)
        # a random whole-branch drop would make the verdict depend on the draw (core/design.py)
        stochastic = stochastic_depth_off(model)
        torch.set_grad_enabled(True)
        for p in params.values():
            p.grad = None
        rng = torch.random.get_rng_state()
        with rec, tracker, ctx.autocast():   # --amp: forward and loss autocast, backward outside
            output = run_forward(model if call is None else call, inputs, tracker)
        with ctx.autocast():
            loss = loss_fn(output)
        reach = reachable(loss.grad_fn)
        ctx.saw_activations(loss, model, inputs)   # what a copy's backward on this batch keeps as well
        local = [describe_leaf(t) for t in local_leaves(loss, model, [t for _, t in inputs.tensors()])]
        def again():   # the same forward, for the fp16 judged backward (the recorder's hooks are off by now)
            with ctx.autocast(), rng_state(rng):
                return loss_fn(run_forward(model if call is None else call, inputs))

        judged_backward(loss, ctx, params.values(), again)   # under --amp fp16, scaled as its GradScaler would
        grads = {n: p.grad for n, p in params.items()}
        for p in params.values():
            p.grad = None
    return Pass(rec, reach, grads, loss.detach(), loss_fn.describe(), stochastic, local, rng, loss_fn.made_target)
