"""Fixtures (the in-process CLI, the untouched-model check) and the collection hook. The helpers live in
tests/support.py: import them from there (`from support import sample`)."""
from __future__ import annotations

import pytest

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


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


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
