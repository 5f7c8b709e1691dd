"""profile under torchrun: time in collectives vs compute per rank, and the straggler.

What the numbers mean (per rank, per active step, averaged over the active steps):
- step time: wall-clock time of one step on that rank (what profile measures without torchrun);
- collective time: wall-clock time during which at least one collective was in flight on that rank
  (the union of the profiler's collective ranges on every thread and stream: gloo runs its collectives
  on its own threads, NCCL on its own kernels), waiting for the other ranks included;
- compute time: step time minus collective time (compute that overlaps a collective counts as
  collective time, so this is a lower bound of the rank's own work).

Under DDP a slow rank does not have the longest step: the others wait for it inside the gradient
allreduce, so every rank's step time is about the same and the wait shows as collective time on the
fast ranks. So the straggler is the rank with the most compute time (the one the others wait for),
and its lag is its compute time minus the fastest rank's (and minus the median). Without collectives
(`--wrap none`), compute time is the step time and the same definition holds. It is a warning only when
the lag is consistent and material in every active step, not on average: on a busy machine the OS
deschedules one rank or another for milliseconds, a few steps at a time, which inflates a mean but leaves
steps where that rank is not behind. So its smallest lag over the others' median in any active step must
be at least 1 ms, 20% of the others' compute, 10% of the step time, and more than the others' own
step-to-step spread (how far a healthy rank's compute wanders by itself).

Two halves: `collectives(events)` runs on each rank from its profiler events (data only, in
`result.data["collectives"]`); `merge_ranks(results, merged)` runs on rank 0 over every rank's JSON
document (stdlib only)."""
from __future__ import annotations

from ...results import Column, Table
from .stats import percentile

# the profiler's names for collective work: gloo's and NCCL's own ranges, c10d's ops, NCCL kernels
_PREFIXES = ("gloo:", "nccl:", "c10d::", "ncclkernel", "nccldevkernel", "record_param_comms")
STRAGGLER_PCT = 0.2        # a warning when the slowest rank's compute is 20% above the median's
STRAGGLER_MIN_MS = 1.0     # ... and at least 1 ms: a few µs on a tiny model is noise
STRAGGLER_STEP_PCT = 0.1   # ... and, in every step, at least 10% of the median step time


def is_collective(name: str) -> bool:
    return name.lower().startswith(_PREFIXES)


def collectives(events) -> dict:
    """From one rank's profiler events (active steps only): {"time_us": wall time with a collective
    in flight, "per_step_us": the same inside each profiler step, "ops": [{"op", "calls", "time_us"}]
    (each op's own summed duration, longest first)}."""
    spans, ops, steps = [], {}, []
    for e in events:
        start, end = float(e.time_range.start), float(e.time_range.end)
        if e.name.startswith("ProfilerStep"):      # "ProfilerStep*" in events() (torch 2.13)
            steps.append((start, end))
        if not is_collective(e.name):
            continue
        spans.append((start, end))
        op = ops.setdefault(e.name, {"op": e.name, "calls": 0, "time_us": 0.0})
        op["calls"] += 1
        op["time_us"] += end - start
    rows = sorted(ops.values(), key=lambda r: (-r["time_us"], r["op"]))
    for r in rows:
        r["time_us"] = round(r["time_us"], 3)
    per_step = [round(union_us([(max(a, s), min(b, e)) for a, b in spans if a < e and b > s]), 3) for s, e in sorted(steps)]
    return {"time_us": round(union_us(spans), 3), "per_step_us": per_step, "ops": rows}


def union_us(spans) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def rank_times(doc: dict) -> dict:
    """One rank's step, collective and compute time per active step (ms, means) from its JSON document,
    and its compute in each active step when the profiler's steps line up with the timed ones."""
    step = float(doc["step_time_ms"]["mean"])
    steps = int(doc.get("active_steps") or 1)
    coll_doc = doc.get("collectives") or {}
    coll = float(coll_doc.get("time_us", 0.0)) / 1e3 / steps
    coll = min(coll, step)     # the union is inside the active steps; rounding must not make compute < 0
    out = {"step_ms": step, "collective_ms": coll, "compute_ms": step - coll,
           "collective_share": coll / step if step > 0 else 0.0}
    timed = (doc.get("step_times_ms") or [])[-steps:]
    per_step = coll_doc.get("per_step_us", [0.0] * steps if not coll_doc else None)
    if len(timed) == steps and per_step is not None and len(per_step) == steps:
        out["compute_steps_ms"] = [max(t - c / 1e3, 0.0) for t, c in zip(timed, per_step)]
    return out


def slowest_in(rows: list[dict], rank: int) -> tuple[int, int] | None:
    """(steps in which `rank` had the most compute, steps compared), None without per-step times."""
    series = [r.get("compute_steps_ms") for r in rows]
    if any(s is None for s in series) or len({len(s) for s in series}) != 1:
        return None
    n = len(series[0])
    wins = sum(1 for i in range(n) if max(rows, key=lambda r: (r["compute_steps_ms"][i], -r["rank"]))["rank"] == rank)
    return wins, n


def straggler(rows: list[dict]) -> dict:
    """The rank with the most compute time per step, and its lag behind the fastest rank and the median
    (rows: {"rank", "compute_ms"}; ties go to the lowest rank)."""
    slow = max(rows, key=lambda r: (r["compute_ms"], -r["rank"]))
    fast = min(rows, key=lambda r: (r["compute_ms"], r["rank"]))
    median = percentile([r["compute_ms"] for r in rows], 50)
    lag, lag_med = slow["compute_ms"] - fast["compute_ms"], slow["compute_ms"] - median
    steps = slowest_in(rows, slow["rank"])
    return {"rank": slow["rank"], "compute_ms": slow["compute_ms"], "fastest_rank": fast["rank"],
            "slowest_steps": steps[0] if steps else None, "steps": steps[1] if steps else None,
            "fastest_compute_ms": fast["compute_ms"], "median_compute_ms": median,
            "lag_ms": lag, "lag_pct": lag / fast["compute_ms"] if fast["compute_ms"] > 0 else None,
            "lag_vs_median_ms": lag_med, "lag_vs_median_pct": lag_med / median if median > 0 else None,
            "median_step_ms": percentile([r["step_ms"] for r in rows], 50), **step_lags(rows, slow["rank"])}


def step_lags(rows: list[dict], rank: int) -> dict:
    """Per active step, `rank`'s compute minus the median of the other ranks' compute in that step:
    {"min_step_lag_ms": the smallest, "others_compute_ms": the others' median compute per step,
    "others_spread_ms": the median over the other ranks of (max - min) of their own per-step compute}.
    All None without per-step times (or without another rank)."""
    mine = next(r for r in rows if r["rank"] == rank).get("compute_steps_ms")
    others = [r.get("compute_steps_ms") for r in rows if r["rank"] != rank]
    if not mine or not others or any(o is None or len(o) != len(mine) for o in others):
        return {"min_step_lag_ms": None, "others_compute_ms": None, "others_spread_ms": None}
    lags = [mine[i] - percentile([o[i] for o in others], 50) for i in range(len(mine))]
    return {"min_step_lag_ms": min(lags),
            "others_compute_ms": percentile([sum(o) / len(o) for o in others], 50),
            "others_spread_ms": percentile([max(o) - min(o) for o in others], 50)}


def rank_docs(results: list[dict]) -> list[dict]:
    """Each rank's JSON document with its "rank" (and "trace": the file that rank wrote, from its
    record's "files"): from the gathered records ({"rank", "result": doc, "files"}) or from documents
    themselves; a rank that failed (no document) is left out."""
    out = []
    for i, r in enumerate(results):
        doc = r.get("result") if "result" in r else r
        if doc:
            trace = (r.get("files") or {}).get("trace") or doc.get("trace")
            out.append({**doc, "rank": r.get("rank", i), **({"trace": trace} if trace else {})})
    return out


def merge_ranks(results: list[dict], merged) -> None:
    """rank 0's hook: the per-rank timing table, the straggler (data, summary line, a warning when it
    holds the others back), and each rank's trace file."""
    rows = []
    for doc in rank_docs(results):
        row = {"rank": doc["rank"], **rank_times(doc)}
        if doc.get("trace"):
            row["trace"] = doc["trace"]
        rows.append(row)
    if not rows:
        return
    slow = straggler(rows)
    for r in rows:
        r["lag_ms"] = r["compute_ms"] - slow["fastest_compute_ms"]
        if r["rank"] == slow["rank"] and _holds_back(slow):
            r["_style"] = "bold"
    merged.data["straggler"] = _rounded(slow)
    if any("trace" in r for r in rows):
        merged.data["traces"] = [r.get("trace") for r in rows]
    merged.tables.append(_table(rows))
    # the step-time lines above are rank 0's own: say so; every rank's is in the table
    merged.summary = [(f"{k} (rank 0)" if k in ("Step time", "Throughput") else k, v) for k, v in merged.summary]
    merged.summary.append(("Straggler", f"rank {slow['rank']}: {straggler_line(slow)}"))
    if _holds_back(slow):
        waits = ("the other ranks wait for it in every collective" if any(r["collective_ms"] > 0 for r in rows)
                 else "no collective ran here, but in data-parallel training the other ranks would wait for it")
        found = merged.add("straggler", "warning", f"rank {slow['rank']}", straggler_line(slow),
                           hint=f"{waits}: look at its trace and its shard of the data (sizes, workers), or at what "
                                "else runs on its device")
        found.ranks = [slow["rank"]]


def _holds_back(s: dict) -> bool:
    """Well above the median on average and, when per-step times exist, behind in every active step by a
    lag that matters (1 ms, 20% of the others' compute, 10% of the step) and that the others' own
    step-to-step spread does not explain: descheduling noise comes and goes, a straggler does not."""
    pct = s["lag_vs_median_pct"]
    if pct is None or pct < STRAGGLER_PCT or s["lag_vs_median_ms"] < STRAGGLER_MIN_MS:
        return False
    floor = s.get("min_step_lag_ms")
    if floor is None:      # no per-step times: the means alone
        return s.get("steps") is None or s["slowest_steps"] == s["steps"]
    material = max(STRAGGLER_MIN_MS, STRAGGLER_PCT * s["others_compute_ms"], STRAGGLER_STEP_PCT * s["median_step_ms"])
    return s["slowest_steps"] == s["steps"] and floor >= material and floor > s["others_spread_ms"]


def straggler_line(s: dict) -> str:
    def pct(v):
        return "" if v is None else f" ({100 * v:+.0f}%)"

    return (f"{s['compute_ms']:.2f} ms of compute per step, {s['lag_ms']:+.2f} ms{pct(s['lag_pct'])} "
            f"vs the fastest (rank {s['fastest_rank']}), {s['lag_vs_median_ms']:+.2f} ms"
            f"{pct(s['lag_vs_median_pct'])} vs the median"
            + (f"; the slowest in {s['slowest_steps']} of {s['steps']} steps" if s.get("steps") else "")
            + (f"; smallest lag in one step {s['min_step_lag_ms']:+.2f} ms (the others' own compute varies by "
               f"{s['others_spread_ms']:.2f} ms across steps)" if s.get("min_step_lag_ms") is not None else ""))


def _rounded(d: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def _table(rows: list[dict]) -> Table:
    for r in rows:
        for k in ("step_ms", "collective_ms", "compute_ms", "lag_ms", "collective_share"):
            r[k] = round(r[k], 4)
        if "compute_steps_ms" in r:
            r["compute_steps_ms"] = [round(v, 4) for v in r["compute_steps_ms"]]
    cols = [Column("rank", "rank", "int"), Column("step_ms", "step", "float", "ms"),
            Column("compute_ms", "compute", "float", "ms"), Column("collective_ms", "in collectives", "float", "ms"),
            Column("collective_share", "%", "pct"), Column("lag_ms", "lag", "float", "ms")]
    if any("trace" in r for r in rows):
        cols.append(Column("trace", "trace"))
    return Table("rank_times", "Time per rank (per active step)", cols, rows,
                 note="step: wall clock; in collectives: time with a collective in flight (waiting for other ranks "
                      "included); compute: step minus that; lag: compute minus the fastest rank's")


def record_collectives(result, events) -> None:
    """On each rank under torchrun: the time in collectives, from this rank's profiler events, into
    `result.data["collectives"]` (what merge_ranks reads). Nothing outside a process group, so a plain
    run's document is unchanged."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        result.data["collectives"] = collectives(events)
