"""The trainable parameters that get no gradient on this rank, by name, with gradflow's cause (never
ran / detached). DDP without find_unused_parameters cannot finish reducing them: its error, at the
next iteration, lists only their indices."""
from __future__ import annotations


def unused_params(model, inputs, ctx) -> list[dict]:
    """One local forward + backward on this rank's shard (core.recording's pass, gradflow's, leaving no trace),
    run before DDP hooks the parameters so no collective starts: [{name, reason, why}]."""
    from ..core.recording import record_pass
    from ..core.unreached import why

    pas = record_pass(model, inputs, None, ctx)
    modules = dict(model.named_modules())
    out = []
    for name, p in model.named_parameters():
        if p.requires_grad and pas.grads.get(name) is None:
            reason, text = why(name, pas.rec, pas.reach, modules)
            out.append({"name": name, "reason": reason, "why": text})
    return out
