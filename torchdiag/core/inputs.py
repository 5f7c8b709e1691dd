"""Model inputs: `-i SHAPE[:DTYPE[RANGE]]`, else `example_inputs()`, else a source form's default
(torchvision:, timm:, hf:), else `example_input_array`."""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError, one_line
from . import seeds
from .resources import memory_limit

INPUT_WAYS = ("-i/--input SHAPE[:DTYPE] (e.g. -i 8x3x32x32 or -i '2x128:int64[0,30000)': quoted for the shell), "
              "an example_inputs() function in the model's module (a dict for keyword inputs), "
              "or an example_input_array attribute on the model; a real batch with --batch FILE.py:fn where the "
              "command takes one")

DTYPES = {
    "float32": "float32", "float": "float32", "f32": "float32", "fp32": "float32",
    "float64": "float64", "double": "float64", "f64": "float64",
    "float16": "float16", "half": "float16", "f16": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}
SHIFT_CLEAR = 10.0   # an LM head's own loss is this much closer to one reading of its labels than to the other
_SPEC = re.compile(r"^(?P<shape>[^:]+)(?::(?P<dtype>[a-z0-9]+)(?P<range>[\[(].*)?)?$")
_RANGE = re.compile(r"^\[\s*(-?[\d.e+]+)\s*,\s*(-?[\d.e+]+)\s*([)\]])$")


@dataclass
class InputSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float | None = None
    high: float | None = None   # exclusive for integers

    @property
    def is_int(self) -> bool:
        return self.dtype.startswith("int") or self.dtype == "uint8"


def parse_input_spec(text: str) -> InputSpec:
    m = _SPEC.match(text.strip().lower())
    if "=" in text:   # (a sweep: a diffusers UNet's encoder_hidden_states, "bad input shape 'x=2x4'")
        raise UsageError(f"keyword input '{text}': -i gives positional inputs only (SHAPE[:DTYPE])",
                         hint="give keyword inputs with an example_inputs() function in the model's module that "
                              "returns a dict, or a real batch with --batch FILE.py:fn")
    if not m:
        raise UsageError(f"bad input '{text}'", hint="write SHAPE[:DTYPE], e.g. 8x3x32x32 or 2x128:int64[0,30000)")
    dims = m.group("shape").split("x")
    try:
        shape = tuple(int(d) for d in dims)
    except ValueError:
        several = "," in m.group("shape")   # one -i per input (a sweep wrote -i 1x10,1x7)
        raise UsageError(f"bad input shape '{m.group('shape')}' in '{text}'",
                         hint="give each input its own -i: " + " ".join(f"-i {part.strip()}" for part in text.split(","))
                         if several else
                         "dimensions are positive integers joined by 'x', e.g. 8x3x32x32") from None
    if any(d <= 0 for d in shape):
        raise UsageError(f"bad input shape '{m.group('shape')}': every dimension must be ≥ 1")
    dtype = m.group("dtype") or "float32"
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}' in '{text}'",
                         hint="use one of float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool")
    spec = InputSpec(shape, DTYPES[dtype])
    if m.group("range"):
        r = _RANGE.match(m.group("range"))
        if not r or spec.dtype == "bool":
            raise UsageError(f"bad value range in '{text}'", hint="write it as [low,high), e.g. int64[0,30000)")
        spec.low, spec.high = float(r.group(1)), float(r.group(2))
        if spec.is_int and r.group(3) == "]":
            spec.high += 1  # inclusive upper bound for integers
        if spec.high <= spec.low:
            raise UsageError(f"empty value range in '{text}'")
        if spec.is_int:
            import torch

            info = torch.iinfo(getattr(torch, spec.dtype))
            if spec.low < info.min or spec.high - 1 > info.max:
                raise UsageError(f"value range in '{text}' does not fit {spec.dtype} ({info.min} … {info.max})")
    return spec


@dataclass
class ModelInputs:
    """Positional and keyword inputs for one forward call, plus how they were chosen."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    chosen: bool = False    # a source's default (torchvision:/timm:/hf:), made up by torchdiag, not the user's
    samples: int | None = None   # how many samples where the layout does not say (the list of images torchdiag makes)
    _written: list[str] = field(default_factory=list, repr=False, compare=False)   # inputs a forward changed
    _kept: dict | None = field(default=None, repr=False, compare=False)   # id -> (tensor, version, first values)

    @property
    def made_up(self) -> bool:
        """Values torchdiag drew itself (a source's default, or -i shapes): fresh draws of them are inputs of the same
        kind, as a mixture of a user's own batch may not be (one-hot columns mixed into counts)."""
        return self.chosen or self.source == "--input"

    def call(self, model):
        self._as_first()
        return model(*self.args, **self.kwargs)

    def _as_first(self) -> None:
        """Every forward gets the values the first one got. A forward that writes into its input (`x.mul_(2)`)
        would hand the next one other values: two identical eval forwards would differ, and a batch trained on
        again would drift. The first call keeps a copy of each input; a later call finds the tensors whose
        version moved and puts in a new tensor with the first values (a new one, not a copy into the old: a graph
        that saved the edited tensor stays valid). One tensor given twice stays one; inputs that share memory
        (x and x[:]) are written back in place instead, so they still share it. `written()` names them."""
        if self._kept is None:
            self.keep()
            return
        moved = self._moved()
        if not moved:
            return
        import torch

        shared = _sharing([t for _, t in self.tensors()])
        made: dict[int, Any] = {}

        def fresh(t):
            if id(t) not in moved:
                return t
            if id(t) in shared:   # aliases of one another: the values go back into them
                with torch.no_grad():
                    t.copy_(self._kept[id(t)][2])
                self._kept[id(t)] = (t, _version(t), self._kept[id(t)][2])
                return t
            if id(t) not in made:
                first = self._kept.pop(id(t))[2]
                again = first.clone().requires_grad_(t.requires_grad and t.is_leaf and first.is_floating_point())
                self._kept[id(again)] = (again, _version(again), first)
                made[id(t)] = again
            return made[id(t)]

        self.args, self.kwargs = _map(self.args, fresh), _map(self.kwargs, fresh)

    def keep(self) -> None:
        """Keep the first values now (a copy of each input): a command that measures its forward's memory or ops
        calls it before, so the copy is not in what it measures."""
        if self._kept is None:
            self._kept = {id(t): (t, v, t.detach().clone()) for _, t in self.tensors() if (v := _version(t)) is not None}

    def _moved(self) -> set[int]:
        """The ids of the inputs whose version moved since they were kept (each gets a fresh tensor: a graph that
        saved it stays valid); the names of those whose values changed join `written()`. A version that moved with
        every value (bit for bit: -0.0 is not 0.0; NaN where NaN was) unchanged, as FSMT's
        `input_ids.masked_fill_(input_ids == -100, pad)` on ids with no -100, is a write of nothing: no edit."""
        kept = self._kept or {}
        moved = {id(t) for _, t in self.tensors() if id(t) in kept and _version(t) != kept[id(t)][1]}
        changed = {i for i in moved if not _same_values(kept[i][0], kept[i][2])}
        self._written += [n for n, t in self.tensors() if id(t) in changed and n not in self._written]
        return moved

    def written(self) -> list[str]:
        """The inputs some forward so far wrote into, in place."""
        self._moved()
        return list(self._written)

    def tensors(self) -> list[tuple[str, Any]]:
        """(name, tensor) for every tensor input, nested ones included."""
        out: list[tuple[str, Any]] = []
        for i, a in enumerate(self.args):
            _collect(f"input[{i}]", a, out)
        for k, v in self.kwargs.items():
            _collect(k, v, out)
        return out

    def describe(self) -> list[str]:
        return [f"{name}: {shape_str(t)} {str(t.dtype).replace('torch.', '')}" for name, t in self.tensors()]

    @property
    def batch_size(self) -> int | None:
        """The first tensor's leading size, unless whoever made the inputs said how many samples they are: the list
        of images torchdiag makes for torchvision's detection models (their channels were read as the batch). A list
        the user gives keeps the leading-size rule: it may hold batched feature maps (an FPN head's levels)."""
        if self.samples is not None:
            return self.samples
        ts = self.tensors()
        if ts and getattr(ts[0][1], "is_nested", False):
            return int(ts[0][1].size(0))
        return int(ts[0][1].shape[0]) if ts and ts[0][1].dim() else None

    def refuse_empty(self) -> ModelInputs:
        """These inputs, or a usage error when they hold no sample: the first tensor's leading size is 0 (a forward
        on it reaches a loss or a statistic over nothing, and failed inside torch)."""
        if self.batch_size == 0:
            from ..errors import UsageError
            name, t = self.tensors()[0]
            where = "the inputs" if self.source in ("", "python") else self.source
            raise UsageError(f"{where}: {name} has shape {shape_str(t)}, a batch of 0 samples; "
                             "nothing to run: give at least one")
        return self

    def first(self, k: int) -> ModelInputs | None:
        """The inputs cut to their first k samples; None where a cut cannot be made: a tensor that does not lead with
        the batch, or one of batch × batch (an adjacency). Where whoever made them said the count (torchdiag's list of
        images, with its list of targets), each list of that many is cut (a review: check counted a detection source's
        two images)."""
        if self.samples is not None:
            return self._first_listed(k)
        n, tensors = self.batch_size, [t for _, t in self.tensors()]
        if not n or not tensors or any(
                t.dim() == 0 or t.shape[0] != n or getattr(t, "is_nested", False) or tuple(t.shape) == (n, n)
                for t in tensors):
            return None
        return self.map(lambda t: t[:k])

    def _first_listed(self, k: int) -> ModelInputs | None:
        n = self.samples

        def cut(v):
            return v[:k] if isinstance(v, (list, tuple)) and len(v) == n else v
        args, kwargs = tuple(cut(a) for a in self.args), {key: cut(v) for key, v in self.kwargs.items()}
        if all(a is b for a, b in zip(args, self.args)) and all(kwargs[key] is v for key, v in self.kwargs.items()):
            return None   # no list of the samples among them
        return ModelInputs(args, kwargs, self.source, list(self.notes), self.chosen, samples=min(k, n))

    def map(self, fn) -> ModelInputs:
        return ModelInputs(_map(self.args, fn), _map(self.kwargs, fn), self.source, list(self.notes), self.chosen,
                           samples=self.samples)

    def to(self, device) -> ModelInputs:
        return self.map(lambda t: t.to(device))

    def clone(self) -> ModelInputs:
        return self.map(lambda t: t.detach().clone())


def _same_values(t, first) -> bool:
    """t still holds its first values: same shape and dtype, every element equal, floats bit for bit in what
    matters (the sign of a zero, NaN where NaN was); a layout that cannot be compared counts as changed."""
    import torch

    try:
        if t.shape != first.shape or t.dtype != first.dtype:
            return False
        x = t.detach()
        if not (x.is_floating_point() or x.is_complex()):
            return bool(torch.equal(x, first))
        same = torch.allclose(x, first, rtol=0.0, atol=0.0, equal_nan=True)
        return bool(same) and (x.is_complex() or bool(torch.equal(torch.signbit(x), torch.signbit(first))))
    except Exception:
        return False


def _sharing(tensors: list) -> set[int]:
    """The ids of the tensors that share memory with another tensor of the list (not the same object)."""
    by_storage: dict[int, set[int]] = {}
    for t in tensors:
        try:
            key = t.untyped_storage().data_ptr()
        except Exception:   # no storage (a nested or subclass tensor): alone
            continue
        by_storage.setdefault(key, set()).add(id(t))
    return {i for ids in by_storage.values() if len(ids) > 1 for i in ids}


def _version(t) -> int | None:
    """The tensor's version counter (bumped by every in-place write); None where it has none (an inference tensor)."""
    try:
        return int(t._version)
    except Exception:
        return None


def _collect(name, obj, out):
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((name, obj))
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _collect(f"{name}[{i}]", x, out)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _collect(f"{name}.{k}", x, out)


def _map(obj, fn):
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_map(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def shape_str(t) -> str:
    if getattr(t, "is_nested", False):
        from .tracking import nested_shape

        return nested_shape(t)
    return "x".join(str(d) for d in t.shape) if t.dim() else "scalar"


def default_int_high(model) -> tuple[int, str]:
    """A range that indexes every embedding: the smallest vocabulary in the model. Only the starting
    point: `realistic_inputs` widens it to the embedding that consumes each input."""
    from torch import nn

    sizes = [(m.num_embeddings, n) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    if sizes:
        size, name = min(sizes)
        return size, f"smallest nn.Embedding ({name or 'model'}: {size})"
    return 10, "default"


def make_tensor(spec: InputSpec, device, generator, model=None):
    import torch

    dtype = getattr(torch, spec.dtype)
    if device.type == "meta":
        return torch.empty(spec.shape, dtype=dtype, device="meta"), None
    note = None
    if spec.dtype == "bool":
        t = torch.rand(spec.shape, generator=generator) < 0.5
    elif spec.is_int:
        low, high = spec.low, spec.high
        if high is None:
            high, why = default_int_high(model) if model is not None else (10, "default")
            low = 0
            note = f"integer values in [0, {high}) ({why})"
        t = torch.randint(int(low), int(high), spec.shape, generator=generator, dtype=dtype)
    elif spec.low is not None:
        t = torch.rand(spec.shape, generator=generator) * (spec.high - spec.low) + spec.low
        t = t.to(dtype)
    else:
        t = torch.randn(spec.shape, generator=generator).to(dtype)
    return t.to(device), note


def _normalise(value, what: str) -> tuple[tuple, dict]:
    import torch

    if isinstance(value, dict):
        return (), dict(value)
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    if isinstance(value, torch.Tensor):
        return (value,), {}
    raise UsageError(f"{what} gave a {type(value).__name__}; expected a tensor, a tuple (positional) or a dict (keyword)")


# ---- default inputs that look like real data --------------------------------------------------------
# -i gives shapes and dtypes only. Values: token ids in the range of the embedding that consumes them
# (found by a probe forward that stops as soon as every id input has reached an nn.Embedding), masks
# named like HF `attention_mask` all ones (attend everywhere) and PyTorch `*padding_mask` all False
# (nothing padded), and an encoder-decoder forward (`decoder_input_ids` not given) gets decoder ids.


class _ProbeDone(Exception):
    pass


def forward_parameters(model) -> list:
    """The named parameters of model.forward (no *args/**kwargs), in order; [] if unknown."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def same_data(x, t) -> bool:
    """x is t, a view of t, or t itself reached through a no-op .to()/.long()."""
    seen = 0
    y = x
    while y is not None and seen < 8:
        if y is t:
            return True
        y, seen = getattr(y, "_base", None), seen + 1
    if x.device.type == "meta" or t.device.type == "meta" or x.is_nested or t.is_nested:
        return False
    try:
        return x.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and x.dtype == t.dtype
    except Exception:   # tensor subclasses without storage
        return False


def embedding_consumers(model, inputs: ModelInputs, wanted: list[str], by_value=(),
                        whole: bool = False) -> dict[str, tuple[str, int]]:
    """name of an integer input -> (path, num_embeddings) of the first nn.Embedding/EmbeddingBag it
    reaches. One traceless forward (buffers, written parameters and the RNG restored; lookups guarded on a GPU)
    that stops once every wanted input has been mapped. The names in `by_value` (ids of a distinct random
    pattern) are also found repeated along the batch (_repeated: a video model's text ids, once per frame).
    `whole`: only a lookup of every entry at once counts (one table for all its positions), not of a column; the
    same values in the same shape count too, or shifted by a constant (ids clamped, cast or offset first: the rows
    given are then those the input's own ids can take, the table's less the shift)."""
    import torch
    from torch import nn

    embeddings = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    named = dict(inputs.tensors())
    targets = {k: named[k] for k in wanted if k in named}
    if not targets or not (embeddings or whole):
        return {}
    found: dict[str, tuple[str, int]] = {}

    def hook(mod, args, kwargs):
        x = args[0] if args else kwargs.get("input")
        if isinstance(x, torch.Tensor):
            for key, t in targets.items():
                if key in found:
                    continue
                rows = int(mod.num_embeddings)
                shift = _whole_shift(x, t) if whole else 0 if same_data(x, t) else None
                if shift is not None or (not whole and key in by_value and _repeated(x, t)):
                    found[key] = (path[id(mod)], rows - (shift or 0))
                elif not whole and (fits := _derived_rows(x, t, rows)) is not None:
                    found[key] = (path[id(mod)], fits)
        if len(found) == len(targets):
            raise _ProbeDone

    path = {id(m): n for n, m in embeddings}
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for _, m in embeddings]
    try:
        with _one_hots(targets, found) if whole else contextlib.nullcontext():
            traceless(model, inputs)
    except Exception:   # noqa: BLE001 - _ProbeDone: all mapped; else the real run reports the model's own error
        pass
    finally:
        for h in handles:
            h.remove()
    return {k: _smallest_sibling(model, where, rows) for k, (where, rows) in found.items()}


def _one_hots(targets: dict, found: dict):
    """A function mode that maps an input made one-hot whole (`F.one_hot(ids, V).float() @ table`, a lookup by
    matmul) as an embedding lookup would be: to ("one_hot", V less any shift)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class OneHots(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is F.one_hot and args and isinstance(args[0], torch.Tensor):
                for key, t in targets.items():
                    shift = None if key in found else _whole_shift(args[0], t)
                    if shift is not None:
                        found[key] = ("one_hot", int(out.shape[-1]) - shift)
            return out

    return OneHots()


def _derived_rows(x, t, rows: int) -> int | None:
    """The rows of a table of `rows` that t's own ids can take, where x holds t's values made anew: a copy of its
    first or last positions (x-transformers' next-token inputs, rebuilt by torch.where and cut: their 256 tokens
    were given a position table's 64), t padded (HF Longformer: its ids were given the 2 rows of its token types),
    shifted by a constant, or by one per column into one shared table (FT-
    Transformer's categories: their 27 rows gave column 2, offset by 21, ids up to 30). None: x is not from t."""
    import torch

    if (x.device != t.device or x.dim() != t.dim() or x.dim() == 0 or x.is_floating_point() or t.is_floating_point()
            or x.shape[:-1] != t.shape[:-1] or x.shape[-1] < 2 or x.device.type == "meta"):
        return None
    n = x.shape[-1]
    if n > t.shape[-1]:   # t padded at either end (Longformer pads its ids to a multiple of its attention window)
        return rows if _padded(x.to(torch.int64), t.to(torch.int64)) else None
    if n < t.shape[-1]:   # a window at either end
        return rows if any(torch.equal(x.to(torch.int64), w.to(torch.int64)) for w in (t[..., :n], t[..., -n:])) else None
    shift = _whole_shift(x, t)   # the same shape: one constant shift, or none
    if shift is not None:
        return rows - shift
    columns = (x.to(torch.int64) - t.to(torch.int64)).reshape(-1, n)
    if columns.shape[0] < 2 or not bool((columns == columns[:1]).all()) or int(columns.min()) < 0:
        return None   # one row: any x would be "constant along the batch"
    starts = sorted(set(columns[0].tolist())) + [rows]
    fits = min(b - a for a, b in zip(starts, starts[1:]))
    return fits if fits > 0 else None


def _padded(x, t) -> bool:
    """x is t with one value filled in before or after it, t at least PADDED_MIN long: shorter, a tensor that merely
    starts or ends with t's few values matches by chance (a review: a (1, 1) condition id of 0 and position ids
    from arange, whose table of 64 rows it was then valued in; the model's own table had 2)."""
    import torch

    m = t.shape[-1]
    if m < PADDED_MIN:
        return False
    for kept, rest in ((x[..., :m], x[..., m:]), (x[..., -m:], x[..., :-m])):
        if torch.equal(kept, t) and bool((rest == rest.reshape(-1)[:1]).all()):
            return True
    return False


PADDED_MIN = 8   # positions an id input has at least for a padded copy of it to be recognised (_padded)


def _whole_shift(x, t) -> int | None:
    """x is all of t, looked up at once: 0 for t itself or a view of it with every entry, else the constant c with
    x == t + c in t's shape (ids clamped, cast, or offset past reserved rows before the lookup: `emb(ids + 2)`), or
    None (a column of t, another tensor)."""
    import torch

    if x.numel() != t.numel():
        return None
    if same_data(x, t):
        return 0
    if x.shape != t.shape or x.device != t.device or x.is_floating_point() or t.is_floating_point():
        return None
    d = x.to(torch.int64) - t.to(torch.int64)
    c = d.reshape(-1)[:1]
    return int(c) if d.numel() and bool((d == c).all()) else None


def _smallest_sibling(model, where: str, rows: int) -> tuple[str, int]:
    """An embedding that is one of a container's tables (a ModuleList/ModuleDict of one per categorical column,
    `embs[i](x_cat[:, i])`): the smallest of them, which every column's ids must fit (a sweep: the first table's 11
    rows gave ids up to 10 to a table of 3). The probe stops at the first lookup; the others come after it."""
    from torch import nn

    parent = where.rpartition(".")[0]
    try:
        box = model.get_submodule(parent) if parent else model
    except AttributeError:
        return where, rows
    if not isinstance(box, (nn.ModuleList, nn.ModuleDict)):
        return where, rows
    tables = [(f"{parent}.{n}", int(m.num_embeddings)) for n, m in box.named_children()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    return min(tables, key=lambda t: t[1]) if len(tables) > 1 else (where, rows)


def _repeated(x, t) -> bool:
    """x holds t's values repeated along the first dimension (each row k times in turn, or the whole k times)."""
    import torch

    if x.dtype != t.dtype or x.dim() != t.dim() or x.dim() == 0 or x.shape[1:] != t.shape[1:] or x.device != t.device:
        return False
    k, rest = divmod(x.shape[0], t.shape[0]) if t.shape[0] else (0, 1)
    if k == 0 or rest:
        return False
    return bool(torch.equal(x, t.repeat_interleave(k, 0)) or torch.equal(x, t.repeat(k, *[1] * (t.dim() - 1))))


def realistic_inputs(model, tensors: list, specs: list[InputSpec], notes: list, device, seed: int,
                     keywords: dict | None = None) -> ModelInputs:
    """Inputs of -i specs with values that look like real data (see the comment above). `keywords`: keyword
    tensors that go with them (a source's default layout); integer decoder ids among them get their range."""
    import torch

    params = forward_parameters(model) if model is not None else []
    names = [p.name for p in params]
    label = {i: (names[i] if i < len(names) else f"input[{i}]") for i in range(len(tensors))}
    kwargs: dict[str, Any] = dict(keywords or {})
    out_notes: list[str] = []
    given_ids = kwargs.get("decoder_input_ids")
    if torch.is_tensor(given_ids) and not given_ids.is_floating_point() and given_ids.device.type != "meta":
        # not zeros (a pad id of 0 would make every decoder token padding): ranged again below by its embedding
        kwargs["decoder_input_ids"] = _random_decoder_ids(given_ids, model, seed)
        out_notes.append(f"decoder_input_ids: {shape_str(given_ids)} (the decoder reads token ids)")
    meta = device.type == "meta"
    ids: list[int] = []   # positions whose range is still the safe default
    for i, (t, spec) in enumerate(zip(tensors, specs)):
        name = label[i]
        if spec.low is None and spec.is_int and meta:   # no values on meta, but the decoder ids below count them
            ids.append(i)
        if meta or spec.low is not None:
            continue
        if "attention_mask" in name and spec.dtype != "bool":
            tensors[i] = torch.ones(spec.shape, dtype=t.dtype, device=t.device)
            notes[i] = f"{name}: all ones (attend to every position)"
        elif "padding_mask" in name and spec.dtype == "bool":
            tensors[i] = torch.zeros(spec.shape, dtype=torch.bool, device=t.device)
            notes[i] = f"{name}: all False (nothing padded)"
        elif spec.is_int:
            ids.append(i)
    # an encoder-decoder forward whose decoder ids were not given gets them, shaped like the first ids
    given = set(names[:len(tensors)])
    if "decoder_input_ids" in names and "decoder_input_ids" not in given and "decoder_input_ids" not in kwargs and ids:
        first = tensors[ids[0]]
        if meta:   # shapes only
            kwargs["decoder_input_ids"] = torch.empty(tuple(first.shape), dtype=first.dtype, device="meta")
        else:
            kwargs["decoder_input_ids"] = _random_decoder_ids(first, model, seed)
        out_notes.append(f"decoder_input_ids: {shape_str(first)} added (the model is an encoder-decoder: "
                         "its forward takes decoder_input_ids)")
    made = [] if meta else _zero_keyword_ids(kwargs)
    zeros = {key: kwargs[key] for key in made}
    if model is not None:   # a pattern to be recognised by, where the model copies them (ranged again below)
        kwargs.update(_patterned(zeros, model, seed))
    inputs = ModelInputs(tuple(tensors), kwargs, "--input")
    wanted = [] if meta else [f"input[{i}]" for i in ids] + (["decoder_input_ids"] if "decoder_input_ids" in kwargs else []) + made
    found = embedding_consumers(model, inputs, wanted, made) if wanted and model is not None else {}
    for key in wanted:
        if key not in found:
            if key in zeros:
                kwargs[key] = zeros[key]
            continue
        where, size = found[key]
        if key == "decoder_input_ids" or key in made:
            t = kwargs[key]
            stream = seeds.decoder_ids(seed) if key == "decoder_input_ids" else seeds.keyword_ids(seed, made.index(key))
            kwargs[key] = torch.randint(0, size, tuple(t.shape), generator=torch.Generator().manual_seed(stream),
                                        dtype=t.dtype).to(t.device)
            if key in made:
                out_notes.append(f"{key}: integer values in [0, {size}) (the nn.Embedding that consumes it: {where})")
            else:
                out_notes[-1] += f"; values in [0, {size}) ({where})"
            continue
        i = int(key[6:-1])
        t = tensors[i]
        g = torch.Generator().manual_seed(seeds.embedding_ids(seed, i))
        tensors[i] = torch.randint(0, size, tuple(t.shape), generator=g, dtype=t.dtype).to(t.device)
        notes[i] = f"{label[i]}: integer values in [0, {size}) (the nn.Embedding that consumes it: {where})"
    return ModelInputs(tuple(tensors), kwargs, "--input", [n for n in notes if n] + out_notes)


def _zero_keyword_ids(kwargs: dict) -> list[str]:
    """Keyword token ids a source's default layout made all zeros (hf_inputs: `input_ids` beside a detector's
    pixels), to be given values in the range of the embedding that reads them: ids that are all 0, a padding
    index, leave a text tower nothing to read (Grounding DINO's word embeddings got exactly zero gradient).
    Type ids keep their zeros (one segment, as a tokenizer gives)."""
    import torch

    return [k for k, t in kwargs.items() if k.endswith("_ids") and "type" not in k and k != "decoder_input_ids"
            and torch.is_tensor(t) and not t.is_floating_point() and t.dim() >= 1 and t.numel() > 1
            and not bool(t.any())]


def _patterned(zeros: dict, model, seed: int) -> dict:
    """The all-zero keyword ids, each given random values in [1, the model's smallest vocabulary): values the
    embedding that reads them can be recognised by, also when the model repeats them (once per video frame:
    InstructBLIP-Video's Q-Former ids) and no longer the same tensor."""
    import torch

    high = default_int_high(model)[0]
    if high < 3:
        return {}
    out = {}
    for k, (key, t) in enumerate(zeros.items()):
        g = torch.Generator().manual_seed(seeds.keyword_ids(seed, k))
        out[key] = torch.randint(1, high, tuple(t.shape), generator=g, dtype=t.dtype).to(t.device)
    return out


def _random_decoder_ids(like, model, seed: int):
    """Decoder ids shaped like `like`, in the safe default range (ranged again by the embedding that reads them)."""
    import torch

    g = torch.Generator().manual_seed(seeds.decoder_ids(seed))
    return torch.randint(0, default_int_high(model)[0], tuple(like.shape), generator=g, dtype=like.dtype).to(like.device)


def source_inputs(loaded, device, seed: int = 0, dtype: str | None = None) -> ModelInputs:
    """The default inputs of `torchvision:`/`timm:`/`hf:` models: their -i specs, with the same
    realistic values (token ids in the vocabulary of the embedding that reads them, decoder ids for an
    encoder-decoder). On meta, where no probe runs, an encoder-decoder still gets its decoder ids. Several
    layouts: the first whose forward runs, or, when none does, one with the optional inputs its error names
    added (core.optional_inputs); one: the same, when its forward takes optional inputs it leaves out (one probe
    forward, _with_optional). `dtype`: --dtype, the model already cast to it (core.context.prepare): the probes'
    float inputs are cast as the command's will be."""
    alternatives = tuple(getattr(loaded, "input_alternatives", ()))
    if alternatives:
        inputs = _first_that_runs((tuple(loaded.default_inputs),) + alternatives, loaded, device, seed, dtype)
        return _finish_source(inputs, loaded, device, seed)
    inputs = resolve_inputs(list(loaded.default_inputs), loaded, device, seed)
    _end_with_eos(inputs, loaded.model)
    inputs.source = loaded.input_source
    return _with_optional(_finish_source(inputs, loaded, device, seed), loaded, device, seed, dtype)


def _with_optional(inputs: ModelInputs, loaded, device, seed: int, dtype: str | None) -> ModelInputs:
    """A source's one default layout as the command gets it (`inputs`: labels and all), or, when its forward fails
    for want of optional inputs the error names, that layout with them added (core.optional_inputs.completed,
    breadth first). One traceless probe forward, only for a forward that takes optional inputs the default leaves
    out; none on meta."""
    from . import optional_inputs

    if device.type == "meta" or not optional_inputs.needs_probe(loaded.model, inputs):
        return inputs
    probed = optional_inputs.probe(loaded.model, inputs, dtype)
    if probed.out is None and not probed.names and probed.width is not None:   # the layout as used, labels and all
        wide = _wide_runs(inputs, probed.width, loaded, seed, dtype)
        if wide is None:
            return inputs
        wide.source = inputs.source + f"; {_wide_note(*probed.width)}"
        return wide
    if probed.out is None and not probed.names and _SHAPE_ERROR.search(probed.error or ""):   # candidates per sample?
        return _choices_run(tuple(loaded.default_inputs), loaded, device, seed, dtype) or inputs
    if probed.out is not None:
        return inputs
    specs = tuple(loaded.default_inputs)
    grown = optional_inputs.completed([specs], [probed], loaded, device, seed, dtype)
    return inputs if grown is None else _finish_source(grown, loaded, device, seed)


def _finish_source(inputs: ModelInputs, loaded, device, seed: int = 0) -> ModelInputs:
    """What every default layout gets once chosen: labels from its ids (the model's own loss), decoder ids on meta."""
    import torch

    inputs.chosen = True
    names = [p.name for p in forward_parameters(loaded.model)]
    _head_labels(inputs, loaded, names, seed)
    if getattr(loaded, "labels_from_ids", False) and inputs.args and "labels" in names:
        start = _missing_decoder_start(loaded.model, names)
        _labels_from_ids(inputs, start, loaded.model)
        encoder_decoder = getattr(getattr(loaded.model, "config", None), "is_encoder_decoder", False)
        if getattr(loaded, "trains", False) and start is None and not encoder_decoder:   # a forward: only to train
            _next_if_unshifted(inputs, loaded.model)
    # (not over ids the source's layout gives, and never copied from features: Whisper's 1x80x200 float input became
    # its decoder ids on meta, where the CPU run takes the layout's 1x16 int64: a sweep)
    first = inputs.args[0] if inputs.args else None
    if device.type == "meta" and "labels" not in inputs.kwargs and "decoder_input_ids" in names[len(inputs.args):] \
            and "decoder_input_ids" not in inputs.kwargs and torch.is_tensor(first) \
            and not (first.is_floating_point() or first.is_complex()):
        inputs.kwargs["decoder_input_ids"] = torch.empty(first.shape, dtype=first.dtype, device="meta")
        inputs.notes.append(f"decoder_input_ids: {shape_str(first)} added (the model is an encoder-decoder)")
    return inputs


def _end_with_eos(inputs: ModelInputs, model) -> None:
    """Token ids made up here end with the config's end-of-sequence id, as a tokenizer's do: a text tower pooled
    at its EOS (CLIP-style, GroupViT, CLIPSeg) reads position 0 otherwise, where causal attention sees a single
    key and the query and key projections get exactly zero gradient."""
    import torch

    from . import image_tokens

    config = getattr(model, "config", None)
    eos, vocab = _config_int(config, "eos_token_id"), _config_int(config, "vocab_size")
    if eos is not None and eos == _config_int(config, "pad_token_id"):
        return      # GPT-2 style: EOS doubles as padding; a padded last position is not what a tokenizer gives
    if eos is not None and eos == image_tokens.token_of(config):
        return      # the placeholder of an image: one more would ask for a feature nobody gives
    ids = inputs.args[0] if inputs.args else None
    if eos is None or vocab is None or not 0 <= eos < vocab or not torch.is_tensor(ids) or ids.dim() != 2 \
            or ids.dtype not in (torch.int64, torch.int32) or ids.device.type == "meta" or ids.shape[1] < 2:
        return
    ids = ids.clone()
    body = ids[:, :-1]   # no eos inside either: a classifier pooled at its EOS (BART's, T5's) refuses rows with
    body[body == eos] = _plain_id(config, eos, vocab)   # different counts of it
    ids[:, -1] = eos
    inputs.args = (ids,) + tuple(inputs.args[1:])
    inputs.notes.append(f"input[0]: each sequence ends with eos_token_id {eos} and has it nowhere else, as a tokenizer "
                        "ends them")


def _plain_id(config, eos: int, vocab: int) -> int:
    """The first id after `eos` (cyclically in the vocabulary) that no `*token*` entry of the config or of its
    sub-configs names (image, video, pad, bos, sep placeholders: eos + 1 was a review's LLaVA image placeholder, and
    its image layout was lost)."""
    special: set[int] = set()
    for c in [config] + [v for v in vars(config).values() if hasattr(v, "to_dict")]:
        for key, value in vars(c).items():
            values = value if isinstance(value, (list, tuple)) else [value]
            if "token" in key:
                special |= {v for v in values if type(v) is int}
    return next(((eos + k) % vocab for k in range(1, min(vocab, 4096)) if (eos + k) % vocab not in special),
                (eos + 1) % vocab)


def _config_int(config, key: str) -> int | None:
    """An int the config names (the first of a list), else its text sub-config's."""
    for c in (config, getattr(config, "text_config", None)):
        value = getattr(c, key, None) if c is not None else None
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if type(value) is int:
            return value
    return None


def spec_inputs(specs: tuple[str, ...], loaded, device, seed: int) -> ModelInputs:
    """A source's specs: positional `SHAPE:DTYPE` as -i gives them, keyword `name=SHAPE:DTYPE[~fill]` (hf_inputs)."""
    import torch

    from . import hf_inputs, image_tokens

    token = next((int(s.rsplit(":", 1)[1]) for s in specs if s.startswith(image_tokens.SPEC + "=")), None)
    specs = tuple(s for s in specs if not s.startswith(image_tokens.SPEC + "="))
    positional = [s for s in specs if "=" not in s]
    gen = torch.Generator().manual_seed(seed)
    keywords = {hf_inputs.split(s)[0]: hf_inputs.make(s, device, gen) for s in specs if "=" in s}
    # the keyword inputs go into the probe that finds which embedding reads the ids (a dual tower's ids are
    # read only when its pixel_values are there too)
    if not positional:
        return ModelInputs((), keywords)
    inputs = resolve_inputs(positional, loaded, device, seed, keywords=keywords)
    if token is not None:   # a vision-language model's ids hold its image's placeholder tokens
        image_tokens.rebuild(inputs, loaded.model, token)
    _end_with_eos(inputs, loaded.model)     # before any probe: the ids probed are the ids used
    return inputs


def runs(model, inputs: ModelInputs, stop: type[Exception] | None = None) -> bool:
    """One forward under no_grad that leaves no trace (RNG forked, buffers restored): does it run? (`stop`: an
    exception a hook raises to end it early, counted as running.)"""
    try:
        traceless(model, inputs)
        return True
    except Exception as exc:   # noqa: BLE001 - any failure means: not this layout
        return stop is not None and isinstance(exc, stop)


def traceless(model, inputs: ModelInputs):
    """The output of one forward under no_grad that leaves no trace on the model's tensors (no_trace). Python
    attributes it changes (a cache) stay changed."""
    import torch

    with no_trace(model), torch.no_grad():
        return inputs.call(model)


@contextlib.contextmanager
def no_trace(model):
    """Forwards (and backwards) inside leave no trace on the model's tensors: RNG forked, buffers restored,
    parameters they write in place copied before the write and restored (a codebook's EMA under no_grad)."""
    import torch

    from .index_guard import guarded
    from .param_writes import restored_writes

    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    devices = sorted({t.device.index or 0 for t in saved.values() if t.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices), restored_writes(model), guarded(model):
            yield
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in saved and b.shape == saved[n].shape:
                    b.copy_(saved[n])


def blank_rank(out) -> int:
    """0: an output that says something; 1: every floating tensor all zeros; 2: a NaN in one (a fully masked
    softmax; -inf stays informative: masked logits are a model's own). Sparse, fp8 or other tensors the checks
    cannot read count as informative."""
    from .reach import floats

    if isinstance(out, dict) and "loss" in out:   # a model's own loss is log(classes) on zero logits: not said
        out = {k: v for k, v in out.items() if k != "loss"}
    tensors = [t for t in floats(out) if t.device.type != "meta" and t.numel()]
    try:
        if any(bool(t.isnan().any()) for t in tensors):
            return 2
        return int(bool(tensors) and all(not bool(t.any()) for t in tensors))
    except (NotImplementedError, RuntimeError, TypeError):
        return 0


def _first_that_runs(sets, loaded, device, seed: int, dtype: str | None = None) -> ModelInputs:
    """The first of a source's candidate inputs whose forward runs on the built model; when none does, one with
    the optional inputs its error names added (core.optional_inputs.completed), else the one that went furthest
    into it (the most module calls before it failed: its error is the model's own, past the input layout, and
    the real run then reports it with its module). `dtype`: --dtype, for the probes' float inputs."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    from . import error_sizes, optional_inputs

    calls = [0]

    def count(module, args):
        calls[0] += 1

    chosen, k, reached, blank, named, first_try = None, -1, [], None, [], ""
    optional_inputs.OUT_OF_MEMORY.clear()
    handle = register_module_forward_pre_hook(count)
    try:
        for i, specs in enumerate(sets):
            inputs = spec_inputs(specs, loaded, device, seed)
            calls[0] = 0
            # what its error names, if it fails; the forward as the command calls it, its labels included
            probed = optional_inputs.probe(loaded.model, with_labels(inputs, loaded), dtype)
            out = probed.out
            named.append(probed)
            if i == 0 and out is None:   # what the first layout was and why it did not run (a new user: "the first 1
                # did not run" said neither, beside a header's length 64 and an input of 62)
                first_try = (", ".join(f"{n} {shape_str(t)}" for n, t in inputs.tensors()[:3])
                             + (f": {probed.error.strip().splitlines()[0][:120]}" if probed.error.strip() else ""))
            rank = None if out is None else blank_rank(out)
            if rank:   # ran, and gave nothing (a mask hiding the whole input: Gemma3n's audio_mel_mask, True =
                # padding) or NaN (a fully masked softmax): a last resort, all zeros before NaN
                blank = blank if blank is not None and blank[2] <= rank else (inputs, i, rank)
            elif out is not None:
                chosen, k = inputs, i
                break
            reached.append(calls[0])
    finally:
        handle.remove()
    if chosen is None and blank is not None:
        chosen, k, rank = blank
        what = "all zeros" if rank == 1 else "NaN"
        chosen.source = loaded.input_source + (f"; layout {k + 1} of {len(sets)}: the only ones that ran gave an "
                                               f"output of {what}")
        return chosen
    # the first running is the usual case: said only when the probe had to go further
    if chosen is not None:
        how = "did not run or gave all zeros or NaN" if blank else "did not run"
        chosen.source = loaded.input_source + (f"; layout {k + 1} of {len(sets)} (the first {k} {how}"
                                               + (f"; the first, {first_try}" if first_try else "") + ")" if k else "")
        return chosen
    labelled = lambda i: with_labels(i, loaded)   # noqa: E731 - every probe as the command will call the model
    furthest: list = []
    grown = optional_inputs.completed(sets, named, loaded, device, seed, dtype, labelled, furthest) \
        if any(p.names for p in named) else None
    if grown is not None:
        return grown
    wide = _widened(sets, named, loaded, device, seed, dtype)
    if wide is not None:
        return wide
    choices = _choices_run(sets[0], loaded, device, seed, dtype) if _SHAPE_ERROR.search(named[0].error or "") else None
    if choices is not None:
        return choices
    blank_only: list = []   # a resized layout that ran but gave nothing: after every other way (Voxtral's grown one)
    asked = error_sizes.resized(sets, named, loaded, device, seed, dtype, blank_only) \
        or _resized_grown(furthest, loaded, device, seed, dtype)
    if asked is not None or blank_only:
        return asked if asked is not None else blank_only[0]
    single = _one_sample(sets[0], named[0], loaded, device, seed, dtype)
    if single is not None:
        return single
    k = max(range(len(reached)), key=lambda i: (reached[i], -i))
    if optional_inputs.OUT_OF_MEMORY:   # the error of a layout that did not fit, not the wrong layouts' (hf tvp)
        _none_fit(optional_inputs.OUT_OF_MEMORY, named[k], k, len(sets))
    chosen = spec_inputs(sets[k], loaded, device, seed)
    chosen.source = loaded.input_source + (f"; none of {len(sets)} layouts ran: layout {k + 1}, which went furthest "
                                           f"into the model ({reached[k]} module calls before it failed), is used")
    return chosen


def _one_sample(specs, first, loaded, device, seed: int, dtype: str | None) -> ModelInputs | None:
    """The first layout at batch 1, where the default batch a train-mode command raised it to (sources.for_training)
    made every layout fail and one sample runs: a model that refuses batches (a sweep: GPT-NeoX's sequence classifier
    with no pad_token_id, "Cannot handle batch sizes > 1", exit 3 at defaults). Said, with the model's own words."""
    from . import optional_inputs

    one = tuple(_LEADING.sub(r"\g<1>1x", s) for s in specs)
    if not getattr(loaded, "trains", False) or one == tuple(specs):
        return None
    inputs = spec_inputs(one, loaded, device, seed)
    probed = optional_inputs.probe(loaded.model, with_labels(inputs, loaded), dtype)
    if probed.out is None or blank_rank(probed.out):
        return None
    import torch

    twice = inputs.map(lambda t: torch.cat([t, t]) if t.dim() and t.shape[0] == 1 else t)
    if optional_inputs.probe(loaded.model, with_labels(twice, loaded), dtype).out is not None:
        return None   # that sample twice runs: the batch was not the cause, the values were (a review: an id the model
        # has no entry for, drawn at batch 2 and not at 1)
    why = first.error.strip().splitlines()[0][:120] if first.error.strip() else "it raised"
    inputs.source = loaded.input_source + f"; batch 1: the model refused the default batch ({why}), one sample runs"
    return inputs


_LEADING = re.compile(r"^((?:\w+=)?)\d+x")   # a -i spec's batch: its name, if any, and its first size
CHOICES = 2   # candidates per sample in a multiple-choice layout (batch x choices x length)
_SHAPE_ERROR = re.compile(r"\bshape\b|\bsize\b", re.IGNORECASE)   # a view or reshape that refused the layout
_FLAT_IDS = re.compile(r"^(?:(\w+)=)?(\d+)x(\d+):((?:int|uint|bool)\w*)(.*)$")


def _with_choices(specs: tuple[str, ...]) -> tuple[str, ...] | None:
    """The layout with every 2-D integer input (batch x length: ids, their mask, their types) given CHOICES
    candidates after the batch, as a multiple-choice head reads them (transformers' *ForMultipleChoice flattens
    (batch, choices, length) and views its logits as (-1, choices): 2-D ids made 128 choices and the view failed);
    None when no input is such."""
    out, changed = [], False
    for s in specs:
        m = _FLAT_IDS.match(s)
        if m is None:
            out.append(s)
            continue
        name, batch, length, dtype, rest = m.groups()
        out.append(f"{name + '=' if name else ''}{batch}x{CHOICES}x{length}:{dtype}{rest}")
        changed = True
    return tuple(out) if changed else None


def _choices_run(specs: tuple[str, ...], loaded, device, seed: int, dtype: str | None) -> ModelInputs | None:
    """`specs` with candidates per sample (_with_choices), when one probe forward of them runs and gives an output
    that says something; else None. Asked only once the layout as given failed on a shape or size, with no input or
    width named (a model's own bug elsewhere costs no probe)."""
    from . import optional_inputs

    choices = _with_choices(specs)
    if choices is None:
        return None
    try:
        inputs = _finish_source(spec_inputs(choices, loaded, device, seed), loaded, device, seed)
    except Exception:   # noqa: BLE001 - a variant that cannot be made is one that does not run
        return None
    probed = optional_inputs.probe(loaded.model, inputs, dtype)
    if probed.out is None or blank_rank(probed.out):
        return None
    inputs.source = loaded.input_source + f"; ids as batch x {CHOICES} choices x length (the layout as given did not run)"
    return inputs


def _none_fit(oom: list[str], furthest, k: int, n: int) -> None:
    """No default layout ran, and some ran out of memory: that is the error (exit 3), said with the furthest
    layout's own, not the model's error on a layout it does not take (a video model given token ids alone)."""
    from ..errors import ModelError

    said = " ".join(furthest.error.split())[:300] or "no message"
    raise ModelError(f"no default input layout ran on this machine: {len(oom)} probe forward(s) ran out of memory "
                     f"({oom[0]}); of the {n} first layouts, the one that went furthest into the model (layout "
                     f"{k + 1}) failed with: {said}",
                     hint="give the model's inputs with -i (a smaller image, fewer frames, a batch of 1) or run it "
                          "where there is more memory")


GROWN_RESIZED = 3   # layouts grown with optional inputs given the sizes their errors ask for, furthest first


def _resized_grown(furthest: list, loaded, device, seed: int, dtype: str | None) -> ModelInputs | None:
    """The sizes a layout's error asks for (core.error_sizes), on the layouts that got optional inputs added and
    then failed further in (optional_inputs.completed's `furthest`): an added input can fix the layout but for a
    size that must agree with it (Voxtral Realtime: 128 feature frames make 16 audio tokens, added to 16 token ids)."""
    from . import error_sizes

    # furthest first; of those as far, one whose error asks for a size (Kosmos-2's mask shaped as the ids, beside
    # one shaped as the pixels that failed at the same module)
    best = sorted(furthest, key=lambda t: (-t[1].calls, not error_sizes.asked(t[1].error, error_sizes.sizes_of(t[0]))))
    best = best[:GROWN_RESIZED]
    if not best:
        return None
    asked = error_sizes.resized([s for s, _ in best], [p for _, p in best], loaded, device, seed, dtype)
    if asked is not None:
        asked.source += " (a layout given the optional inputs its errors named: the forward failed without them)"
    return asked


def with_labels(inputs: ModelInputs, loaded) -> ModelInputs:
    """A copy of a candidate layout with the labels _finish_source will give it, for its probe: a forward that runs
    without them can fail in its own loss (GIT's drops its image tokens' logits first, and ids alone leave none to
    compare with the labels). The layout itself when no labels are given."""
    names = [p.name for p in forward_parameters(loaded.model)]
    head = getattr(loaded, "head_labels", None) is not None
    if not ((getattr(loaded, "labels_from_ids", False) or head) and inputs.args and "labels" in names):
        return inputs
    probe = ModelInputs(tuple(inputs.args), dict(inputs.kwargs), inputs.source, list(inputs.notes))
    if head:
        _head_labels(probe, loaded, names)
    else:
        _labels_from_ids(probe, _missing_decoder_start(loaded.model, names), loaded.model)
    return probe


def _head_labels(inputs: ModelInputs, loaded, names: list[str], seed: int = 0) -> None:
    """Random labels for a classification head that computes its own loss from them (sources._head_labels): a class
    per token of the ids, or a 0/1 target per label per sample; seeded, drawn on the CPU. Nothing where the head
    is not one, the forward takes no labels, or the ids are no (N, T) tensor."""
    import torch

    head = getattr(loaded, "head_labels", None)
    ids = inputs.args[0] if inputs.args else None
    if head is None or "labels" not in names or "labels" in inputs.kwargs or not torch.is_tensor(ids) \
            or ids.dim() != 2 or ids.device.type == "meta":
        return
    kind, classes = head
    g = torch.Generator().manual_seed(seeds.head_labels(seed))
    if kind == "token":
        labels = torch.randint(0, classes, tuple(ids.shape), generator=g)
        said = f"labels: a random class in [0, {classes}) per token (the model's own loss, a cross-entropy per token)"
    elif kind == "regression":
        labels = torch.randn(ids.shape[0], classes, generator=g)
        said = (f"labels: {'a random normal value' if classes == 1 else f'{classes} random normal values'} per sample "
                "(the model's own loss: a regression, mean-squared error)")
    else:
        labels = torch.randint(0, 2, (ids.shape[0], classes), generator=g).float()
        said = (f"labels: a random 0/1 per label, {classes} labels (the model's own loss: problem_type "
                "multi_label_classification, a binary cross-entropy per label)")
    inputs.kwargs["labels"] = labels.to(ids.device)
    inputs.notes.append(said)


def _widened(sets, probes, loaded, device, seed: int, dtype: str | None) -> ModelInputs | None:
    """The first layout whose probe failed in an nn.Linear that refused the width of an input it was handed,
    tried again with that width (core.input_width), when that runs; else None. One probe per such layout."""
    for i, p in enumerate(probes):
        wide = _wide_runs(spec_inputs(sets[i], loaded, device, seed), p.width, loaded, seed, dtype, labelled=True) \
            if p.width else None
        if wide is not None:
            wide.source = loaded.input_source + f"; layout {i + 1} of {len(sets)}, {_wide_note(*p.width)}"
            return wide
    return None


def _wide_runs(inputs: ModelInputs, width: tuple, loaded, seed: int, dtype: str | None,
               labelled: bool = False) -> ModelInputs | None:
    """`inputs` with the input a Linear refused at its width ((name, width): core.input_width), when one probe
    forward of them runs and gives an output that says something; else None. `labelled`: probed with the labels the
    command will add (a candidate layout; a chosen one already has them)."""
    from . import input_width, optional_inputs

    wide = input_width.widened(inputs, *width, seed)
    again = optional_inputs.probe(loaded.model, with_labels(wide, loaded) if labelled else wide, dtype)
    return wide if again.out is not None and not blank_rank(again.out) else None


def _wide_note(name: str, width: int) -> str:
    return f"{name} {width} wide: the width of the linear layer that reads it (a width from the config did not run)"


def _missing_decoder_start(model, names: list[str]) -> int | None:
    """An encoder-decoder whose config sets no decoder_start_token_id cannot shift its labels right itself
    (T5Config leaves it unset; a saved T5 checkpoint's config has it): the pad id it falls back to, by
    T5's convention (decoder start = pad), or None when the model can shift them itself."""
    config = getattr(model, "config", None)
    if "decoder_input_ids" not in names or not getattr(config, "is_encoder_decoder", False):
        return None
    if getattr(config, "decoder_start_token_id", None) is not None:
        return None
    pad = getattr(config, "pad_token_id", None)
    return pad if isinstance(pad, int) else None


def _placeholder(model) -> int | None:
    """A vision-language model's image placeholder id (its config's), else None."""
    from .image_tokens import token_of

    config = getattr(model, "config", None)
    return token_of(config) if config is not None else None


def without_labels(inputs: ModelInputs, model) -> ModelInputs:
    """A source's default inputs (chosen) without the labels given so that the model computes its own loss, for a
    forward that computes none (a sweep: GPT-2's inference memory and time held its LM loss over a 50k vocabulary,
    +65% peak, +38% time). An encoder-decoder that made its decoder ids from them gets those ids (the labels shifted
    right from decoder_start_token_id, else pad_token_id, as transformers' models shift them). The user's own inputs,
    and inputs without labels, are returned as they are."""
    import dataclasses

    import torch

    labels = inputs.kwargs.get("labels")
    if not inputs.chosen or not torch.is_tensor(labels):
        return inputs
    kwargs = {k: v for k, v in inputs.kwargs.items() if k != "labels"}
    config = getattr(model, "config", None)
    note = "labels: dropped (inference computes no loss)"
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" not in kwargs and labels.dim() >= 1:
        start, pad = _config_int(config, "decoder_start_token_id"), _config_int(config, "pad_token_id")
        start = pad if start is None else start
        if start is None:   # the decoder would have no ids: the labels stay
            return inputs
        shifted = labels.new_full(labels.shape, start)
        shifted[..., 1:] = labels[..., :-1].masked_fill(labels[..., :-1] == -100, pad or 0)   # (-100: pad, as theirs)
        kwargs["decoder_input_ids"] = shifted
        note += f"; decoder_input_ids: the labels shifted right from {start}, as the model makes them from labels"
    notes = [n for n in inputs.notes if not n.startswith("labels:")] + [note]
    source = re.sub(r"; labels = [^;]*", "", inputs.source)   # (the source said what training commands get)
    return dataclasses.replace(inputs, kwargs=kwargs, notes=notes, source=source, _written=[], _kept=None)


def _labels_from_ids(inputs, start: int | None = None, model=None) -> None:
    """An LM head's own loss on labels = the input ids: a causal LM shifts them itself; an encoder-decoder
    makes its decoder inputs from them (shifted right), so random decoder ids are not given as well.
    `start`: the config names no decoder start, so the decoder ids are the labels shifted right here.
    With `model`: beside an image, its placeholder positions are not predicted (-100 in a causal LM's labels; an
    encoder-decoder's target is the text ids alone), and ids the output layer has no class for are -100."""
    ids = inputs.args[0]
    labels, said = _vlm_labels(inputs, ids, model) if model is not None else (ids, "the input ids")
    inputs.kwargs["labels"] = labels
    if start is not None:
        shifted = labels.new_full(labels.shape, start)
        shifted[..., 1:] = labels[..., :-1].clamp_min(0)   # no -100 in the decoder's ids
        inputs.kwargs["decoder_input_ids"] = shifted
        inputs.notes = [n for n in inputs.notes if not n.startswith("decoder_input_ids")]
        inputs.notes.append(f"labels: {said}; decoder_input_ids: the labels shifted right, starting with "
                            f"pad_token_id {start} (config.json sets no decoder_start_token_id)")
    elif inputs.kwargs.pop("decoder_input_ids", None) is not None:
        inputs.notes = [n for n in inputs.notes if not n.startswith("decoder_input_ids")]
        inputs.notes.append(f"labels: {said}; decoder_input_ids: the model's own (labels shifted right)")
    else:
        inputs.notes.append(f"labels: {said} (the model's own loss)")


def _next_if_unshifted(inputs, model) -> None:
    """A causal-LM head that does not shift its labels (XLNet's predicts the token at each position), given
    labels = the input ids, is set a copy task that tied embeddings solve at initialisation (every gradient
    ~60x smaller than on a real target). Told by behaviour: one forward, the model's own loss against the
    cross-entropy of its logits with the labels as they are and shifted by one; when it is clearly the first
    (SHIFT_CLEAR), the labels become the next id at each position (-100 at the last)."""
    import torch
    import torch.nn.functional as F

    from .index_guard import guarded

    labels = inputs.kwargs.get("labels")
    if not torch.is_tensor(labels) or labels.device.type == "meta" or labels.dim() != 2 or labels.shape[1] < 3:
        return
    try:
        out = traceless(model, inputs)
    except Exception:   # noqa: BLE001 - the real run reports a failing forward with its module
        return
    loss, logits = getattr(out, "loss", None), getattr(out, "logits", None)
    if not (torch.is_tensor(loss) and loss.numel() == 1 and torch.is_tensor(logits) and logits.dim() == 3
            and logits.shape[:2] == labels.shape):
        return
    flat, targets = logits.detach().float(), labels.to(logits.device, torch.long)   # a user's int32 ids
    try:
        with guarded(model):   # on a GPU an id without a class would assert on the device
            same = F.cross_entropy(flat.flatten(0, 1), targets.flatten(), ignore_index=-100)
            shifted = F.cross_entropy(flat[:, :-1].flatten(0, 1), targets[:, 1:].flatten(), ignore_index=-100)
    except (IndexError, RuntimeError):   # ids the logits have no class for: not a reading of the labels to test
        return
    own = loss.detach().float().reshape(()).to(logits.device)
    if not bool(SHIFT_CLEAR * (own - same).abs() < (own - shifted).abs()):
        return
    following = labels.new_full(labels.shape, -100)
    following[:, :-1] = labels[:, 1:]
    inputs.kwargs["labels"] = following
    from .sources import LABELS_FROM_IDS

    inputs.source = inputs.source.replace(LABELS_FROM_IDS, "labels = the next input ids")
    inputs.notes = [n for n in inputs.notes if not n.startswith("labels:")]
    inputs.notes.append(f"labels: the next input id at each position, -100 at the last (the model's loss does not "
                        f"shift its labels: its loss on the input ids, {float(own):.4g}, is the cross-entropy of its "
                        f"logits against them unshifted, {float(same):.4g}, not shifted by one, {float(shifted):.4g}; "
                        "the ids themselves would set it a copy task)")


def _vlm_labels(inputs, ids, model):
    """(labels, how the note says them) for a model that may read an image beside its ids (see _labels_from_ids)."""
    if ids.device.type == "meta":
        return ids, "the input ids"
    labels, said = ids, "the input ids"
    placeholder = _placeholder(model)
    imaged = any(k.startswith("pixel_values") for k in inputs.kwargs)
    hidden = ids == placeholder if placeholder is not None and imaged else None
    if hidden is not None and bool(hidden.any()):
        counts = hidden.sum(-1)
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False) and bool((counts == counts[0]).all()):
            labels = ids[~hidden].reshape(ids.shape[0], -1)   # the decoder writes the text, not the image
            said = f"the text ids of the input (its image placeholders, id {placeholder}, left out)"
        else:
            labels = ids.masked_fill(hidden, -100)
            said = f"the input ids, its image placeholders (id {placeholder}) -100: not predicted"
    classes = _output_classes(model)
    if classes is not None and bool((labels >= classes).any()):   # ids the embedding has and the head has not
        labels = labels.masked_fill(labels >= classes, -100)
        said += f"; ids ≥ {classes} (no class of the output layer) -100"
    if labels.shape[-1] < 2 or not bool((labels[..., 1:] != -100).any()):   # nothing left to predict: a loss of NaN
        return ids, "the input ids, all of them (masking would leave nothing to predict)"
    return labels, said


def _output_classes(model) -> int | None:
    """How many classes an LM head predicts (its output embedding's rows), or None."""
    try:
        head = model.get_output_embeddings()
    except Exception:
        return None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else None


def resolve_inputs(specs: list[str] | None, loaded, device, seed: int = 0, keywords: dict | None = None,
                   dtype: str | None = None) -> ModelInputs:
    """First that applies: -i specs, example_inputs() in the module, model.example_input_array. `keywords`:
    keyword tensors given beside the specs (a source's default layout), in the probe and in the result. `dtype`:
    the run's --dtype, for a source's probe forwards (source_inputs)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if specs:
        parsed = [parse_input_spec(s) for s in specs]
        tensors, notes = [], []
        for text, p in zip(specs, parsed):
            nbytes = math.prod(p.shape) * torch.empty((), dtype=getattr(torch, p.dtype)).element_size()
            if device.type != "meta" and nbytes > memory_limit():
                raise UsageError(f"input '{text}' would take {nbytes / 2**30:.1f} GiB",
                                 hint="use a smaller shape, or --device meta to count without allocating")
            try:
                t, note = make_tensor(p, device, gen, loaded.model)
            except (RuntimeError, MemoryError) as exc:
                raise UsageError(f"cannot allocate input '{text}': {one_line(exc)}") from exc
            tensors.append(t)
            notes.append(note)
        return realistic_inputs(loaded.model, tensors, parsed, notes, device, seed, keywords)
    fn = getattr(loaded.module, "example_inputs", None)
    if callable(fn):
        from .train import user_call

        value = user_call(seed, fn, "example_inputs()")
        args, kwargs = _normalise(value, "example_inputs()")
        chosen = getattr(fn, "chosen", False) is True   # torchdiag's own default (a detection model's images)
        label = (getattr(loaded, "input_source", None) or "example_inputs()") if chosen else "example_inputs()"
        return ModelInputs(args, kwargs, label, chosen=chosen, samples=getattr(fn, "samples", None)).to(device)
    if getattr(loaded, "default_inputs", ()):
        return source_inputs(loaded, device, seed, dtype)
    value = getattr(loaded.model, "example_input_array", None)
    if value is not None:
        args, kwargs = _normalise(value, "example_input_array")
        return ModelInputs(args, kwargs, "example_input_array").to(device)
    raise UsageError("no inputs for the model", hint="give them one of three ways: " + INPUT_WAYS)
