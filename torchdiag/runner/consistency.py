"""Do the ranks hold the same model? Every parameter and buffer is compared across ranks as built
(step 0) and, under DDP or FSDP, after each of STEPS real steps on a train copy; the gradients after
the wrapper's reduction must be identical too. A cheap checksum per tensor is computed on the device,
read back once per comparison and all-gathered; only tensors whose checksums differ are gathered whole
for the exact difference. Under FSDP the parameters and gradients are DTensor shards: each is made
whole (full_tensor) only for its checksum, one at a time, so no rank ever holds the whole model twice.
Runs on every rank (it exchanges data): the result is the same everywhere."""
from __future__ import annotations

from ..core.device import widened

STEPS = 2
BN_STATS = ("running_mean", "running_var")


def check(model, inputs, ctx, sess, how: str) -> dict:
    """{compared, steps, differs: [{name, kind, step, max_abs_diff}], grads_differ, unused_stop, notes}.
    `model` is this rank's unwrapped model; it is only copied."""
    out = {"compared": 0, "steps": 0, "differs": [], "grads_differ": [], "notes": []}
    if how == "ddp":   # DDP neither broadcasts nor reduces these (report.py says so)
        out["ddp_ignored"] = sorted(getattr(model, "_ddp_params_and_buffers_to_ignore", None) or ())
    from ..core.distributed import on_every_rank
    from ..core.train import train_copy

    # trained with the run's optimizer, but under --wrap none only compared as built; made on every rank or none
    work = on_every_rank(lambda: train_copy(model, "to compare ranks after a step",
                                            optimizer=ctx.spec.optimizer if how != "none" else None), ctx.device)
    tensors = _state(work)
    out["compared"] = len(tensors)
    _compare(tensors, 0, "state", sess, out)
    if how == "none":
        for d in out["differs"]:
            d["batchnorm"] = is_bn_stat(work, d["name"])
        out["notes"].append("--wrap none: each rank trains on its own rows without synchronising, so only the "
                            "state as built (step 0) is compared")
        return out
    if how == "fsdp":
        _fsdp_steps(work, inputs, ctx, sess, out)
    else:
        _ddp_steps(work, tensors, inputs, ctx, sess, out)
    for d in out["differs"]:
        d["batchnorm"] = is_bn_stat(work, d["name"])
    return out


def _state(model) -> list[tuple[str, str, object]]:
    """(kind, name, tensor): parameters, then buffers (ties once)."""
    params = [("parameter", n, p) for n, p in model.named_parameters()]
    return params + [("buffer", n, b) for n, b in model.named_buffers()]


def _ddp_steps(work, tensors, inputs, ctx, sess, out) -> None:
    from ..core.distributed import wrap

    wrapped = wrap(work, sess.ranks, "ddp")     # broadcasts rank 0's state: training starts equal
    params = _trainable(work)

    def grads(k):
        if any(sess.all_gather([n for n, p in params if p.grad is None])):   # DDP's next forward would raise
            out["notes"].append(f"step {k}: some parameters got no gradient (see ddp-unused-parameter); steps stopped")
            return None
        return [("grad", n, p.grad) for n, p in params]

    _steps(wrapped, work, tensors, inputs, ctx, sess, out, grads)


def _fsdp_steps(work, inputs, ctx, sess, out) -> None:
    """The copy sharded in place by fully_shard. It broadcasts nothing (each rank keeps its own shard of
    its own values) and keeps buffers as plain tensors each rank updates from its own rows; parameters
    and gradients are compared made whole. Every collective here (the forward's all-gathers, the
    backward's reduce-scatters, full_tensor, agree) is made by every rank in the same order: the lists
    compared are the same on every rank."""
    from ..core.distributed import agree, wrap

    wrap(work, sess.ranks, "fsdp")       # in place: the parameters are now DTensors, the buffers as they were
    params = _trainable(work)

    def grads(k):
        # a gradient FSDP left None (a parameter no rank used) is left out on every rank: full_tensor is a collective
        gone = agree([p.grad is None for _, p in params], ctx.device) if params else []
        return [("grad", n, p.grad) for (n, p), g in zip(params, gone) if not g]

    _steps(work, work, _state(work), inputs, ctx, sess, out, grads)


def _trainable(work) -> list:
    return [(n, p) for n, p in work.named_parameters() if p.requires_grad]


def _steps(call, work, tensors, inputs, ctx, sess, out, grads) -> None:
    """STEPS real steps through `call` (the wrapped `work`): after each backward the gradients `grads(k)`
    names (None: stop) and after each step `tensors` compared across ranks, made whole where sharded."""
    from ..core.distributed import whole
    from ..core.train import backward, step

    optimizer = ctx.optimizer([p for _, p in _trainable(work)])
    loss_fn = ctx.loss()
    for k in range(1, STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = _agreed_loss(call, inputs, ctx, loss_fn, k, out)
        if loss is None:
            return
        backward(loss)
        entries = grads(k)
        if entries is None:
            return
        _compare(entries, k, "grad", sess, out, whole)
        step(optimizer)
        out["steps"] = k
        _compare(tensors, k, "state", sess, out, whole)


def _agreed_loss(call, inputs, ctx, loss_fn, k: int, out):
    """Step k's loss (under --amp, autocast as the run steps), or None on every rank when the forward or
    the loss raised on any rank: that rank would never make the backward's collectives, so no rank
    starts them (one all_reduce over the model's group)."""
    from ..core.distributed import agree
    from ..core.tracking import run_forward

    loss = None
    try:
        with ctx.autocast():
            loss = loss_fn(run_forward(call, inputs, phase=f"forward (cross-rank step {k})"))
    except Exception:   # the command's own passes report the model's errors; here they only stop the steps
        pass
    if agree([loss is None], ctx.device)[0]:
        out["notes"].append(f"step {k}: the forward or the loss raised on some rank (the per-rank findings say "
                            "where); cross-rank steps stopped")
        return None
    return loss


def _compare(entries, k: int, what: str, sess, out, whole=lambda t: t) -> None:
    """Checksums of `entries` on every rank, matched by kind and name; the ones that differ (the same list on every
    rank, since all see the same gathered checksums) gathered whole for the exact difference against rank 0. A tensor
    not on every rank (a layer one rank's factory added) is a difference of its own (_absent): matched by position, a
    sweep's extra layer on rank 1 went unseen and one on rank 0 was an IndexError. `whole(t)`: the tensor to compare
    (FSDP: made whole, in the same order on every rank; its wrapper refuses ranks whose parameters differ)."""
    import torch

    keys = [(kind, name) for kind, name, _ in entries]
    dtypes = [str(t.dtype).replace("torch.", "") for _, _, t in entries]
    sums = torch.stack([_checksum(whole(t)) for _, _, t in entries]).cpu() if entries else torch.zeros(0, 2)
    gathered = sess.all_gather((keys, dtypes, sums.view(torch.int64)))   # one read-back
    everyone = [dict(zip(ks, ss)) for ks, _, ss in gathered]
    if what != "grad":
        _absent(everyone, k, out)
        _other_dtype([dict(zip(ks, ds)) for ks, ds, _ in gathered], k, out)
    common = [key for key in everyone[0] if all(key in d for d in everyone)]
    bad = [key for key in common if any(not torch.equal(d[key], everyone[0][key]) for d in everyone)]
    known = {(d["kind"], d["name"]) for d in out["differs"]} | {("grad", d["name"]) for d in out["grads_differ"]}
    bad = [key for key in bad if key not in known]
    if not bad:
        return
    mine = {(kind, name): t for kind, name, t in entries}
    values = sess.all_gather([whole(mine[key]).detach().float().cpu() for key in bad])
    for j, (kind, name) in enumerate(bad):
        diffs = {r: _max_diff(values[0][j], values[r][j]) for r in range(len(values)) if r}
        row = {"name": name, "kind": kind, "step": k, "max_abs_diff": diffs}
        (out["grads_differ"] if what == "grad" else out["differs"]).append(row)


def _other_dtype(dtypes: list[dict], k: int, out) -> None:
    """A row per tensor every rank has in a dtype not all share (the checksums, in float64, cannot tell a float32
    from a float64 holding the same values: a review), once."""
    known = {(d["kind"], d["name"]) for d in out["differs"]}
    for key, dt in dtypes[0].items():
        if key not in known and all(key in d for d in dtypes) and any(d[key] != dt for d in dtypes):
            out["differs"].append({"name": key[1], "kind": key[0], "step": k, "max_abs_diff": {},
                                   "dtypes": {r: d[key] for r, d in enumerate(dtypes)}})


def _absent(everyone: list[dict], k: int, out) -> None:
    """A row per tensor some ranks do not have, naming them (once: the state as built)."""
    known = {(d["kind"], d["name"]) for d in out["differs"]}
    seen: dict = {}
    for d in everyone:
        seen.update(dict.fromkeys(d))
    for kind, name in seen:
        absent = [r for r, d in enumerate(everyone) if (kind, name) not in d]
        if absent and (kind, name) not in known:
            out["differs"].append({"name": name, "kind": kind, "step": k, "max_abs_diff": {}, "absent_on": absent})


def _checksum(t):
    """Two sums in the device's widest float (float64; float32 on mps), plain and position-weighted (a permutation
    changes the second), as 2 numbers."""
    import torch

    x = widened(t.detach().flatten())
    if x.numel() == 0:
        return torch.zeros(2, dtype=x.dtype, device=x.device)
    w = torch.linspace(1.0, 2.0, x.numel(), dtype=x.dtype, device=x.device)
    return torch.stack([x.sum(), (x * w).sum()])


def _max_diff(a, b):
    """max |a - b| as a float (NaN-safe: a NaN on one side only counts as inf); None for other shapes."""
    import torch

    if a.shape != b.shape:
        return None
    same_nan = torch.isnan(a) & torch.isnan(b)
    d = (a - b).abs().masked_fill(same_nan, 0).nan_to_num(nan=float("inf"))
    return float(d.max()) if d.numel() else 0.0


def is_bn_stat(model, name: str) -> bool:
    """A BatchNorm running statistic (each rank's own batches update it: differing is expected)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    mod_name, _, leaf = name.rpartition(".")
    mod = dict(model.named_modules()).get(mod_name)
    return leaf in BN_STATS + ("num_batches_tracked",) and isinstance(mod, _BatchNorm)
