"""The suite must pass on a machine WITH a GPU (issue 16): no test may depend on CUDA being absent.

On an H100 seven tests failed only because they assumed a CPU-only machine. The rules they now follow:

- a test of the CPU-only message ("device 'cuda' is not available") simulates a CPU-only machine with
  ``monkeypatch.setattr("torch.cuda.is_available", lambda: False)``; it does not skip on a GPU box;
- a test of CPU output (memory's ``fits`` without a budget, profile's "operators by self CPU time") pins
  ``--device cpu``: ``--device auto`` means cuda where a GPU exists.

This file keeps it so on a machine without a GPU. Every device-dependent test of the suite runs a second
time, `<its id>[…pretend-gpu]`, right after itself in the same session (tests/conftest.py makes the copies
at collection), and during that run's setup, call and teardown torch claims one CUDA device
(``torch.cuda.is_available() -> True``, ``torch.cuda.device_count() -> 1``: all that
``core.device.resolve_device`` asks), so ``--device auto`` and ``--device cuda`` resolve to cuda. Nothing
can run on that pretend GPU, and nothing here tries: a test that relies on CUDA being absent either gets
past device resolution and fails when the model moves to cuda, or skips itself; a skip of the second run
is turned into its failure. Tests that simulate a CPU-only machine or pin ``--device cpu`` pass
unchanged. (Until issue 30 a child pytest re-ran them: the same checks, at the cost of a second process
that started torch, collected twenty modules and launched torchrun twice more.)

Which tests are device-dependent (tests/support.py ``pretend_gpu_selection``): every test function (not
marked ``cuda``) of tests/test_*.py that runs the CLI in-process (the ``cli`` fixture: a patch cannot
reach a subprocess) and whose code or parametrisation holds the string "cuda"/"cuda:N" or the argument
pair "--device", "cpu", found by reading the source; KNOWN must be among them (and gets its second run
even if it no longer is). What this cannot catch: a new test that runs with the default ``--device auto``
and asserts CPU-only output without saying "cpu" anywhere; only a run on a GPU machine finds those (the
``cuda``-marked tests are the place for GPU behaviour).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.reports import TestReport

from support import KNOWN_DEVICE_DEPENDENT as KNOWN
from support import (
    PRETEND_GPU,
    PRETEND_GPU_SELF_CHECK,
    device_dependent_tests,
    fake_gpu,
    pretend_gpu_report,
    pretend_gpu_selection,
    sample,
)

TESTS = Path(__file__).resolve().parent


def test_discovery_finds_every_known_device_dependent_test():
    found = set(device_dependent_tests())
    assert KNOWN <= found, sorted(KNOWN - found)


def test_the_pretend_gpu_reaches_device_resolution(monkeypatch):
    """What the second run relies on: under fake_gpu, auto and cuda resolve to cuda; the CPU-only
    simulation the tests use still wins when applied on top."""
    import torch

    from torchdiag.core.device import resolve_device
    from torchdiag.errors import UsageError

    real = torch.cuda.is_available, torch.cuda.device_count
    with fake_gpu():
        assert resolve_device("auto").type == "cuda"
        assert str(resolve_device("cuda:0")) == "cuda:0"
        with pytest.raises(UsageError, match="1 CUDA device"):
            resolve_device("cuda:1")
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(UsageError, match="not available"):
            resolve_device("cuda")
        monkeypatch.undo()
        assert resolve_device("auto").type == "cuda"
    assert (torch.cuda.is_available, torch.cuda.device_count) == real   # restored


def test_an_unsimulated_cuda_request_does_not_get_the_cpu_only_message(cli):
    """So a usage-error test that forgets to simulate a CPU-only machine fails in its second run. (On a
    real GPU the run succeeds; without one it fails moving the model; either way not exit 2.)"""
    with fake_gpu():
        r = cli("summary", sample("mlp.py:build"), "--device", "cuda")
    assert not (r.code == 2 and "not available" in r.stderr), r.stderr


def test_the_second_run_has_a_pretend_gpu(request):
    """Named in the selection (PRETEND_GPU_SELF_CHECK), so it runs twice: the second run is the one that
    sees a GPU, through device resolution too; the first sees the machine as it is (no claim about it)."""
    import torch

    from torchdiag.core.device import resolve_device

    if request.node.name.endswith(f"[{PRETEND_GPU}]"):
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert resolve_device("auto").type == "cuda"


def test_every_device_dependent_test_has_a_second_run_with_a_pretend_gpu(request):
    """The copies exist in this session: one `[…pretend-gpu]` run after each collected item of every
    selected test (all of them when the session collected the whole suite, as `make test` does)."""
    items = request.session.items
    selected = pretend_gpu_selection()
    key = lambda item: f"{item.path.name}::{item.originalname}"   # noqa: E731
    firsts = [i for i in items if key(i) in selected and not i.name.endswith(f"{PRETEND_GPU}]")]
    seconds = {i.nodeid for i in items if key(i) in selected and i.name.endswith(f"{PRETEND_GPU}]")}
    assert PRETEND_GPU_SELF_CHECK in {key(i) for i in firsts}
    for item in firsts:
        wanted = item.nodeid[:-1] + f"-{PRETEND_GPU}]" if item.nodeid.endswith("]") else item.nodeid + f"[{PRETEND_GPU}]"
        assert wanted in seconds, f"{item.nodeid} has no second run with a pretend GPU"
    collected = {i.path.name for i in items}
    every_file = {p.name for p in TESTS.glob("test_*.py")}
    chosen = request.config.getoption("markexpr") or request.config.getoption("keyword")   # -m/-k: a part
    if collected >= every_file and not chosen:            # the whole suite: every selected test is in it
        assert {key(i) for i in firsts} == selected, sorted(selected - {key(i) for i in firsts})


def test_a_skip_of_the_second_run_is_its_failure():
    """What tests/conftest.py does with each report of a second run: a skip (the test relied on CUDA being
    absent) becomes a failure naming the skip; a pass stays a pass; both say what the run pretends."""
    def report(outcome, longrepr):
        return TestReport("t.py::t[pretend-gpu]", ("t.py", 1, "t"), {}, outcome, longrepr, "call")

    failed = pretend_gpu_report(report("skipped", (str(TESTS), 1, "Skipped: needs no GPU")))
    assert failed.failed and "needs no GPU" in str(failed.longrepr), failed
    passed = pretend_gpu_report(report("passed", None))
    assert passed.passed and "CUDA device" in dict(passed.sections)[PRETEND_GPU]
