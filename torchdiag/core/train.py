"""The mechanics every training-like diagnostic shares, in one place each: the optimizer, backward
from a loss, a seeded call to the user's code, and a copy of the model to train."""
from __future__ import annotations

import contextlib

from ..errors import ModelError, UsageError, device_error, one_line


def make_optimizer(params, spec, *, foreach: bool | None = None):
    """The optimizer `spec` (core.run.OptimizerSpec) names, over `params`. `foreach=None` is torch's
    own per-device default; memory estimates pass it explicitly to model CUDA's choice on meta."""
    import torch

    lr = spec.learning_rate
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=spec.momentum, foreach=foreach)
    cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
    return cls(params, lr=lr, foreach=foreach)


def nothing_to_train(model) -> UsageError:
    """The one line for a model a training command cannot train: no parameters at all (nn.ReLU()), or all frozen."""
    if next(iter(model.parameters()), None) is None:
        return UsageError("the model has no parameters: there is nothing to train",
                          hint="give a model with weights (this one computes a fixed function)")
    return UsageError("the model has no trainable parameters (requires_grad is False everywhere)",
                      hint="nothing can be trained: unfreeze some parameters")


def backward(loss, hint: str = "the model's own code raised in backward", retain_graph: bool = False,
             run=None) -> bool:
    """loss.backward() (or `run(loss, retain_graph)`); False when the loss has no gradient path (nothing trainable
    reached it). A failure is the user's (exit 3), named as a backward failure."""
    if not loss.requires_grad:
        return False
    try:
        (run or _plain_backward)(loss, retain_graph)
    except Exception as exc:
        raise (device_error(exc, "backward") or ModelError(f"backward failed: {one_line(exc)}", hint=hint)) from exc
    return True


def _plain_backward(loss, retain_graph: bool) -> None:
    loss.backward(retain_graph=retain_graph)


def step(optimizer) -> None:
    """optimizer.step(); a failure is the user's (exit 3), but sparse gradients torchdiag's own optimizer refuses are
    a choice of optimizer (exit 2: memory on an `Embedding(sparse=True)` under the default Adam, a review)."""
    try:
        optimizer.step()
    except Exception as exc:
        if "does not support sparse gradients" in str(exc):
            from ..errors import UsageError

            raise UsageError(f"the model makes sparse gradients (an embedding with sparse=True), which "
                             f"{type(optimizer).__name__} does not take", hint="--optimizer sgd takes them") from exc
        raise (device_error(exc, "the optimizer step") or ModelError(f"optimizer step failed: {one_line(exc)}")) from exc


@contextlib.contextmanager
def seeded(seed: int):
    """The global RNGs (torch's CPU, and CUDA when in use; numpy's and Python's, which some forwards draw from:
    transformers' SpecAugment masks in wav2vec2-style models use numpy) seeded for the block and restored
    afterwards, so a diagnostic is reproducible and leaves the caller's random streams where they were."""
    import random

    import numpy as np
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def user_call(seed: int, fn, what: str):
    """The user's fn() (example_inputs, a --batch function) under `seeded(seed)`; what it raises is the
    user's (exit 3), named as `what`."""
    with seeded(seed):
        try:
            return fn()
        except Exception as exc:
            raise ModelError(f"{what} raised {one_line(exc)}") from exc


def train_copy(model, why: str = "to train it", dtype=None, *, backward: bool = False, optimizer=None,
               activations: dict | None = None, buckets: bool = False):
    """A deep copy of the user's model in train mode, with .grad cleared and the hooks registered on
    parameters (deepcopy drops them) put back, so a hook that masks a gradient acts on the copy too. Its room
    is checked for what its caller will run on it (room_for_copy)."""
    import copy

    room_for_copy(model, why, dtype, backward=backward, optimizer=optimizer, activations=activations, buckets=buckets)
    try:
        work = copy.deepcopy(model, _graph_tensors(model))
    except Exception as exc:
        raise ModelError(f"cannot copy the model {why} (copy.deepcopy raised {one_line(exc)})",
                         hint="torchdiag never trains your model itself; make it deep-copyable "
                              "(no open files, locks or generators as attributes)") from exc
    copy_param_hooks(model, work)
    for p in work.parameters():
        p.grad = None
    return work.train()


class NoRoom(ModelError):
    """A copy the memory where the model lives cannot hold: no fallback that copies as much may follow.
    `activations`: the bytes of activations it was asked, `needed` in all and `free` where it was refused (core.fewer
    retries on fewer samples where half the activations would fit)."""
    activations: int = 0
    needed: int = 0
    free: int = 0


def room_for_copy(model, why: str, dtype=None, *, backward: bool = False, optimizer=None,
                  activations: dict | None = None, buckets: bool = False) -> None:
    """A copy takes what the model's tensors take (each parameter cloned, each buffer storage once; in `dtype`
    when given, for the floating ones); run backward (`backward`) its gradients as much again as its trainable
    parameters; stepped by `optimizer` (a core.run.OptimizerSpec, implies backward) that optimizer's state beside
    them. One that does not fit in the memory free where its tensors live is refused with NoRoom (exit 3, one line;
    a caller that can do without the copy says so and goes on), not left to the kernel's OOM killer, which ends
    the process with no line at all (torchvision vit_h_14 on 24 GiB: gradflow's re-check trained a copy with Adam,
    then cast one to float64 and ran backward, its room asked for the weights alone). `activations`: {device: bytes}
    its passes keep for backward (measured on a pass of the model: Context.saw_activations); none where no pass was
    measured. `buckets`: wrapped in DistributedDataParallel, whose buckets hold a flat copy of the gradients."""
    from ..fmt import bytes_apart, human_bytes
    from .resources import device_available

    for device, named in _copy_parts(model, dtype, backward, optimizer, activations or {}, buckets).items():
        free = device_available(device)
        total = sum(named.values())
        if free is None or total <= free:
            continue
        what = [(n, b) for n, b in named.items() if b]
        need, left = bytes_apart(total, free)
        need = (f"its tensors on {device} take {need}" if [n for n, _ in what] == ["its tensors"] else
                f"on {device} it needs {need} (" + ", ".join(f"{n} {human_bytes(b)}" for n, b in what) + ")")
        acts = named["the activations its backward keeps"]
        err = NoRoom(f"not enough memory for a copy of the model {why}: {need}, {left} is free there",
                     hint="free memory on that device" + (", or give a smaller batch" if acts else "")
                     + " (summary and flops make no copy)")
        err.activations, err.needed, err.free = acts, total, free
        raise err


def _copy_parts(model, dtype, backward: bool, optimizer, activations: dict, buckets: bool) -> dict:
    """{device: {what: bytes}} a copy takes, in the order the refusal names them (room_for_copy)."""
    states = optimizer.states if optimizer is not None else 0
    state = f"{getattr(optimizer, 'name', '')} state"
    parts: dict = {}

    def row(device) -> dict:
        return parts.setdefault(device, {"its tensors": 0, "its gradients": 0, state: 0, "DDP's gradient buckets": 0,
                                         "the activations its backward keeps": 0})

    for device, nbytes in _copy_bytes(model, dtype):
        row(device)["its tensors"] += nbytes
    for device, nbytes in _grad_bytes(model, dtype) if backward or optimizer is not None else ():
        got = row(device)
        got["its gradients"] += nbytes
        got[state] += states * nbytes
        got["DDP's gradient buckets"] += nbytes if buckets else 0
    for device, nbytes in activations.items():
        row(device)["the activations its backward keeps"] += nbytes
    return parts


def _grad_bytes(model, dtype=None):
    """(device, bytes) of the gradient each trainable floating or complex parameter of a copy gets (a floating one in
    `dtype` when given); a sparse embedding's (resources.sparse_grads) holds a batch's rows and is not counted."""
    from torch.nn.parameter import UninitializedTensorMixin

    from .resources import sparse_grads, takes_grad

    seen: set = sparse_grads(model)   # their gradients hold a batch's rows: not counted
    for p in model.parameters():
        if id(p) in seen or not takes_grad(p) or p.device.type == "meta" or isinstance(p, UninitializedTensorMixin):
            continue
        seen.add(id(p))
        yield p.device, p.numel() * (dtype.itemsize if dtype is not None and p.is_floating_point() else p.element_size())


def _copy_bytes(model, dtype=None):
    """(device, bytes) per tensor a deep copy makes: a parameter is cloned whole (Parameter.__deepcopy__); a buffer
    copies its storage, once for buffers sharing one (an expanded buffer is its few stored values); a sparse
    tensor its indices and values. Meta tensors and a lazy module's uninitialised ones take nothing."""
    import torch
    from torch.nn.parameter import UninitializedTensorMixin

    seen: set = set()
    for t, param in [(p, True) for p in model.parameters()] + [(b, False) for b in model.buffers()]:
        # a lazy module's parameter has no size until its first forward (a review: `data --model` crashed on it)
        if id(t) in seen or t.device.type == "meta" or isinstance(t, UninitializedTensorMixin):
            continue
        seen.add(id(t))
        size = dtype.itemsize if dtype is not None and t.is_floating_point() else t.element_size()
        if t.layout != torch.strided:
            coo = t.layout == torch.sparse_coo
            yield t.device, (t._indices().numel() * t._indices().element_size() + t._values().numel() * size) if coo else 0
        elif param:
            yield t.device, t.numel() * size
        else:
            try:
                key = ("storage", t.untyped_storage().data_ptr())
                nbytes = t.untyped_storage().nbytes() * size // t.element_size()
            except Exception:
                key, nbytes = ("tensor", id(t)), t.numel() * size
            if key not in seen:
                seen.add(key)
                yield t.device, nbytes


def held_tensors(model):
    """Every tensor the model's modules hold in attributes, directly or in lists, tuples, sets and dicts up to three
    deep (parameters and buffers among them, a cache or an EMA's weights beside them); a tensor may come twice."""
    import torch

    def visit(v, depth: int):
        if isinstance(v, torch.Tensor):
            yield v
        elif depth < 3 and isinstance(v, (list, tuple, set)):
            for x in v:
                yield from visit(x, depth + 1)
        elif depth < 3 and isinstance(v, dict):
            for x in v.values():
                yield from visit(x, depth + 1)

    for m in model.modules():
        for key, v in vars(m).items():
            if key != "_modules":
                yield from visit(v, 0)


def _graph_tensors(model) -> dict:
    """deepcopy's memo: a detached clone for every tensor with a grad_fn the model holds as an attribute (a
    cache its forward left, e.g. torchvision RAFT's correlation pyramid), which deepcopy refuses ("Only
    Tensors created explicitly by the user (graph leaves) support the deepcopy protocol")."""
    memo: dict = {}
    for v in held_tensors(model):
        if not v.is_leaf and id(v) not in memo:
            memo[id(v)] = v.detach().clone()
    return memo


def copy_param_hooks(model, work) -> None:
    originals = dict(model.named_parameters())
    for name, q in work.named_parameters():
        p = originals.get(name)
        if p is None:
            continue
        for hook in list((getattr(p, "_backward_hooks", None) or {}).values()):
            q.register_hook(hook)
        for hook in list((getattr(p, "_post_accumulate_grad_hooks", None) or {}).values()):
            q.register_post_accumulate_grad_hook(hook)
