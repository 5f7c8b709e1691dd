"""device-mismatch (meta run): the model is rebuilt with its weights on `meta` and run WITHOUT a
default-device context, so a tensor made in forward without a device (torch.arange(n),
torch.zeros(...)) lands on the CPU, and an op mixing it with meta tensors is caught (a dispatch mode
also checks ops meta itself would let through, such as matmul). No GPU needed."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ...core.fake_quiet import fake_log_quiet
from ...core.tracking import ModuleTracker
from ...errors import one_line
from .checklist import Checklist
from .shared import failing_call, name

# ops that legitimately take CPU tensors next to device tensors (explicit moves, CPU-side indices/lengths)
ALLOWED_OPS = {"copy_", "_to_copy", "to", "index", "index_put", "index_put_", "_index_put_impl_", "lift_fresh",
               "lift_fresh_copy", "_local_scalar_dense", "detach", "alias", "clone", "_has_compatible_shallow_copy_type",
               "set_", "tensor_split", "_pack_padded_sequence", "_pad_packed_sequence"}


class DeviceMix(RuntimeError):
    """An op received meta tensors and a non-scalar tensor on another device."""

    def __init__(self, op: str, tensor, creator: str | None, where: str, shape=None):
        self.op, self.creator, self.where = op, creator, where
        # a size only known at run time (a boolean mask's, symbolic in the fake run: torch names it u0) is "?"
        self.shape = "x".join(str(d) if isinstance(d, int) else "?" for d in (tensor.shape if shape is None else shape))
        self.device = str(tensor.device)
        super().__init__(f"Tensor on device {self.device} is not on the expected device meta! "
                         f"(aten.{op} got a {self.device} tensor of shape {self.shape})")


def _device_guard_mode(tracker, home: str = "meta"):
    """A dispatch mode that raises DeviceMix when an op mixes tensors on the model's device (`home`: meta, or
    the fake CUDA of the confirming run) with a non-scalar tensor on another device (meta itself lets some
    through: meta @ cpu works; CUDA would not; a fake kernel may not check). It also remembers which module's
    forward created each off-device tensor, to name the creator."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    created: dict[int, tuple] = {}   # id(tensor) -> (weakref, creating module); tensors compare elementwise

    def current() -> str:
        return tracker._stack[-1][0].name if tracker._stack else ""

    class MixedDeviceGuard(TorchDispatchMode):
        created: dict

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            op = func.overloadpacket.__name__
            if op not in ALLOWED_OPS:
                ts = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
                if any(a.device.type == home for a in ts):
                    other = [a for a in ts if a.device.type != home and a.dim() > 0]
                    if other:
                        made = _entry(created, other[0])
                        raise DeviceMix(op, other[0], made and made[0], current(), made and made[1])
            out = func(*args, **kwargs)
            # an output made from an off-device tensor recorded already keeps that tensor's creator and shape: the
            # user's line made it, not the module whose code derived it (a helper: MultiheadAttention was named for
            # the float mask it builds from the user's key_padding_mask, made without device= in the root)
            ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a.device.type != home]
            origins = [_entry(created, a) for a in ins]
            # one maker only: an op joining tensors of several makers, or one not made in a forward (lengths >
            # torch.arange(T)), made a new one here (a review)
            origin = origins[0] if origins and all(e is not None and e[0] == origins[0][0] for e in origins) else None
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != home and _lookup(created, t, by_memory=False) is None:
                    made = origin or (current(), tuple(t.shape))
                    created[id(t)] = (weakref.ref(t), *made)
                    if _ptr(t):   # nn.Parameter(t) in forward is a new object on the same memory
                        created[("ptr", _ptr(t))] = (None, *made)
            return out

    mode = MixedDeviceGuard()
    mode.created = created
    return mode


def _lookup(created: dict, t, by_memory: bool = True) -> str | None:
    """The module whose forward created `t` (None: not made in a forward)."""
    made = _entry(created, t, by_memory)
    return made[0] if made is not None else None


def _entry(created: dict, t, by_memory: bool = True) -> tuple | None:
    """(creating module, shape as created) of an off-device tensor `t`, or of the one it was derived from."""
    entry = created.get(id(t))
    if entry is not None and entry[0]() is t:
        return entry[1:]
    if not by_memory:
        return None
    # the same memory under another tensor object (nn.Parameter(torch.randn(...)) made in forward);
    # everything the forward allocates passes through the guard, so a reused address is re-recorded
    entry = created.get(("ptr", _ptr(t))) if t.device.type != "meta" and _ptr(t) else None
    return entry[1:] if entry is not None else None


def _ptr(t) -> int:
    """A tensor's data pointer; 0 for a meta or fake tensor (no memory, and FakeTensor warns when asked)."""
    if t.device.type == "meta" or getattr(t, "fake_mode", None) is not None:
        return 0
    return t.data_ptr()


def _off_meta_args(args) -> list:
    """The non-scalar tensors a call received that are not on meta."""
    import torch
    from torch.utils._pytree import tree_flatten

    return [a for a in tree_flatten(list(args))[0]
            if isinstance(a, torch.Tensor) and a.device.type != "meta" and a.dim() > 0]


def _creator_of_args(args, created) -> tuple[str | None, Any]:
    """For an error raised outside the guard (a module's own device check): the module that
    created an off-meta tensor among the failing module's inputs."""
    for a in _off_meta_args(args):
        if _lookup(created, a) is not None:
            return _lookup(created, a), a
    return None, None


def rebuild_on_meta(model, factory):
    """The model with its weights on meta: from the factory (the constructor runs normally with
    parameters turned to meta as registered, then .to('meta') — so a plain tensor attribute that
    .to() does not move stays on the CPU, as it would when moving to a GPU); else a copy."""
    from ...core.meta import build_on_meta, params_on_meta

    if factory is not None:
        fn, kwargs = factory
        try:
            with params_on_meta():
                m = fn(**kwargs)
            return _dtypes_of(model, m.to("meta")), "factory rebuilt with parameters on meta"
        except Exception:
            try:
                m, how = build_on_meta(fn, kwargs)
                return _dtypes_of(model, m), f"factory rebuilt under {how}"
            except Exception:
                pass
    return copy.deepcopy(model).to("meta"), "copy of the model moved to meta"


def _count_free_momentum(meta_model) -> None:
    """A BatchNorm of momentum None averages over 1 / float(num_batches_tracked) in train mode, a read no meta or
    fake tensor allows ("Tensor.item() cannot be called on meta tensors" stood in the devices row): the meta copy
    (ours) takes a number, which moves nothing between devices."""
    from torch.nn.modules.batchnorm import _BatchNorm

    for m in meta_model.modules():
        if isinstance(m, _BatchNorm) and m.momentum is None:
            m.momentum = 0.1


def _dtypes_of(model, rebuilt):
    """The rebuilt model with each parameter and buffer in the dtype the model's has: the factory builds float32,
    the model may run cast (--dtype bfloat16: "Input type (BFloat16) and bias type (float) should be the same"
    skipped the check on a ViT, a sweep)."""
    import torch

    given = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        for name, t in [*rebuilt.named_parameters(), *rebuilt.named_buffers()]:
            want = given.get(name)
            if want is not None and want.dtype != t.dtype and want.is_floating_point() and t.is_floating_point():
                t.data = t.data.to(want.dtype)
    return rebuilt


def check_device_meta(model, inputs, factory, ck: Checklist, real_device_hint: str) -> None:
    """`factory` is ctx.factory ((fn, kwargs) or None); `real_device_hint` says how to run for real."""
    import torch

    try:
        meta_model, how = rebuild_on_meta(model, factory)
    except Exception as exc:
        ck.row("device", "skipped", f"could not build the model on meta: {one_line(exc)}")
        return
    meta_inputs = inputs.map(lambda t: torch.empty_like(t, device="meta"))
    _count_free_momentum(meta_model)
    for mode in ("eval", "train"):
        meta_model.train(mode == "train")
        tracker = ModuleTracker(meta_model)
        guard = _device_guard_mode(tracker)
        try:
            with torch.no_grad(), tracker, guard:
                meta_inputs.call(meta_model)
        except Exception as exc:
            fake = fake_cuda_run(meta_model, meta_inputs, mode == "train")
            if fake.status == "ran":
                what = "mixed devices" if isinstance(exc, DeviceMix) else "failed"
                ck.row("device", "ok", f"the meta run {what} ({one_line(exc, 100)}), a run with the weights as fake "
                       "CUDA tensors did not: every tensor follows the model's device (the model treats meta "
                       "tensors specially)")
                continue
            if fake.status == "mismatch":   # confirmed on (fake) CUDA: name the tensor that run found
                _meta_failure(fake.model, fake.exc, fake.tracker, fake.created, mode, ck, real_device_hint)
            else:
                _meta_failure(meta_model, exc, tracker, guard.created, mode, ck, real_device_hint)
            return
    if "device" not in ck.rows:
        ck.row("device", "ok", "no off-device tensor in forward (meta run)")
        ck.result.data["meta_build"] = how


@dataclass
class FakeRun:
    status: str                  # "ran", "mismatch" (a DeviceMix, with where it was made), "unknown"
    model: Any = None
    exc: Any = None
    tracker: Any = None
    created: dict = field(default_factory=dict)


def fake_cuda_run(meta_model, meta_inputs, training: bool) -> FakeRun:
    """Confirm a meta run's failure on another device: a fresh copy of the model called with its parameters,
    buffers and inputs as fake CUDA tensors (torch's FakeTensor: shapes and devices, no data, no GPU needed),
    under the same guard with CUDA as the model's device (a fake kernel need not check devices itself). Code
    that reads a weight's device and treats meta specially (LongT5: `device if not meta else None`) takes its
    real path. "unknown" when the fake run fails otherwise (a CPU-only torch build refuses some fake CUDA ops;
    data-dependent code)."""
    import torch

    try:
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        from torch.func import functional_call
    except ImportError:
        return FakeRun("unknown")
    try:   # a shape environment: a boolean mask's nonzero gets a symbolic size (a GNN's self-loop removal)
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake_mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=ShapeEnv())
    except Exception:   # noqa: BLE001 - private: without it, data-dependent code is "unknown" as before
        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    cuda = torch.device("cuda")

    def fake(t):
        return FakeTensor(fake_mode, t.detach().to("meta"), cuda)

    try:
        model = copy.deepcopy(meta_model).train(training)     # what the forward caches stays on this copy
        state = {n: fake(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
        args = [fake(a) if isinstance(a, torch.Tensor) else a for a in meta_inputs.args]
        kwargs = {k: fake(v) if isinstance(v, torch.Tensor) else v for k, v in meta_inputs.kwargs.items()}
    except Exception:
        return FakeRun("unknown")
    tracker = ModuleTracker(model)
    guard = _device_guard_mode(tracker, home="cuda")
    try:
        with fake_mode, torch.no_grad(), tracker, guard, fake_log_quiet():
            functional_call(model, state, tuple(args), kwargs)
    except DeviceMix as exc:
        return FakeRun("mismatch", model, exc, tracker, guard.created)
    except Exception:
        return FakeRun("unknown")
    return FakeRun("ran")


def _meta_failure(meta_model, exc, tracker, created, mode: str, ck: Checklist, real_device_hint: str) -> None:
    """Why the meta forward failed, from what is known: the guard's DeviceMix, or the off-meta tensors
    the failing module received (and which forward made them). Anything else is not a device fact."""
    types = {n: type(m).__name__ for n, m in meta_model.named_modules()}
    call, _module, args = failing_call(tracker, meta_model)
    where = call.name if call else ""
    if not isinstance(exc, DeviceMix):   # e.g. a module's own device check (GRU: input vs hidden)
        creator, tensor = _creator_of_args(args, created)
        if creator is not None:
            exc = DeviceMix(f"{types.get(where, '?')} input check", tensor, creator, where)
    if isinstance(exc, DeviceMix) and exc.creator is not None:
        culprit = exc.creator
        used = "" if culprit == where else f", used in {name(where)} ({types.get(where, '?')})"
        ck.suspects.update({culprit, where})
        ck.find("device", "device-mismatch", "error", name(culprit),
                f"forward ({mode} mode) of {name(culprit)} ({types.get(culprit, '?')}) creates a "
                f"{exc.shape} tensor without device=: it stays on {exc.device} while the model is elsewhere "
                f"({exc.op if ' ' in exc.op else 'aten.' + exc.op} mixes it with model tensors{used})",
                "create tensors on the input's device: torch.arange(n, device=x.device), "
                "x.new_zeros(...), torch.zeros_like(x); or register them as buffers",
                verdict=f"a tensor created in {name(culprit)}'s forward ignores the model's device")
    elif isinstance(exc, DeviceMix) or _off_meta_args(args):   # made outside any forward
        ck.suspects.add(where)
        ck.find("device", "device-mismatch", "error", name(where),
                f"forward ({mode} mode) in {name(where)} ({call.type if call else '?'}) mixes devices: "
                f"a tensor that .to(device) does not move (made outside forward, most likely a plain tensor "
                f"attribute rather than a buffer) stays on the CPU ({one_line(exc)})",
                "register constant tensors with self.register_buffer(name, t) so model.to(device) moves "
                "them; create tensors in forward with device=x.device",
                verdict=f"{name(where)} uses a tensor that does not follow the model's device")
    elif mode == "train":
        ck.row("device", "ok", f"no off-device tensor in eval-mode forward (meta run; train mode raised "
               f"there: {one_line(exc, 80)})")
    else:
        ck.row("device", "skipped", f"forward on meta not possible ({mode} mode, {name(where)}): "
               f"{one_line(exc, 120)}", name(where) if call else "",
               f"some ops cannot run on meta (data-dependent ones such as .item() and nonzero, or one whose meta "
               f"kernel refuses its dtype); {real_device_hint} to check for real")
