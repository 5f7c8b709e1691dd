"""gradcheck: are the analytical gradients of the user's own autograd code right?

TARGET names a `torch.autograd.Function` subclass (checked through `.apply`), an `nn.Module`
(a class, built with --arg; its parameters are checked too, through torch.func.functional_call)
or a plain function. Everything runs in float64 on small random inputs.

Two independent checks, both must pass:
- torch.autograd.gradcheck / gradgradcheck (the reference implementation, its message kept);
- our own per-input comparison, which tells *where*: the full analytical Jacobian (one backward
  per output element) against central differences f(x+eps)-f(x-eps) / 2eps, per input; an entry
  fails when |analytical - numerical| > atol + rtol·|numerical| (torch's rule). The worst entry
  names the input, its element (index into the input) and the output element.
Second order (`--second-order`) checks the gradient function g(x) = vjp(f, x, v) (fixed random v,
create_graph=True) the same way.

Entry points: `check_spec(spec, opts)` for the CLI (TARGET loaded from the run spec, --checkpoint
loaded into an nn.Module target as on every command, inputs made by core's input preparation), `check_callable(target, inputs, opts)` for the Python API, and
`run(checked, opts)` on what `build` made. gradcheck's target is not a model, so it is not run
through `diagnostics.invoke`."""
from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.run import number
from ..errors import ModelError, OptionError, UsageError, one_line
from ..results import Column, Result, Table

NEEDS_VALUES = True
TOLERANCE_HINT = "defaults: eps 1e-6, atol 1e-5, rtol 1e-3"


@dataclass
class Options:
    """gradcheck's options, validated here for every caller (CLI, Python) before anything runs."""

    second_order: bool = False
    eps: float = 1e-6
    atol: float = 1e-5
    rtol: float = 1e-3
    params: bool = True         # nn.Module targets: check parameters too
    max_elements: int = 4096    # inputs+params numel cap (one forward per element, twice)

    def __post_init__(self):
        # eps 0 makes every numerical gradient 0/0, a negative one flips its sign; a NaN tolerance passes nothing
        try:
            number("eps", self.eps, low=0, low_open=True)
            number("atol", self.atol, low=0)
            number("rtol", self.rtol, low=0)
        except OptionError as exc:
            exc.hint = TOLERANCE_HINT
            raise
        number("max_elements", self.max_elements, low=1, integer=True)


@dataclass
class Checked:
    """What gradcheck differentiates: fn(*tensors) with names for every tensor."""
    fn: Callable
    tensors: list
    names: list[str]
    kind: str
    label: str
    extra: dict = field(default_factory=dict)
    module: Any = None          # the float64 copy an nn.Module target runs on


def resolve_target(obj, kwargs: dict, label: str):
    """(kind, callable or module) for a Function subclass, Module class/instance or function; a
    TorchScript module is a usage error (as on every command), not a failure of the target."""
    from ..core.loading import refuse_scripted

    kind, target = _resolve(obj, kwargs, label)
    if kind == "nn.Module":
        refuse_scripted(target, label)
    return kind, target


def _resolve(obj, kwargs: dict, label: str):
    import torch
    from torch import nn

    if inspect.isclass(obj) and issubclass(obj, torch.autograd.Function):
        if kwargs:
            raise UsageError(f"{label} is an autograd.Function: --arg does not apply")
        return "autograd.Function", obj.apply
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        try:
            return "nn.Module", obj(**kwargs)
        except TypeError as exc:
            raise UsageError(f"cannot build {label}: {one_line(exc)}", hint="pass constructor arguments with --arg key=value") from exc
        except Exception as exc:
            raise ModelError(f"building {label} raised {one_line(exc)}") from exc
    if isinstance(obj, nn.Module):
        return "nn.Module", obj
    if callable(obj):
        try:
            sig = inspect.signature(obj)
            required = [p for p in sig.parameters.values()
                        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            required = [None]
        if not required or kwargs:
            # a factory: build what it returns
            try:
                made = obj(**kwargs)
            except Exception as exc:
                raise ModelError(f"{label}() raised {one_line(exc)}") from exc
            if isinstance(made, nn.Module):
                return "nn.Module", made
            if inspect.isclass(made) and issubclass(made, torch.autograd.Function):
                return "autograd.Function", made.apply
            raise UsageError(f"{label}() returned {type(made).__name__}; expected an nn.Module")
        return "function", obj
    raise UsageError(f"{label} is a {type(obj).__name__}, not an autograd.Function, nn.Module or function")


def arity(kind: str, target) -> tuple[int, int | None] | None:
    """(fewest, most) positional inputs the target takes (most None: *args), from its signature:
    Function.forward(ctx, ...) (no ctx with setup_context), Module.forward(self, ...), a plain
    function. None when the signature cannot be read."""
    import torch

    try:
        if kind == "autograd.Function":
            cls = getattr(target, "__self__", None)
            if not (inspect.isclass(cls) and issubclass(cls, torch.autograd.Function)):
                return None
            params = list(inspect.signature(cls.forward).parameters.values())
            if cls.setup_context is torch.autograd.Function.setup_context:
                params = params[1:]             # forward(ctx, ...)
        elif kind == "nn.Module":
            params = list(inspect.signature(target.forward).parameters.values())   # bound: no self
        else:
            params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    fewest = sum(1 for p in positional if p.default is p.empty)
    most = None if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    return fewest, most


def check_arity(kind: str, target, given: int, label: str, source: str = "") -> None:
    """UsageError (exit 2) when the number of inputs cannot match the target's signature."""
    span = arity(kind, target)
    if span is None:
        return
    fewest, most = span
    if fewest <= given and (most is None or given <= most):
        return
    if most == fewest:
        takes = f"{fewest} input{'s' if fewest != 1 else ''}"
    elif most is None:
        takes = f"at least {fewest} input{'s' if fewest != 1 else ''}"
    else:
        takes = f"{fewest} to {most} inputs"
    n = fewest if given < fewest else most
    raise UsageError(f"{label} takes {takes}, got {given}" + (f" from {source}" if source else ""),
                     hint="give one -i per input, e.g. " + (" ".join(["-i 3"] * n) if n else "no -i"))


def build(kind: str, target, inputs: list, input_names: list[str], opts: Options, label: str) -> Checked:
    import torch

    diff = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if kind != "nn.Module":
        fixed = list(inputs)

        def fn(*ts):
            args = list(fixed)
            for i, t in zip(diff, ts):
                args[i] = t
            return target(*args)

        return Checked(fn, [inputs[i] for i in diff], [input_names[i] for i in diff], kind, label)

    module = copy.deepcopy(target).double()   # complex tensors stay complex, in double precision (complex128)
    module._apply(lambda t: t.to(torch.complex128) if t.is_complex() else t)
    pnames, pvals = [], []
    if opts.params:
        for n, p in module.named_parameters():
            if p.requires_grad:
                pnames.append(n)
                pvals.append(p.detach().clone())
    fixed = list(inputs)
    nd = len(diff)

    def fn(*ts):
        from torch.func import functional_call

        args = list(fixed)
        for i, t in zip(diff, ts[:nd]):
            args[i] = t
        return functional_call(module, dict(zip(pnames, ts[nd:])), tuple(args))

    return Checked(fn, [inputs[i] for i in diff] + pvals, [input_names[i] for i in diff] + pnames, kind, label,
                   {"parameters": len(pnames)}, module)


def _outputs(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())]
    raise UsageError(f"the target returned a {type(value).__name__}; gradcheck needs tensor outputs")


def realified(fn, xs: list):
    """(fn, xs) as a real function: each complex tensor in as its real view (..., 2) in float64 (its real and
    imaginary parts), each complex output out as its real view. The real Jacobian of that is what autograd's
    gradient of a real loss uses; a sweep: complex parameters cast to float64 lost their imaginary part, and the
    check passed on another function."""
    import torch

    cplx = [x.is_complex() for x in xs]
    real = [torch.view_as_real(x.detach().to(torch.complex128).resolve_conj()).clone() if c else x.detach().double()
            for x, c in zip(xs, cplx)]   # a conjugate view has no real view until resolved (a review)

    def g(*ts):
        args = [torch.view_as_complex(t) if c else t for t, c in zip(ts, cplx)]
        out = fn(*args)
        outs = [torch.view_as_real(o.resolve_conj()) if o.is_complex() else o for o in _outputs(out)]
        return outs[0] if isinstance(out, torch.Tensor) else tuple(outs)   # one tensor stays one (its dtype said)

    return g, real


def _call(fn, xs, what="forward"):
    try:
        return _outputs(fn(*xs))
    except (UsageError, ModelError):
        raise
    except Exception as exc:
        raise ModelError(f"{what} of the target raised {one_line(exc)}",
                         hint="the target's own code raised on float64 inputs of the given shapes") from exc


def jacobians(fn, xs: list, eps: float):
    """Per input: (analytical, numerical) Jacobians, each of shape (total output numel, input numel)."""
    import torch

    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    outs = _call(fn, xs)
    n_out = sum(o.numel() for o in outs)
    analytical = [torch.zeros(n_out, x.numel(), dtype=torch.float64) for x in xs]
    row = 0
    for o in outs:
        flat = o.reshape(-1)
        for j in range(flat.numel()):
            if not flat.requires_grad:
                row += 1
                continue
            try:
                grads = torch.autograd.grad(flat[j], xs, retain_graph=True, allow_unused=True)
            except Exception as exc:
                raise ModelError(f"backward of the target raised {one_line(exc)}",
                                 hint="the analytical gradient (backward) itself failed") from exc
            for i, g in enumerate(grads):
                if g is not None:
                    if g.shape != xs[i].shape:
                        raise ModelError(f"backward returned a gradient of shape {tuple(g.shape)} for an input "
                                         f"of shape {tuple(xs[i].shape)}")
                    analytical[i][row] = g.detach().reshape(-1).double().cpu()
            row += 1
    numerical = []
    with torch.no_grad():
        base = [x.detach().clone() for x in xs]
        for x in base:
            jac = torch.zeros(n_out, x.numel(), dtype=torch.float64)
            flat = x.view(-1)
            for k in range(flat.numel()):
                orig = flat[k].item()
                flat[k] = orig + eps
                plus = torch.cat([o.detach().reshape(-1).double().cpu() for o in _call(fn, base)])
                flat[k] = orig - eps
                minus = torch.cat([o.detach().reshape(-1).double().cpu() for o in _call(fn, base)])
                flat[k] = orig
                jac[:, k] = (plus - minus) / (2 * eps)
            numerical.append(jac)
    out_shapes = [tuple(o.shape) for o in outs]
    return analytical, numerical, out_shapes


def _unravel(index: int, shape: tuple) -> tuple:
    out = []
    for d in reversed(shape):
        out.append(index % d if d else 0)
        index = index // d if d else 0
    return tuple(reversed(out))


def _out_element(row: int, out_shapes) -> tuple[int, tuple]:
    import math

    for k, shape in enumerate(out_shapes):
        n = math.prod(shape)
        if row < n:
            return k, _unravel(row, shape)
        row -= n
    return len(out_shapes) - 1, ()


def compare(names, xs, analytical, numerical, out_shapes, opts: Options, order: int) -> list[dict]:
    rows = []
    for name, x, a, n in zip(names, xs, analytical, numerical):
        diff = (a - n).abs()
        allowed = opts.atol + opts.rtol * n.abs()
        excess = diff - allowed
        rel = diff / n.abs().clamp_min(1e-12)
        bad = int((~(excess <= 0)).sum())  # a NaN difference is a failure, not a pass
        row = {"order": order, "input": name, "shape": "x".join(map(str, x.shape)) or "scalar",
               "max_abs_error": float(diff.max()) if diff.numel() else 0.0,
               # None (shown "—") where no entry is off by more than atol: a "0" beside an abs error of 3e-10 was
               # read as a wrong figure (a new user's hour)
               "max_rel_error": float(rel[diff > opts.atol].max()) if bool((diff > opts.atol).any()) else None,
               "failing_entries": bad, "entries": diff.numel(), "passed": bad == 0}
        if bad:
            flat = int(excess.reshape(-1).argmax())
            r, c = divmod(flat, a.shape[1])
            k, oel = _out_element(r, out_shapes)
            row["element"] = list(_unravel(c, tuple(x.shape)))
            row["output"] = k
            row["output_element"] = list(oel)
            row["analytical"] = float(a[r, c])
            row["numerical"] = float(n[r, c])
        rows.append(row)
    return rows


def torch_check(fn, xs, opts: Options, second: bool) -> tuple[bool, str]:
    import torch
    from torch.autograd.gradcheck import GradcheckError

    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    check = torch.autograd.gradgradcheck if second else torch.autograd.gradcheck
    try:
        ok = check(fn, tuple(xs), eps=opts.eps, atol=opts.atol, rtol=opts.rtol, raise_exception=True)
        return bool(ok), ""
    except GradcheckError as exc:
        return False, one_line(exc, 600)
    except RuntimeError as exc:
        return False, one_line(exc, 600)


def _second_order_fn(fn, xs):
    """g(*xs) = d<f(xs), v>/dxs with a fixed random v: its Jacobian is the second derivative."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        outs = _call(fn, [x.detach() for x in xs])
    vs = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device) for o in outs]

    def g(*ts):
        with torch.enable_grad():
            ts = [t if t.requires_grad else t.detach().requires_grad_(True) for t in ts]
            outs = _outputs(fn(*ts))
            grads = torch.autograd.grad(outs, ts, vs, create_graph=True, allow_unused=True)
        return tuple(gr if gr is not None else torch.zeros_like(t) for gr, t in zip(grads, ts))

    return g


def run(checked: Checked, opts: Options | None = None) -> Result:
    import torch

    opts = opts or Options()
    fn, xs = realified(checked.fn, checked.tensors)
    result = Result("gradcheck", header={"target": checked.label, "kind": checked.kind,
                                         "precision": "float64", "eps": opts.eps, "atol": opts.atol, "rtol": opts.rtol})
    if any(x.is_complex() for x in checked.tensors):
        result.notes.append("complex tensors are checked as their real and imaginary parts (complex128; a shape's "
                            "last 2), as are complex outputs")
    if not xs:
        raise UsageError(f"{checked.label} has no floating-point input to differentiate",
                         hint="give float inputs with -i, e.g. -i 3x4")
    total = sum(x.numel() for x in xs)
    if total > opts.max_elements:
        # the parameters are checked too (the last `parameters` tensors): a new user's 16 ids beside 106,304 weights
        # were told to shrink -i
        n = checked.extra.get("parameters", 0)
        weights = sum(x.numel() for x in checked.tensors[len(checked.tensors) - n:]) if n else 0
        of = f" ({weights:,} of them the module's parameters)" if weights else ""
        raise UsageError(f"{total:,} elements to check{of}; the numerical gradient needs two forwards per element",
                         hint=f"≤ {opts.max_elements:,} in all: --no-params checks the inputs alone, or check a "
                              "submodule" if weights > total // 2 else
                              f"use smaller shapes with -i (≤ {opts.max_elements:,} elements in all)")
    _deterministic(checked, fn, xs, result)
    grad_mode = torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    try:
        analytical, numerical, out_shapes = jacobians(fn, xs, opts.eps)
        rows = compare(checked.names, xs, analytical, numerical, out_shapes, opts, 1)
        torch_ok, torch_msg = torch_check(fn, xs, opts, False)
        result.data["torch_gradcheck"] = {"passed": torch_ok, "message": torch_msg}
        if opts.second_order:
            g = _second_order_fn(fn, xs)
            a2, n2, s2 = jacobians(g, xs, opts.eps)
            rows += compare(checked.names, xs, a2, n2, s2, opts, 2)
            ok2, msg2 = torch_check(fn, xs, opts, True)
            result.data["torch_gradgradcheck"] = {"passed": ok2, "message": msg2}
    finally:
        torch.set_grad_enabled(grad_mode)

    for r in rows:
        r["_worst"] = _where(r) if not r["passed"] else ""
        r["_style"] = None if r["passed"] else "red"
        r["_verdict"] = "pass" if r["passed"] else "FAIL"
    ours = all(r["passed"] for r in rows)
    theirs = result.data["torch_gradcheck"]["passed"] and result.data.get("torch_gradgradcheck", {"passed": True})["passed"]
    passed = ours and theirs
    result.data["passed"] = passed
    result.data["second_order"] = opts.second_order
    result.data.update(checked.extra)
    cols = [Column("order", "order", "int"), Column("input", "input"), Column("shape", "shape"),
            Column("max_abs_error", "max abs err", "float"), Column("max_rel_error", "max rel err", "float"),
            Column("failing_entries", "bad entries", "count"), Column("_verdict", "result")]
    result.tables.append(Table("per_input", "Analytical vs numerical gradient, per input", cols, rows,
                               note=f"entry fails when |analytical − numerical| > {opts.atol:g} + {opts.rtol:g}·|numerical|; "
                                    f"max rel err over the entries off by more than {opts.atol:g} (—: none is); central "
                                    f"differences, eps "
                                    f"{opts.eps:g}; order 2 = gradient of the gradient"))
    for r in rows:
        if not r["passed"]:
            what = "second-order gradient" if r["order"] == 2 else "gradient"
            result.add("wrong-gradient" if r["order"] == 1 else "wrong-second-order-gradient", "error", r["input"],
                       f"{what} of {r['input']} is wrong at {_where(r)}: analytical {r['analytical']:.6g}, "
                       f"numerical {r['numerical']:.6g} ({r['failing_entries']} of {r['entries']} Jacobian entries off)",
                       hint="check the backward() formula for this input")
    for key, order in (("torch_gradcheck", 1), ("torch_gradgradcheck", 2)):
        info = result.data.get(key)
        if info and not info["passed"] and not any(not r["passed"] and r["order"] == order for r in rows):
            result.add("torch-gradcheck-failed", "error", "", f"torch.autograd.{key[6:]} failed: {info['message']}")
    result.verdict = ("PASS: analytical gradients match the numerical ones" + (" (first and second order)" if opts.second_order else "")
                      if passed else "FAIL: analytical and numerical gradients differ")
    result.failed = not passed
    return result


def _same(a, b) -> bool:
    import torch

    return all(x.shape == y.shape and bool(torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))) for x, y in zip(a, b))


def _deterministic(checked: Checked, fn, xs, result) -> None:
    """Finite differences need f to give the same output for the same input, and a float output.
    An nn.Module that is random in training mode (Dropout) is checked in eval mode, with a note;
    anything else random is a usage error (it would read as a wrong backward)."""
    import torch

    with torch.no_grad():
        first = _call(fn, xs)
        if not any(o.is_floating_point() or o.is_complex() for o in first):
            raise UsageError(f"{checked.label} returns no floating-point output "
                             f"({', '.join(str(o.dtype).replace('torch.', '') for o in first) or 'nothing'}): "
                             "there is no gradient to check")
        if _same(first, _call(fn, xs)):
            if checked.module is not None:   # a function has no mode: no key (a null one read as meaningless)
                result.data["mode"] = "train" if checked.module.training else "eval"
            return
        if checked.module is not None and checked.module.training:
            checked.module.eval()
            if _same(_call(fn, xs), _call(fn, xs)):
                result.data["mode"] = "eval"
                result.notes.append(f"{checked.label} gives different outputs for the same input in training mode "
                                    "(Dropout or other random ops): checked in eval mode")
                return
    raise UsageError(f"{checked.label} gives different outputs for the same input: numerical gradients of a random "
                     "function are meaningless", hint="make it deterministic for the check (no dropout/sampling), "
                                                      "or seed the randomness inside it")


def _where(r) -> str:
    el = ", ".join(map(str, r.get("element", [])))
    oel = ", ".join(map(str, r.get("output_element", [])))
    return f"element ({el}) of {r['input']}, output[{r.get('output', 0)}] element ({oel})"


def check_callable(target, inputs, opts: Options | None = None) -> Result:
    """The Python API: `target` (Function subclass, module or function) at the given tensors (float
    ones doubled), e.g. check_callable(MyFn, (torch.randn(3), torch.randn(3)), Options())."""
    import torch

    opts = opts or Options()
    label = getattr(target, "__qualname__", None) or type(target).__name__
    kind, fn = resolve_target(target, {}, label)
    if not inputs:
        raise UsageError(f"gradcheck needs inputs: torchdiag.gradcheck({label}, torch.randn(3), ...)")
    tensors = [t.detach().double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    check_arity(kind, fn, len(tensors), label)
    checked = build(kind, fn, tensors, [f"input[{i}]" for i in range(len(tensors))], opts, label)
    return run(checked, opts)


def check_spec(spec, opts: Options | None = None) -> Result:
    """The CLI: TARGET (`spec.model`, built with `spec.args` when it is a class or factory) at the
    inputs of `spec.inputs` or the module's example_inputs(), float ones in float64."""
    from ..core.context import Context
    from ..core.device import has_float64, resolve_device
    from ..core.inputs import ModelInputs
    from ..core.lazy import materialise
    from ..core.loading import find_factory, import_module, parse_args, split_spec
    from ..core.precision import cast_inputs

    opts = opts or Options()
    device = resolve_device(spec.device)
    Context(spec, device).require_values()     # the one meta refusal, before the target is imported
    if not has_float64(device):
        raise UsageError(f"gradcheck compares gradients in float64, which {device.type} does not have",
                         hint="run it with --device cpu (or cuda)")
    import torch

    where, name = split_spec(spec.model)
    module = import_module(where)
    # built after `torch.manual_seed(seed)`, as every command builds its model (a review: a module's weights, and
    # so its errors, changed from run to run)
    if spec.seed is not None:
        torch.manual_seed(spec.seed)
    kind, target = resolve_target(find_factory(module, name, where), parse_args(list(spec.args)), name)
    if kind == "nn.Module":
        target = target.to(device)
    loaded = _load_checkpoint(spec, kind, target, name, device)
    tensors, source = _inputs(spec, module, target if kind == "nn.Module" else None, device)
    check_arity(kind, target, len(tensors), name, "" if source == "--input" else source)
    names = [f"input[{i}]" for i in range(len(tensors))]
    shown = ModelInputs(tuple(tensors), {}, source)
    said: dict = {}
    if kind == "nn.Module":   # a lazy module cannot be copied before its first forward: given the inputs as its own
        materialise(target, cast_inputs(shown, "float32"), said)   # dtype (until build makes a float64 copy)
    result = run(build(kind, target, tensors, names, opts, name), opts)
    result.header = {"model": spec.model, "device": str(device), "inputs": shown.describe(), "input_source": source,
                     **said, **result.header}
    if loaded:
        result.header["checkpoint"] = [r.describe() for r in loaded]
        for report in loaded:   # keys that did not fit (--no-strict-checkpoint): findings, exit 1
            report.add_findings(result)
    return result


def _load_checkpoint(spec, kind: str, target, label: str, device) -> list:
    """--checkpoint into an nn.Module target, as every command loads one (the gradients are then checked
    at the trained weights); a Function or a plain function has no weights to load."""
    from types import SimpleNamespace

    from ..core.context import load_checkpoints

    if not spec.checkpoint:
        return []
    if kind != "nn.Module":
        raise OptionError("checkpoint", f"does not apply to {label}: it is {'an' if kind[0] == 'a' else 'a'} {kind}, "
                                        "which has no weights to load",
                          hint="--checkpoint loads weights into an nn.Module target (a class, or a factory returning one)")
    return load_checkpoints(spec, SimpleNamespace(model=target, weights=()), device)


def _inputs(spec, module, model, device) -> tuple[list, str]:
    """(tensors, source) from core's input preparation (-i specs, else example_inputs(), seeded and
    RNG-restored there); floating tensors become float64, the precision gradcheck works in."""
    from types import SimpleNamespace

    import torch

    from ..core.inputs import resolve_inputs

    if not spec.inputs and not callable(getattr(module, "example_inputs", None)):
        raise UsageError("no inputs for gradcheck", hint="give small shapes with -i, e.g. -i 3x4 -i 3x4 (one per input), "
                                                         "or an example_inputs() function in the target's module")
    # resolve_inputs wants what core.loading returns: the module (example_inputs) and a model (integer ranges)
    inputs = resolve_inputs(list(spec.inputs), SimpleNamespace(model=model, module=module), device, spec.seed)
    if inputs.kwargs:
        raise UsageError(f"gradcheck takes positional inputs; {inputs.source} gave keyword inputs "
                         f"({', '.join(inputs.kwargs)})", hint="use -i")
    tensors = [t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
               for t in inputs.args]
    return tensors, inputs.source

