"""Which random ops a forward calls (aten names, read by a dispatch mode), by what they draw. Samples from a
distribution (a Gaussian, a categorical, a permutation) are how a VAE reparameterises, ViLT picks patches, a vocoder
or VITS draws noise; uniform numbers and coin flips are what dropout masks, stochastic depth and LayerDrop are made
of (F.dropout's bernoulli_, CUDA's native_dropout, `keep_prob + torch.rand(...)`, `rand_like(x) > p`)."""
from __future__ import annotations

import contextlib

SAMPLING_OPS = {"randn", "randn_like", "normal", "normal_", "multinomial", "randperm", "poisson", "_standard_gamma",
                "binomial", "exponential_", "cauchy_", "log_normal_", "geometric_"}
RANDOM_OPS = SAMPLING_OPS | {"bernoulli", "bernoulli_", "native_dropout", "_fused_dropout", "rrelu_with_noise",
                             "rrelu_with_noise_", "dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
                             "rand", "rand_like", "uniform_", "randint", "randint_like", "random_"}


@contextlib.contextmanager
def drawn():
    """`with drawn() as ops:` the names of the random ops (RANDOM_OPS) called inside, added to the set `ops`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: set[str] = set()

    class Drawn(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            op = func.overloadpacket.__name__
            if op in RANDOM_OPS:
                ops.add(op)
            return func(*args, **(kwargs or {}))

    with Drawn():
        yield ops


DROPOUT_OPS = {"native_dropout", "_fused_dropout", "dropout", "feature_dropout", "alpha_dropout",
               "feature_alpha_dropout"}   # and a coin flip of one probability for all (F.dropout's bernoulli_(p))


@contextlib.contextmanager
def dropout_callers():
    """`with dropout_callers() as found:` the modules whose own forward drew a dropout mask (DROPOUT_OPS) inside the
    block, the innermost module running when it was drawn, in order, each once: a dropout called through
    torch.nn.functional (`F.dropout(x, self.p, self.training)`, as BART's layers do), which no module's type shows."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    found: list = []
    stack: list = []

    class Callers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if stack and _drops(func, args, kwargs or {}) and all(m is not stack[-1] for m in found):
                found.append(stack[-1])
            return func(*args, **(kwargs or {}))

    def pre(module, args):
        stack.append(module)

    def post(module, args, output):
        if stack:
            stack.pop()

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post, always_call=True)]
    try:
        with Callers():
            yield found
    finally:
        for h in handles:
            h.remove()


def _drops(func, args, kwargs: dict) -> bool:
    """A dropout op; a coin flip of one probability given as a number (F.dropout's mask, `bernoulli_(1 - p)`; not a
    tensor of probabilities, which a stochastic unit draws as its function: a review's straight-through binary
    layer); or a fused attention given a dropout probability (`scaled_dot_product_attention(..., dropout_p=...)`, at
    the place its schema gives: the CUDA kernels take it later than the CPU one, a review)."""
    op = func.overloadpacket.__name__
    if op in DROPOUT_OPS:
        return True
    if op in ("bernoulli", "bernoulli_"):
        return _number(_argument(func, args, kwargs, "p")) is not None
    if "scaled_dot_product" not in op:
        return False
    p = _number(_argument(func, args, kwargs, "dropout_p"))
    return p is not None and p > 0


def _argument(func, args, kwargs: dict, name: str):
    if name in kwargs:
        return kwargs[name]
    names = [a.name for a in func._schema.arguments]
    return args[names.index(name)] if name in names and names.index(name) < len(args) else None


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
