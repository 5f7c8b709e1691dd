"""A user's script run on every rank under torchrun (watch): each rank runs and watches its own run; at the
end every rank hands rank 0 a record (its Result as data, or its error with the report so far), the same
records and merge as the per-rank commands (runner/merge.py), so rank 0 reports the findings of every rank,
each tagged with the ranks that had it. The gather is one exchange at the end through torchrun's
rendezvous store (core.distributed.gather_to_main), never a collective per step; a rank whose script
failed still hands in its record, a rank that hands in none within the timeout is a rank-failed finding,
and a store that cannot be reached leaves rank 0 its own report with a note. Torch-free at import."""
from __future__ import annotations

import time

from ..errors import DiagError, one_line
from .merge import finish, merge, record


def run_on_ranks(ranks, run, command: str = "watch", others_own: bool = False):
    """`run()` gives this rank's Result or raises (a DiagError carrying the report so far in `partial`).
    Rank 0 gets the merged Result (or its own error, re-raised with the merged report as its partial);
    the other ranks, once their record is handed in, an empty Result with exit 0 (the runner keeps them quiet),
    or with `others_own` (the Python API) their own Result."""
    result, exc = None, None
    try:
        result = run()
        rec = record(ranks.rank, _device(), result.exit_code, result)
    except Exception as e:   # noqa: BLE001 — every rank must reach the gather; re-raised after it
        exc = e
        partial = getattr(e, "partial", None) if isinstance(e, DiagError) else None
        code = e.code if isinstance(e, DiagError) else 4
        message = e.message if isinstance(e, DiagError) else f"internal error in torchdiag: {one_line(e)}"
        rec = record(ranks.rank, _device(), code, partial,
                     {"message": message, "hint": getattr(e, "hint", None), "at": time.time()})
    rec["result"] = None   # the whole document (its per-step series) is not merged: keep what goes through the store small
    from ..core.distributed import gather_to_main

    records, problem = None, None
    try:
        got = gather_to_main(rec, ranks)
        if got is not None:
            records = [r if r is not None else _missing(i) for i, r in enumerate(got[0])]
    except Exception as e:   # the store cannot be reached: each rank keeps its own report and exit code
        problem = one_line(e)
    except KeyboardInterrupt:   # Ctrl-C while rank 0 waits for a slower rank: its own report, said so
        problem = "interrupted while waiting for them"
    if not ranks.main:
        if problem is None and not others_own:   # exit 0 once handed in: torchrun stops every rank when one
            return _handed_in()   # exits non-zero, and rank 0's exit code is the worst over ranks (per-rank commands)
        if exc is not None:
            raise exc
        return result
    own = result if exc is None else getattr(exc, "partial", None)
    merged = _merged(records, own, command, ranks) if records else own
    if problem is not None and merged is not None:
        merged.notes.append(f"the other ranks' reports could not be gathered ({problem}): this is rank 0's alone")
    if exc is not None:
        if isinstance(exc, DiagError):
            exc.partial = merged
        raise exc
    return merged


def _handed_in():
    from ..results import Result

    done = Result("watch")
    done.code = 0
    return done


def _missing(rank: int) -> dict:
    from ..core.distributed import timeout_seconds

    return record(rank, "?", 3, None, {"message": f"rank {rank} handed in no report within {timeout_seconds()} s of rank 0's "
                                                  "end (it died, or its script still runs)",
                                       "hint": "see its own output above; TORCHDIAG_DIST_TIMEOUT sets the wait",
                                       "at": time.time()})


def _merged(records: list[dict], own, command: str, ranks):
    merged = merge(records, own, command)
    merged.data.pop("rank", None)
    merged.header["torchrun"] = (f"{ranks.world_size} ranks, each watching its own run; findings of every rank, "
                                 "tagged [rank N] where not every rank had them")
    finish(merged, records)
    _warn_verdict(merged, records)
    return merged


def _warn_verdict(merged, records: list[dict]) -> None:
    """Rank 0's own PASS does not stand when another rank warned (finish() redoes the verdict for errors only)."""
    warned = sorted({r for f in merged.findings if f.severity == "warning" for r in (f.ranks or [])})
    if warned and (merged.verdict or "").startswith("PASS"):
        n = sum(1 for f in merged.findings if f.severity == "warning")
        where = "" if warned == [r["rank"] for r in records] else f" on rank{'s' if len(warned) > 1 else ''} " \
                                                                  f"{','.join(map(str, warned))}"
        merged.verdict = f"WARN: {n} warning(s){where}"


def _device() -> str:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
