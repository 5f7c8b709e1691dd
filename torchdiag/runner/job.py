"""What one run of a command asks for, as its caller gives it. Torch-free."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..commands import RENDER_FIELDS, RUN, Command


@dataclass
class Job:
    """A command to run. `fields` holds the run-wide options given (commands.RUN_OPTIONS names, plus `model`
    and `optimizer` = the OptimizerSpec fields given); the RunSpec is built from them inside the run, so a bad
    value is an outcome like any other. Hooks, all optional:
    `options()` builds the diagnostic's Options (before anything loads); `precheck()` checks files asked for;
    `run(model, inputs, opts, ctx)` replaces the diagnostic's run (live progress); `produce() -> Result` is
    for targets that are not one model (check, gradcheck); `after(result, written)` runs once the files are
    written (the CLI's messages about them); `progress(message)` a context shown while it loads; `working(message)`
    one around the diagnostic's run (the CLI's "still running" notice in a log)."""

    command: Command
    fields: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)      # kind -> path of the files asked for (None: not asked)
    options: Callable | None = None
    precheck: Callable | None = None
    run: Callable | None = None
    produce: Callable | None = None
    after: Callable | None = None                 # after(result, written) once the files are written
    show: Callable | None = None                  # show(outcome) -> exit code: how the caller prints an outcome
    progress: Callable[[str], Any] = lambda message: contextlib.nullcontext()
    working: Callable[[str], Any] = lambda message: contextlib.nullcontext()   # around the diagnostic's run
    caller: str = "cli"

    def given(self, name: str, default=None):
        return self.fields.get(name, default)

    @property
    def json(self) -> bool:
        return bool(self.fields.get("json"))

    @property
    def debug(self) -> bool:
        return bool(self.fields.get("debug"))

    def diagnostic(self):
        return None if self.command.diagnostic is None else self.command.diagnostic_module()

    def run_spec(self):
        fields = {k: v for k, v in self.fields.items() if k not in RENDER_FIELDS}
        return run_spec(self.command.name, self.diagnostic(), caller=self.caller, **fields)

    def render_spec(self):
        from ..render import RenderSpec

        outputs = {k: str(v) for k, v in self.outputs.items() if v is not None}
        tb = self.fields.get("tb")
        return RenderSpec(self.command.name, self.json, None if tb is None else str(tb), outputs)


def run_spec(command: str, diagnostic=None, *, caller: str = "cli", optimizer: dict | None = None, **fields):
    """The RunSpec: run-wide fields by their RunSpec names (None = not given, the default), the optimizer
    the diagnostic's default (its OPTIMIZER) with the fields given."""
    from ..core.run import RunSpec, optimizer_spec

    unknown = set(fields) - set(RUN) - {"model", "needs_inputs"}
    if unknown:   # a caller's bug, not the user's
        raise TypeError(f"not run-wide options: {sorted(unknown)}")
    given = {k: v for k, v in fields.items() if v is not None}
    for name in ("args", "inputs"):
        if name in given:
            given[name] = tuple(given[name])
    if given.get("checkpoint") is not None:
        given["checkpoint"] = str(given["checkpoint"])
    spec_optimizer = optimizer_spec(getattr(diagnostic, "OPTIMIZER", None), **(optimizer or {}))
    return RunSpec(command, optimizer=spec_optimizer, caller=caller, **given)
