"""Replay the batch of the step where a value first went non-finite, on a copy of the weights that
produced it, to name the module and the direction (forward/backward) where it went bad.

Kept in one module on purpose (it may move to core/ beside nancheck's localisation): it runs only
when watch found a non-finite loss or gradient at the step being read, in the optimizer's pre-hook, so
the model still holds the weights of that step. It works on a deep copy (the user's model, its buffers
and gradients are untouched) and restores the RNG it consumes (dropout draws).

The user's loss function is not known (it runs outside the model), so the backward is replayed with
the gradient of `output.sum()`: a module that makes a non-finite gradient out of finite ones is found
whatever the loss; when the model's own forward and backward stay finite, the loss is the culprit."""
from __future__ import annotations

from ...core.masks import additive_mask
from ...errors import one_line


def _finite(t) -> bool:
    import torch

    return bool(torch.isfinite(t).all())


def _floats(value, out=None) -> list:
    import torch

    out = [] if out is None else out
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _floats(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _floats(v, out)
    elif hasattr(value, "values") and callable(value.values):   # HF ModelOutput
        for v in value.values():
            _floats(v, out)
    return out


def _ranks() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def replay(root, args, kwargs, prefix: str = "", loss: float | None = None) -> dict:
    """{"direction": "weights"|"input"|"forward"|"backward"|"loss", "module", "type", "detail"} or {"error": ...}.
    `prefix`: the model's `Type#i.` where there are several, as the rows name its parameters."""
    import copy

    import torch

    from .engine import inner

    module = inner(root)
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        model = copy.deepcopy(module)
        bad = [prefix + n for n, p in model.named_parameters() if not _finite(p)]
        if bad:
            return {"direction": "weights", "module": bad[0].rsplit(".", 1)[0] if "." in bad[0] else "",
                    "type": "", "detail": f"parameter {bad[0]} is already non-finite before this step"}
        if any(not _finite(t) and not additive_mask(t) for t in _floats(list(args) + list(kwargs.values()))):
            # the batch itself (a sweep: the hint named a weight's gradient and never the NaN in the input); an
            # additive mask's -inf is no bad data, its NaN made by the model (localised below), as nancheck says
            return {"direction": "input", "module": "", "type": "",
                    "detail": "the batch's input already holds NaN/Inf: the data, not the model"}
        for p in model.parameters():
            p.grad = None
        with torch.enable_grad():
            found = _localise(model, args, kwargs, prefix, loss)
        if found.get("direction") == "loss" and module is not root and _ranks() > 1:
            # under DDP/FSDP a peer's non-finite gradient arrives through the reduction (a sweep: rank 0 was told its
            # own loss was the culprit for rank 1's NaN batch)
            found["detail"] += (", or from another rank's gradient through the wrapper's reduction: look at the other "
                                "ranks' reports")
        return found
    except Exception as exc:   # the replay is a help, never a new failure of the run
        return {"error": one_line(exc)}
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _localise(model, args, kwargs, prefix: str = "", loss: float | None = None) -> dict:
    names = {id(m): (prefix + n).rstrip(".") if prefix else n for n, m in model.named_modules()}
    calls: list = []   # [name, type, ins, outs, inputs finite, non-finite ones masks only, order, made a NaN]
    first: list = []
    handles = []

    def pre(mod, a, kw):
        ins = _floats(list(a) + list(kw.values()))
        finite = all(_finite(t) for t in ins)
        calls.append([names.get(id(mod), "?"), type(mod).__name__, ins, [], finite,
                      finite or all(_finite(t) or additive_mask(t) for t in ins), len(calls), False])
        mod._watch_call = len(calls) - 1

    def post(mod, a, kw, out):
        rec = calls[mod._watch_call]
        rec[3] = _floats(out)
        # a NaN out of inputs holding none is made here, an additive mask's -inf among them or not (as nancheck)
        made = rec[4] or (rec[5] and any(bool(t.isnan().any()) for t in rec[3])
                          and not any(c[7] for c in calls[rec[6] + 1:]))
        rec[7] = made and any(bool(t.isnan().any()) for t in rec[3])   # it made a NaN (not a mask passed on)
        if not first and made and not all(_finite(t) for t in rec[3]):
            first.append(rec)

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        output = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
        for m in model.modules():
            m.__dict__.pop("_watch_call", None)
    if first:
        name, kind, _, _, finite, _, _, _ = first[0]
        held = "finite inputs" if finite else "inputs holding ±Inf but no NaN (an additive mask's -inf, or an Inf in the data)"
        return {"direction": "forward", "module": name, "type": kind,
                "detail": f"{name or '(root)'} ({kind}) made a non-finite output from {held}"}
    found = _backward(model, calls, _floats(output), prefix)
    if found.get("direction") == "loss" and found.get("module") == "" and "outside the model" in found["detail"]:
        facts = _output_facts(calls, _floats(output), loss)
        found["detail"] += f"; {facts}" if facts else ""
    return found


def _output_facts(calls, outputs, loss: float | None = None) -> str:
    """What in the finite output a loss finds undefined (core.output_facts), with the module that made it."""
    from ...core.output_facts import output_facts, storage_ptr

    t = next((t for t in outputs if t.is_floating_point()), None)
    ptr = storage_ptr(t) if t is not None else 0
    maker = next((rec for rec in reversed(calls) if ptr and rec[0] and any(storage_ptr(o) == ptr for o in rec[3])), None)
    return output_facts(t, f"{maker[0]} ({maker[1]})" if maker else None, loss)


def _backward(model, calls, outputs, prefix: str = "") -> dict:
    import torch

    order: list = []
    marks: dict = {}   # id(tensor) -> [finite or None, order]
    for rec in calls:
        for t in rec[2] + rec[3]:
            if t.requires_grad and id(t) not in marks:
                marks[id(t)] = [None, None]

                def hook(g, key=id(t)):
                    if marks[key][0] is None:
                        marks[key] = [_finite(g), len(order)]
                        order.append(key)
                t.register_hook(hook)
    roots = [o for o in outputs if o.requires_grad]
    if not roots:
        return {"direction": "loss", "module": "", "type": "", "detail": "the model's output needs no gradient"}
    torch.autograd.backward([o.float().sum() for o in roots])
    suspects = []
    for rec in calls:
        out_ok = [marks[id(t)][0] for t in rec[3] if id(t) in marks and marks[id(t)][0] is not None]
        ins = [marks[id(t)] for t in rec[2] if id(t) in marks and marks[id(t)][0] is not None]
        bad_in = [m for m in ins if m[0] is False]
        if out_ok and all(out_ok) and bad_in:
            suspects.append((min(m[1] for m in bad_in), rec[0], rec[1]))
    params = {n.rsplit(".", 1)[0] if "." in n else "": n for n, p in
              ((prefix + n, p) for n, p in model.named_parameters()) if p.grad is not None and not _finite(p.grad)}
    if suspects:
        _, name, kind = min(suspects)
        return {"direction": "backward", "module": name, "type": kind,
                "detail": f"{name or '(root)'} ({kind}) turned finite gradients at its output into non-finite "
                          "gradients at its input (backward)"}
    if params:
        mod = next(iter(params))
        return {"direction": "backward", "module": mod, "type": "",
                "detail": f"the gradient of {params[mod]} is non-finite while every module's output gradient is finite"}
    return {"direction": "loss", "module": "", "type": "",
            "detail": "the model's forward and backward are finite on this batch with these weights: the "
                      "non-finite value came from the loss computed on its output (outside the model)"}
