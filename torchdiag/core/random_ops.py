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


DROPOUT_OPS = {"bernoulli", "bernoulli_", "native_dropout", "_fused_dropout", "dropout", "feature_dropout",
               "alpha_dropout", "feature_alpha_dropout"}   # the coin flips a dropout mask is made of


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
            if stack and _drops(func.overloadpacket.__name__, args, kwargs or {}) and all(m is not stack[-1]
                                                                                          for m in found):
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


def _drops(op: str, args, kwargs: dict) -> bool:
    """A dropout op, or a fused attention given a dropout probability (`scaled_dot_product_attention(...,
    dropout_p=self.dropout if self.training else 0.0)`: BART's and most Hugging Face attentions)."""
    if op in DROPOUT_OPS:
        return True
    if "scaled_dot_product" not in op:
        return False
    p = kwargs.get("dropout_p", args[3] if len(args) > 3 else 0.0)
    return isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0
