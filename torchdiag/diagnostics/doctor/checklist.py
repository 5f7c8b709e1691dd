"""The checklist: one row per check (check, result, verdict, where, hint) and the findings behind it.

Checks only set a status; how a status looks on the console is decided once, in `Checklist.table`."""
from __future__ import annotations

from ...results import Column, Result, Table

CHECK_TITLES = {
    "device": "devices",
    "inplace": "in-place/autograd",
    "modes": "train/eval modes",
    "batchnorm": "BatchNorm",
    "determinism": "eval determinism",
    "update": "params update",
    "frozen": "frozen params",
    "dtype": "dtypes",
    "inputs": "inputs",
    "target": "class targets",
}
VALUE_CHECKS = ("inplace", "modes", "batchnorm", "determinism", "update", "target")   # need a forward that runs
SEVERITY_ORDER = {"ok": 0, "skipped": 0, "info": 1, "warning": 2, "error": 3}
STYLES = {"error": "bold red", "warning": "yellow", "skipped": "dim"}   # status -> console row style


class Checklist:
    def __init__(self, result: Result):
        self.result = result
        self.rows: dict[str, dict] = {}
        self.wheres: dict[str, list[str]] = {}   # check -> every culprit of its current verdict
        self.suspects: set[str] = set()          # modules the device/dtype checks blame (error level)

    def row(self, check: str, status: str, verdict: str, where: str = "", hint: str = "", code: str = "") -> None:
        """One line per check; a later call for the same check replaces a less severe verdict."""
        old = self.rows.get(check)
        if old is not None and SEVERITY_ORDER[old["status"]] > SEVERITY_ORDER[status]:
            return
        if old is not None and old["status"] == status and old["code"] == code and code and where:
            wheres = self.wheres[check] + [where]   # several culprits of one kind: list them
            shown = ", ".join(wheres[:3]) + (f" (+{len(wheres) - 3} more)" if len(wheres) > 3 else "")
            old.update(where=shown, verdict=verdict)
            self.wheres[check] = wheres
            return
        self.rows[check] = {"check": CHECK_TITLES[check], "id": check, "status": status, "code": code,
                            "verdict": verdict, "where": where, "hint": hint}
        self.wheres[check] = [where] if where else []

    def find(self, check: str, code: str, severity: str, where: str, message: str, hint: str,
             verdict: str | None = None, members: list[str] | None = None) -> None:
        self.result.add(code, severity, where, message, hint, members=members)
        self.row(check, severity, verdict or message, where or "(model)", hint, code)

    def skip(self, checks, verdict: str) -> None:
        """Mark the checks that have no row yet as skipped, for one reason."""
        for check in checks:
            if check not in self.rows:
                self.row(check, "skipped", verdict)

    def has_error(self, *checks: str) -> bool:
        return any(self.rows.get(c, {}).get("status") == "error" for c in checks)

    def table(self) -> Table:
        rows = []
        for key, title in CHECK_TITLES.items():
            row = self.rows.get(key)
            if row is None:   # never reached (the model raised first): no hint to shorten, shown as —
                rows.append({"check": title, "id": key, "status": "skipped", "code": "", "verdict": "not run",
                             "where": "", "hint": "", "_style": STYLES["skipped"]})
            else:
                rows.append(dict(row, _hint=short_hint(row["hint"]), _style=STYLES.get(row["status"])))
        return Table("checks", "Checklist", [
            Column("check", "check"), Column("status", "result", "status"), Column("verdict", "verdict"),
            Column("where", "where"), Column("_hint", "hint", "note")], rows,
            note="full hints with each finding below; --json has every row")


def short_hint(hint: str) -> str:
    """The first clause of a hint, for the table (findings and JSON keep the whole hint)."""
    for sep in ("; ", " ("):
        if sep in hint:
            hint = hint.split(sep, 1)[0]
    return hint


def verdict(result: Result) -> str:
    errors = [f for f in result.findings if f.severity == "error"]
    warns = [f for f in result.findings if f.severity == "warning"]
    if errors:
        return f"FAIL: {len(errors)} error(s): " + ", ".join(sorted({f.code for f in errors}))
    return f"PASS with {len(warns)} warning(s)" if warns else "PASS"
