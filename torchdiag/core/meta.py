"""Build a model without allocating its weights (the `meta` device)."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def params_on_meta():
    """Let the constructor run on the CPU but turn every parameter into a meta tensor as it is
    registered. Constructors that compute with tensors (and fail under torch.device("meta"))
    still build, while weights never take real memory: at most one parameter at a time does."""
    from torch import nn

    original = nn.Module.register_parameter

    def register_parameter(self, name, param):
        if param is not None and param.device.type != "meta":
            kwargs = dict(param.__dict__)
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            param.__dict__.update(kwargs)
        original(self, name, param)

    nn.Module.register_parameter = register_parameter
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_on_meta(factory, kwargs):
    """Call factory(**kwargs) so its parameters and buffers live on meta.

    First under torch.device("meta") (nothing allocated at all); when the constructor
    needs real tensor values ("Cannot copy out of meta tensor", `.item()` on meta …),
    again with parameters moved to meta as they are registered."""
    import torch

    try:
        with torch.device("meta"):
            model = factory(**kwargs)
        return model, "torch.device('meta')"
    except (NotImplementedError, RuntimeError) as first:
        try:
            with params_on_meta():
                model = factory(**kwargs)
        except Exception:
            raise first from None
        if hasattr(model, "to"):
            model = model.to("meta")
        return model, "parameters moved to meta as registered"


def refuse_meta_tensors(model, what: str, partly: bool = False) -> None:
    """A model holding parameters or buffers on the meta device has no values to move or compute with (a factory
    that built on meta and never materialised, a buffer left unassigned): exit 2 naming the first, not torch's
    "Cannot copy out of meta tensor" from deep inside. `partly`: only when some tensors have values (the Python
    API's model wholly on meta is a meta run)."""
    from ..errors import UsageError

    state = [(f"parameter {n}", t) for n, t in model.named_parameters()] + \
        [(f"buffer {n}", t) for n, t in model.named_buffers()]
    on_meta = [n for n, t in state if t.device.type == "meta"]
    if not on_meta or (partly and len(on_meta) == len(state)):
        return
    raise UsageError(f"{what} holds {len(on_meta)} tensor(s) on the meta device, without values (first: "
                     f"{on_meta[0]})", hint="materialise them in the factory (to_empty() then initialise, or load "
                     "the weights there); --device meta runs the commands that need shapes only")


def weightless_copy(model):
    """A deep copy of `model` whose tensors are meta tensors: its parameters and buffers, and every tensor reached from
    its modules' attributes through lists, tuples, sets, dicts and other objects' attributes (an EMA's weights, an
    optimizer's state, a dataset or replay buffer kept on the model: a review found 250 MB copied): the structure and
    the code, no values. NumPy arrays and other non-tensor data are copied as they are."""
    import copy

    import torch

    memo: dict = {}
    for t in _reachable_tensors(model):
        if id(t) not in memo:
            m = t.detach().to("meta")
            memo[id(t)] = torch.nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else m
    return copy.deepcopy(model, memo)


def _reachable_tensors(model, depth: int = 10, limit: int = 200_000):
    """The model's parameters and buffers, then every tensor reachable from its modules' attributes within `depth`
    steps through containers (deques too) and objects' attributes and slots (not classes, functions or Python
    modules), at most `limit` objects looked at; numbers and strings are not looked at (a review: a module's list of
    300,000 ids used up the limit before the parameters)."""
    import types

    import torch

    yield from model.parameters()
    yield from model.buffers()
    seen: set[int] = set()
    stack = [(v, 0) for m in model.modules() for k, v in vars(m).items() if k not in ("_modules", "_parameters")]
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes,
            int, float, complex, bool, type(None))
    while stack and len(seen) < limit:
        v, d = stack.pop()
        if isinstance(v, skip) or id(v) in seen or isinstance(v, torch.nn.Module) and d:
            continue
        seen.add(id(v))
        if isinstance(v, torch.Tensor):
            yield v
        elif d < depth:
            stack.extend((x, d + 1) for x in _members(v))


def _members(v) -> list:
    """What a container holds (numbers and strings aside), or an object's attributes and slots; [] where reading them
    raises."""
    import collections

    try:
        if isinstance(v, dict):
            return list(v.values())
        if isinstance(v, (list, tuple, set, frozenset, collections.deque)):
            return [x for x in v if not isinstance(x, (int, float, str))]
        found = list(vars(v).values()) if hasattr(v, "__dict__") else []
        slots = [k for c in type(v).__mro__ for k in getattr(c, "__slots__", ()) if isinstance(k, str)]
        return found + [getattr(v, k) for k in slots if hasattr(v, k)]
    except Exception:   # noqa: BLE001 - an object that will not say what it holds: left as it is
        return []
