"""Does train/eval mode change what a model computes? Asked once, at the end of a run that trained in eval mode: a
model without dropout, BatchNorm or code that reads self.training computes the same either way, and training it
in eval mode is no mistake (a sweep: a plain MLP left in eval got `trained-in-eval-mode`). A model that holds a
dropout or BatchNorm is not asked: their train mode acts whatever one batch shows (a review: an all-zero batch)."""
from __future__ import annotations

import contextlib

RTOL, ATOL = 1e-5, 1e-7   # kernels may differ by rounding between two calls (a GPU's reductions)


def mode_inert(model, args, kwargs, sensitive: tuple) -> bool | None:
    """True when the model holds none of the `sensitive` module types (dropout, BatchNorm: they act in train mode
    whatever the batch) and its output on a copy of (args, kwargs) is the same in eval and in train mode (code
    that reads self.training); None when that cannot be told (the forward raised). Under no_grad, with every
    module's mode, every parameter's requires_grad (a train() override may set it), every buffer (running
    statistics) and the random states (torch's, Python's, NumPy's) put back. The modes are set flag by flag, the
    model's own eval()/train() not called. The forward runs twice more: a user's forward hooks and counters see two
    more calls."""
    import torch

    from ...core.random_ops import drawn

    if any(isinstance(m, sensitive) for m in model.modules()):
        return False
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    # the buffer objects too: a forward that assigns a new tensor to one (`self.mu = 0.9 * self.mu + …`) is put back
    buffers = [(m, k, b, b.detach().clone()) for m in model.modules() for k, b in m._buffers.items() if b is not None]
    try:
        with torch.no_grad(), _random_states_kept(model):
            _flags(model, False)   # the flags alone: the model's own eval()/train() may do more (swap in EMA
            seen = _flat(model(*_copied(args), **_copied(kwargs)))   # weights: a review); a forward that edits
            _flags(model, True)                                      # its input in place gets a copy
            with drawn() as ops:   # a train mode that draws (LayerDrop) acts whatever one draw shows (a review)
                same = _same(seen, _flat(model(*_copied(args), **_copied(kwargs))))
            return same and not ops
    except Exception:   # the model's own failure on a second call: the warning stands as it was
        return None
    finally:
        for m, training in modes:
            m.training = training
        for p, flag in grads:
            p.requires_grad_(flag)
        with torch.no_grad(), contextlib.suppress(Exception):
            for m, k, b, value in buffers:
                m._buffers[k] = b
                b.copy_(value)


@contextlib.contextmanager
def _random_states_kept(model):
    """torch's (CPU and the model's CUDA devices), Python's and NumPy's random states put back after the block."""
    import random

    import torch

    devices = sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})
    py, np_state = random.getstate(), _numpy_state()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py)
        _numpy_state(np_state)


def _flags(model, training: bool) -> None:
    for m in model.modules():
        m.training = training


FAILED = "failed"   # left_in_train: the copy could not be made, or its eval() raised


def left_in_train(model, sensitive: tuple) -> set[str] | str | None:
    """The `sensitive` submodules (dropout, BatchNorm) the model's own eval() leaves in train mode by mistake, asked
    of a weightless copy (every tensor on meta) as it is now: an eval() that swaps in EMA weights runs on nothing of
    the user's (a review: asked of the model itself, the run went on training on the EMA). A mistake when it leaves a
    BatchNorm (a train() that forgets super() on a model of raw parameters) or a module holding weights of its own (a
    Linear: the override forgot super(), or forgot the head) in train; one that leaves only dropouts in train keeps
    them on purpose (MC dropout written in eval(), on raw parameters too: reviews), and a train() that switches
    blocks of raw weights but not the dropouts inside them is not told from it; test-time adaptation that keeps a
    BatchNorm in train inside eval() is said. None when no module overrides train() or eval() (torch's own reach
    every submodule); FAILED when the copy cannot be made (a lock, an open file) or its eval() raises there. The random states (torch's, Python's,
    NumPy's) are put back: an eval() that draws (a NoisyNet's noise) leaves the run's stream as it was; what an eval()
    writes outside the model (a log) it writes once more."""
    import torch

    from ...core.meta import weightless_copy

    base = torch.nn.Module
    if not any(type(m).train is not base.train or type(m).eval is not base.eval or "train" in vars(m)
               or "eval" in vars(m) for m in model.modules()):
        return None
    try:
        with _random_states_kept(model):
            shadow = weightless_copy(model)
            shadow.eval()
            left = [(n, m) for n, m in shadow.named_modules() if n and m.training]
    except Exception:   # noqa: BLE001 - the copy or the user's override failed on it
        return FAILED
    forgot = any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        or not isinstance(m, sensitive) and next(m.parameters(recurse=False), None) is not None for _, m in left)
    return {n for n, m in left if isinstance(m, sensitive)} if forgot else set()


def kept_in_eval(model, names: list[str]) -> set[str]:
    """Of the submodules `names` found in eval mode while the model trained, those the model's own train() leaves in
    eval: its train() is overridden to keep them so (mmdetection's norm_eval: BatchNorm statistics frozen for small
    detection batches, the affine weights trained), a design, not a .eval() left over. Asked of a weightless copy
    (every tensor on meta): a train() that swaps weights (an EMA's in on eval(), the trained ones back on train()) runs
    on nothing of the user's (a second review: the probe on the model itself put the trained weights back). A copy
    that cannot be made, or a train() that raises there, tells nothing."""
    from ...core.meta import weightless_copy

    try:
        shadow = weightless_copy(model)
        shadow.train()
        modules = dict(shadow.named_modules())
        return {n for n in names if n in modules and not modules[n].training}
    except Exception:   # noqa: BLE001 - a help only
        return set()


def _copied(obj):
    """Tensors cloned, containers rebuilt: the user's batch is never the one the probe runs on."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _copied(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_copied(v) for v in obj)
    return obj


def _numpy_state(state=None):
    """NumPy's global random state (read, or put back), where NumPy is imported already."""
    import sys

    np = sys.modules.get("numpy")
    if np is None:
        return None
    if state is None:
        return np.random.get_state()
    np.random.set_state(state)
    return None


def _flat(out) -> list:
    from ...core.loss import float_outputs

    return [t.detach() for _, t in float_outputs(out)]


def _same(a: list, b: list) -> bool:
    """The float outputs of two calls equal within kernel rounding (RTOL, ATOL)."""
    import torch

    return bool(a) and len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True)
        for x, y in zip(a, b))
