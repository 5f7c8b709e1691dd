"""Why a trainable parameter got no gradient, worked out from the recorded forward, not guessed:
its module never ran (unused), ran but none of its outputs reached the loss (detached: `.detach()`,
an integer output, `torch.no_grad()`), or ran and reached the loss without using it."""
from __future__ import annotations

from .module_paths import ancestors, label, owner


def why(name, rec, reach: set[int], modules) -> tuple[str, str]:
    """('unused' | 'detached', explanation) for a trainable parameter that got no gradient."""
    mod = owner(name)
    ran = rec.order
    if mod not in ran:
        # the highest ancestor that never ran either (an unused submodule, not just its leaf)
        top = mod
        for a in ancestors(mod)[1:]:
            if a in ran or a == "":
                break
            top = a
        return "unused", f"module {label(top)} ({type(modules[top]).__name__}) never ran in forward"
    cut = _cut(mod, rec, reach)
    if cut is not None:
        return "detached", _detached(cut, rec)
    kind = rec.types.get(mod) or type(modules[mod]).__name__
    return "unused", (f"module {label(mod)} ({kind}) ran and reached the loss, but this parameter "
                      "was not used (or was detached) in its forward")


def _cut(mod: str, rec, reach: set[int]) -> str | None:
    """The highest ancestor of `mod` that ran and none of whose outputs reached the loss."""
    cut = None
    for a in ancestors(mod):
        if a not in rec.order:
            continue          # containers (ModuleList) are never called themselves
        if any(n is not None and id(n) in reach for n in rec.nodes.get(a, [])):
            break
        cut = a
    return cut


def _detached(cut: str, rec) -> str:
    nodes = rec.nodes.get(cut, [])
    ckind = rec.types.get(cut, "")
    if not nodes:
        return (f"module {label(cut)} ({ckind}) ran but returned no floating-point tensor "
                "(argmax, a cast to int, a comparison): no gradient flows through an integer output")
    if all(n is None for n in nodes):
        if not rec.grad_enabled.get(cut, True):
            return f"module {label(cut)} ({ckind}) ran under torch.no_grad()"
        return (f"module {label(cut)} ({ckind}) ran but its output carried no autograd graph "
                "(detached or computed under no_grad inside its forward)")
    return (f"module {label(cut)} ({ckind}) ran but its output never reached the loss "
            "(.detach(), a cast to int, or a non-differentiable op after it)")
