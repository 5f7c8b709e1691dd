"""What a diagnostic returns: findings, tables, series. Stdlib only; renderers read these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ExitCode

SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    code: str            # stable kebab-case, e.g. "non-finite-output"
    severity: str        # error | warning | info
    where: str           # module path or parameter name ("" for the whole model)
    message: str
    hint: str | None = None
    ranks: list[int] | None = None   # under torchrun: the ranks that reported it (None: one process)
    members: list[str] | None = None  # a finding on a stack's blocks (core/repeats.py): the parameters it covers

    def accepted_by(self, patterns) -> bool:
        """An allow glob (fnmatch) accepts it: on every parameter it covers when it names them (a finding on a
        stack's blocks, doctor's no-grad), else on its place."""
        import fnmatch

        if self.members:
            return all(any(fnmatch.fnmatch(m, a) for a in patterns) for m in self.members)
        return any(fnmatch.fnmatch(self.where, a) for a in patterns)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "severity": self.severity, "where": self.where, "message": self.message}
        if self.hint:
            d["hint"] = self.hint
        if self.members is not None:
            d["members"] = list(self.members)
        if self.ranks is not None:
            d["ranks"] = list(self.ranks)
        return d


@dataclass
class Column:
    key: str             # key in each row dict (and in JSON)
    title: str
    kind: str = "text"   # text | int | count | bytes | flops | float | pct | bar | status | note
    # status: a short verdict word, never cut or hidden; note: long text (a hint) that goes under the table
    # when the table is too wide for the console
    unit: str = ""


@dataclass
class Table:
    key: str                                # the JSON key the rows appear under
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None                 # one line shown under the table
    show: bool = True                       # False: JSON-only data (e.g. full lists)
    limit: int | None = None                # console shows at most this many rows (JSON has all)
    tb_scalars: tuple[str, ...] = ()        # numeric columns TensorBoard also gets per row (by row["name"])


@dataclass
class Result:
    command: str
    header: dict[str, Any] = field(default_factory=dict)    # choices made for the user
    data: dict[str, Any] = field(default_factory=dict)      # top-level JSON scalars/lists
    tables: list[Table] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=dict)  # e.g. loss per step
    notes: list[str] = field(default_factory=list)
    summary: list[tuple[str, str]] = field(default_factory=list)  # (label, value) lines for people
    verdict: str | None = None                              # one line, e.g. "PASS: ..."
    # Not in JSON: payloads only the TensorBoard/plot renderers use.
    histograms: dict[str, Any] = field(default_factory=dict)  # tag -> 1-D array
    images: dict[str, Any] = field(default_factory=dict)      # tag -> HxWx3 uint8 array
    text: dict[str, str] = field(default_factory=dict)        # tag -> markdown
    artefacts: dict[str, Any] = field(default_factory=dict)   # what file writers need (figure data, trace bytes)
    failed: bool | None = None    # override: a command may fail without an error finding
    code: int | None = None       # override of the exit code (check: 3 when a model raised)
    # findings already in causal order (nancheck: the order values went bad): kept within a severity
    # instead of being put in model order
    ordered: bool = False

    def add(self, code: str, severity: str, where: str, message: str, hint: str | None = None,
            members: list[str] | None = None) -> Finding:
        f = Finding(code, severity, where, message, hint, members=members)
        self.findings.append(f)
        return f

    def table(self, key: str) -> Table | None:
        return next((t for t in self.tables if t.key == key), None)

    @property
    def exit_code(self) -> ExitCode:
        if self.code is not None:
            return ExitCode(self.code)
        failed = self.failed if self.failed is not None else any(f.severity == "error" for f in self.findings)
        return ExitCode.CHECK_FAILED if failed else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": self.command}

        def put(key, value, source):
            # header, data, tables and series share one namespace: a clash would silently drop a value
            # (the same value twice is fine, e.g. the seed in the header and in a command's data)
            if key in doc and source != "series" and doc[key] != value:
                raise ValueError(f"{self.command}: JSON key '{key}' from {source} clashes with an earlier one")
            doc.setdefault(key, value)

        for k, v in self.header.items():
            put(k, v, "header")
        for k, v in self.data.items():
            put(k, v, "data")
        for t in self.tables:  # keys starting with "_" are for display only
            put(t.key, [{k: v for k, v in r.items() if not k.startswith("_")} for r in t.rows], "tables")
        for name, values in self.series.items():
            put(name, values, "series")
        doc["findings"] = [f.to_dict() for f in self.findings]
        doc["notes"] = list(self.notes)
        doc["exit_code"] = int(self.exit_code)
        return doc


def error_document(command: str | None, message: str, hint: str | None, code: int, partial: Result | None = None) -> dict:
    """The one JSON document of a run that failed (usage error, model error, interrupt)."""
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command,
                           "error": {"message": message, "hint": hint}, "exit_code": int(code)}
    if partial is not None:
        try:   # its exit code is the run's: the findings' own (0 before an error) read as a pass (a review)
            doc["partial"] = {**partial.to_dict(), "exit_code": int(code)}
        except Exception:  # never hide the real error behind a rendering failure
            pass
    return doc
