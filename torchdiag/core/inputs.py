"""Model inputs: `-i SHAPE[:DTYPE[RANGE]]`, else `example_inputs()`, else `example_input_array`."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError, UsageError, one_line

INPUT_WAYS = ("-i/--input SHAPE[:DTYPE] (e.g. -i 8x3x32x32 or -i 2x128:int64[0,30000)), "
              "an example_inputs() function in the model's module, "
              "or an example_input_array attribute on the model")

DTYPES = {
    "float32": "float32", "float": "float32", "f32": "float32", "fp32": "float32",
    "float64": "float64", "double": "float64", "f64": "float64",
    "float16": "float16", "half": "float16", "f16": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}
_SPEC = re.compile(r"^(?P<shape>[^:]+)(?::(?P<dtype>[a-z0-9]+)(?P<range>[\[(].*)?)?$")
MAX_INPUT_BYTES = 16 * 2**30  # a random input larger than this is a typo, not a test batch
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
    if not m:
        raise UsageError(f"bad input '{text}'", hint="write SHAPE[:DTYPE], e.g. 8x3x32x32 or 2x128:int64[0,30000)")
    dims = m.group("shape").split("x")
    try:
        shape = tuple(int(d) for d in dims)
    except ValueError:
        raise UsageError(f"bad input shape '{m.group('shape')}' in '{text}'",
                         hint="dimensions are positive integers joined by 'x', e.g. 8x3x32x32") from None
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

    def call(self, model):
        return model(*self.args, **self.kwargs)

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
        ts = self.tensors()
        return int(ts[0][1].shape[0]) if ts and ts[0][1].dim() else None

    def map(self, fn) -> "ModelInputs":
        return ModelInputs(_map(self.args, fn), _map(self.kwargs, fn), self.source, list(self.notes))

    def to(self, device) -> "ModelInputs":
        return self.map(lambda t: t.to(device))

    def clone(self) -> "ModelInputs":
        return self.map(lambda t: t.detach().clone())


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
    return "x".join(str(d) for d in t.shape) if t.dim() else "scalar"


def default_int_high(model) -> tuple[int, str]:
    """Token ids must index every embedding: use the smallest vocabulary in the model."""
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


def resolve_inputs(specs: list[str] | None, loaded, device, seed: int = 0) -> ModelInputs:
    """First that applies: -i specs, example_inputs() in the module, model.example_input_array."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if specs:
        parsed = [parse_input_spec(s) for s in specs]
        tensors, notes = [], []
        for text, p in zip(specs, parsed):
            nbytes = math.prod(p.shape) * torch.empty((), dtype=getattr(torch, p.dtype)).element_size()
            if device.type != "meta" and nbytes > MAX_INPUT_BYTES:
                raise UsageError(f"input '{text}' would take {nbytes / 2**30:.1f} GiB",
                                 hint="use a smaller shape, or --device meta to count without allocating")
            try:
                t, note = make_tensor(p, device, gen, loaded.model)
            except (RuntimeError, MemoryError) as exc:
                raise UsageError(f"cannot allocate input '{text}': {one_line(exc)}") from exc
            tensors.append(t)
            if note:
                notes.append(note)
        return ModelInputs(tuple(tensors), {}, "--input", notes)
    fn = getattr(loaded.module, "example_inputs", None)
    if callable(fn):
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            value = fn()
        except Exception as exc:
            raise ModelError(f"example_inputs() raised {one_line(exc)}") from exc
        finally:
            torch.random.set_rng_state(state)
        args, kwargs = _normalise(value, "example_inputs()")
        return ModelInputs(args, kwargs, "example_inputs()").to(device)
    value = getattr(loaded.model, "example_input_array", None)
    if value is not None:
        args, kwargs = _normalise(value, "example_input_array")
        return ModelInputs(args, kwargs, "example_input_array").to(device)
    raise UsageError("no inputs for the model", hint="give them one of three ways: " + INPUT_WAYS)
