"""frozen: requires_grad=False parameters, listed by module (info; the whole model frozen: warning)."""
from __future__ import annotations

from .checklist import Checklist
from .shared import name


def frozen_groups(model) -> list[tuple[str, list[str], int, bool]]:
    """(module, frozen parameter names, count, whole subtree frozen), topmost module first."""
    out = []

    def visit(path, mod):
        ps = list({id(p): p for p in mod.parameters()}.values())
        if ps and not any(p.requires_grad for p in ps):
            out.append((path, [n for n, _ in mod.named_parameters()], sum(p.numel() for p in ps), True))
            return
        direct = [(n, p) for n, p in mod.named_parameters(recurse=False) if not p.requires_grad]
        if direct:
            out.append((path, [n for n, _ in direct], sum(p.numel() for _, p in direct), False))
        for cn, child in mod.named_children():
            visit(f"{path}.{cn}" if path else cn, child)

    visit("", model)
    return out


def check_frozen(model, ck: Checklist) -> list[dict]:
    groups = frozen_groups(model)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    rows = []
    for mod, names, count, whole in groups:
        what = "all parameters" if whole else ", ".join(names)
        if not mod and whole:
            ck.find("frozen", "frozen", "warning", "(root)", f"every parameter of the model is frozen ({count:,})",
                    "set requires_grad=True on the parts you mean to train; an optimizer over them does nothing",
                    verdict="the whole model is frozen")
        else:
            ck.result.add("frozen", "info", name(mod), f"{what} frozen ({count:,} params)",
                          "if this layer should train: for p in module.parameters(): p.requires_grad_(True)")
        rows.append({"module": name(mod), "params": count, "frozen": what})
    frozen_total = sum(r["params"] for r in rows)
    if rows:
        ck.row("frozen", "info", f"{frozen_total:,} of {total:,} params frozen in {len(rows)} module(s)",
               ", ".join(r["module"] for r in rows[:4]) + (" …" if len(rows) > 4 else ""),
               "intended? unfreeze with requires_grad_(True)", "frozen")
    else:
        ck.row("frozen", "ok", f"none ({total:,} params trainable)")
    return rows
