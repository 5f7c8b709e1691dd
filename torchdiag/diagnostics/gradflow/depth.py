"""Does the gradient grow through the model's depth? An exploding gradient grows from block to block as it goes
back through repeated blocks (a 30-layer MLP at twice the default gain: 2.2e4 over its run). A large gradient
that torchdiag's own made-up loss gives (an MSE of a latent of std 7.8 against a unit target, cross-entropy read
off hidden states of std 9: the zoo's mimi, pocket_tts and gemma4 vision towers) is as large at the first block
as at the last: its size is the loss's scale, which the user's loss does not share (a sweep: at the output's own
scale nothing was flagged).

Measured on a copy, one forward and backward, only when an exploding-grad verdict is left after the other
re-checks: for each run of at least MIN_RUN sibling modules of one class and one set of parameter shapes,
each called once, each on an input of its own (parallel heads on one input are not a depth), the RMS of the
loss's gradient at each member's output. Growth: the largest ratio of an earlier member's to a later one's
(a gradient flows back from the last). None without such a run: the verdict stays."""
from __future__ import annotations

from dataclasses import dataclass

MIN_RUN = 3
GROWS = 10.0    # healthy models tried: at most 3.0 (a prototype's sweep: vit_tiny, convnext_atto, the six rows)
MODEST = 1e3    # the made-up loss at most this: an output within ~30x of the unit target's scale (mimi: 65.6, gemma4's
#                 cross-entropy 20.7); a head initialised 1e4x too large makes the same flat gradient with an output
#                 far off any target's scale, which is a fault of its own


@dataclass
class Growth:
    factor: float    # the largest growth over any run
    run: str         # the parent of the run it was found in ("" the root), and its length
    length: int
    runs: int        # runs measured
    made_up: bool    # the loss was torchdiag's own against a target it drew (not the user's, nor the model's own)
    loss: float      # its value


def runs(model) -> list[tuple[str, list[str]]]:
    """(parent path, member paths) of each run of MIN_RUN or more consecutive children of one class and the same
    parameter names and shapes (a ModuleList of transformer layers, a Sequential of blocks)."""
    out = []
    for parent, mod in model.named_modules():
        run: list[str] = []
        key = None
        for name, child in mod.named_children():
            k = (type(child), tuple((n, tuple(p.shape)) for n, p in child.named_parameters()))
            if k != key or not k[1]:
                if len(run) >= MIN_RUN:
                    out.append((parent, run))
                run, key = [], k
            run.append(f"{parent}.{name}" if parent else name)
        if len(run) >= MIN_RUN:
            out.append((parent, run))
    return out


def growth(model, inputs, ctx, prepare) -> Growth | None:
    """The gradient's largest growth through a run of sibling blocks, on a fresh copy (see the module doc)."""
    import torch

    from ...core.gates import fresh_copy
    from ...core.readback import read_back
    from ...core.recording import float_tensors
    from ...core.tracking import run_forward

    work = fresh_copy(model, ctx, prepare=prepare)
    found = runs(work)
    if not found:
        return None
    modules = dict(work.named_modules())
    seen: dict[str, list] = {}   # path -> [its input's id, its output tensor], at its first call; None when called again
    handles = []

    def hook(mod, args, out, path):
        if path in seen:
            seen[path] = None
            return
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        outs = [t for t in float_tensors(out) if t.requires_grad]
        seen[path] = [id(first) if first is not None else None, outs[0] if outs else None]
        if outs:
            outs[0].retain_grad()

    for _, members in found:
        for p in members:
            handles.append(modules[p].register_forward_hook(lambda m, a, o, p=p: hook(m, a, o, p)))
    loss_fn = ctx.loss()
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = loss_fn(run_forward(work, inputs, phase="forward (re-check of the gradient's growth)"))
    finally:
        for h in handles:
            h.remove()
    loss.backward()
    measured = [(parent, members) for parent, members in found if _sequential(members, seen)]
    *rms, value = read_back([seen[p][1].grad.double().pow(2).mean().sqrt() for _, ms in measured for p in ms] + [loss])
    best, where, k = None, "", 0
    for parent, members in measured:
        g, rms = rms[:len(members)], rms[len(members):]
        run_growth = max(g[i] / g[j] for i in range(len(g)) for j in range(i + 1, len(g)) if g[j] > 0) \
            if any(v > 0 for v in g) else 1.0
        if best is None or run_growth > best:
            best, where, k = run_growth, parent, len(members)
    made_up = bool(loss_fn.made_target) and loss_fn.custom is None
    return Growth(best, where, k, len(measured), made_up, value) if best is not None else None


def _sequential(members: list[str], seen: dict) -> bool:
    """Each member called once, with a gradient at its output, and on an input of its own."""
    calls = [c for p in members if (c := seen.get(p)) is not None and c[1] is not None and c[1].grad is not None]
    return len(calls) == len(members) and len({c[0] for c in calls}) == len(calls)
