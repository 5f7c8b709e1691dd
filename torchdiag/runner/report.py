"""Findings only several ranks together can show, added to the merged Result on rank 0: state that
differs across ranks (consistency.py), gradients that differ after reduction, and parameters DDP
cannot reduce because a rank gives them no gradient (unused.py). Torch-free."""
from __future__ import annotations

from .merge import tag

# the findings only the ranks together show (not one rank's: the Ranks table's per-rank counts leave them out)
CROSS_RANK = ("batchnorm-stats-differ", "ddp-unused-parameter", "rank-buffer-differs", "rank-check-failed",
              "rank-divergence", "rank-grads-differ", "rank-init-differs")

SYNC_BN_HINT = ("to normalise with the statistics of the whole global batch, convert the model with "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping it")


def add_rank_findings(merged, records: list[dict], wrap: str) -> None:
    everyone = [r["rank"] for r in records]
    cons = records[0].get("consistency")
    if cons:
        _consistency(merged, cons, wrap, everyone)
    if wrap == "ddp":
        _unused(merged, records)


def _consistency(merged, cons: dict, wrap: str, everyone: list[int]) -> None:
    merged.data["consistency"] = cons
    merged.notes.extend(cons.get("notes", []))
    if cons.get("error"):
        merged.add("rank-check-failed", "warning", "", cons["error"])
        return
    unreduced = {d["name"] for d in cons["grads_differ"]}
    ignored = set(cons.get("ddp_ignored") or ())   # the model's _ddp_params_and_buffers_to_ignore
    stats = [d for d in cons["differs"] if d.get("batchnorm")]
    if stats:   # one finding: a healthy ResNet-50 has 106 such buffers, all for the same reason
        _batchnorm_stats(merged, stats).ranks = list(everyone)
    for d in cons["differs"]:
        if not d.get("batchnorm"):
            f = _differs(merged, d, wrap, d["name"] in unreduced, d["name"] in ignored)
            f.ranks = list(everyone)
    reduction = REDUCTION.get(wrap, "the reduction")
    for d in cons["grads_differ"]:
        f = merged.add("rank-grads-differ", "error", d["name"],
                       f"the gradient of {d['name']} after {reduction} differs across ranks at step {d['step']} "
                       f"({_diffs(d)})", f"{reduction} does not cover it (a parameter DDP was told to ignore, or one "
                       "added after wrapping) or a hook changes it after the reduction; reduced gradients must be equal "
                       "on every rank")
        f.ranks = list(everyone)


REDUCTION = {"ddp": "DDP's reduction", "fsdp": "FSDP's reduce-scatter"}
MAX_NAMED = 6


def _batchnorm_stats(merged, stats: list[dict]):
    """BatchNorm running statistics that differ (each rank updates them from its own rows): one info
    finding naming the modules, at the module they share."""
    modules = list(dict.fromkeys(d["name"].rpartition(".")[0] for d in stats))
    shown = ", ".join(m or "(root)" for m in modules[:MAX_NAMED]) + (f", … {len(modules) - MAX_NAMED} more"
                                                                     if len(modules) > MAX_NAMED else "")
    worst = max(stats, key=lambda d: max((v for v in d["max_abs_diff"].values() if v is not None), default=0.0))
    first = min(d["step"] for d in stats)
    where = modules[0] if len(modules) == 1 else _common([d["name"] for d in stats])
    return merged.add("batchnorm-stats-differ", "info", where,
                      f"BatchNorm running statistics differ across ranks from step {first} in {len(modules)} "
                      f"module(s) ({shown}): each rank updates them from its own rows (largest: {worst['name']}, "
                      f"{_diffs(worst)})", SYNC_BN_HINT)


def _differs(merged, d: dict, wrap: str, unreduced: bool = False, ignored: bool = False):
    what = f"{d['kind']} {d['name']}"
    if d.get("absent_on"):
        return merged.add("rank-divergence", "error", d["name"],
                          f"{what} is not on every rank (absent on {tag(d['absent_on'])}, step {d['step']}): the ranks "
                          "built different models", "every rank must build the same model: look for code in the factory "
                          "that depends on the rank (RANK, LOCAL_RANK) or on what each machine has")
    if d.get("dtypes"):
        held = ", ".join(f"rank {r}: {t}" for r, t in sorted(d["dtypes"].items(), key=lambda kv: int(kv[0])))
        return merged.add("rank-divergence", "error", d["name"],
                          f"{what} is not of one dtype on every rank ({held}, step {d['step']}): the ranks built "
                          "different models", "every rank must build the same model: look for a cast or a default "
                          "dtype in the factory that depends on the rank or on what each machine has")
    if d["step"] == 0 and wrap == "ddp" and (ignored or unreduced):
        return _not_broadcast(merged, d, what, ignored)
    if d["step"] > 0 and wrap == "ddp" and d["kind"] == "buffer" and not ignored:
        # DDP (broadcast_buffers, its default) puts rank 0's buffers on every rank at each forward: a buffer each
        # rank updates from its own rows is rank 0's in training, as BatchNorm's statistics are (a sweep: an EMA of
        # the batch mean was a rank-divergence error)
        return merged.add("rank-buffer-differs", "info", d["name"],
                          f"{what} differs across ranks from step {d['step']} ({_diffs(d)}): each rank updates it from "
                          "its own rows or code, and DDP broadcasts rank 0's buffers at every forward, so training uses "
                          "rank 0's; a checkpoint saved on another rank holds that rank's",
                          "save checkpoints from rank 0; if every rank's rows should count, reduce the buffer yourself "
                          "(as SyncBatchNorm does for its statistics)")
    if d["step"] == 0 and wrap == "ddp":
        return merged.add("rank-init-differs", "info", d["name"],
                          f"{what} differs across ranks as built ({_diffs(d)}); DDP broadcasts rank 0's value when "
                          "it wraps the model, so training starts equal",
                          "seed the RNG the same way on every rank before building the model if ranks must agree without DDP")
    if d["step"] == 0:
        hint = "each rank built it differently: seed the RNG the same way on every rank before building, or load one checkpoint"
    elif unreduced:
        hint = (f"its gradient is not the same on every rank after {REDUCTION.get(wrap, 'the reduction')} (see "
                "rank-grads-differ), so each rank steps it its own way")
    elif wrap == "fsdp" and d["kind"] == "buffer":
        hint = ("each rank updates this buffer from its own rows or code that depends on the rank; FSDP shards and "
                "synchronises parameters only, never buffers")
    else:
        hint = ("something changes it outside autograd on some ranks (an in-place update under no_grad, code that depends "
                "on the rank); DDP keeps only the gradients in sync")
    return merged.add("rank-divergence", "error", d["name"],
                      f"{what} differs across ranks from step {d['step']} (step 0 = as built; {_diffs(d)})", hint)


def _not_broadcast(merged, d: dict, what: str, ignored: bool):
    """Differs as built, and DDP does not make it equal: DDP broadcasts at wrap time only what it does not
    ignore (torch.distributed.utils._sync_module_states skips _ddp_params_and_buffers_to_ignore)."""
    if ignored:
        why = ("DDP was told to ignore it (_ddp_params_and_buffers_to_ignore), so it never broadcasts rank 0's value "
               "and each rank trains its own from the start")
    else:   # its gradient is not reduced either: ignored, or added after wrapping; steps part it anyway
        why = ("its gradient is not the same on every rank after DDP's reduction either (see rank-grads-differ), so "
               "whatever DDP did at wrap time each rank steps it its own way")
    seed = "seed the RNG the same way on every rank before building the model (or load one checkpoint)"
    hint = (f"{seed}, or broadcast it yourself (torch.distributed.broadcast) before training: DDP will not" if ignored
            else f"{seed}; the gradient is what parts the ranks during training: see rank-grads-differ")
    return merged.add("rank-divergence", "error", d["name"],
                      f"{what} differs across ranks as built (step 0; {_diffs(d)}): {why}", hint)


def _diffs(d: dict) -> str:
    parts = [f"rank {r}: {v:.3g}" if v is not None else f"rank {r}: other shape"
             for r, v in sorted(d["max_abs_diff"].items(), key=lambda kv: int(kv[0]))]
    return "max |Δ| against rank 0: " + ", ".join(parts)


def _unused(merged, records: list[dict]) -> None:
    """One finding per cause (and set of ranks) of parameters that got no gradient, naming them."""
    for names, ranks, u in unused_groups(records):
        where = names[0] if len(names) == 1 else _common(names)
        on = "" if ranks == [r["rank"] for r in records] else f" on {tag(ranks)}"
        f = merged.add("ddp-unused-parameter", "error", where,
                       f"{_prefix(ranks, records)}{len(names)} parameter(s) got no gradient{on} ({', '.join(names)}) — "
                       f"{u['reason']}: {u['why']}; DDP (find_unused_parameters=False) cannot finish reducing them and "
                       "fails at the next iteration", UNUSED_HINT)
        f.ranks = ranks


def unused_hint(records: list[dict]) -> str | None:
    """The hint of a run every rank failed, when DDP met parameters without a gradient: their names and why."""
    groups = unused_groups(records)
    if not groups:
        return None
    parts = [f"{', '.join(names)} ({u['reason']}: {u['why']}{'' if _prefix(ranks, records) == '' else ' on ' + tag(ranks)})"
             for names, ranks, u in groups]
    return "parameters that got no gradient under DDP: " + "; ".join(parts) + "; " + UNUSED_HINT


UNUSED_HINT = "pass find_unused_parameters=True to DistributedDataParallel, or remove or freeze the parameters"


def unused_groups(records: list[dict]) -> list[tuple[list[str], list[int], dict]]:
    """(names, ranks, first entry) per (reason, why, ranks where the parameter got no gradient)."""
    ranks_of: dict[str, list[int]] = {}
    entry: dict[str, dict] = {}
    for r in records:
        for u in r.get("unused") or []:
            ranks_of.setdefault(u["name"], []).append(r["rank"])
            entry.setdefault(u["name"], u)
    groups: dict[tuple, list[str]] = {}
    for name, ranks in ranks_of.items():
        groups.setdefault((entry[name]["reason"], entry[name]["why"], tuple(ranks)), []).append(name)
    return [(names, list(key[2]), entry[names[0]]) for key, names in groups.items()]


def _prefix(ranks: list[int], records: list[dict]) -> str:
    return "" if ranks == [r["rank"] for r in records] else f"[{tag(ranks)}] "


def _common(names: list[str]) -> str:
    from ..core.repeats import common_path

    return common_path(names) or "(root)"
