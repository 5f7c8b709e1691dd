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
