"""Fixtures (the in-process CLI, the untouched-model check) and the collection hook. The helpers live in
tests/support.py: import them from there (`from support import sample`)."""
from __future__ import annotations

import dataclasses
import json
import os

# One process per core under pytest-xdist, so torch gets the cores divided among the workers, set before torch is
# first imported (here) and inherited by every child (torchrun, subprocess runs). Two workers with two OpenMP
# threads each on two cores spin against each other: the tiny-model overfit-batch tests took 148 s instead of 31.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

# The CLI's "still running" notice (cli/common.still_running) comes after a minute of a run; a busy machine could make a
# sample's run that long and put a line in an output a test compares: off here, on in the tests that ask for it.
os.environ["TORCHDIAG_STILL_RUNNING"] = "0"

import pytest  # noqa: E402
from _pytest.python import CallSpec

import support

# Re-exported so a test written against the old home (`from conftest import sample`) still runs; new tests and the
# suite import from support.
from support import (  # noqa: F401
    FAST_RUNS,
    ROOT,
    SAMPLES,
    CliResult,
    assert_readme_picture,
    load,
    load_module,
    one_error_line,
    sample,
)


@pytest.hookimpl(tryfirst=True)   # before `-m` deselects: a second run carries its original's markers
def pytest_collection_modifyitems(config, items):
    import torch

    items[:] = with_pretend_gpu_runs(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):   # a worker's order is the order xdist hands units out in
        check_spread(items)
        items[:] = costliest_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# ---- xdist: what stays together, what goes first -----------------------------------------------------------------

# Modules of independent tests (each makes its own model and files; no fixture of module or class scope) whose tests
# xdist hands out one by one instead of as one block: the costliest in-process modules, which as a block were the
# run's critical path. Every other module stays whole on one worker (its module-scoped fixtures, e.g. one torchrun
# launch shared by its assertions, run once). A module listed here that gains such a fixture fails collection.
SPREAD = {"test_first_hour.py", "test_readme.py"}


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist: unknown (and unused) when xdist is off
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope`, except that a test of a SPREAD module is a unit of its own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if unit_of(nodeid) == nodeid else super()._split_scope(nodeid)

    return Scheduling(config, log)


def unit_of(nodeid: str) -> str:
    """What xdist hands out whole: the test itself in a SPREAD module, else its module."""
    module = nodeid.split("::", 1)[0]
    return nodeid if module.rsplit("/", 1)[-1] in SPREAD else module


def check_spread(items: list) -> None:
    for item in items:
        if item.path.name in SPREAD:
            shared = [name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                      if any(d.scope != "function" and d.baseid == item.nodeid.split("::")[0] for d in defs)]
            if shared:
                raise pytest.UsageError(f"{item.nodeid} shares the {shared} fixture(s) of its module: take "
                                        f"{item.path.name} off tests/conftest.py SPREAD")


def costliest_first(items: list) -> list:
    """The items unit by unit (`unit_of`), the costliest first by tests/costs.json (CPU seconds per file, measured
    by bench/suite_cpu.py; a file it does not name counts as its median; a test of a SPREAD module by its own entry,
    else as under 2 s, the least an entry holds). xdist hands units to idle workers in this order (`--no-loadscope-reorder`), so the long ones start
    first and the run ends with short ones on both workers."""
    path = support.ROOT / "tests" / "costs.json"
    costs = json.loads(path.read_text()) if path.exists() else {}
    files = sorted(v for k, v in costs.items() if "::" not in k)
    default = files[len(files) // 2] if files else 0.0
    units: dict = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    per_file: dict = {}
    for item in items:
        per_file[item.path.name] = per_file.get(item.path.name, 0) + 1

    def cost(unit: str) -> float:   # a unit's nodeid is tests/FILE or tests/FILE::TEST; costs.json has no tests/
        name = unit.split("::", 1)[0].rsplit("/", 1)[-1]
        whole = costs.get(name, default)
        if "::" not in unit:
            return whole
        return costs.get(name + "::" + unit.split("::", 1)[1], min(whole / per_file[name], 2.0))

    order = sorted(units, key=lambda unit: -cost(unit))   # stable: ties keep the collection order
    return [item for unit in order for item in units[unit]]


# ---- the second run with a pretend GPU (tests/test_gpu_assumptions.py says why) ----------------------------------

def pretend_gpu(item) -> bool:
    """Is this item the second run of a device-dependent test, the one with a pretend GPU present?"""
    return getattr(item, "pretend_gpu", False)


def with_pretend_gpu_runs(items: list) -> list:
    """Each device-dependent test (support.pretend_gpu_selection) followed by a second run of itself,
    `<id>[…pretend-gpu]`, in the same module (so on the same xdist worker, sharing its module's fixtures)."""
    selected, out = support.pretend_gpu_selection(), []
    for item in items:
        out.append(item)
        if isinstance(item, pytest.Function) and f"{item.path.name}::{item.originalname}" in selected:
            spec = getattr(item, "callspec", None)
            # the copy's id: its original's parameters and `pretend-gpu` (pytest builds the id from the callspec)
            spec = (dataclasses.replace(spec, _idlist=[*spec._idlist, support.PRETEND_GPU]) if spec is not None else
                    CallSpec(params={}, indices={}, _arg2scope={}, _idlist=[support.PRETEND_GPU], marks=[]))
            copy = pytest.Function.from_parent(item.parent, name=f"{item.originalname}[{spec.id}]", callspec=spec,
                                               callobj=item.obj, originalname=item.originalname,
                                               fixtureinfo=item._fixtureinfo)
            copy.pretend_gpu = True
            out.append(copy)
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The second run's setup, call and teardown see one CUDA device; a test's own CPU-only simulation
    (monkeypatching is_available) goes on top of it and is undone before it."""
    if not pretend_gpu(item):
        return (yield)
    with support.fake_gpu():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    return support.pretend_gpu_report(report) if pretend_gpu(item) else report


@pytest.fixture
def cli():
    """cli('summary', spec, '-i', ...) → CliResult(code, stdout, stderr), in-process."""
    from typer.testing import CliRunner

    from torchdiag.cli.app import app

    runner = CliRunner()

    def run(*args):
        r = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        return CliResult(r.exit_code, r.stdout, r.stderr)

    return run


@pytest.fixture
def untouched():
    """with untouched(model): ... asserts the model and global state are as they were."""
    import contextlib

    from torchdiag.core.guard import differences, fingerprint

    @contextlib.contextmanager
    def check(model):
        before = fingerprint(model)
        yield
        changed = differences(before, fingerprint(model))
        assert not changed, f"diagnostic changed the model or global state: {changed}"

    return check
