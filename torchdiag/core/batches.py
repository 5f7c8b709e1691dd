"""Batches as data loaders give them: a tensor, a tuple/list (inputs, target, ...), a dict, a namedtuple,
nested — flattened into named fields, with the input and the target found the way the rest of torchdiag
finds them (core.loss: `(inputs, target)` tuples; dict keys like "labels"/"label"/"target"/"y"), or
named by the caller (`--input-field`, `--target-field`).

Field names: `batch` for a lone tensor, `[0]`, `[1]` for tuple positions, the key for a dict
(`image`, `label`), nested joined (`[0].pixels`). numpy arrays are read as tensors; other leaves
(strings, file names) are left out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

TARGET_KEYS = ("labels", "label", "targets", "target", "y", "class", "classes")
INPUT_KEYS = ("input", "inputs", "x", "image", "images", "img", "pixel_values", "input_ids", "data", "features")


def flatten(batch, prefix: str = "") -> list[tuple[str, Any]]:
    """(name, tensor) for every tensor (or numpy array, read as a tensor) in a batch, in order."""
    import torch

    out: list[tuple[str, Any]] = []
    _flatten(batch, prefix, out, torch)
    return out


def _flatten(obj, name, out, torch) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((name or "batch", obj))
    elif type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and getattr(obj, "ndim", 0) > 0 \
            and obj.dtype.kind in "biuf":
        out.append((name or "batch", torch.as_tensor(obj)))
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "items") and not isinstance(obj, str)):
        for k, v in obj.items():
            _flatten(v, f"{name}.{k}" if name else str(k), out, torch)
    elif isinstance(obj, (tuple, list)):
        names = getattr(obj, "_fields", None)
        for i, v in enumerate(obj):
            key = names[i] if names else f"[{i}]"
            _flatten(v, (f"{name}.{key}" if names else f"{name}{key}") if name else key, out, torch)


@dataclass
class Roles:
    """Which fields are the model's input and which the target, and how that was decided."""

    inputs: list[str]
    target: str | None
    how: str
    structure: str                  # tensor | tuple | dict
    names: list[str] = field(default_factory=list)

    def describe(self) -> str:
        target = self.target if self.target is not None else "none"
        return f"input {', '.join(self.inputs) or 'none'}, target {target} ({self.how})"


def structure(batch) -> str:
    import torch

    if isinstance(batch, torch.Tensor):
        return "tensor"
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        return "dict"
    return "tuple"


def find_roles(batch, input_field: str | None = None, target_field: str | None = None,
               option=lambda name: name, positional: int = 1) -> Roles:
    """The input and target fields of a batch: named ones first, else the conventions above. `positional`: the
    inputs the model's forward requires (model_inputs): a tuple of more fields than that is (inputs…, target), as
    TensorDataset(x_cat, x_num, y) makes it (a sweep: x_num was read as the target, and the model refused one input)."""
    names = [n for n, _ in flatten(batch)]
    kind = structure(batch)
    if not names:
        kind = type(batch).__name__
        raise UsageError(f"a batch holds no tensors (it is {'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind})",
                         hint="batches must be tensors, or tuples/lists/dicts of tensors (numpy arrays are read too)")
    for given, opt in ((input_field, "input_field"), (target_field, "target_field")):
        if given is not None and given not in names:
            raise UsageError(f"{option(opt)} '{given}': the batch has no such field",
                             hint=f"its fields: {', '.join(names)}")
    target, how = target_field, "as named"
    several = _several(batch, names, positional) if kind == "tuple" and input_field is None and target_field is None \
        else None
    if several:
        inputs, target, how = several
        return Roles(inputs, target, how, kind, names)
    if target is None:
        target, how = _conventional_target(batch, kind, names)
    if input_field is not None:
        inputs = [input_field]
    elif kind == "dict":   # every other top-level key goes to the model (input_ids, attention_mask, ...)
        top = [n for n in names if n != target and not (target and n.startswith(target + "."))]
        first = [n for n in top if n.split(".")[0] in INPUT_KEYS]
        inputs = first[:1] + [n for n in top if n not in first[:1]] if first else top
    elif target_field is not None and kind == "tuple" and positional > 1 and all(
            _under(names, t) == [t] for t in _tops(batch)):
        # the target named, a flat tuple of tensors, and a model whose forward requires more than one input: that many
        # of the other fields go in (an index or weight field beyond them is not an input: a review). A tuple that
        # nests a dict or a tuple keeps the one input (model_call passes leaves, not the dict: a review's KeyError)
        inputs = [t for t in _tops(batch) if t != target][:positional]
    else:
        inputs = [n for n in names if n != target][:1]
    return Roles(inputs, target, how, kind, names)


def _tops(batch) -> list[str]:
    """The names of a tuple's own elements (a namedtuple's fields, else `[i]`)."""
    fields = getattr(batch, "_fields", None)
    return list(fields) if fields else [f"[{i}]" for i in range(len(batch))]


def _under(names: list[str], top: str) -> list[str]:
    return [n for n in names if n == top or n.startswith(top + ".") or n.startswith(top + "[")]


def _several(batch, names: list[str], k: int) -> tuple[list[str], str, str] | None:
    """A model whose forward takes k > 1 inputs, and a tuple that holds them: (inputs, target, how) for `(x1, …, xk,
    y, …)` flat, or `((x1, …, xk), y)` nested (a namedtuple by its fields). None when the tuple holds neither."""
    if k < 2:
        return None
    tops = _tops(batch)
    if len(tops) > k and all(len(_under(names, t)) == 1 for t in tops[:k + 1]):
        return [_under(names, t)[0] for t in tops[:k]], _under(names, tops[k])[0], \
            f"({k} inputs, target) tuple: the model's forward takes {k}"
    first = _under(names, tops[0]) if tops else []
    if len(tops) >= 2 and len(first) == k and len(_under(names, tops[1])) == 1:
        return first, _under(names, tops[1])[0], f"((inputs), target) tuple: the model's forward takes {k}"
    return None


def _conventional_target(batch, kind: str, names: list[str]) -> tuple[str | None, str]:
    fields = getattr(batch, "_fields", None)
    if kind == "tuple" and fields:   # a namedtuple: by its field names first, as a dict's keys
        for key in TARGET_KEYS:
            if key in names:
                return key, f"field '{key}'"
        for key in TARGET_KEYS:   # a target field that is no tensor is no reason to take the next (a review)
            if key in fields:
                return _one_under(f"field '{key}'", getattr(batch, key), names, key)
        if len(fields) >= 2 and fields[1] in names:
            return fields[1], "(inputs, target) namedtuple"
    if kind == "dict":
        for key in TARGET_KEYS:
            if key in names:
                return key, f"dict key '{key}'"
        for key in TARGET_KEYS:   # a review: a `label` key of strings was "no dict key named like a target"
            if key in batch:
                return _one_under(f"dict key '{key}'", batch[key], names, key)
        return None, "no dict key named like a target (" + "/".join(TARGET_KEYS[:5]) + ")"
    if kind == "tuple":
        if len(batch) >= 2 and "[1]" in names:
            return "[1]", "(inputs, target) tuple"
        if len(batch) >= 2:   # a sweep: class names as strings were "a 1-tuple: no target"
            top = _tops(batch)[1]
            return _one_under(top if fields else "[1]", batch[1], names, top)
        return None, "a 1-tuple: no target"
    return None, "a lone tensor: no target"


def _one_under(what: str, value, names: list[str], top: str) -> tuple[str | None, str]:
    """The target in the field where one would be, that holds no tensor itself: the one tensor nested in it (a
    review: `{"target": {"cls": y}}`), or none and why: several (one is named with --target-field), or no tensor at
    all (class names left as strings)."""
    inner = [n for n in names if n.startswith(top + ".") or n.startswith(top + "[")]
    if len(inner) == 1:
        return inner[0], f"{what} (the one tensor in it)"
    if inner:
        return None, (f"{what} holds {len(inner)} tensors ({', '.join(inner[:3])}{' …' if len(inner) > 3 else ''}): "
                      "no single target read")
    return None, f"{what} holds {_kind_of(value)}, not a tensor: no target read"


def _kind_of(value) -> str:
    """What a batch field that is no tensor holds, in a few words ("a list of str", "None")."""
    if isinstance(value, (list, tuple)) and value:
        kinds = sorted({type(v).__name__ for v in value})
        return f"a {type(value).__name__} of {'/'.join(kinds[:3])}"
    return "None" if value is None else f"a {type(value).__name__}"


def get(batch, name: str):
    """The field `name` of a batch (as flatten names it)."""
    for n, t in flatten(batch):
        if n == name:
            return t
    raise KeyError(name)


def batch_size(batch) -> int:
    """Samples in a batch: dim 0 of its first tensor (1 for a 0-dim tensor)."""
    fields = flatten(batch)
    if not fields:
        return 0
    t = fields[0][1]
    return int(t.shape[0]) if t.dim() else 1


def model_call(batch, roles: Roles):
    """(args, kwargs) to call a model with the input fields: one positional input for a tuple or a tensor
    batch, keyword arguments (top-level keys) for a dict batch with several inputs."""
    if roles.structure == "dict" and len(roles.inputs) > 1:
        tops = {n.split(".")[0] for n in roles.inputs}
        return (), {k: batch[k] for k in batch.keys() if k in tops}
    return tuple(get(batch, n) for n in roles.inputs), {}


def unread_keywords(roles: Roles, model) -> list[str]:
    """The dict keys model_call would pass to the model's forward as keywords that it takes no parameter of (no
    **kwargs either): a new user's {'image', 'mask'} batch against forward(self, x) raised inside the model, exit 3,
    "fix it or the inputs (-i)", where naming the fields was the fix. [] when the signature is unknown."""
    import inspect

    if model is None or roles.structure != "dict" or len(roles.inputs) < 2:
        return []
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while isinstance(model, (DataParallel, DistributedDataParallel)):   # their forward(*inputs, **kwargs) passes on
        model = model.module
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return []
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return sorted({n.split(".")[0] for n in roles.inputs} - names)


def model_inputs(model) -> int:
    """How many positional inputs the model's forward requires (1 without a model, or when unknown)."""
    from .inputs import forward_parameters

    if model is None:
        return 1
    need = [p for p in forward_parameters(model) if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                      p.POSITIONAL_OR_KEYWORD)]
    return max(1, len(need))
