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
    """A deep copy of `model` whose parameters, buffers and the tensors its modules hold in attributes, lists and dicts
    (an EMA's weights) are meta tensors: the structure and the code, no values, no memory."""
    import copy

    import torch

    from .train import held_tensors

    memo: dict = {}
    for t in held_tensors(model):
        if id(t) not in memo:
            m = t.detach().to("meta")
            memo[id(t)] = torch.nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else m
    return copy.deepcopy(model, memo)
