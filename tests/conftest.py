"""Fixtures (the in-process CLI, the untouched-model check) and the collection hook. The helpers live in
tests/support.py: import them from there (`from support import sample`)."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
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
    if os.environ.get("PYTEST_XDIST_WORKER"):   # a worker's order is the order xdist hands modules out in
        items[:] = costliest_modules_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def costliest_modules_first(items: list) -> list:
    """The items module by module, the costliest first by tests/costs.json (CPU seconds per file, measured by
    bench/suite_cpu.py; a file it does not name counts as its median). With `--dist loadscope
    --no-loadscope-reorder` xdist hands whole modules to idle workers in this order, so a long module never
    starts last while the other worker waits (longest first: the run ends at most one short module apart)."""
    path = support.ROOT / "tests" / "costs.json"
    costs = json.loads(path.read_text()) if path.exists() else {}
    default = sorted(costs.values())[len(costs) // 2] if costs else 0.0
    modules: dict = {}
    for item in items:
        modules.setdefault(item.path.name, []).append(item)
    order = sorted(modules, key=lambda name: -costs.get(name, default))   # stable: ties keep the collection order
    return [item for name in order for item in modules[name]]


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
