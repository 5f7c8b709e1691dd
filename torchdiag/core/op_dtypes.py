"""The dtype each matmul/conv/attention op actually ran in, and in which module: what autocast really did.

autocast decides per op (some ops are not on its lists, a region may disable it, an explicit .float()
inside a disabled region stays float32), so asking for --amp says little about what ran. A
TorchDispatchMode sees every aten op below autocast, with the dtypes autocast cast its inputs to;
forward pre/post hooks say which module is running (none: the backward, the loss, the optimizer).
Used by profile (one extra, unprofiled step) and memory (its tracked step); only under --amp/--dtype,
so a float32 run is unchanged. Nothing is read from the device: dtypes are metadata."""
from __future__ import annotations

from collections import Counter

# aten op names (overload packet) that do the multiply-adds
COMPUTE_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "convolution",
               "_convolution", "cudnn_convolution", "mkldnn_convolution", "_scaled_dot_product_flash_attention",
               "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math", "_int_mm")
OUTSIDE = "(no module: backward, loss or optimizer)"


def _float_dtypes(args) -> tuple[str, ...]:
    import torch

    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out.append(str(a.dtype).replace("torch.", ""))
    return tuple(out)


class OpDtypes:
    """`with OpDtypes(model) as rec:` run a step; `rec.seen` counts (op, input dtypes, module) calls."""

    def __init__(self, model):
        from .tracking import module_names

        self.model = model
        self.names = module_names(model)
        self.stack: list[str] = []
        self.seen: Counter = Counter()
        self._handles: list = []
        self._mode = None

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name in COMPUTE_OPS:
                    where = rec.stack[-1] if rec.stack else OUTSIDE
                    rec.seen[(f"aten::{name}", _float_dtypes(args), where)] += 1
                return func(*args, **(kwargs or {}))

        for mod in {id(m): m for m in self.model.modules()}.values():
            self._handles.append(mod.register_forward_pre_hook(self._push))
            self._handles.append(mod.register_forward_hook(self._pop))
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def _push(self, mod, args):
        self.stack.append(self.names.get(id(mod), "?") or "(root)")

    def _pop(self, mod, args, out):
        if self.stack:
            self.stack.pop()

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.stack.clear()
        return False


def rows(seen: Counter, limit: int = 4) -> list[dict]:
    """One row per (op, input dtypes): calls, and the modules they ran in (first `limit`)."""
    grouped: dict = {}
    for (op, dtypes, where), n in seen.items():
        row = grouped.setdefault((op, dtypes), {"op": op, "input_dtypes": ", ".join(dtypes) or "—", "calls": 0,
                                                "modules": []})
        row["calls"] += n
        if where not in row["modules"]:
            row["modules"].append(where)
    out = sorted(grouped.values(), key=lambda r: (r["op"], r["input_dtypes"]))
    for r in out:
        r["_modules"] = ", ".join(r["modules"][:limit]) + (f" … (+{len(r['modules']) - limit})"
                                                          if len(r["modules"]) > limit else "")
    return out


def fallbacks(seen: Counter, amp_dtype: str) -> list[str]:
    """Modules where a compute op ran in float32 (or wider) while autocast to `amp_dtype` was asked."""
    wide = ("float32", "float64")
    return sorted({where for (_, dtypes, where), _ in seen.items()
                   if where != OUTSIDE and dtypes and any(d in wide for d in dtypes)})


def report(result, seen: Counter, ctx, where: str) -> None:
    """The op_dtypes table, and under --amp an info finding naming the modules that fell back to float32."""
    from ..results import Column, Table

    table = rows(seen)
    amp = ctx.autocast_dtype
    result.tables.append(Table("op_dtypes", f"Compute ops by input dtype ({where})", [
        Column("op", "op"), Column("input_dtypes", "input dtypes"), Column("calls", "calls", "count"),
        Column("_modules", "modules")], table,
        note="the dtypes the op received after autocast; backward ops run outside any module"))
    if not amp:
        return
    fell = fallbacks(seen, amp)
    if fell:
        shown = ", ".join(fell[:6]) + (f" … (+{len(fell) - 6})" if len(fell) > 6 else "")
        result.add("autocast-fallback", "info", fell[0],
                   f"autocast {amp} was asked, but matmul/conv ops ran in float32 in {len(fell)} module(s): {shown}",
                   hint="autocast leaves ops off its lists and disabled regions (autocast(enabled=False)) in float32; "
                        "if that is not deliberate, cast there or use an op autocast covers")
