"""Forward hooks that record which module ran, with what shapes — and which one raised."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import (
    HOST_OOM_HINT,
    ModelError,
    UsageError,
    device_error,
    host_out_of_memory,
    one_line,
)


def describe(obj: Any, limit: int = 4) -> str:
    """A short shape description of a forward output or input: `8x10`, `(8x10, 8)`, `{logits: 2x5}`."""
    import torch

    if isinstance(obj, torch.Tensor):
        if getattr(obj, "is_nested", False):
            return nested_shape(obj, limit)
        shape = "x".join(str(d) for d in obj.shape) if obj.dim() else "scalar"
        return shape if obj.is_floating_point() else f"{shape} {str(obj.dtype).replace('torch.', '')}"
    if isinstance(obj, (tuple, list)):
        parts = [describe(x, limit) for x in obj[:limit]]
        more = ", …" if len(obj) > limit else ""
        body = ", ".join(parts) + more
        return f"({body})" if isinstance(obj, tuple) else f"[{body}]"
    if isinstance(obj, dict):
        items = list(obj.items())
        body = ", ".join(f"{k}: {describe(v, limit)}" for k, v in items[:limit])
        return "{" + body + (", …" if len(items) > limit else "") + "}"
    if obj is None:
        return "None"
    fields = dataclass_fields(obj)
    if fields is not None:   # a plain @dataclass output: its fields, as a dict's
        body = ", ".join(f"{k}: {describe(v, limit)}" for k, v in fields[:limit])
        return f"{type(obj).__name__}(" + body + (", …" if len(fields) > limit else "") + ")"
    return type(obj).__name__


def dataclass_fields(obj: Any) -> list[tuple[str, Any]] | None:
    """A @dataclass instance's (name, value) fields (not a dict-like model output: those are dicts), else None."""
    import dataclasses

    if not dataclasses.is_dataclass(obj) or isinstance(obj, type) or hasattr(obj, "keys"):
        return None
    return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]


def nested_shape(t, limit: int = 4) -> str:
    """A nested tensor (PyTorch's fast paths return them, e.g. nn.TransformerEncoder in eval with a
    padding mask): `.shape`/`.size()` raise on it, so describe it by its per-sample shapes:
    `nested(2: 5x16, 3x16)`."""
    try:
        parts = ["x".join(str(d) for d in x.shape) or "scalar" for x in t.unbind()]
    except Exception:   # a layout whose components cannot be listed
        return f"nested({t.dim()}-d)"
    dtype = "" if t.is_floating_point() else f" {str(t.dtype).replace('torch.', '')}"
    shown = ", ".join(parts[:limit]) + (", …" if len(parts) > limit else "")
    return f"nested({len(parts)}: {shown}){dtype}"


@dataclass
class Call:
    name: str          # module path ("" is the root)
    type: str
    depth: int
    inputs: str = ""
    output: str = ""
    done: bool = False
    float_ids: tuple | None = None   # an nn.Embedding given floating-point values: (rows, shape) (float_ids())


def float_ids(mod, tensors) -> tuple[int, str] | None:
    """An nn.Embedding called with floating-point values (ids of the wrong dtype): its number of rows and
    the shape it was given ("2x32")."""
    import torch

    first = tensors[0] if tensors else None
    if isinstance(mod, torch.nn.Embedding) and isinstance(first, torch.Tensor) and first.is_floating_point():
        return mod.num_embeddings, "x".join(str(d) for d in first.shape)
    return None


def module_names(model) -> dict[int, str]:
    """id(module) -> its path in `model` ("" is the root); a module reachable by two paths keeps the first."""
    names: dict[int, str] = {}
    for name, mod in model.named_modules():
        names.setdefault(id(mod), name)
    return names


_OURS = ("torchdiag.", "torchinfo", "fvcore.")   # the code whose hooks a diagnostic puts on modules


def _ours(hook) -> bool:
    fn = getattr(hook, "func", hook)        # a functools.partial
    fn = getattr(fn, "__func__", fn)        # a bound method
    return str(getattr(fn, "__module__", "") or "").startswith(_OURS)


def remove_copied_hooks(model, before: set[int]) -> int:
    """Remove our hooks from the modules of `model` that were not in it before a diagnostic (`before`: their ids):
    a forward that deep-copies a part of itself (BYOL's target made lazily, `copy.deepcopy(self.online)`) copies the
    hooks on it, which no handle of ours removes (a review found 2-4 left on each copied module). Returns how many."""
    removed = 0
    for m in model.modules():
        if id(m) in before:
            continue
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            hooks = getattr(m, attr, None) or {}
            for key in [k for k, fn in hooks.items() if _ours(fn)]:
                del hooks[key]
                removed += 1
                for extra in ("_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                              "_forward_pre_hooks_with_kwargs"):
                    getattr(m, extra, {}).pop(key, None)
    return removed


TRANSFORMED: set[str] = set()   # modules hooks skipped inside a torch.func transform (cleared per diagnostic:
                                # runner.local.invoke; said in a note: core.context.finish)


def under_transform() -> bool:
    """A torch.func transform (vmap, grad, jacrev, ...) is running."""
    import torch

    return torch._C._functorch.peek_interpreter_stack() is not None


class ForwardHooks:
    """`self._pre` as forward pre-hook and `self._post` as forward hook on every module of `model`
    while the `with` block runs, plus `self.names` (id(module) -> path).

    Several diagnostics watch each module call the same way; this is that mechanism written once.
    A subclass defines `_pre(mod, args)` (or `_pre(mod, args, kwargs)` with `pre_kwargs = True`) and
    `_post(mod, args, output)`; setting either to None registers no hook of that kind."""

    pre_kwargs = False
    _pre = None
    _post = None

    def __init__(self, model):
        self.model = model
        self.names = module_names(model)
        self._handles: list = []

    def hooked(self):
        """The modules it hooks: every one, once."""
        return {id(m): m for m in self.model.modules()}.values()

    def __enter__(self):
        pre, post = self._outside(self._pre), self._outside(self._post)
        for mod in self.hooked():
            if pre is not None:
                self._handles.append(mod.register_forward_pre_hook(pre, with_kwargs=self.pre_kwargs))
            if post is not None:
                self._handles.append(mod.register_forward_hook(post))
        return self

    def _outside(self, hook):
        """`hook`, run only outside a torch.func transform: inside `torch.vmap(self.block)` a module's tensors are
        batched wrappers that must not escape it, and that have no storage or single value to read (a review:
        gradflow and nancheck stopped with an internal error, doctor and activations blamed the model)."""
        if hook is None:
            return None

        def outside(*args):
            if under_transform():
                TRANSFORMED.add(self.names.get(id(args[0]), "?") or "(root)")
                return None
            return hook(*args)
        return outside

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False


class ModuleTracker(ForwardHooks):
    """Install with `with ModuleTracker(model) as tr:`; calls are in execution (pre-hook) order."""

    pre_kwargs = True

    def __init__(self, model, record_shapes: bool = True):
        super().__init__(model)
        self.record_shapes = record_shapes
        self.calls: list[Call] = []
        self._stack: list = []
        self.none_kwargs: list[str] = []   # of the failing call: keyword arguments it received as None
        self.root_given: tuple[int, set] | None = None   # (number of positional, keyword names) of the root call

    def _pre(self, mod, args, kwargs):
        name = self.names.get(id(mod), "?")
        call = Call(name, type(mod).__name__, name.count(".") + 1 if name else 0)
        self.calls.append(call)
        if mod is self.model and self.root_given is None:
            self.root_given = (len(args), set(kwargs))
        # Inputs are only described if this call fails: describing every call costs time.
        self._stack.append((call, tuple(args) + tuple(kwargs.values()), kwargs, mod))

    def _post(self, mod, args, output):
        if self._stack:
            call = self._stack.pop()[0]
            call.done = True
            if self.record_shapes:
                call.output = describe(output)

    @property
    def failing(self) -> Call | None:
        """The innermost module still open after an exception: the one that raised."""
        if not self._stack:
            return None
        call, args, kwargs, mod = self._stack[-1]
        if not call.inputs:
            call.inputs = describe(args)
            call.float_ids = float_ids(mod, args)
            self.none_kwargs = [k for k, v in kwargs.items() if v is None]
        return call

    def missing_inputs(self, error: str = "") -> list[str]:
        """Optional inputs of the model's forward that were not given and whose absence the failing
        module saw as a None keyword (T5's decoder gets input_ids=None when decoder_input_ids is
        missing): the names an error should give. Where the error names some of those keywords ("exactly one
        of input_ids or inputs_embeds"), only theirs: T5's decoder also got attention_mask=None, which it
        does not need (a review: the hint said to pass attention_mask)."""
        if self.failing is None or self.root_given is None or not self.none_kwargs:
            return []
        from .inputs import forward_parameters

        n_args, given = self.root_given
        params = forward_parameters(self.model)
        free = [p.name for i, p in enumerate(params) if i >= n_args and p.name not in given]
        named = [k for k in self.none_kwargs if re.search(rf"\b{re.escape(k)}\b", error)]
        keys = [k for k in named if any(p == k or p.endswith("_" + k) for p in free)] or self.none_kwargs
        return [p for p in free if any(p == k or p.endswith("_" + k) for k in keys)]

    def failing_nones(self) -> list[str]:
        """The inputs the module that raised (the innermost call still open) received as None, by keyword and by
        position (named from its forward's signature: Conv1d's `input`, a prompter's `pixel_values`), and those
        of each call around it that handed a None on (every call inside it still open received one): a None a
        module replaced with a value of its own before its sub-module failed (RoBERTa's position ids) is not
        among them."""
        import inspect

        out: list[str] = []
        for _, given, kwargs, mod in reversed(self._stack):
            try:
                names = list(inspect.signature(mod.forward).parameters)
            except (TypeError, ValueError):
                names = []
            positional = given[:len(given) - len(kwargs)]
            nones = ([names[i] for i, v in enumerate(positional) if v is None and i < len(names)] +
                     [k for k, v in kwargs.items() if v is None])
            if not nones:
                break
            out += nones
        return out

    def called(self) -> set[str]:
        return {c.name for c in self.calls}


def _without_forward(model, name: str):
    """The module at `name` when its forward is torch's placeholder (nn.Module defines none), else None."""
    import torch

    try:
        mod = model.get_submodule(name) if name else model
    except AttributeError:
        return None
    forward = getattr(type(mod), "forward", None)
    return mod if forward is torch.nn.Module.forward else None


RAISED_HINT = "the model's own code raised; fix it or the inputs (-i) and run again"


def forward_error(exc: BaseException, tracker: ModuleTracker | None, phase: str = "forward", partial=None) -> ModelError:
    """A ModelError that names the module path, its type and the shapes it received (a GPU's own failure: where
    it surfaced, which need not be where it happened, with errors.device_error's hint)."""
    call = tracker.failing if tracker else None
    gpu = device_error(exc, f"{phase}, at {call.name or '(root)'} ({call.type})" if call is not None else phase)
    if gpu is not None:
        gpu.partial, gpu.where = partial, (call.name if call else "")
        return gpu
    if call is not None:
        where = call.name or "(root)"
        # shapes only where the tracker recorded them (nancheck's does not: "with input shapes ()" was not true), and
        # some (nancheck's records floating inputs only: an EmbeddingBag's ids and offsets were "()", a new user)
        recorded = getattr(tracker, "record_shapes", True) and call.inputs not in ("", "()")
        shapes = f" with input shapes {call.inputs}" if recorded else ""
        msg = f"{phase} failed in {where} ({call.type}){shapes}: {one_line(exc)}"
    else:
        msg = f"{phase} failed: {one_line(exc)}"
    hint = RAISED_HINT
    if host_out_of_memory(exc):   # the allocator refused, not the model's code (efficientnet_b7 at 3x600x600 under a cap)
        return ModelError(f"out of memory: {msg}", hint=HOST_OOM_HINT, partial=partial)
    model = getattr(tracker, "model", None)
    container = _without_forward(model, call.name) if call is not None and model is not None else None
    if container is not None:   # torch's placeholder forward: a holder of sub-models (Bark, a VQ-VAE's parts)
        parts = [n for n, _ in container.named_children()]
        msg = (f"{call.name or '(root)'} ({call.type}) has no forward() of its own (it holds "
               f"{', '.join(parts[:6]) + (' …' if len(parts) > 6 else '') or 'no sub-modules'}), so it cannot be run")
        hint = "run one of the models it holds (a factory that returns it: module.py:factory)"
    text = one_line(exc)
    missing = tracker.missing_inputs(text) if isinstance(tracker, ModuleTracker) else []
    # only where the error is one a None makes or names the input: BLT's "'BltConfig' object has no attribute
    # 'num_hidden_layers'" (its config's) was told to pass attention_mask
    if missing and call is not None and (re.search(r"\bNone(Type)?\b", text) or any(
            re.search(rf"\b{re.escape(k)}\b", text) for k in [*missing, *tracker.none_kwargs])):
        got = ", ".join(f"{k}=None" for k in tracker.none_kwargs)
        msg += f" — the model's forward was not given {' or '.join(missing)} ({call.name or '(root)'} received {got})"
        hint = (f"pass {missing[0]} as a keyword input: an example_inputs() function in the model's module "
                "returning a dict, or inputs={...} in Python")
    if getattr(call, "float_ids", None) is not None:   # trackers of our own may return a plain record
        rows, shape = call.float_ids
        msg += f" — {call.name or '(root)'} is an nn.Embedding and was given floating-point values, not integer ids"
        hint = f"give the input an integer dtype: -i {shape}:int64[0,{rows}) on the command line (ids in [0, {rows}))"
    # a sweep: ids past the vocabulary read "IndexError: index out of range in self" alone. torch's own lookup error
    # only (a subclass's list index is another), and either cause: ids given, or positions the model makes past its
    # table (GPT-2's wpe with a sequence longer than it: a review)
    rows = (_embedding_rows(model, call) if isinstance(exc, IndexError) and call is not None
            and "index out of range in self" in text else None)
    if rows is not None:
        msg += (f" — {call.name or '(root)'} is an nn.Embedding of {rows} rows and got an index of {rows} or more (or "
                "negative)")
        hint = (f"if it reads the input ids: give ids in [0, {rows}) (-i SHAPE:int64[0,{rows})); if it reads positions "
                f"the model makes: a sequence of at most {rows}")
    err = ModelError(msg, hint=hint, partial=partial)
    err.where = call.name if call else ""
    return err


def _embedding_rows(model, call) -> int | None:
    """The rows of the nn.Embedding (or EmbeddingBag) that raised, None when the failing module is none."""
    import torch

    try:
        mod = model.get_submodule(call.name) if model is not None and call.name else model
    except AttributeError:
        return None
    if isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return int(mod.num_embeddings)
    return None


def run_forward(model, inputs, tracker: ModuleTracker | None = None, phase: str = "forward"):
    """model(*args, **kwargs); a failure becomes a ModelError naming the module (installs a
    tracker just for naming when none is given)."""
    own = tracker is None
    if own:
        tracker = ModuleTracker(model, record_shapes=True)
        tracker.__enter__()
    try:
        return inputs.call(model)
    except ModelError:
        raise
    except Exception as exc:
        raise forward_error(exc, tracker, phase) from exc
    finally:
        if own:
            tracker.__exit__(None, None, None)


# containers hold modules but are never called themselves
CONTAINERS = ("ModuleList", "ModuleDict", "ParameterList", "ParameterDict")


def first_tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for x in out:
            t = first_tensor(x)
            if t is not None:
                return t
    if isinstance(out, dict):
        for x in out.values():
            t = first_tensor(x)
            if t is not None:
                return t
    return None


def module_named(model, name: str):
    """The submodule at path `name`, or a usage error with the closest names."""
    names = dict(model.named_modules())
    if name not in names:
        import difflib

        close = difflib.get_close_matches(name, [n for n in names if n], n=3, cutoff=0.5)
        raise UsageError(f"no module named '{name}' in the model",
                         hint=(f"did you mean {', '.join(close)}?" if close else "module paths are listed by `torchdiag summary`"))
    return names[name]
