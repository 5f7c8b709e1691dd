"""The ranks' records (plain dicts, gathered on rank 0) made into one Result: findings are the union
over ranks, each tagged with the ranks that had it; the exit code is the worst over ranks. Torch-free."""
from __future__ import annotations

import re

from ..results import Column, Finding, Result, Table

RANK_KEYS = ("rank", "batch_shard")          # per-rank header entries: in the ranks list, not the merged header


def record(rank: int, device: str, code: int, result: Result | None = None, error: dict | None = None,
           header: dict | None = None, **extra) -> dict:
    """What one rank hands to rank 0: plain data (JSON or pickle), and small (the command's data, not its tables)."""
    doc = result.to_dict() if result is not None else None
    return {"rank": rank, "device": device, "exit_code": int(code),
            "header": dict(result.header if result is not None else header or {}),
            "findings": [f.to_dict() for f in result.findings] if result is not None else [],
            "data": dict(result.data) if result is not None else {},
            "error": error, "result": doc, **extra}


def merge(records: list[dict], base: Result | None, command: str, unwrap: str = "") -> Result:
    """One Result for all ranks. `base` is rank 0's own Result (its tables and files), when it has one.
    `unwrap`: the prefix a wrapper puts before the user's names (DDP's "module."), taken off findings."""
    merged = base if base is not None else Result(command, header=_header(records))
    for key in RANK_KEYS:
        merged.header.pop(key, None)
    merged.findings = union(records)
    if unwrap:
        for f in merged.findings:
            _unwrap(f, unwrap)
    # ranks that failed alike are said once, with their ranks (a sweep: FSDP2's refusal under watch, twice)
    # (messages that differ only in their numbers, each rank's shard's shape, are alike: a review)
    alike: dict[tuple, list[dict]] = {}
    for r in records:
        if r["error"]:
            key = (re.sub(r"\d+", "#", r["error"]["message"]), r["error"].get("hint"))
            alike.setdefault(key, []).append(r)
    for group in alike.values():
        ranks, error = [r["rank"] for r in group], group[0]["error"]
        numbers = len({r["error"]["message"] for r in group}) > 1
        merged.add("rank-failed", "error", "", f"[{tag(ranks)}] {error['message']}"
                   + (f" (rank {ranks[0]}'s numbers; each rank's own in --json `ranks`)" if numbers else ""),
                   error.get("hint"))
        merged.findings[-1].ranks = ranks
    merged.data["world_size"] = len(records)
    merged.tables.insert(0, rank_table(records))
    worst = max(r["exit_code"] for r in records)
    if worst != int(merged.exit_code):
        merged.code = worst
    if base is not None:
        merged.notes.append("the tables after Ranks and the summary are rank 0's; --json has every rank's data and "
                            "findings in `ranks`")
    return merged


def rank_table(records: list[dict]) -> Table:
    """JSON `ranks`: each rank's record (header, findings, data, error); the console shows one line per rank."""
    rows = []
    for r in records:
        row = {k: v for k, v in r.items() if k != "result"}
        row["_shard"] = r["header"].get("batch_shard", "")
        row["_findings"] = len(r["findings"])
        row["_error"] = r["error"]["message"] if r["error"] else ""
        rows.append(row)
    return Table("ranks", "Ranks", [Column("rank", "rank", "int"), Column("device", "device"), Column("_shard", "rows"),
                                    Column("exit_code", "exit", "int"), Column("_findings", "findings", "count"),
                                    Column("_error", "error")], rows)


def finish(merged: Result, records: list[dict]) -> None:
    """The verdict, once every finding is in (the generic merge, the cross-rank findings, the command's hook)."""
    from .report import CROSS_RANK

    cross = sum(1 for f in merged.findings if f.code in CROSS_RANK)
    table = next((t for t in merged.tables if t.key == "ranks"), None)
    if cross and table is not None:   # a sweep: both rows said 0 findings above a FAIL: rank-divergence
        table.note = (f"findings counts each rank's own; {cross} more come from comparing the ranks "
                      "(below, named for every rank)")
    _verdict(merged, records)
    failed = [str(r["rank"]) for r in records if r["error"]]
    if failed:
        # "ended with an error", not "did not finish": a script's run can end before its report is refused
        merged.verdict = f"FAIL: rank(s) {', '.join(failed)} ended with an error" + (f"; {merged.verdict}" if merged.verdict else "")


def _verdict(merged: Result, records: list[dict]) -> None:
    """Over every rank: rank 0's own verdict does not stand when another rank (or the cross-rank check)
    found an error."""
    bad = [f for f in merged.findings if f.severity == "error"]
    if not bad:
        return
    ranks = sorted({r for f in bad for r in (f.ranks or [])})
    where = "" if ranks == [r["rank"] for r in records] else f" on {tag(ranks)}"
    merged.verdict = f"FAIL{where}: {', '.join(sorted({f.code for f in bad}))}"


def union(records: list[dict]) -> list[Finding]:
    """Each distinct finding (code, severity, where) once, with the ranks that reported it; named by rank in
    its message when not every rank had it. Ranks whose messages differ only in their numbers (each its own
    rows) give one finding with the first rank's message, said so."""
    seen: dict[tuple, Finding] = {}
    texts: dict[tuple, set] = {}
    everyone = [r["rank"] for r in records]
    for r in records:
        for f in r["findings"]:
            key = (f["code"], f["severity"], f["where"])
            if key not in seen:
                seen[key] = Finding(f["code"], f["severity"], f["where"], f["message"], f.get("hint"),
                                    members=f.get("members"))
                seen[key].ranks = []
                texts[key] = set()
            seen[key].ranks.append(r["rank"])
            texts[key].add(f["message"])
    for key, f in seen.items():
        if len(texts[key]) > 1:
            f.message += f" (rank {f.ranks[0]}'s numbers; each rank's own in --json `ranks`)"
        if f.ranks != everyone:
            f.message = f"[{tag(f.ranks)}] {f.message}"
    return list(seen.values())


def tag(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def _header(records: list[dict]) -> dict:
    """The merged header when rank 0 has no Result: the first header any rank has."""
    for r in records:
        if r["header"]:
            return {k: v for k, v in r["header"].items() if k not in RANK_KEYS}
    return {}


def _unwrap(f: Finding, prefix: str) -> None:
    """`module.body.1` → `body.1` in where, and where the message names the same path."""
    if f.where == prefix.rstrip("."):
        f.where = "(root)"
    elif f.where.startswith(prefix):
        bare = f.where[len(prefix):]
        f.message = f.message.replace(f.where, bare)
        f.where = bare
